"""Module boundaries of `neural_tangents`, checked from the source.

Two rules, stated in CONTRIBUTING.md ("Module boundaries"):

1. **No module imports another module's underscore names.** A helper that
   sibling modules share gets a public name in the module that owns it; an
   underscore name is private to its module. Checked on `from m import _x`,
   `import m` followed by `m._x`, and `from pkg import _m` (a private module).
   Dunder names (`__version__`) are not private. Tests may use private names.
2. **No import circle between the package's modules**, counting every import
   (also those inside functions, which must not be used to dodge a circle),
   and counting a package's `__init__.py` as a module: a circle through the
   re-exports of an `__init__` is a circle too.

And two size limits: **no module over 800 lines** (`_MAX_LINES`), except
the modules of `_LONG_MODULES`, and **no function over 120 lines of code**
(`_MAX_FUNCTION_LINES`: from its `def` line to its last line, its docstring
aside; a nested function counts in its parent too), except the functions of
`_LONG_FUNCTIONS`. Neither allow-list may grow past its recorded size.

The checks read the source with `ast`; nothing is imported.
"""
import ast
import pathlib
import tempfile
from typing import Optional

from absl.testing import absltest

_PACKAGE = 'neural_tangents'
_ROOT = pathlib.Path(__file__).resolve().parent.parent


def _is_private(name: str) -> bool:
  return name.startswith('_') and not (name.startswith('__') and
                                       name.endswith('__'))


def package_modules(root: pathlib.Path = _ROOT) -> dict[str, pathlib.Path]:
  """Maps each module's dotted name to its file."""
  modules = {}
  for path in sorted((root / _PACKAGE).rglob('*.py')):
    parts = list(path.relative_to(root).with_suffix('').parts)
    if parts[-1] == '__init__':
      parts = parts[:-1]
    modules['.'.join(parts)] = path
  return modules


def _resolve(module: str, path: pathlib.Path, node: ast.ImportFrom) -> str:
  """The absolute module name of a (possibly relative) `from` import."""
  if not node.level:
    return node.module or ''
  package = module.split('.')
  if path.name != '__init__.py':
    package = package[:-1]
  if node.level > 1:
    package = package[:len(package) - node.level + 1]
  return '.'.join(package + ([node.module] if node.module else []))


def _imports(module: str, path: pathlib.Path, modules: dict[str, pathlib.Path]):
  """Yields `(imported module, name or None, line)` for each import."""
  tree = ast.parse(path.read_text(), str(path))
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        if alias.name.startswith(_PACKAGE):
          yield alias.name, None, node.lineno
    elif isinstance(node, ast.ImportFrom):
      source = _resolve(module, path, node)
      if not source.startswith(_PACKAGE):
        continue
      for alias in node.names:
        submodule = f'{source}.{alias.name}'
        if submodule in modules:
          yield submodule, None, node.lineno
        else:
          yield source, alias.name, node.lineno


def private_imports(root: pathlib.Path = _ROOT) -> list[str]:
  """Every use of another module's underscore name, as `file:line: what`."""
  modules = package_modules(root)
  found = []
  for module, path in modules.items():
    rel = path.relative_to(root)
    # Names bound to package modules in this file (`import a.b as c`,
    # `from a import b`), to catch `c._x` attribute access.
    aliases = {}
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        for alias in node.names:
          if alias.name.startswith(_PACKAGE) and alias.asname:
            aliases[alias.asname] = alias.name
      elif isinstance(node, ast.ImportFrom):
        source = _resolve(module, path, node)
        for alias in node.names:
          if f'{source}.{alias.name}' in modules:
            aliases[alias.asname or alias.name] = f'{source}.{alias.name}'
    for source, name, line in _imports(module, path, modules):
      last = source.rsplit('.', 1)[-1]
      if source != module and name is None and _is_private(last):
        found.append(f'{rel}:{line}: imports private module {source}')
      if name is not None and _is_private(name) and source != module:
        found.append(f'{rel}:{line}: imports {source}.{name}')
    for node in ast.walk(tree):
      if (isinstance(node, ast.Attribute) and _is_private(node.attr) and
          isinstance(node.value, ast.Name) and node.value.id in aliases and
          aliases[node.value.id] != module):
        found.append(f'{rel}:{node.lineno}: uses '
                     f'{aliases[node.value.id]}.{node.attr}')
  return sorted(set(found))


