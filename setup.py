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
        'Programming Language :: Python :: 3',
        'License :: OSI Approved :: Apache Software License',
        'Topic :: Scientific/Engineering :: Artificial Intelligence',
    ],
)
