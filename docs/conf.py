"""Sphinx configuration: `sphinx-build -W -b html docs docs/_build/html`."""
import os
import re
import sys

_DOCS = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_DOCS)
sys.path.insert(0, _ROOT)  # Document this checkout, not an installed copy.
sys.path.insert(0, _DOCS)

import neural_tangents  # pylint: disable=g-import-not-at-top,wrong-import-position
import notebook_pages  # pylint: disable=g-import-not-at-top,wrong-import-position

project = 'Neural Tangents, maintained'
author = 'Neural Tangents, maintained contributors'
copyright = '2026, ' + author  # pylint: disable=redefined-builtin
release = neural_tangents.__version__

extensions = [
    'myst_nb',  # Markdown (MyST) pages and the notebooks.
    'sphinx.ext.autodoc',
    'sphinx.ext.napoleon',
    'sphinx.ext.viewcode',
]
source_suffix = {'.rst': 'restructuredtext', '.md': 'myst-nb',
                 '.ipynb': 'myst-nb'}
exclude_patterns = ['_build', 'requirements.txt']
# Notebooks show their outputs: those of tests/notebooks_test.py where it ran
# on the same code cells, else executed here in small mode and cached (see
# notebook_pages.py).
nb_execution_mode = 'cache'
nb_execution_cache_path = os.path.join(_ROOT, 'build', 'jupyter_cache')
nb_execution_timeout = 600  # Seconds per cell.
nb_execution_raise_on_error = True
nb_execution_show_tb = True
# Progress bars (stderr) are for interactive runs: one output block per
# update on a static page. Figures and printed results stay.
nb_output_stderr = 'remove'
myst_heading_anchors = 3

autodoc_default_options = {'members': True, 'member-order': 'bysource'}
autodoc_typehints = 'description'
autodoc_mock_imports = []
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_use_ivar = True  # `Attributes:` of NamedTuples: no duplicate entries.
html_theme = 'alabaster'
html_static_path = []


_SECTION = re.compile(r'^\s*[A-Z][A-Za-z ]*:\s*$')  # `Args:`, `Example:`, ...
_LIST_ITEM = re.compile(r'^\s*([*+-]|\d+\.)\s')
_PLURAL_LITERAL = re.compile(r'(`[^`\s][^`]*`)(s)\b')  # `jax.jvp`s


def _indent(line: str) -> int:
  return len(line) - len(line.lstrip())


def display_blocks_as_literals(lines: list[str]) -> list[str]:
  """Docstring displays (formulas, shape tables) as RST literal blocks.

  The docstrings show formulas as a blank line and a more indented block,
  which reads well in `help()`, and which reStructuredText would take for a
  block quote (and reject its continuation lines). A `::` paragraph before
  such a block makes it a literal block. Blocks after a section header
  (`Args:`), a list item, or starting with `>>>` are left alone.
  """
  out, paragraph_start = [], None
  for i, line in enumerate(lines):
    if line.strip() and (i == 0 or not lines[i - 1].strip()):
      previous = [l for l in lines[:i] if l.strip()]
      if (previous and paragraph_start is not None and
          _indent(line) > _indent(lines[paragraph_start]) and
          not _SECTION.match(previous[-1]) and
          not _LIST_ITEM.match(lines[paragraph_start]) and
          not line.lstrip().startswith(('>>>', '*', '-', '..')) and
          not previous[-1].rstrip().endswith('::')):
        out += [' ' * _indent(lines[paragraph_start]) + '::', '']
      else:
        paragraph_start = i
    out.append(_PLURAL_LITERAL.sub(r'\1\\ \2', line))
  return out


def _process_docstring(app, what, name, obj, options, lines):
  del app, what, name, obj, options
  lines[:] = display_blocks_as_literals(lines)


def _check_notebook_figures(app, exception):
  if exception is None and app.builder.format == 'html':
    notebook_pages.check_figures(_NOTEBOOK_DST, app.outdir)


def setup(app):
  # Before napoleon (priority 500), on the Google-style text.
  app.connect('autodoc-process-docstring', _process_docstring, priority=400)
  app.connect('build-finished', _check_notebook_figures)


# The notebooks live in notebooks/; Sphinx reads sources under docs/ only.
# Those executed here run on this checkout, in small mode, with inline figures.
_NOTEBOOK_DST = os.path.join(_DOCS, 'notebooks')
notebook_pages.copy_notebooks(os.path.join(_ROOT, 'notebooks'),
                              os.path.join(_ROOT, 'build', 'notebooks'),
                              _NOTEBOOK_DST)
os.environ.setdefault('NT_NOTEBOOK_SIZE', 'small')
os.environ['MPLBACKEND'] = 'module://matplotlib_inline.backend_inline'
os.environ['PYTHONPATH'] = os.pathsep.join(
    p for p in (_ROOT, os.environ.get('PYTHONPATH')) if p)
