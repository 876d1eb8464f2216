"""`nt.predict` solvers at dataset scale, against a bare SciPy Cholesky.

For each training-set size `n` and solver, a fresh subprocess builds a float32
train-train kernel (the NNGP of a one-hidden-layer ReLU network on points of
the sphere, full rank; built in row blocks so that it is the only `n x n`
array), then times

* `first`: `gp_inference(k, y, diag_reg)` and a call with 100 test points
  (`get='nngp'`; with `--cov` also their covariance, which CG solves with
  one column per test point), or `gradient_descent_mse(k, y,
  diag_reg)(t=None, ...)` on 100 test points: factorization and compilation
  included;
* `second`: the same call on 100 new test points (factorization cached);

then reads the peak resident memory (`ru_maxrss`) of the process, and, in the
same process, times a bare `scipy.linalg.cho_factor` + `cho_solve` of the same
regularized kernel (`bare_seconds`; the ratio `first / bare` is
`vs_bare`). The relative error of the first call's test mean is against a
float64 direct solve of the same float32 kernel (run in its own subprocess
where `n <= --ref_max_n`).

One JSON line per measurement:

  PYTHONPATH=$PWD python benchmarks/predict_scale.py --n 2000,5000,10000 \\
      --solvers cholesky,eigh,cg --fns gp_inference,gradient_descent_mse

`--memmap DIR` stores the train kernel in a file in DIR (an `np.memmap`)
instead of memory; `--no_bare` skips the SciPy reference (it needs a second
copy of the kernel, 20 GB at n = 50,000).
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

N_TEST = 100
N_TARGETS = 10
DIM = 32


def _points(n, seed):
  x = np.random.RandomState(seed).randn(n, DIM).astype(np.float64)
  return x / np.linalg.norm(x, axis=1, keepdims=True)


def relu_nngp(x1, x2):
  """NNGP of `Dense(W_std=sqrt(2), b_std=0.1) -> Relu -> Dense` on unit
  inputs (arc-cosine kernel of degree 1)."""
  c = np.clip(x1 @ x2.T, -1., 1.)
  return 0.01 + (np.sqrt(1. - c**2) + (np.pi - np.arccos(c)) * c) / np.pi


def train_kernel(x, dtype, out=None, block=1024):
  """`relu_nngp(x, x)` in row blocks, written into `out`."""
  n = x.shape[0]
  if out is None:
    out = np.empty((n, n), dtype)
  for start in range(0, n, block):
    out[start:start + block] = relu_nngp(x[start:start + block], x)
  return out


def _rss_bytes():
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _current_rss():
  with open('/proc/self/statm') as f:
    return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')


def run_one(n, solver, fn, diag_reg, memmap_dir, bare, out_path, cov):
  """One measurement; prints its JSON line; saves the first test mean."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import scipy.linalg  # pylint: disable=g-import-not-at-top
  import neural_tangents as nt  # pylint: disable=g-import-not-at-top

  x = _points(n + 2 * N_TEST, 0)
  x_train, tests = x[:n], (x[n:n + N_TEST], x[n + N_TEST:])
  y = np.random.RandomState(1).randn(n, N_TARGETS).astype(np.float32)
  rss_before = _current_rss()
  if memmap_dir:
    path = os.path.join(memmap_dir, f'k_{n}.f32')
    k = np.memmap(path, np.float32, 'w+', shape=(n, n))
    train_kernel(x_train, np.float32, out=k)
  else:
    k = train_kernel(x_train, np.float32)
  kernel_bytes = n * n * 4
  rss_kernel = _current_rss()
  kw = dict(diag_reg=diag_reg, solver=solver)
  results = {}
  for call, x_test in (('first', tests[0]), ('second', tests[1])):
    k_test = jnp.asarray(relu_nngp(x_test, x_train), jnp.float32)
    k_tt = jnp.asarray(relu_nngp(x_test, x_test), jnp.float32)
    t0 = time.perf_counter()
    if fn == 'gp_inference':
      if call == 'first':
        predict_fn = nt.predict.gp_inference(k, y, **kw)
      out = predict_fn('nngp', k_test, k_tt if cov else None)
      mean = out.mean if cov else out  # Means only without `k_test_test`.
    else:
      if call == 'first':
        predict_fn = nt.predict.gradient_descent_mse(k, y, **kw)
      mean = predict_fn(None, None, 0., k_test)  # Test outputs only.
    mean = np.asarray(jax.block_until_ready(mean))
    results[call] = time.perf_counter() - t0
    if call == 'first':
      np.save(out_path, mean)
  info = predict_fn.solve_info
  if isinstance(info, dict):
    info = info.get('nngp')
  peak = _rss_bytes()
  line = dict(
      bench='predict_scale', fn=fn, n=n, solver=solver, dtype='float32',
      memmap=bool(memmap_dir), first_seconds=round(results['first'], 3),
      second_seconds=round(results['second'], 4),
      peak_rss_gb=round(peak / 2**30, 3),
      kernel_gb=round(kernel_bytes / 2**30, 3),
      peak_over_kernel=round((peak - rss_before) / kernel_bytes, 3),
      added_over_kernel=round((peak - rss_kernel) / kernel_bytes, 3),
      iterations=info.iterations if info else None,
      residual=float(f'{info.residual:.3g}') if info else None,
      backend=jax.default_backend())
  if bare:
    del predict_fn
    reg = diag_reg * float(np.mean(np.diagonal(k)))
    t0 = time.perf_counter()
    a = np.array(k, np.float32, order='F')
    a.flat[::n + 1] += reg
    c = scipy.linalg.cho_factor(a, lower=True, overwrite_a=True,
                                check_finite=False)
    alpha = scipy.linalg.cho_solve(c, y, check_finite=False)
    np.asarray(jnp.asarray(relu_nngp(tests[0], x_train), jnp.float32)
               @ alpha)
    line['bare_seconds'] = round(time.perf_counter() - t0, 3)
    line['vs_bare'] = round(results['first'] / line['bare_seconds'], 2)
  print(json.dumps(line), flush=True)
  if memmap_dir:
    del k
    os.remove(path)


