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

Processes (`python benchmarks/batching.py --processes`): the analytic NTK of
the same network on 20,000 x 20,000 inputs (`x2=None`, float32, a 1.5 GiB
kernel), `batch_size=2500` (8 x 8 blocks, 36 computed), with
`store_on_device=False` into an on-disk store (`store=`, zarr, in a temporary
directory), by 1 process and by 2 processes (JAX's distributed runtime on
127.0.0.1, gloo CPU collectives), each with 2 simulated CPU devices. One line
per process: blocks it computed, seconds of the call, peak resident memory
growth during the call, compared with the kernel and one block; then a
summary line (blocks per process, the 2-process speedup, the largest peak
growth over one block).
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


PROCESSES_N = 20_000
PROCESSES_BATCH_SIZE = 2_500


def measure_process(port: int, n_processes: int, process_id: int,
                    store: str) -> dict:
  """Runs in each worker process: its share of one stored kernel."""
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  if n_processes > 1:
    jax.distributed.initialize(coordinator_address=f'127.0.0.1:{port}',
                               num_processes=n_processes,
                               process_id=process_id)
  import numpy as np  # pylint: disable=g-import-not-at-top
  import neural_tangents as nt  # pylint: disable=g-import-not-at-top
  from neural_tangents import stax  # pylint: disable=g-import-not-at-top

  _, _, kernel_fn = stax.serial(
      stax.Dense(512, W_std=1.5, b_std=0.1), stax.Relu(),
      stax.Dense(512, W_std=1.5, b_std=0.1), stax.Relu(),
      stax.Dense(1, W_std=1.5, b_std=0.1))
  x = np.random.default_rng(0).standard_normal((PROCESSES_N, FEATURES),
                                               dtype=np.float32)
  # Compile the block shapes first (a small kernel of the same blocks).
  nt.batch(kernel_fn, PROCESSES_BATCH_SIZE, store_on_device=False)(
      x[:2 * PROCESSES_BATCH_SIZE], None, 'ntk')
  batched = nt.batch(kernel_fn, PROCESSES_BATCH_SIZE, store_on_device=False,
                     store=store)
  rss_before = process_memory.status_mib('VmRSS')
  peak_reset = process_memory.reset_peak()
  start = time.perf_counter()
  ntk = batched(x, None, 'ntk')
  seconds = time.perf_counter() - start
  peak = process_memory.status_mib('VmHWM')
  if not peak_reset:
    rss_before = min(rss_before, peak)
  corner = np.asarray(ntk[:3, -3:])
  reference = np.asarray(kernel_fn(x[:3], x[-3:], 'ntk'))
  counts = batched.block_counts
  block_mib = PROCESSES_BATCH_SIZE**2 * 4 / 2**20
  return dict(
      benchmark='batching_processes', kernel='ntk', n=PROCESSES_N,
      batch_size=PROCESSES_BATCH_SIZE, store_on_device=False, store='zarr',
      processes=n_processes, process=process_id,
      local_devices=jax.local_device_count(), devices=jax.device_count(),
      blocks_computed=counts['computed'], blocks_total=counts['total'],
      output_type=type(ntk).__module__.split('.')[0] + '.' +
      type(ntk).__name__,
      corner_max_relative_error=float(np.max(np.abs(corner - reference) /
                                             np.abs(reference))),
      seconds=round(seconds, 2),
      kernel_mib=round(PROCESSES_N**2 * 4 / 2**20, 1),
      block_mib=round(block_mib, 1), rss_before_mib=round(rss_before, 1),
      peak_growth_mib=round(peak - rss_before, 1), peak_reset=peak_reset)


def _run_processes(n_processes: int) -> list[dict]:
  import socket  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  env['XLA_FLAGS'] = (env.get('XLA_FLAGS', '') +
                      ' --xla_force_host_platform_device_count=2')
  with tempfile.TemporaryDirectory() as directory:
    store = os.path.join(directory, 'kernel')
    workers = [subprocess.Popen(
        [sys.executable, __file__, '--process_worker', str(port),
         str(n_processes), str(i), store],
        env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
               for i in range(n_processes)]
    try:
      outs = [w.communicate(timeout=3000)[0] for w in workers]
    finally:
      for w in workers:
        if w.poll() is None:
          os.killpg(w.pid, 9)
  return [json.loads(o.strip().splitlines()[-1]) for o in outs]


def main_processes() -> None:
  results = {}
  for n_processes in (1, 2):
    results[n_processes] = _run_processes(n_processes)
    for line in results[n_processes]:
      print(json.dumps(line), flush=True)
  one, two = results[1][0], results[2]
  print(json.dumps(dict(
      benchmark='batching_processes', summary=True,
      blocks_per_process_1=[one['blocks_computed']],
      blocks_per_process_2=[r['blocks_computed'] for r in two],
      speedup_2_processes=round(one['seconds'] /
                                max(r['seconds'] for r in two), 2),
      max_peak_growth_over_block=round(
          max(r['peak_growth_mib'] for r in two + [one]) / one['block_mib'],
          2),
      max_peak_growth_over_kernel=round(
          max(r['peak_growth_mib'] for r in two + [one]) /
          one['kernel_mib'], 3),
  )), flush=True)


if __name__ == '__main__':
  if len(sys.argv) > 1 and sys.argv[1] == '--process_worker':
    print(json.dumps(measure_process(int(sys.argv[2]), int(sys.argv[3]),
                                     int(sys.argv[4]), sys.argv[5])))
  elif len(sys.argv) > 1 and sys.argv[1] == '--processes':
    main_processes()
  elif len(sys.argv) > 1 and sys.argv[1] == '--worker':
    print(json.dumps(measure(bool(int(sys.argv[2])), int(sys.argv[3]))))
  else:
    main()
