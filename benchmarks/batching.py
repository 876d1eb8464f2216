"""Time and peak memory of `nt.batch` on a large analytic kernel.

Usage (from the project root, with the package installed):

  python benchmarks/batching.py

Workload: the analytic NTK of a 3-layer fully connected network
(`Dense(512) -> Relu -> Dense(512) -> Relu -> Dense(1)`) between two sets of
4096 inputs with 32 features, computed by `nt.batch(kernel_fn,
batch_size=256)` (16 x 16 blocks). Each configuration runs in a fresh
subprocess, so that its peak memory is its own:

* `store_on_device` True and False, one device;
* 4 simulated CPU devices (`XLA_FLAGS=--xla_force_host_platform_device_count=4`)
  with `device_count=4`, and in the same process `device_count=1`.

Each configuration is first run on 512 x 512 inputs (same block shapes, so
everything is compiled), then the peak resident set size (Linux `VmHWM`) is
reset and the 4096 x 4096 kernel computed. Memory is measured from the
process's resident set (XLA's CPU buffers live there, unlike Python
allocations that `tracemalloc` sees): `peak_growth_mib` is the peak minus the
resident size before the call, compared to `kernel_mib`, the size of the
final kernel.

Each line is JSON: one per configuration, then one with the ratios measured in
this run (speedup of 4 simulated devices over 1; peak growth over kernel size
for host storage).
"""
import json
import os
import subprocess
import sys
import time

import process_memory  # benchmarks/process_memory.py

N = 4096
FEATURES = 32
BATCH_SIZE = 256
WARMUP_N = 512


def measure(store_on_device: bool, device_count: int) -> dict:
  """Runs in the subprocess: one batched kernel, timed and measured."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import neural_tangents as nt  # pylint: disable=g-import-not-at-top
  from neural_tangents import stax  # pylint: disable=g-import-not-at-top

  _, _, kernel_fn = stax.serial(
      stax.Dense(512, W_std=1.5, b_std=0.1), stax.Relu(),
      stax.Dense(512, W_std=1.5, b_std=0.1), stax.Relu(),
      stax.Dense(1, W_std=1.5, b_std=0.1))
  batched = nt.batch(kernel_fn, batch_size=BATCH_SIZE,
                     device_count=device_count,
                     store_on_device=store_on_device)
  rng = np.random.default_rng(0)
  x1 = rng.standard_normal((N, FEATURES), dtype=np.float32)
  x2 = rng.standard_normal((N, FEATURES), dtype=np.float32)

  start = time.perf_counter()
  jax.block_until_ready(batched(x1[:WARMUP_N], x2[:WARMUP_N], 'ntk'))
  warmup_seconds = time.perf_counter() - start

  rss_before = process_memory.status_mib('VmRSS')
  peak_reset = process_memory.reset_peak()
  start = time.perf_counter()
  ntk = jax.block_until_ready(batched(x1, x2, 'ntk'))
  seconds = time.perf_counter() - start
  peak = process_memory.status_mib('VmHWM')
  if not peak_reset:  # Peak over the whole process: an upper bound.
    rss_before = min(rss_before, peak)
  return dict(
      benchmark='batching', kernel='ntk', n=N, batch_size=BATCH_SIZE,
      store_on_device=store_on_device, device_count=device_count,
      devices_present=jax.local_device_count(),
      output_type=type(ntk).__name__, output_shape=list(ntk.shape),
      finite=bool(np.isfinite(np.asarray(ntk)).all()),
      seconds=round(seconds, 3), warmup_seconds=round(warmup_seconds, 3),
      kernel_mib=round(ntk.size * ntk.dtype.itemsize / 2**20, 1),
      rss_before_mib=round(rss_before, 1),
      peak_growth_mib=round(peak - rss_before, 1), peak_reset=peak_reset)


def _run(store_on_device: bool, device_count: int, simulated_devices: int
         ) -> dict:
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  if simulated_devices > 1:
    env['XLA_FLAGS'] = (env.get('XLA_FLAGS', '') +
                        f' --xla_force_host_platform_device_count='
                        f'{simulated_devices}')
  out = subprocess.run(
      [sys.executable, __file__, '--worker', str(int(store_on_device)),
       str(device_count)],
      env=env, capture_output=True, text=True, check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
  results = {}
  for name, (store, count, simulated) in {
      'device': (True, 1, 1),
      'host': (False, 1, 1),
      'four_devices_1': (True, 1, 4),
      'four_devices_4': (True, 4, 4),
  }.items():
    results[name] = _run(store, count, simulated)
    print(json.dumps(dict(results[name], config=name)), flush=True)
  host = results['host']
  print(json.dumps(dict(
      benchmark='batching', summary=True,
      speedup_4_devices_over_1_device_process=round(
          results['device']['seconds'] /
          results['four_devices_4']['seconds'], 2),
      speedup_4_devices_over_1_same_process=round(
          results['four_devices_1']['seconds'] /
          results['four_devices_4']['seconds'], 2),
      host_peak_growth_over_kernel=round(
          host['peak_growth_mib'] / host['kernel_mib'], 2),
      device_peak_growth_over_kernel=round(
          results['device']['peak_growth_mib'] /
          results['device']['kernel_mib'], 2),
      host_under_3x_kernel=host['peak_growth_mib'] < 3 * host['kernel_mib'],
  )), flush=True)


if __name__ == '__main__':
  if len(sys.argv) > 1 and sys.argv[1] == '--worker':
    print(json.dumps(measure(bool(int(sys.argv[2])), int(sys.argv[3]))))
  else:
    main()
