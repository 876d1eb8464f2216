"""Runs every docstring example of the package (`>>>` lines) as a doctest.

Each example runs in float32 (what users see by default) with its module's
names and the same small set of globals, so that an example can use `nt`, `stax`, `jax`, `jnp`, `np` and `random` (= `jax.random`) without
importing them, and `x1`, `x2` (a few small float inputs of shape `(3, 4)` and
`(2, 4)`) without building them.
"""
import doctest
import importlib
import importlib.util
import pkgutil

from absl.testing import absltest
from absl.testing import parameterized
import jax
from jax import random
import jax.numpy as jnp
import numpy as np

import neural_tangents as nt
from neural_tangents import stax


# Modules whose examples need an optional extra: skipped without it.
_EXTRAS = {
    'neural_tangents._src.experimental.empirical_tf': ('tensorflow', 'tf2jax'),
    'neural_tangents._src.predict.stored': ('zarr',),
}


def _module_names() -> list[str]:
  names = ['neural_tangents']
  for info in pkgutil.walk_packages(nt.__path__, 'neural_tangents.'):
    names.append(info.name)
  return sorted(names)


def _shared_globals(module_name: str) -> dict:
  """The module's own names, then the shared ones."""
  globs = dict(vars(importlib.import_module(module_name)))
  globs.update({
      'nt': nt,
      'stax': stax,
      'jax': jax,
      'jnp': jnp,
      'np': np,
      'random': random,
      'x1': random.normal(random.PRNGKey(1), (3, 4)),
      'x2': random.normal(random.PRNGKey(2), (2, 4)),
  })
  return globs


def _examples(module_name: str) -> list[doctest.DocTest]:
  module = importlib.import_module(module_name)
  finder = doctest.DocTestFinder(exclude_empty=True)
  tests = finder.find(module, module_name, globs={})
  return [t for t in tests if t.examples
          and getattr(module, '__name__', '') == module_name]


class DocstringExamplesTest(parameterized.TestCase):

  @parameterized.named_parameters(
      (name.replace('.', '_'), name) for name in _module_names())
  def test_examples_run(self, module_name):
    missing = [m for m in _EXTRAS.get(module_name, ())
               if importlib.util.find_spec(m) is None]
    if missing:
      self.skipTest(f'needs {missing}')
    # Examples show what a user sees by default: float32 arrays.
    x64 = jax.config.jax_enable_x64
    jax.config.update('jax_enable_x64', False)
    try:
      failures = self._failures(module_name)
    finally:
      jax.config.update('jax_enable_x64', x64)
    if failures:
      self.fail('\n'.join(failures))

  def _failures(self, module_name: str) -> list[str]:
    failures = []
    for test in _examples(module_name):
      report = []
      runner = doctest.DocTestRunner(
          optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
      test.globs = _shared_globals(module_name)
      if runner.run(test, out=report.append).failed:
        failures.append(f'{test.name}:\n' + ''.join(report)[:2000])
    return failures


if __name__ == '__main__':
  absltest.main()
