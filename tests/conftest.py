"""Pytest configuration shared by every test module.

Sets, once for the whole suite, the JAX options that users may set, so that the
library is tested under them: float64 (`jax_enable_x64`) and strict rank
promotion (`jax_numpy_rank_promotion='raise'`, which turns silent broadcasting
of arrays of different ranks into an error). Test modules import shared
helpers as a package, `from tests import test_utils`.

It also asks XLA to compile without its backend optimizations (LLVM at -O0,
no fusion emitters on CPU). The suite compiles thousands of small programs
that each run for milliseconds, so compilation is most of its time: on a
2-core CPU these flags compile about 2x faster and cut `pooling_test.py` from
89 s to 57 s. They change no IEEE semantics (XLA's fast-math stays off), so
every assertion holds as before; benchmarks, examples and the docs build run
with XLA's defaults. Set `NT_TEST_XLA_DEFAULTS=1` to test under the defaults
too. The flags are checked once in a subprocess, since an XLA that does not
know a flag refuses to start.
"""
import os
import subprocess
import sys

_FAST_COMPILE_FLAGS = ('--xla_backend_optimization_level=0',
                       '--xla_cpu_use_fusion_emitters=false')


def _use_fast_compile_flags() -> None:
  """Appends `_FAST_COMPILE_FLAGS` to `XLA_FLAGS` if this XLA accepts them.

  Runs before any JAX backend starts (XLA reads its flags then). pytest-xdist
  workers inherit the controller's `XLA_FLAGS`, so only the first process
  probes.
  """
  if os.environ.get('NT_TEST_XLA_DEFAULTS'):
    return
  flags = os.environ.get('XLA_FLAGS', '')
  missing = [f for f in _FAST_COMPILE_FLAGS if f.split('=')[0] not in flags]
  if not missing:
    return
  candidate = ' '.join([flags] + missing).strip()
  try:
    probe = subprocess.run(
        [sys.executable, '-c', 'import jax; jax.jit(lambda x: x + 1)(1.)'],
        env={**os.environ, 'XLA_FLAGS': candidate}, capture_output=True,
        timeout=120, check=False)
  except subprocess.TimeoutExpired:
    return
  if probe.returncode == 0:
    os.environ['XLA_FLAGS'] = candidate


_use_fast_compile_flags()

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position

jax.config.update('jax_enable_x64', True)
jax.config.update('jax_numpy_rank_promotion', 'raise')
