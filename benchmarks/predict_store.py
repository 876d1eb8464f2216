"""Conjugate gradients in memory and straight from a kernel store (issue 31).

An infinitely wide 2-hidden-layer ReLU FCN (NNGP), `--n` training points and
`--n_test` test points of `--dim` features (synthetic, labelled by a random
linear teacher into 10 classes, as `benchmarks/cifar_scale.py`):

1. `kernel`: the train-train kernel into an on-disk store,
   `nt.batch(kernel_fn, batch_size, store_on_device=False, store=...)`
   (and the test-train kernel into a second store);
2. `bare_matmul`: a bare float32 `k @ v` of the kernel (loaded into memory)
   with the 10 targets, numpy, median of 3: the memory-bandwidth bound of
   one CG iteration;
3. `cg_memory`: `nt.predict.gp_inference(k, y, solver='cg')` on the kernel in
   memory and its first prediction (from the test-train kernel in memory):
   seconds per iteration (the whole solve, preconditioner and exact residual
   checks included, divided by the iterations) against `bare_matmul`;
4. `read_bandwidth`: the store's chunk files read once from disk (evicted
   from the page cache first with `posix_fadvise(DONTNEED)`), GB/s;
5. `cg_store`: the same solve and prediction from the two stores
   (`StoredKernel`s, read by row blocks, evicted from the page cache
   first), seconds per iteration against `cg_memory`'s;
6. `cg_store_cached`: the same with `StoredKernel(..., cache_bytes=...)`
   holding the train kernel's row blocks in memory once read (`--cache_gb`,
   default: the kernel's size): one pass over the disk, then memory speed.

Stages 2-3, 5 and 6 each run in a fresh process (their own peak memory; the
first holds both kernels in memory). Prints one JSON line per stage.
`--mode=store` runs only stage 5 (stage 6 with `--cache_gb`), computing the
stores first if absent: the end-to-end run for kernels larger than memory
(`--n=100000`: 37 GiB).

Usage (from the project root):

  PYTHONPATH=$PWD python benchmarks/predict_store.py [--n 50000] \\
      [--directory /tmp/predict_store]
  PYTHONPATH=$PWD python benchmarks/predict_store.py --mode=store \\
      --n=100000 --directory=/tmp/predict_store_100k
  PYTHONPATH=$PWD python benchmarks/predict_store.py --small   # seconds
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import numpy as np


def _peak_gb() -> float:
  """This process's peak resident memory (`VmHWM`: unlike `ru_maxrss`, not
  inherited from the parent of a subprocess)."""
  with open('/proc/self/status') as f:
    for line in f:
      if line.startswith('VmHWM:'):
        return int(line.split()[1]) / 2**20
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _report(stage: str, **values) -> None:
  print(json.dumps({'bench': 'predict_store', 'stage': stage, **values}),
        flush=True)


def synthetic(n_train, n_test, dim, classes=10, seed=0):
  """`(x, y, x_test, test labels)`, drawn in float32 (no float64 copy)."""
  r = np.random.default_rng(seed)
  x = r.standard_normal((n_train + n_test, dim), dtype=np.float32)
  teacher = r.standard_normal((dim, classes), dtype=np.float32)
  labels = np.argmax(x @ teacher, axis=1)
  y = np.eye(classes, dtype=np.float32)[labels] - 1. / classes
  return x[:n_train], y[:n_train], x[n_train:], labels[n_train:]


def _targets(args):
  """`(y, test labels)`, without keeping the inputs."""
  _, y, _, labels = synthetic(args.n, args.n_test, args.dim)
  return y, labels


def _kernel_fn():
  from neural_tangents import stax  # pylint: disable=g-import-not-at-top
  return stax.serial(stax.Dense(512, 1.4, 0.05), stax.Relu(),
                     stax.Dense(512, 1.4, 0.05), stax.Relu(),
                     stax.Dense(10, 1.4, 0.05))[2]


def _stores(args):
  """The train-train and test-train kernels' stores (computed if absent)."""
  import neural_tangents as nt  # pylint: disable=g-import-not-at-top
  x, _, x_test, _ = synthetic(args.n, args.n_test, args.dim)
  kernel_fn = _kernel_fn()
  out = []
  for name, x1, x2 in (('train', x, None), ('test', x_test, x)):
    batched = nt.batch(kernel_fn, args.batch_size, store_on_device=False,
                       store=os.path.join(args.directory, name),
                       progress=not args.small)
    out.append(batched(x1, x2, 'nngp'))
  return out


