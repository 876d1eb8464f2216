"""Time and peak memory of analytic NTKs: a Myrtle-5 CNN and a 3-layer FCN.

Usage (from the project root, with the package installed):

  python benchmarks/kernel_speed.py [--quick]

Workloads (float32; the analytic kernel does not depend on channel counts):

* `myrtle5`: the NTK of a Myrtle-5 style CNN (Shankar et al. 2020) on
  32x32x3 images: `[Conv(3x3, SAME), Relu] x 2, AvgPool(2x2),
  Conv(3x3, SAME), Relu, AvgPool(2x2), Conv(3x3, SAME), Relu,
  GlobalAvgPool, Dense`. Pooling needs full spatial covariances, so every
  pair of images carries `32^4` entries per covariance at the first layers.
  Measured on 8 x 8 and 32 x 32 input pairs, with `nt.batch(kernel_fn,
  batch_size=8)` (one 8 x 8 block, and 16 of them); and, for reference,
  32 x 32 pairs computed directly when they fit in memory (otherwise the line
  says so, with the memory it would need, extrapolated from the 8 x 8 peak).
* `fcn3`: the NTK of `Dense, Relu, Dense, Relu, Dense` on 1024 x 1024 pairs
  of 3072-dimensional inputs (flattened 32x32x3 images).

Time is the median of `repeats` calls after a first (compiling) call.
Memory is the growth of the peak resident set size of the process (Linux
`VmHWM`, reset after the inputs are built, so it covers the compiling call
and the timed ones; XLA's CPU buffers live there), or, on GPU/TPU, the
device's `peak_bytes_in_use`. Each
measurement runs in a fresh subprocess. Each line is JSON; the last one holds
ratios measured in this run.
"""
import json
import subprocess
import sys
import time

import process_memory  # benchmarks/process_memory.py

BATCH_SIZE = 8
IMAGE_SHAPE = (32, 32, 3)
FCN_N, FCN_FEATURES = 1024, 3072


def _myrtle5():
  from neural_tangents import stax  # pylint: disable=g-import-not-at-top
  conv_relu = lambda: [stax.Conv(1, (3, 3), padding='SAME', W_std=2**0.5),
                       stax.Relu()]
  pool = lambda: stax.AvgPool((2, 2), (2, 2))
  return stax.serial(*conv_relu(), *conv_relu(), pool(), *conv_relu(), pool(),
                     *conv_relu(), stax.GlobalAvgPool(), stax.Dense(1))


def _fcn3():
  from neural_tangents import stax  # pylint: disable=g-import-not-at-top
  return stax.serial(stax.Dense(1, W_std=1.5, b_std=0.1), stax.Relu(),
                     stax.Dense(1, W_std=1.5, b_std=0.1), stax.Relu(),
                     stax.Dense(1, W_std=1.5, b_std=0.1))


