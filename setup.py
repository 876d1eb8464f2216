"""Installs `neural_tangents`, a maintained fork of Neural Tangents for current JAX."""
import os

import setuptools


def _version() -> str:
  path = os.path.join(os.path.dirname(__file__), 'neural_tangents',
                      '__init__.py')
  with open(path) as f:
    for line in f:
      if line.startswith('__version__'):
        return line.split('=')[1].strip().strip('\'"')
  raise RuntimeError('`__version__` not found in neural_tangents/__init__.py.')


# What `neural_tangents` imports, and nothing else.
INSTALL_REQUIRES = [
    'jax>=0.6',
    'jaxlib>=0.6',
    'numpy>=1.24',
    'opt_einsum>=3.3',
]

EXAMPLES_REQUIRE = [
    'absl-py>=1.0',
    'scikit-learn>=1.2',
    'tqdm>=4',
]

# What the notebooks import, and Jupyter to run them (`jupyter lab notebooks/`,
# `jupyter nbconvert --to script`).
NOTEBOOKS_RUN = [
    'flax>=0.10',
    'matplotlib>=3.7',
    'scikit-learn>=1.2',
    'tqdm>=4',
]
NOTEBOOKS_REQUIRE = ['jupyter>=1.1'] + NOTEBOOKS_RUN

# `python -m sphinx -W -b html docs docs/_build/html`: Sphinx, and what it
# needs to execute the notebooks it shows (docs/requirements.txt pins the
# versions CI builds with). No test-only package.
DOCS_REQUIRE = [
    'alabaster>=0.7',
    'ipykernel>=6',
    'jupyter-cache>=1',
    'myst-nb>=1.1',
    'myst-parser>=3',
    'nbclient>=0.8',
    'nbformat>=5.7',
    'sphinx>=7',
] + NOTEBOOKS_RUN

# tests/ also runs every example and notebook.
TESTS_REQUIRE = [
    'absl-py>=1.0',
    'flax>=0.10',
    'ipykernel>=6',
    'matplotlib>=3.7',
    'nbclient>=0.8',
    'nbformat>=5.7',
    'pytest>=7',
    'pytest-xdist>=3',
    'scipy>=1.10',
    'zarr>=3',
] + EXAMPLES_REQUIRE

setuptools.setup(
    name='neural-tangents',
    version=_version(),
    license='Apache 2.0',
    author='Neural Tangents, maintained contributors',
    project_urls={
        'Paper': 'https://arxiv.org/abs/1912.02803',
    },
    keywords='neural tangent kernel, NNGP, infinite width, JAX',
    description=('Fast and easy infinite neural networks in Python, '
                 'maintained for current JAX.'),
    long_description=open('README.md').read(),
    long_description_content_type='text/markdown',
    packages=setuptools.find_packages(exclude=('tests', 'tests.*',
                                               'examples', 'benchmarks')),
    python_requires='>=3.11',
    install_requires=INSTALL_REQUIRES,
    extras_require={
        'test': TESTS_REQUIRE,
        'examples': EXAMPLES_REQUIRE,
        'notebooks': NOTEBOOKS_REQUIRE,
        'docs': DOCS_REQUIRE,
        'progress': ['tqdm>=4'],
        # `nt.batch(..., store=path)`: the resumable on-disk kernel.
        'store': ['zarr>=3'],
        # `examples/datasets.py --dataset=mnist|cifar10|imdb_reviews`, with
        # the data already prepared locally.
        'tfds': ['tensorflow-datasets>=4.9'],
        # `nt.experimental.empirical_ntk_fn_tf`: NTKs of TensorFlow models.
        'tf': ['tensorflow>=2.16', 'tf2jax>=0.3.6'],
    },
    classifiers=[
        'Intended Audience :: Science/Research',
        'Programming Language :: Python :: 3',
        'Programming Language :: Python :: 3 :: Only',
        'Programming Language :: Python :: 3.11',
        'Programming Language :: Python :: 3.12',
        'Programming Language :: Python :: 3.13',
        'License :: OSI Approved :: Apache Software License',
        'Topic :: Scientific/Engineering :: Artificial Intelligence',
    ],
)