def _solve(args, k, k_test):
  """`(seconds, iterations, residual, accuracy)` of a CG solve and its
  prediction."""
  import neural_tangents as nt  # pylint: disable=g-import-not-at-top
  y, labels = _targets(args)
  start = time.perf_counter()
  predict_fn = nt.predict.gp_inference(
      k, y, diag_reg=args.diag_reg, solver='cg', tol=args.tol,
      maxiter=args.maxiter, preconditioner_rank=args.rank)
  mean = np.asarray(predict_fn('nngp', k_test))
  seconds = time.perf_counter() - start
  info = predict_fn.solve_info['nngp']
  accuracy = float(np.mean(np.argmax(mean, axis=1) == labels))
  return seconds, info.iterations, info.residual, accuracy


def _evict(directory: str) -> int:
  """Drops the store's files from the page cache; their total bytes."""
  total = 0
  for root, _, files in os.walk(directory):
    for name in files:
      path = os.path.join(root, name)
      fd = os.open(path, os.O_RDONLY)
      try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
      finally:
        os.close(fd)
      total += os.path.getsize(path)
  return total


def _read_bandwidth(directory: str) -> dict:
  total = _evict(directory)
  start = time.perf_counter()
  for root, _, files in os.walk(directory):
    for name in files:
      with open(os.path.join(root, name), 'rb') as f:
        while f.read(1 << 24):
          pass
  seconds = time.perf_counter() - start
  return dict(gb=round(total / 1e9, 3), seconds=round(seconds, 3),
              gb_per_s=round(total / 1e9 / seconds, 3))


def _child(args, mode: str, **overrides) -> dict:
  """Runs `mode` in a fresh process (its own peak memory); its last line."""
  values = {**vars(args), **overrides}
  flags = [f'--{name}={values[name]}' for name in (
      'n', 'n_test', 'dim', 'batch_size', 'diag_reg', 'tol', 'maxiter',
      'rank', 'directory', 'cache_gb')]
  out = subprocess.run([sys.executable, __file__, f'--mode={mode}', *flags],
                       check=True, capture_output=True, text=True)
  lines = [l for l in out.stdout.splitlines() if l.startswith('{')]
  for line in lines:
    print(line, flush=True)
  return json.loads(lines[-1])


def run_all(args) -> None:
  """The kernels into their stores, then each measurement."""
  start = time.perf_counter()
  _stores(args)
  _report('kernel', n=args.n, n_test=args.n_test,
          seconds=round(time.perf_counter() - start, 3),
          peak_rss_gb=round(_peak_gb(), 3))
  memory = _child(args, 'memory')
  bandwidth = _read_bandwidth(os.path.join(args.directory, 'train'))
  _report('read_bandwidth', **bandwidth)
  store = _child(args, 'store', cache_gb=0.)
  kernel_gb = args.n * args.n * 4 / 1e9
  cached = _child(args, 'store', cache_gb=args.cache_gb or kernel_gb * 1.01)
  # An iteration from disk reads the whole kernel: its bound is the disk's.
  disk_bound = bandwidth['gb'] / bandwidth['gb_per_s']
  _report('summary', n=args.n, memory_vs_bare=memory['vs_bare'],
          store_vs_memory=round(store['seconds_per_iteration'] /
                                memory['seconds_per_iteration'], 3),
          disk_bound_seconds_per_iteration=round(disk_bound, 3),
          store_vs_disk_bound=round(store['seconds_per_iteration'] /
                                    disk_bound, 3),
          store_cached_vs_memory=round(cached['seconds_per_iteration'] /
                                       memory['seconds_per_iteration'], 3))