def measure(case: str, n: int, repeats: int) -> dict:
  """Runs in the subprocess: one kernel computation, timed and measured."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import neural_tangents as nt  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(0)
  if case == 'fcn3':
    shape, kernel_fn = (FCN_FEATURES,), _fcn3()[2]
    fn = jax.jit(kernel_fn, static_argnames='get')
  else:
    shape, kernel_fn = IMAGE_SHAPE, _myrtle5()[2]
    if case == 'myrtle5_direct':
      fn = jax.jit(kernel_fn, static_argnames='get')
    else:
      fn = nt.batch(kernel_fn, batch_size=BATCH_SIZE)
  x1 = rng.standard_normal((n,) + shape, dtype=np.float32)
  x2 = rng.standard_normal((n,) + shape, dtype=np.float32)

  device = jax.devices()[0]
  # Freed buffers stay in the process (allocator caches), so the peak is
  # measured from before the first call, which allocates them.
  rss_before = process_memory.status_mib('VmRSS')
  peak_reset = process_memory.reset_peak()
  start = time.perf_counter()
  jax.block_until_ready(fn(x1, x2, get='ntk'))
  first_seconds = time.perf_counter() - start

  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    ntk = jax.block_until_ready(fn(x1, x2, get='ntk'))
    times.append(time.perf_counter() - start)
  stats = device.memory_stats() if device.platform != 'cpu' else None
  if stats:
    memory_method = 'device memory_stats peak_bytes_in_use'
    peak_mib = stats.get('peak_bytes_in_use', float('nan')) / 2**20
  else:
    memory_method = ('process peak RSS (VmHWM) minus RSS before the first '
                     'call' + ('' if peak_reset else
                               ' (peak not resettable: since start)'))
    peak_mib = (process_memory.status_mib('VmHWM') -
                (rss_before if peak_reset else 0.))
  ntk = np.asarray(ntk)
  return dict(
      benchmark='kernel_speed', case=case, pairs=f'{n}x{n}',
      input_shape=list(shape), backend=device.platform,
      batch_size=None if case in ('fcn3', 'myrtle5_direct') else BATCH_SIZE,
      median_seconds=round(float(np.median(times)), 4), repeats=repeats,
      first_call_seconds=round(first_seconds, 3),
      peak_memory_mib=round(peak_mib, 1), memory_method=memory_method,
      output_shape=list(ntk.shape), finite=bool(np.isfinite(ntk).all()))


def _run(case: str, n: int, repeats: int) -> dict:
  proc = subprocess.run(
      [sys.executable, __file__, '--worker', case, str(n), str(repeats)],
      capture_output=True, text=True, check=False)
  if proc.returncode != 0:
    # An out-of-memory kill ends the worker without a Python exception.
    reason = (proc.stderr.strip().splitlines() or ['no output'])[-1]
    return dict(benchmark='kernel_speed', case=case, pairs=f'{n}x{n}',
                error=f'worker exited with code {proc.returncode}: '
                f'{reason[:300]}')
  return json.loads(proc.stdout.strip().splitlines()[-1])


def main(quick: bool) -> None:
  results = {}

  def report(name, result):
    results[name] = result
    print(json.dumps(result), flush=True)

  report('fcn3', _run('fcn3', FCN_N, 5))
  report('myrtle5_8', _run('myrtle5', 8, 3))
  n_large = 16 if quick else 32
  report('myrtle5_large', _run('myrtle5', n_large, 1))

  # Unbatched, every pair's full covariances are alive at once: the peak of
  # one 8 x 8 block, times the number of blocks.
  covariance_mib = n_large**2 * 32**4 * 4 / 2**20
  needed_mib = results['myrtle5_8'].get('peak_memory_mib', float('inf')) * (
      n_large / 8)**2
  available_mib = process_memory.available_mib()
  if not needed_mib < 0.8 * available_mib:
    report('myrtle5_direct', dict(
        benchmark='kernel_speed', case='myrtle5_direct',
        pairs=f'{n_large}x{n_large}', fits_in_memory=False,
        note=(f'not run: computed directly it needs about '
              f'{needed_mib / 1024:.0f} GiB (the 8x8 peak times '
              f'{(n_large / 8)**2:.0f}; one {n_large}^2 x 32^4 float32 '
              f'covariance alone is {covariance_mib / 1024:.0f} GiB), '
              f'{available_mib / 1024:.0f} GiB available; the nt.batch lines '
              'above compute it in 8x8 blocks')))
  else:
    report('myrtle5_direct', _run('myrtle5_direct', n_large, 1))

  small, large = results['myrtle5_8'], results['myrtle5_large']
  if 'median_seconds' in small and 'median_seconds' in large:
    print(json.dumps(dict(
        benchmark='kernel_speed', summary=True,
        myrtle5_large_over_8x8_seconds=round(
            large['median_seconds'] / small['median_seconds'], 2),
        myrtle5_pairs_ratio=(n_large / 8)**2,
        myrtle5_seconds_per_pair=round(
            large['median_seconds'] / n_large**2, 4),
        fcn3_seconds_per_1k_pairs=round(
            results['fcn3'].get('median_seconds', float('nan')) /
            (FCN_N**2 / 1000), 6),
    )), flush=True)


if __name__ == '__main__':
  if len(sys.argv) > 1 and sys.argv[1] == '--worker':
    print(json.dumps(measure(sys.argv[2], int(sys.argv[3]),
                             int(sys.argv[4]))))
  else:
    main(quick='--quick' in sys.argv)
