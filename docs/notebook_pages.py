"""The notebooks' pages in the docs: executed, with their outputs and figures.

`docs/conf.py` copies `notebooks/*.ipynb` (committed without outputs) to
`docs/notebooks/` with `copy_notebooks`. A notebook that
`tests/notebooks_test.py` executed in this checkout (`build/notebooks/`, the
same code cells) is copied with its outputs and not executed again; any other
is executed by myst-nb while the docs build, at `NT_NOTEBOOK_SIZE=small`, and
cached by jupyter-cache (`build/jupyter_cache/`), so that a rebuild executes
only the notebooks whose code changed. After the build, `check_figures`
fails it if a page of a notebook that plots has no image.
"""
import glob
import os
import re
import shutil

import nbformat

# A cell that draws a figure (every figure of the notebooks is shown so).
_PLOT = 'plt.show()'
_IMAGE = re.compile(r'<img\b[^>]*\bsrc=')


def _code(notebook) -> list[str]:
  return [cell.source for cell in notebook.cells if cell.cell_type == 'code']


def _plots(notebook) -> bool:
  return any(_PLOT in source for source in _code(notebook))


def copy_notebooks(source_dir: str, executed_dir: str,
                   destination_dir: str) -> dict[str, str]:
  """Copies the notebooks of `source_dir` to `destination_dir`.

  Args:
    source_dir: the committed notebooks (`notebooks/`).
    executed_dir: notebooks executed by the tests (`build/notebooks/`); one
      whose code cells are those of the committed notebook is copied instead,
      marked not to be executed again.
    destination_dir: where Sphinx reads them (`docs/notebooks/`); replaced.

  Returns:
    `{name: 'tests' or 'build'}`: where each notebook's outputs come from.
  """
  shutil.rmtree(destination_dir, ignore_errors=True)
  os.makedirs(destination_dir)
  origins = {}
  for path in sorted(glob.glob(os.path.join(source_dir, '*.ipynb'))):
    name = os.path.basename(path)
    notebook = nbformat.read(path, as_version=4)
    executed_path = os.path.join(executed_dir, name)
    origins[name[:-len('.ipynb')]] = 'build'
    if os.path.exists(executed_path):
      executed = nbformat.read(executed_path, as_version=4)
      if _code(executed) == _code(notebook):
        notebook = executed
        notebook.metadata['mystnb'] = {'execution_mode': 'off'}
        origins[name[:-len('.ipynb')]] = 'tests'
    nbformat.write(notebook, os.path.join(destination_dir, name))
  return origins


def check_figures(notebook_dir: str, html_dir: str) -> None:
  """Raises `RuntimeError` if the page of a notebook that plots has no image.

  Args:
    notebook_dir: the notebooks the pages were built from.
    html_dir: the built pages (`<html>/notebooks/NAME.html`).
  """
  missing = []
  for path in sorted(glob.glob(os.path.join(notebook_dir, '*.ipynb'))):
    if not _plots(nbformat.read(path, as_version=4)):
      continue
    name = os.path.basename(path)[:-len('.ipynb')]
    page = os.path.join(html_dir, 'notebooks', f'{name}.html')
    with open(page, encoding='utf-8') as f:
      if not _IMAGE.search(f.read()):
        missing.append(name)
  if missing:
    raise RuntimeError(
        f'The docs pages of the notebooks {missing} show no figure, although '
        'they plot: they were not executed, or their image outputs were '
        'dropped. Build with nb_execution_mode "cache" (docs/conf.py), or run '
        'tests/notebooks_test.py first.')
