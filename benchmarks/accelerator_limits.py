"""The library's speed next to the chip's own limits, in one process.

Prints one JSON line per measurement, each with the bare reference it is
compared with, measured in the same run:

* `matmul`: a bare `n x n` product, float32 at 'highest' and 'default'
  precision and bfloat16: the chip's matmul throughput (TFLOP/s).
* `bandwidth`: a bare `k @ v` with a float32 `n x n` kernel and 10 targets,
  the memory-bandwidth bound of a conjugate-gradient iteration (GB/s).
* `cg`: `nt.predict.gp_inference(..., solver='cg')` on the device kernel:
  seconds per iteration over the bare `k @ v`.
* `cholesky`: `gp_inference`'s default Cholesky solve, seconds over the
  time of its `n^3 / 3` flops at the measured float32 throughput.
* `kernel`: the analytic kernels of `../shared/bench/kernel_bench.py`
  (`--kernel_bench PATH`), XLA's flop count of the jitted program over its
  median time, as a fraction of the float32 matmul throughput.

  python benchmarks/accelerator_limits.py --n 20000 \
      --kernel_bench ../shared/bench/kernel_bench.py
"""
import argparse
import importlib.util
import json
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

import neural_tangents as nt


def _median_seconds(fn: Callable[[], Any], repeats: int = 5) -> float:
  jax.block_until_ready(fn())  # Compiled and warm.
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def _emit(**fields: Any) -> None:
  fields['backend'] = jax.default_backend()
  print(json.dumps(fields), flush=True)


def matmul_throughput(n: int) -> dict[str, float]:
  """TFLOP/s of a bare `n x n` product per precision and dtype."""
  rng = np.random.RandomState(0)
  a = jnp.asarray(rng.randn(n, n), jnp.float32)
  b = jnp.asarray(rng.randn(n, n), jnp.float32)
  out = {}
  for name, dtype, precision in (('float32_highest', jnp.float32, 'highest'),
                                 ('float32_default', jnp.float32, 'default'),
                                 ('bfloat16', jnp.bfloat16, 'default')):
    x, y = a.astype(dtype), b.astype(dtype)
    product = jax.jit(lambda x, y, p=precision: jnp.matmul(x, y, precision=p))
    seconds = _median_seconds(lambda: product(x, y))
    out[name] = 2 * n**3 / seconds / 1e12
    _emit(measure='matmul', n=n, kind=name, seconds=seconds,
          tflops=out[name])
  return out


def _dot_product_kernel(n: int, d: int = 32) -> tuple[jax.Array, jax.Array]:
  rng = np.random.RandomState(0)
  x = rng.randn(n, d).astype(np.float32)
  x /= np.linalg.norm(x, axis=1, keepdims=True)
  k = jnp.asarray(x) @ jnp.asarray(x).T
  return 1. + 2 * k + 1.5 * k**2, jnp.asarray(rng.randn(n, 10), jnp.float32)


def solves(n: int, tflops: float) -> None:
  """CG per iteration and Cholesky against the bare bounds."""
  k, y = _dot_product_kernel(n)
  matvec = jax.jit(lambda k, v: k @ v)
  bare = _median_seconds(lambda: matvec(k, y))
  _emit(measure='bandwidth', n=n, seconds=bare,
        gb_per_s=4 * n * n / bare / 1e9)
  for solver in ('cg', 'cholesky'):
    start = time.perf_counter()
    predict_fn = nt.predict.gp_inference(k, y, diag_reg=1e-3, solver=solver)
    jax.block_until_ready(predict_fn('nngp', k[:100]))
    seconds = time.perf_counter() - start
    info = predict_fn.solve_info['nngp']
    if solver == 'cg':
      per_iteration = seconds / max(info.iterations, 1)
      _emit(measure='cg', n=n, seconds=seconds, iterations=info.iterations,
            seconds_per_iteration=per_iteration, bare_matvec=bare,
            over_bare=per_iteration / bare)
    else:
      bound = n**3 / 3 / (tflops * 1e12)
      _emit(measure='cholesky', n=n, seconds=seconds, flop_bound=bound,
            over_bound=seconds / bound)


def kernels(path: str, tflops: float) -> None:
  """FLOP/s of `kernel_bench.py`'s jitted kernels against the throughput."""
  spec = importlib.util.spec_from_file_location('kernel_bench', path)
  bench = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(bench)
  for name in bench.WORKLOADS:
    (_, _, kernel_fn), x1, x2 = getattr(bench, name)()
    fn = jax.jit(lambda a, b, f=kernel_fn: f(a, b, ('nngp', 'ntk')))
    start = time.perf_counter()
    compiled = fn.lower(x1, x2).compile()
    compile_seconds = time.perf_counter() - start
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    flops = float(cost.get('flops', 0.))
    seconds = _median_seconds(lambda: compiled(x1, x2))
    _emit(measure='kernel', workload=name, seconds=seconds,
          compile_seconds=compile_seconds, flops=flops,
          tflops=flops / seconds / 1e12,
          fraction_of_matmul=flops / seconds / 1e12 / tflops)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--n', type=int, default=4000,
                      help='training points of the solves')
  parser.add_argument('--matmul_n', type=int, default=4096)
  parser.add_argument('--kernel_bench', default='',
                      help='path of ../shared/bench/kernel_bench.py')
  args = parser.parse_args()
  throughput = matmul_throughput(args.matmul_n)['float32_highest']
  solves(args.n, throughput)
  if args.kernel_bench:
    kernels(args.kernel_bench, throughput)


if __name__ == '__main__':
  main()
