"""Executes every notebook in `notebooks/` headless, on small sizes.

Each notebook reads `NT_NOTEBOOK_SIZE=small` in its first cell and shrinks its
problem. The notebooks are committed without outputs; the PNG figures of this
run are written to `$NT_NOTEBOOK_FIGURES` (default `build/notebook_figures/`)
so that they can be looked at, and each notebook that ran without error, with
its outputs, to `build/notebooks/`, where the docs build takes it (see
`docs/notebook_pages.py`). Every cell that draws a figure sets a title and
axis labels.
"""
import base64
import glob
import os

from absl.testing import absltest
from absl.testing import parameterized

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_NOTEBOOK_DIR = os.path.join(_ROOT, 'notebooks')
_NOTEBOOKS = sorted(
    os.path.splitext(os.path.basename(p))[0]
    for p in glob.glob(os.path.join(_NOTEBOOK_DIR, '*.ipynb')))
_CELL_TIMEOUT_S = 600

try:
  import matplotlib  # pylint: disable=g-import-not-at-top,unused-import
  import nbclient  # pylint: disable=g-import-not-at-top
  import nbformat  # pylint: disable=g-import-not-at-top
  _MISSING = None
except ImportError as e:
  _MISSING = str(e)


def _executed_dir() -> str:
  return os.path.join(_ROOT, 'build', 'notebooks')


def _figure_dir() -> str:
  return os.environ.get('NT_NOTEBOOK_FIGURES',
                        os.path.join(_ROOT, 'build', 'notebook_figures'))


def _read(name: str):
  return nbformat.read(os.path.join(_NOTEBOOK_DIR, f'{name}.ipynb'),
                       as_version=4)


def _pngs(notebook) -> list[bytes]:
  return [base64.b64decode(output['data']['image/png'])
          for cell in notebook.cells if cell.cell_type == 'code'
          for output in cell.get('outputs', [])
          if 'image/png' in output.get('data', {})]


@absltest.skipIf(_MISSING, f'needs nbclient, nbformat and matplotlib '
                 f'(pip install ".[test]"): {_MISSING}')
class NotebooksTest(parameterized.TestCase):

  def test_there_are_notebooks(self):
    self.assertGreaterEqual(len(_NOTEBOOKS), 8)

  @parameterized.named_parameters((name, name) for name in _NOTEBOOKS)
  def test_committed_without_outputs(self, name):
    for cell in _read(name).cells:
      if cell.cell_type == 'code':
        self.assertEmpty(cell.outputs, msg=f'{name}: strip outputs')
        self.assertIsNone(cell.execution_count, msg=name)

  @parameterized.named_parameters((name, name) for name in _NOTEBOOKS)
  def test_exports_to_a_python_script(self, name):
    # `jupyter nbconvert --to script` names the file by this extension.
    language = _read(name).metadata.language_info
    self.assertEqual((language.name, language.file_extension),
                     ('python', '.py'), msg=name)

  @parameterized.named_parameters((name, name) for name in _NOTEBOOKS)
  def test_plots_have_title_and_axis_labels(self, name):
    for cell in _read(name).cells:
      if cell.cell_type == 'code' and 'plt.show()' in cell.source:
        for word in ('title', 'xlabel', 'ylabel'):
          self.assertRegex(cell.source, rf'\b(set_)?{word}\b',
                           msg=f'{name}: a figure without its {word}')

  @parameterized.named_parameters((name, name) for name in _NOTEBOOKS)
  def test_runs(self, name):
    notebook = _read(name)
    environment = {
        'NT_NOTEBOOK_SIZE': 'small',
        'PYTHONPATH': os.pathsep.join(
            p for p in (_ROOT, os.environ.get('PYTHONPATH')) if p),
        'MPLBACKEND': 'module://matplotlib_inline.backend_inline',
    }
    with absltest.mock.patch.dict(os.environ, environment):
      client = nbclient.NotebookClient(
          notebook, timeout=_CELL_TIMEOUT_S, kernel_name='python3',
          resources={'metadata': {'path': _NOTEBOOK_DIR}})
      client.execute()  # Raises `CellExecutionError` with the cell's error.
    plots = sum('plt.show()' in c.source for c in notebook.cells
                if c.cell_type == 'code')
    pngs = _pngs(notebook)
    self.assertGreaterEqual(len(pngs), plots, msg=f'{name}: missing figures')
    os.makedirs(_figure_dir(), exist_ok=True)
    for i, png in enumerate(pngs):
      self.assertTrue(png.startswith(b'\x89PNG'))
      path = os.path.join(_figure_dir(), f'{name}_{i}.png')
      with open(path, 'wb') as f:
        f.write(png)
    errors = [o for c in notebook.cells if c.cell_type == 'code'
              for o in c.outputs if o.output_type == 'error']
    self.assertEmpty(errors, msg=name)
    text = '\n'.join(o.get('text', '') for c in notebook.cells
                     if c.cell_type == 'code' for o in c.outputs)
    self.assertNotRegex(text, r'\bnan\b', msg=f'{name} printed a NaN')
    os.makedirs(_executed_dir(), exist_ok=True)
    nbformat.write(notebook, os.path.join(_executed_dir(), f'{name}.ipynb'))


if __name__ == '__main__':
  absltest.main()