def run_memory(args) -> None:
  """`bare_matmul` and `cg_memory`, the kernels loaded from their stores."""
  k_store, k_test_store = _stores(args)
  k = np.asarray(k_store[...])
  k_test = np.asarray(k_test_store[...])
  v = _targets(args)[0]
  times = []
  for _ in range(3):
    start = time.perf_counter()
    k @ v
    times.append(time.perf_counter() - start)
  bare = statistics.median(times)
  _report('bare_matmul', n=args.n, targets=v.shape[1],
          seconds=round(bare, 4),
          gb_per_s=round(k.nbytes / 1e9 / bare, 3))
  seconds, iterations, residual, accuracy = _solve(args, k, k_test)
  per_iteration = seconds / max(iterations, 1)
  _report('cg_memory', n=args.n, seconds=round(seconds, 3),
          iterations=iterations, residual=residual,
          seconds_per_iteration=round(per_iteration, 4),
          vs_bare=round(per_iteration / bare, 3), test_accuracy=accuracy,
          peak_rss_gb=round(_peak_gb(), 3))


def run_store(args) -> None:
  """`cg_store`: the solve and prediction from the stores, which are
  computed first if absent (`kernel` is then reported: end to end)."""
  import neural_tangents as nt  # pylint: disable=g-import-not-at-top
  start = time.perf_counter()
  computed = not os.path.isdir(os.path.join(args.directory, 'test'))
  k_store, k_test_store = _stores(args)
  if computed:
    _report('kernel', n=args.n, n_test=args.n_test,
            seconds=round(time.perf_counter() - start, 3),
            peak_rss_gb=round(_peak_gb(), 3))
  _evict(args.directory)
  cache_bytes = int(args.cache_gb * 1e9)
  k = nt.predict.StoredKernel(k_store, cache_bytes=cache_bytes)
  k_test = nt.predict.StoredKernel(k_test_store, 'k_test_train')
  seconds, iterations, residual, accuracy = _solve(args, k, k_test)
  _report('cg_store_cached' if cache_bytes else 'cg_store', n=args.n,
          cache_gb=args.cache_gb, cached_blocks=len(k.cached_blocks),
          seconds=round(seconds, 3),
          iterations=iterations, residual=residual,
          seconds_per_iteration=round(seconds / max(iterations, 1), 4),
          test_accuracy=accuracy, peak_rss_gb=round(_peak_gb(), 3),
          row_block_reads=sum(k.reads.values()),
          end_to_end_seconds=round(time.perf_counter() - start, 3))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--n', type=int, default=50000)
  parser.add_argument('--n_test', type=int, default=10000)
  parser.add_argument('--dim', type=int, default=3072)
  parser.add_argument('--batch_size', type=int, default=2500)
  parser.add_argument('--diag_reg', type=float, default=1e-3)
  parser.add_argument('--tol', type=float, default=1e-5)
  parser.add_argument('--maxiter', type=int, default=2000)
  parser.add_argument('--rank', type=int, default=200)
  parser.add_argument('--directory', default='/tmp/predict_store')
  parser.add_argument('--cache_gb', type=float, default=0.,
                      help='row blocks of the train kernel kept in memory '
                      "(`StoredKernel`'s cache_bytes) in --mode=store; with "
                      "--mode=all, the cached run's (default: the kernel)")
  parser.add_argument('--mode', choices=('all', 'memory', 'store'),
                      default='all')
  parser.add_argument('--small', action='store_true')
  args = parser.parse_args()
  if args.small:
    args.n, args.n_test, args.dim, args.batch_size = 2000, 500, 256, 500
    args.directory += '_small'
  {'all': run_all, 'memory': run_memory, 'store': run_store}[args.mode](args)


if __name__ == '__main__':
  main()
