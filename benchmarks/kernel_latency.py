"""Latency of one `../shared/bench/kernel_bench.py` workload over many calls.

`kernel_bench.py` reports a median of 5 calls, which cannot resolve a ~1 ms
workload such as `attention`. This script times the same jitted workload
(`kernel_fn(x, None, ('nngp', 'ntk'))`) over 400 calls and prints one JSON
line: median and minimum wall seconds, and CPU seconds per call. Run it from
two trees alternately to compare them:

  PYTHONPATH=$PWD python benchmarks/kernel_latency.py [workload]
"""
import importlib.util
import json
import os
import sys
import time

import jax
import numpy as np

_BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..',
                      'shared', 'bench', 'kernel_bench.py')
_CALLS = 400


def _workloads():
  spec = importlib.util.spec_from_file_location('kernel_bench', _BENCH)
  module = importlib.util.module_from_spec(spec)
  argv, sys.argv = sys.argv, sys.argv[:1]
  try:
    spec.loader.exec_module(module)
  finally:
    sys.argv = argv
  return module


def main(workload: str) -> None:
  net, x, _ = getattr(_workloads(), workload)()
  kernel = jax.jit(lambda x: net[2](x, None, ('nngp', 'ntk')))
  jax.block_until_ready(kernel(x))
  walls = []
  for _ in range(_CALLS):
    start = time.perf_counter()
    jax.block_until_ready(kernel(x))
    walls.append(time.perf_counter() - start)
  cpu = time.process_time()
  for _ in range(_CALLS):
    jax.block_until_ready(kernel(x))
  cpu = (time.process_time() - cpu) / _CALLS
  print(json.dumps(dict(workload=workload, calls=_CALLS,
                        median_s=round(float(np.median(walls)), 7),
                        min_s=round(float(np.min(walls)), 7),
                        cpu_s_per_call=round(cpu, 7))))


if __name__ == '__main__':
  main(sys.argv[1] if len(sys.argv) > 1 else 'attention')