def reference(n, diag_reg, out_path):
  """The float64 test mean of the same problem, by a direct solve."""
  import scipy.linalg  # pylint: disable=g-import-not-at-top
  x = _points(n + 2 * N_TEST, 0)
  y = np.random.RandomState(1).randn(n, N_TARGETS).astype(np.float32)
  # The float32 kernel the solvers get, solved exactly: the error measured is
  # the solver's, not the kernel's float32 rounding (which alone moves the
  # mean by ~eps32 * cond).
  k = train_kernel(x[:n], np.float32).astype(np.float64)
  reg = diag_reg * float(np.mean(np.diagonal(k)))
  k.flat[::n + 1] += reg
  c = scipy.linalg.cho_factor(k.T, lower=True, overwrite_a=True,
                              check_finite=False)
  alpha = scipy.linalg.cho_solve(c, y.astype(np.float64))
  np.save(out_path, relu_nngp(x[n:n + N_TEST], x[:n]) @ alpha)


def _subprocess(args):
  env = dict(os.environ)
  proc = subprocess.run([sys.executable, __file__] + args, env=env,
                        capture_output=True, text=True, check=False)
  if proc.returncode:
    return None, proc.stderr[-400:]
  return proc.stdout, None


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--n', default='2000,5000,10000')
  parser.add_argument('--solvers', default='cholesky,cg')
  parser.add_argument('--fns', default='gp_inference,gradient_descent_mse')
  parser.add_argument('--diag_reg', type=float, default=1e-4)
  parser.add_argument('--memmap', default='')
  parser.add_argument('--no_bare', action='store_true')
  parser.add_argument('--cov', action='store_true')
  parser.add_argument('--ref_max_n', type=int, default=20000)
  parser.add_argument('--one', nargs=3, help=argparse.SUPPRESS)
  parser.add_argument('--reference', type=int, help=argparse.SUPPRESS)
  parser.add_argument('--out', help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.reference:
    reference(args.reference, args.diag_reg, args.out)
    return
  if args.one:
    n, solver, fn = args.one
    run_one(int(n), solver, fn, args.diag_reg, args.memmap,
            not args.no_bare, args.out, args.cov)
    return
  tmp = tempfile.mkdtemp()
  for n in (int(v) for v in args.n.split(',')):
    ref_path = os.path.join(tmp, f'ref_{n}.npy')
    have_ref = False
    if n <= args.ref_max_n:
      _, err = _subprocess(['--reference', str(n), '--out', ref_path,
                            '--diag_reg', str(args.diag_reg)])
      have_ref = err is None
    for fn in args.fns.split(','):
      for solver in args.solvers.split(','):
        out_path = os.path.join(tmp, f'{fn}_{solver}_{n}.npy')
        extra = ['--memmap', args.memmap] if args.memmap else []
        extra += ['--no_bare'] if args.no_bare else []
        extra += ['--cov'] if args.cov else []
        stdout, err = _subprocess(
            ['--one', str(n), solver, fn, '--out', out_path, '--diag_reg',
             str(args.diag_reg)] + extra)
        if err is not None:
          print(json.dumps(dict(bench='predict_scale', fn=fn, n=n,
                                solver=solver, error=err)), flush=True)
          continue
        line = json.loads(stdout.strip().splitlines()[-1])
        if have_ref:
          ref, got = np.load(ref_path), np.load(out_path)
          line['rel_error_vs_float64'] = float(
              f'{np.linalg.norm(got - ref) / np.linalg.norm(ref):.3g}')
        print(json.dumps(line), flush=True)


if __name__ == '__main__':
  main()
