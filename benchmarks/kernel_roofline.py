"""Roofline of the analytic kernel workloads of `kernel_bench.py`.

  python benchmarks/kernel_roofline.py [workload ...]

For each workload of `/work/shared/bench/kernel_bench.py` (imported from
`$KERNEL_BENCH_DIR`, `../shared/bench` or
`/work/shared/bench`) prints one JSON line: the median
seconds of a jitted `kernel_fn(x, None, ('nngp', 'ntk'))` call, the minimal
floating-point operations and bytes the kernel recursion needs (counted
below), the roofline bound `max(flops / peak_flops, bytes / peak_bandwidth)`
and `seconds / bound`. Peaks are measured in the same process first: matmul
FLOP/s from a `4096 x 4096` float32 `jnp.dot`, bandwidth from a 256 MiB
float32 array copy (`x + 1`: one read and one write per entry). The last
line holds the peaks.

Counting (float32, 4 bytes an entry; `N = 1` pair counts per example pair).
A covariance array of a layer has `E = N1 N2 P` entries for `nngp` and
`ntk`, `P` the spatial entries of one pair (`S` when only spatial diagonals
are needed, as before `Flatten`; `S^2` when pooling or attention needs the
full covariance), and `N P` for the batch-diagonal `cov1`. Per layer:

* input covariance `x x^T`: `2 C` flops per `nngp` and `cov1` entry;
* `Dense` / bias: 2 flops per entry of each of `nngp`, `cov1`, and 2 more
  per `ntk` entry (`ntk' = nngp' + W^2 ntk`);
* `Conv` with `f` taps: `f + 1` per `nngp`/`cov1` entry (window sum,
  scale; the zero bias adds nothing), `f + 2` per `ntk` entry (the
  first conv maps a zero NTK: 1);
* `AvgPool` / `GlobalAvgPool`: one add per input entry of each array;
* nonlinearities (`T` transcendental or divide counted as 1 flop), per
  `nngp`/`cov1` entry, plus 1 per `ntk` entry (`dot * ntk`): ReLU 14
  (`rho`, `sin`, `atan2`, the arc-cosine formula, the derivative), Erf 12,
  GeLU 22;
* attention (softmax over `L` keys, full `L^2` covariance per pair):
  the nngp of the softmax mixes, `2 L^2` flops per output entry, twice (`nngp`
  and `ntk`);
* `FanInSum` of a residual block: 1 per entry of each array.

Bytes are the traffic no schedule can avoid: the inputs are read once, the
outputs written once, and every covariance that feeds a layer reading
neighbouring entries (a window sum, a pooling, attention) is written once by
its producer and read once by that layer (fusing the window into its producer
would recompute the producer once per tap). Elementwise layers and `Dense`
fuse into their neighbours and add no traffic; so a network of only those
(`fcn`, `resnet_deep`) moves only its inputs and outputs, and its bound is its
arithmetic at matmul peak, which transcendental-heavy elementwise code cannot
reach on a CPU (it runs on the vector units without FMA-dense matmul
kernels). The ratio is therefore a ceiling on the possible speed-up, not a
promise of it.
"""
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH_DIRS = [os.environ.get('KERNEL_BENCH_DIR', ''),
              os.path.join(_ROOT, '..', 'shared', 'bench'),
              os.path.join(_ROOT, 'shared', 'bench'), '/work/shared/bench']
F32 = 4


def _median_seconds(fn, *args, repeats: int = 5) -> float:
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def peak_flops(n: int = 4096) -> float:
  """Matmul FLOP/s of a float32 `n x n` `jnp.dot`."""
  a = jnp.ones((n, n), jnp.float32)
  seconds = _median_seconds(jax.jit(jnp.dot), a, a)
  return 2 * n**3 / seconds


