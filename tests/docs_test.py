"""`docs/notebook_pages.py`: which outputs the notebooks' docs pages show,
and the check that the page of every notebook that plots has a figure (run at
the end of every docs build, CI's included)."""
import importlib.util
import os
import tempfile

from absl.testing import absltest
import nbformat

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _notebook_pages():
  """`docs/notebook_pages.py`, imported from its path (docs/ is no package)."""
  spec = importlib.util.spec_from_file_location(
      'notebook_pages', os.path.join(_ROOT, 'docs', 'notebook_pages.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _notebook(*sources, png=False):
  notebook = nbformat.v4.new_notebook()
  notebook.cells = [nbformat.v4.new_code_cell(s) for s in sources]
  if png:
    notebook.cells[-1].outputs = [nbformat.v4.new_output(
        'display_data', data={'image/png': 'iVBORw0KGgo='})]
  return notebook


class NotebookPagesTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.pages = _notebook_pages()
    temporary = tempfile.TemporaryDirectory()
    self.addCleanup(temporary.cleanup)
    self.root = temporary.name
    self.dirs = {}
    for name in ('source', 'executed', 'docs', 'html/notebooks'):
      self.dirs[name] = os.path.join(self.root, name)
      os.makedirs(self.dirs[name])

  def _write(self, directory, name, notebook):
    nbformat.write(notebook, os.path.join(self.dirs[directory],
                                          f'{name}.ipynb'))

  def _page(self, name, html):
    with open(os.path.join(self.dirs['html/notebooks'], f'{name}.html'),
              'w', encoding='utf-8') as f:
      f.write(html)

  def test_takes_the_tests_outputs_only_for_the_same_code(self):
    self._write('source', 'same', _notebook('x = 1', 'plt.show()'))
    self._write('executed', 'same', _notebook('x = 1', 'plt.show()',
                                              png=True))
    self._write('source', 'changed', _notebook('x = 2', 'plt.show()'))
    self._write('executed', 'changed', _notebook('x = 1', 'plt.show()',
                                                 png=True))
    self._write('source', 'new', _notebook('plt.show()'))
    origins = self.pages.copy_notebooks(
        self.dirs['source'], self.dirs['executed'], self.dirs['docs'])
    self.assertEqual(origins, {'same': 'tests', 'changed': 'build',
                               'new': 'build'})
    read = lambda name: nbformat.read(
        os.path.join(self.dirs['docs'], f'{name}.ipynb'), as_version=4)
    same = read('same')
    self.assertEqual(same.metadata.mystnb, {'execution_mode': 'off'})
    self.assertLen(same.cells[1].outputs, 1)
    # Executed by the docs build instead: no outputs, no override.
    changed = read('changed')
    self.assertEqual(changed.cells[0].source, 'x = 2')
    self.assertEmpty(changed.cells[1].outputs)
    self.assertNotIn('mystnb', changed.metadata)

  def test_a_page_that_plots_needs_an_image(self):
    self._write('docs', 'plots', _notebook('plt.show()'))
    self._write('docs', 'prints', _notebook('print(1)'))
    self._page('prints', '<p>1</p>')  # Needs no figure.
    self._page('plots', '<p><img alt="" src="../_images/plots_0.png" /></p>')
    self.pages.check_figures(self.dirs['docs'], os.path.join(self.root,
                                                             'html'))
    self._page('plots', '<pre>plt.show()</pre>')
    with self.assertRaisesRegex(RuntimeError, r"\['plots'\] show no figure"):
      self.pages.check_figures(self.dirs['docs'], os.path.join(self.root,
                                                               'html'))


if __name__ == '__main__':
  absltest.main()