def import_graph(root: pathlib.Path = _ROOT) -> dict[str, set[str]]:
  """Module -> the package modules it imports (a package import counts as an
  import of its `__init__`)."""
  modules = package_modules(root)
  graph = {m: set() for m in modules}
  for module, path in modules.items():
    for source, _, _ in _imports(module, path, modules):
      while source and source not in modules:
        source = source.rsplit('.', 1)[0] if '.' in source else ''
      if source and source != module:
        graph[module].add(source)
  return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components with more than one module (Tarjan).

  Every edge counts, also those from a package's `__init__` to its own
  submodules and from a submodule to a package above it: `from pkg import
  name` in `pkg.a` runs `pkg/__init__.py`, which may import `pkg.a` back.
  (`from pkg import a`, `a` a submodule, is an edge to `pkg.a` itself.)
  """
  index, low, stack, on_stack, circles = {}, {}, [], set(), []
  counter = [0]

  def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on_stack.add(v)
    for w in sorted(graph[v]):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        circles.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return circles


# A module longer than this is split by concept (CONTRIBUTING.md, "Layout").
_MAX_LINES = 800
# Modules over `_MAX_LINES` when the limit was set, with their line counts
# then; each may not grow past it, and leaves the list once split (the list
# is empty since `empirical/structured/rules.py` became the package `rules/`,
# one module per primitive family).
_LONG_MODULES: dict[str, int] = {}


def long_modules(root: pathlib.Path = _ROOT,
                 allowed: Optional[dict[str, int]] = None) -> list[str]:
  """Every module over `_MAX_LINES` lines that `allowed` (path -> lines, by
  default `_LONG_MODULES`) does not allow, as `path: N lines`; and every
  allowed module that grew past its entry or is no longer long."""
  allowed = _LONG_MODULES if allowed is None else allowed
  found = []
  for path in package_modules(root).values():
    rel = path.relative_to(root).as_posix()
    lines = len(path.read_text().splitlines())
    if rel in allowed:
      if lines > allowed[rel]:
        found.append(f'{rel}: {lines} lines, grew past the {allowed[rel]} '
                     'allowed; split it by concept')
      elif lines <= _MAX_LINES:
        found.append(f'{rel}: {lines} lines, no longer over {_MAX_LINES}; '
                     'remove it from `_LONG_MODULES`')
    elif lines > _MAX_LINES:
      found.append(f'{rel}: {lines} lines, over {_MAX_LINES}; split it by '
                   'concept')
  return sorted(found)


# A function longer than this is split into named helpers (CONTRIBUTING.md,
# "Module boundaries").
_MAX_FUNCTION_LINES = 120
# Functions over `_MAX_FUNCTION_LINES` when the limit was set, as
# `path:qualified name` with their lines of code then; each may not grow past
# it, and leaves the list once shortened.
_LONG_FUNCTIONS: dict[str, int] = {}


def function_lengths(path: pathlib.Path) -> dict[str, int]:
  """Lines of code of each function of a file, its docstring aside.

  Keys are qualified names (`Outer.inner` for a function defined in `Outer`,
  a function or a class); a function's lines run from its `def` line to its
  last line, nested functions included.
  """
  lengths = {}

  def visit(node: ast.AST, prefix: str) -> None:
    for child in ast.iter_child_nodes(node):
      name = prefix
      if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
        name = f'{prefix}{child.name}'
        n = child.end_lineno - child.lineno + 1
        first = child.body[0]
        if (isinstance(first, ast.Expr) and
            isinstance(first.value, ast.Constant) and
            isinstance(first.value.value, str)):
          n -= first.end_lineno - first.lineno + 1
        lengths[name] = max(n, lengths.get(name, 0))
        name += '.'
      elif isinstance(child, ast.ClassDef):
        name = f'{prefix}{child.name}.'
      visit(child, name)

  visit(ast.parse(path.read_text(), str(path)), '')
  return lengths


def long_functions(root: pathlib.Path = _ROOT,
                   allowed: Optional[dict[str, int]] = None) -> list[str]:
  """Every function over `_MAX_FUNCTION_LINES` lines of code that `allowed`
  (`path:name` -> lines, by default `_LONG_FUNCTIONS`) does not allow, as
  `path:name: N lines`; and every allowed function that grew past its entry,
  is no longer long, or no longer exists."""
  allowed = _LONG_FUNCTIONS if allowed is None else allowed
  found, seen = [], set()
  for path in package_modules(root).values():
    rel = path.relative_to(root).as_posix()
    for name, lines in function_lengths(path).items():
      key = f'{rel}:{name}'
      seen.add(key)
      if key in allowed:
        if lines > allowed[key]:
          found.append(f'{key}: {lines} lines, grew past the {allowed[key]} '
                       'allowed; extract named helpers')
        elif lines <= _MAX_FUNCTION_LINES:
          found.append(f'{key}: {lines} lines, no longer over '
                       f'{_MAX_FUNCTION_LINES}; remove it from '
                       '`_LONG_FUNCTIONS`')
      elif lines > _MAX_FUNCTION_LINES:
        found.append(f'{key}: {lines} lines, over {_MAX_FUNCTION_LINES}; '
                     'extract named helpers')
  found += [f'{key}: not found; remove it from `_LONG_FUNCTIONS`'
            for key in allowed if key not in seen]
  return sorted(found)


class ArchitectureTest(absltest.TestCase):

  def test_the_scan_sees_the_package(self):
    modules = package_modules()
    self.assertIn('neural_tangents._src.stax.requirements', modules)
    self.assertGreater(len(modules), 40)

  def test_the_checks_catch_what_they_should(self):
    tmp_dir = tempfile.TemporaryDirectory()
    self.addCleanup(tmp_dir.cleanup)
    tmp = pathlib.Path(tmp_dir.name)
    pkg = tmp / _PACKAGE
    pkg.mkdir()
    (pkg / '__init__.py').write_text('')
    (pkg / 'a.py').write_text('from neural_tangents import b\n'
                              'def f():\n  return b._g()\n')
    (pkg / 'b.py').write_text('from . import c\n')
    (pkg / 'c.py').write_text('def f():\n'
                              '  from neural_tangents.a import _h\n')
    found = private_imports(tmp)
    self.assertEqual(len(found), 2, found)
    self.assertIn('uses neural_tangents.b._g', found[0])
    self.assertIn('imports neural_tangents.a._h', found[1])
    self.assertEqual(import_circles(import_graph(tmp)),
                     [['neural_tangents.a', 'neural_tangents.b',
                       'neural_tangents.c']])

  def test_the_circle_check_sees_circles_through_a_package_init(self):
    tmp_dir = tempfile.TemporaryDirectory()
    self.addCleanup(tmp_dir.cleanup)
    tmp = pathlib.Path(tmp_dir.name)
    pkg = tmp / _PACKAGE
    (pkg / 'p').mkdir(parents=True)
    (pkg / '__init__.py').write_text('')
    # `p/__init__.py` re-exports `p.a`, which needs `q`, which imports a name
    # re-exported by `p`: p -> p.a -> q -> p.
    (pkg / 'p' / '__init__.py').write_text(
        'from neural_tangents.p.a import f\n')
    (pkg / 'p' / 'a.py').write_text('from neural_tangents import q\n'
                                    'def f():\n  return q.g()\n')
    (pkg / 'q.py').write_text('from neural_tangents.p import f\n'
                              'def g():\n  return 1\n')
    # A submodule importing a name from its own package's `__init__`, which
    # imports the submodule: r -> r.b -> r.
    (pkg / 'r').mkdir()
    (pkg / 'r' / '__init__.py').write_text('from . import b\nN = 1\n')
    (pkg / 'r' / 'b.py').write_text('from neural_tangents.r import N\n')
    # Not a circle: `from s import c` (a submodule) is an edge to `s.c`.
    (pkg / 's').mkdir()
    (pkg / 's' / '__init__.py').write_text(
        'from neural_tangents.s.c import h\n')
    (pkg / 's' / 'c.py').write_text('def h():\n  return 1\n')
    (pkg / 's' / 'd.py').write_text('from neural_tangents.s import c\n')
    self.assertEqual(import_circles(import_graph(tmp)),
                     [['neural_tangents.p', 'neural_tangents.p.a',
                       'neural_tangents.q'],
                      ['neural_tangents.r', 'neural_tangents.r.b']])

  def test_the_size_check_catches_long_modules(self):
    tmp_dir = tempfile.TemporaryDirectory()
    self.addCleanup(tmp_dir.cleanup)
    tmp = pathlib.Path(tmp_dir.name)
    pkg = tmp / _PACKAGE
    pkg.mkdir()
    (pkg / '__init__.py').write_text('')
    long_text = 'x = 1\n' * (_MAX_LINES + 1)
    for name in ('new', 'grown', 'kept', 'split'):
      (pkg / f'{name}.py').write_text(long_text)
    (pkg / 'split.py').write_text('x = 1\n')
    (pkg / 'grown.py').write_text(long_text + 'y = 2\n')
    (pkg / 'short.py').write_text('x = 1\n' * _MAX_LINES)
    allowed = {f'{_PACKAGE}/{name}.py': _MAX_LINES + 1
               for name in ('grown', 'kept', 'split')}
    found = long_modules(tmp, allowed)
    self.assertLen(found, 3, found)
    self.assertIn(f'{_PACKAGE}/grown.py: {_MAX_LINES + 2} lines, grew past',
                  found[0])
    self.assertIn(f'{_PACKAGE}/new.py: {_MAX_LINES + 1} lines, over',
                  found[1])
    self.assertIn(f'{_PACKAGE}/split.py: 1 lines, no longer over', found[2])

  def test_the_size_check_catches_long_functions(self):
    tmp_dir = tempfile.TemporaryDirectory()
    self.addCleanup(tmp_dir.cleanup)
    tmp = pathlib.Path(tmp_dir.name)
    pkg = tmp / _PACKAGE
    pkg.mkdir()
    (pkg / '__init__.py').write_text('')

    def function(name: str, lines: int, indent: str = '') -> str:
      # `def`, a docstring of three lines (not counted), `lines - 1` more.
      return (f'{indent}def {name}():\n'
              f'{indent}  """Doc.\n\n{indent}  More.\n{indent}  """\n' +
              f'{indent}  x = 1\n' * (lines - 1))

    limit = _MAX_FUNCTION_LINES
    (pkg / 'a.py').write_text(
        function('new', limit + 1) + function('short', limit) +
        function('grown', limit + 2) + function('kept', limit + 1) +
        function('shortened', 5) +
        # A nested function counts in its parent, docstring included (only a
        # function's own docstring is aside): 2 + (limit + 4) lines.
        'class C:\n  def outer(self):\n    y = 2\n' +
        function('inner', limit, indent='    '))
    allowed = {f'{_PACKAGE}/a.py:{name}': limit + 1
               for name in ('grown', 'kept', 'shortened', 'gone')}
    self.assertEqual(function_lengths(pkg / 'a.py')['C.outer.inner'], limit)
    found = long_functions(tmp, allowed)
    self.assertLen(found, 5, found)
    self.assertIn(f'a.py:C.outer: {limit + 6} lines, over', found[0])
    self.assertIn('a.py:gone: not found', found[1])
    self.assertIn(f'a.py:grown: {limit + 2} lines, grew past', found[2])
    self.assertIn(f'a.py:new: {limit + 1} lines, over', found[3])
    self.assertIn('a.py:shortened: 5 lines, no longer over', found[4])

  def test_no_module_imports_another_modules_private_names(self):
    found = private_imports()
    self.assertEmpty(found, 'Give these helpers a public name in the module '
                     'that owns them:\n' + '\n'.join(found))

  def test_no_import_circles(self):
    circles = import_circles(import_graph())
    self.assertEmpty(circles, 'Import circles between modules:\n' +
                     '\n'.join(' <-> '.join(c) for c in circles))


  def test_no_module_is_over_the_size_limit(self):
    found = long_modules()
    self.assertEmpty(found, f'Modules over {_MAX_LINES} lines:\n' +
                     '\n'.join(found))

  def test_no_function_is_over_the_size_limit(self):
    found = long_functions()
    self.assertEmpty(found, f'Functions over {_MAX_FUNCTION_LINES} lines of '
                     'code:\n' + '\n'.join(found))


if __name__ == '__main__':
  absltest.main()