def peak_bandwidth(mib: int = 256) -> float:
  """Bytes/s of a float32 array copy (one read and one write per entry)."""
  x = jnp.ones((mib * 2**20 // F32,), jnp.float32)
  seconds = _median_seconds(jax.jit(lambda a: a + 1), x)
  return 2 * x.size * F32 / seconds


def _counts(layers, n: int, p_out: int) -> tuple[float, float]:
  """Sums `(flops, bytes)` of `layers`: `(flops_per_entry, entries, bytes)`."""
  flops = sum(f * e for f, e, _ in layers)
  traffic = sum(b for _, _, b in layers)
  return flops, traffic + 2 * n * n * p_out * F32  # outputs nngp, ntk


def workload_counts(name: str) -> tuple[float, float]:
  """Minimal `(flops, bytes)` of a workload, as the module docstring counts."""
  if name == 'fcn':
    n, c = 2048, 256
    e, d = n * n, n
    layers = [(2 * c, e + d, n * c * F32)]            # x x^T
    layers += [(2, 2 * e + d, 0)] * 4                 # 4 Dense
    layers += [(14, e + d, 0), (1, e, 0),             # Relu
               (12, e + d, 0), (1, e, 0),             # Erf
               (22, e + d, 0), (1, e, 0)]             # Gelu
    return _counts(layers, n, 1)
  if name == 'cnn_flatten':
    n, s, c, f = 256, 16 * 16, 3, 9
    e, d = n * n * s, n * s
    materialize = 2 * 2 * e * F32                     # write + read nngp, ntk
    layers = [(2 * c, e + d, n * s * c * F32 + 2 * (e + d) * F32)]
    layers += [(f + 1, e + d, 0), (1, e, 0)]          # Conv 1 (zero NTK)
    layers += [(14, e + d, 0), (1, e, materialize)]   # Relu -> Conv 2
    layers += [(f + 1, e + d, 0), (f + 2, e, 0)]      # Conv 2
    layers += [(14, e + d, 0), (1, e, 0)]             # Relu
    layers += [(1, 2 * e, 0), (2, 2 * n * n, 0)]      # Flatten, Dense
    return _counts(layers, n, 1)
  if name in ('cnn_gap', 'myrtle5'):
    n, side, c = (16, 12, 3) if name == 'cnn_gap' else (8, 16, 3)
    f = 9
    layers = []
    s = side * side
    e, d = n * n * s * s, n * s * s
    layers.append((2 * c, e + d, n * s * c * F32 + (e + d) * F32))
    convs = 2 if name == 'cnn_gap' else 4
    first = True
    for i in range(convs):
      e, d = n * n * s * s, n * s * s
      if not first:                                   # written + read again
        layers.append((0, 0, 2 * (2 * e + d) * F32))
      layers += [(f + 1, e + d, 0), (1 if first else f + 2, e, 0)]
      layers += [(14, e + d, 0), (1, e, 0)]           # Relu
      first = False
      if name == 'myrtle5' and i >= 1:                # AvgPool 2x2
        layers += [(1, 2 * e + d, 2 * (2 * e + d) * F32)]
        side //= 2
        s = side * side
    e, d = n * n * s * s, n * s * s
    layers += [(1, 2 * e, 2 * 2 * e * F32)]           # GlobalAvgPool
    layers += [(2, 2 * n * n, 0)]                     # Dense
    return _counts(layers, n, 1)
  if name == 'attention':
    n, length, c = 16, 12, 8
    e, d = n * n * length**2, n * length**2
    layers = [(2 * c, e + d, n * length * c * F32 + (e + d) * F32)]
    layers += [(2, 2 * e + d, 0)]                      # Dense
    layers += [(2 * length**2, 2 * e + d, 2 * (e + d) * F32)]  # attention
    layers += [(14, e + d, 0), (1, e, 0)]              # Relu
    layers += [(1, 2 * e, 2 * 2 * e * F32), (2, 2 * n * n, 0)]  # GAP, Dense
    return _counts(layers, n, 1)
  if name == 'resnet_deep':
    n, c = 1024, 64
    e, d = n * n, n
    layers = [(2 * c, e + d, n * c * F32), (2, 2 * e + d, 0)]
    block = [(14, e + d, 0), (1, e, 0), (2, 2 * e + d, 0), (1, 2 * e + d, 0)]
    layers += block * 50 + [(2, 2 * e + d, 0)]
    return _counts(layers, n, 1)
  raise ValueError(f'Unknown workload {name!r}.')


def main(names) -> None:
  sys.path[:0] = [d for d in BENCH_DIRS if d]
  import kernel_bench  # pylint: disable=g-import-not-at-top
  flops_peak, bandwidth_peak = peak_flops(), peak_bandwidth()
  for name in names or kernel_bench.WORKLOADS:
    (_, _, kernel_fn), x1, x2 = kernel_bench.WORKLOADS[name]()
    fn = jax.jit(lambda a, kernel_fn=kernel_fn, x2=x2: kernel_fn(
        a, x2, ('nngp', 'ntk')))
    seconds = _median_seconds(fn, x1)
    flops, traffic = workload_counts(name)
    bound = max(flops / flops_peak, traffic / bandwidth_peak)
    print(json.dumps(dict(
        workload=name, seconds=round(seconds, 5), gflop=round(flops / 1e9, 4),
        mbytes=round(traffic / 1e6, 2), bound_s=round(bound, 5),
        bound_by='flops' if flops / flops_peak > traffic / bandwidth_peak
        else 'bytes', ratio=round(seconds / bound, 2))), flush=True)
  print(json.dumps(dict(peak_gflops=round(flops_peak / 1e9, 1),
                        peak_gbytes_per_s=round(bandwidth_peak / 1e9, 1))))


if __name__ == '__main__':
  main(sys.argv[1:])
