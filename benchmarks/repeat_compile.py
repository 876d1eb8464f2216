"""Compile time and memory of deep networks: unfolded `serial`, folded `serial`
and `repeat`, as ratios to depth 10 measured in the same run.

Usage (from the project root, with the package installed):

  python benchmarks/repeat_compile.py            # all constructions
  python benchmarks/repeat_compile.py repeat     # one construction

Each line is JSON: the construction, the depth, the seconds to trace, lower
and compile `jit(kernel_fn(x, x, 'ntk'))` and `jit(apply_fn)`, the peak memory
(resident set size) of the process that compiled them, its growth over the
process's memory before compiling, and the ratios of time and growth to the
same construction at depth 10. Each (construction, depth) runs in a fresh
subprocess so that peaks are its own. The workload is the one of the issue:
`block = serial(Dense(64, 1.5, 0.1), Relu())`, 8 inputs of 64 features.
"""
import json
import os
import subprocess
import sys
import time

import process_memory  # benchmarks/process_memory.py

DEPTHS = {
    'serial_unfolded': (10, 100, 1000),
    'serial_folded': (10, 100, 1000),
    'repeat': (10, 100, 1000, 10000),
}
# Unfolded `serial` stops at the first depth that takes longer than this.
STOP_AFTER_SECONDS = 60.


def measure(construction: str, depth: int) -> dict:
  """Runs in the subprocess: compiles one network and reports."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from neural_tangents import stax  # pylint: disable=g-import-not-at-top

  block = stax.serial(stax.Dense(64, 1.5, 0.1), stax.Relu())
  if construction == 'repeat':
    net = stax.repeat(block, depth)
  else:
    net = stax.serial(*[block] * depth,
                      fold_repeats=construction == 'serial_folded')
  init_fn, apply_fn, kernel_fn = net
  x = jax.random.normal(jax.random.PRNGKey(0), (8, 64))
  _, params = init_fn(jax.random.PRNGKey(1), x.shape)
  jax.block_until_ready(params)
  rss_before = process_memory.status_mib('VmRSS')

  start = time.perf_counter()
  compiled = jax.jit(lambda x: kernel_fn(x, x, 'ntk')).lower(x).compile()
  kernel_seconds = time.perf_counter() - start
  jax.block_until_ready(compiled(x))

  start = time.perf_counter()
  jax.jit(apply_fn).lower(params, x).compile()
  apply_seconds = time.perf_counter() - start
  peak = process_memory.status_mib('VmHWM')
  return dict(kernel_compile_s=round(kernel_seconds, 3),
              apply_compile_s=round(apply_seconds, 3),
              peak_rss_mb=round(peak, 1),
              compile_rss_growth_mb=round(peak - rss_before, 1))


def _run_subprocess(construction: str, depth: int, timeout: float) -> dict:
  cmd = [sys.executable, os.path.abspath(__file__), '--child', construction,
         str(depth)]
  try:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                         check=True)
  except subprocess.TimeoutExpired:
    return dict(error=f'timed out after {timeout:.0f} s')
  except subprocess.CalledProcessError as e:
    return dict(error=e.stderr.strip().splitlines()[-1][:300])
  return json.loads(out.stdout.strip().splitlines()[-1])


def main(constructions: list[str]) -> None:
  for construction in constructions:
    base = None
    for depth in DEPTHS[construction]:
      timeout = 4 * STOP_AFTER_SECONDS if construction == 'serial_unfolded' \
          else 600
      result = _run_subprocess(construction, depth, timeout)
      line = dict(construction=construction, depth=depth, **result)
      if 'error' not in result:
        base = base or result
        line['kernel_ratio_to_depth_10'] = round(
            result['kernel_compile_s'] / base['kernel_compile_s'], 2)
        line['apply_ratio_to_depth_10'] = round(
            result['apply_compile_s'] / base['apply_compile_s'], 2)
        line['memory_growth_ratio_to_depth_10'] = round(
            max(result['compile_rss_growth_mb'], 1.) /
            max(base['compile_rss_growth_mb'], 1.), 2)
      print(json.dumps(line), flush=True)
      if 'error' in result or (construction == 'serial_unfolded' and
                               result['kernel_compile_s'] > STOP_AFTER_SECONDS):
        break


if __name__ == '__main__':
  if len(sys.argv) > 1 and sys.argv[1] == '--child':
    print(json.dumps(measure(sys.argv[2], int(sys.argv[3]))))
  else:
    main(sys.argv[1:] or list(DEPTHS))
