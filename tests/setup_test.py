"""The package metadata and extras that `setup.py` declares."""
import glob
import os
import re
import runpy
import sys

from absl.testing import absltest
import nbformat

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Packages only the tests use: the docs must build without them.
_TEST_ONLY = ('pytest', 'pytest-xdist', 'zarr', 'absl-py', 'scipy')
# Module names that are not their distribution's name.
_DISTRIBUTIONS = {'sklearn': 'scikit-learn'}


def _name(requirement: str) -> str:
  for separator in '<>=!~[; ':
    requirement = requirement.split(separator)[0]
  return requirement.lower()


def setup_arguments() -> dict:
  """The keyword arguments `setup.py` passes to `setuptools.setup`."""
  calls = []
  cwd = os.getcwd()
  os.chdir(_ROOT)  # setup.py reads README.md relative to it.
  try:
    with absltest.mock.patch('setuptools.setup',
                             lambda **kwargs: calls.append(kwargs)):
      runpy.run_path(os.path.join(_ROOT, 'setup.py'), run_name='__main__')
  finally:
    os.chdir(cwd)
  (arguments,) = calls
  return arguments


def notebook_distributions() -> set[str]:
  """The distributions of what the notebooks import, beyond the package's
  own requirements and the standard library."""
  modules = set()
  for path in glob.glob(os.path.join(_ROOT, 'notebooks', '*.ipynb')):
    for cell in nbformat.read(path, as_version=4).cells:
      if cell.cell_type == 'code':
        modules |= set(re.findall(r'^\s*(?:import|from) (\w+)', cell.source,
                                  re.M))
  modules -= set(sys.stdlib_module_names) | {'jax', 'numpy', 'opt_einsum',
                                             'neural_tangents'}
  return {_DISTRIBUTIONS.get(m, m) for m in modules}


class SetupTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.arguments = setup_arguments()

  def test_author_and_project_urls(self):
    self.assertTrue(self.arguments['author'])
    for url in self.arguments['project_urls'].values():
      self.assertRegex(url, r'^https://')

  def test_python_versions(self):
    classifiers = self.arguments['classifiers']
    self.assertEqual(self.arguments['python_requires'], '>=3.11')
    for version in ('3.11', '3.12', '3.13'):
      self.assertIn(f'Programming Language :: Python :: {version}',
                    classifiers)

  def test_docs_extra_has_no_test_only_package(self):
    docs = {_name(r) for r in self.arguments['extras_require']['docs']}
    self.assertContainsSubset({'sphinx', 'myst-nb', 'jupyter-cache'}, docs)
    self.assertNoCommonElements(docs, _TEST_ONLY)

  def test_notebooks_and_docs_extras_cover_what_the_notebooks_import(self):
    extras = self.arguments['extras_require']
    needed = notebook_distributions()
    self.assertContainsSubset({'matplotlib', 'scikit-learn', 'flax'}, needed)
    for extra in ('notebooks', 'docs'):
      self.assertContainsSubset(needed, {_name(r) for r in extras[extra]},
                                msg=extra)
    self.assertIn('jupyter', {_name(r) for r in extras['notebooks']})


if __name__ == '__main__':
  absltest.main()
