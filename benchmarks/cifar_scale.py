"""NNGP regression at CIFAR-10 size, end to end, on one machine.

An infinitely wide 2-hidden-layer ReLU FCN, 50,000 training and 10,000 test
points of 3,072 features (synthetic, CIFAR-10 sized, labelled by a random
linear teacher into 10 classes):

1. `kernel`: the train-train NNGP with `nt.batch(kernel_fn, batch_size,
   store_on_device=False, progress=True)`, a numpy array on the host
   (50,000^2 float32 = 10 GB; the batching preallocates it, so it is the only
   `n x n` array);
2. `solve`: `nt.predict.gp_inference(k, y, diag_reg, solver='cg')` and its
   first call (preconditioned conjugate gradients on the 10 targets, no copy
   of the kernel), with iterations and residual;
3. `test`: predictions on the test points in blocks of `--test_block` rows
   (test-train kernel blocks by the same batched `kernel_fn`), with a
   progress bar, and the test accuracy.

Prints one JSON line per stage (seconds, peak resident memory) and a summary
line with `peak_over_kernel`. `--small` runs it at 2,000 x 500 points of 256
features in seconds, and also checks the CG mean against a Cholesky solve.

  PYTHONPATH=$PWD python benchmarks/cifar_scale.py            # 50,000 points
  PYTHONPATH=$PWD python benchmarks/cifar_scale.py --small
"""
import argparse
import json
import resource
import time

import numpy as np


def _peak_gb():
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def synthetic(n_train, n_test, dim, classes=10, seed=0):
  r = np.random.RandomState(seed)
  x = r.randn(n_train + n_test, dim).astype(np.float32)
  teacher = r.randn(dim, classes).astype(np.float32)
  labels = np.argmax(x @ teacher, axis=1)
  y = (np.eye(classes, dtype=np.float32)[labels] - 1. / classes)
  return x[:n_train], y[:n_train], x[n_train:], labels[n_train:]


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--n_train', type=int, default=50000)
  parser.add_argument('--n_test', type=int, default=10000)
  parser.add_argument('--dim', type=int, default=3072)
  parser.add_argument('--batch_size', type=int, default=2500)
  parser.add_argument('--test_block', type=int, default=1000)
  parser.add_argument('--diag_reg', type=float, default=1e-3)
  parser.add_argument('--tol', type=float, default=1e-5)
  parser.add_argument('--maxiter', type=int, default=2000)
  parser.add_argument('--rank', type=int, default=200)
  parser.add_argument('--small', action='store_true')
  args = parser.parse_args()
  if args.small:
    args.n_train, args.n_test, args.dim = 2000, 500, 256
    args.batch_size, args.test_block = 500, 250

  # pylint: disable=g-import-not-at-top
  from tqdm.auto import tqdm
  import neural_tangents as nt
  from neural_tangents import stax

  def report(stage, seconds, **extra):
    print(json.dumps(dict(bench='cifar_scale', stage=stage,
                          n_train=args.n_train, n_test=args.n_test,
                          dim=args.dim, seconds=round(seconds, 2),
                          peak_rss_gb=round(_peak_gb(), 3), **extra)),
          flush=True)

  t0 = time.perf_counter()
  x_train, y_train, x_test, labels = synthetic(args.n_train, args.n_test,
                                               args.dim)
  report('data', time.perf_counter() - t0)

  _, _, kernel_fn = stax.serial(
      stax.Dense(512, W_std=1.5, b_std=0.05), stax.Relu(),
      stax.Dense(512, W_std=1.5, b_std=0.05), stax.Relu(),
      stax.Dense(10, W_std=1.5, b_std=0.05))
  batched = nt.batch(kernel_fn, batch_size=args.batch_size,
                     store_on_device=False, progress=True)

  t0 = time.perf_counter()
  k_train_train = batched(x_train, None, 'nngp')
  kernel_gb = k_train_train.nbytes / 2**30
  report('kernel', time.perf_counter() - t0, kernel_gb=round(kernel_gb, 3),
         dtype=str(k_train_train.dtype), type=type(k_train_train).__name__)

  t0 = time.perf_counter()
  predict_fn = nt.predict.gp_inference(
      k_train_train, y_train, diag_reg=args.diag_reg, solver='cg',
      tol=args.tol, maxiter=args.maxiter, preconditioner_rank=args.rank)
  first = slice(0, min(args.test_block, args.n_test))
  # Without `k_test_test`, `predict_fn` returns the posterior means.
  means = [np.asarray(predict_fn('nngp', batched(x_test[first], x_train,
                                                 'nngp')))]
  info = predict_fn.solve_info['nngp']
  report('solve', time.perf_counter() - t0, iterations=info.iterations,
         residual=float(f'{info.residual:.3g}'), converged=info.converged)

  t0 = time.perf_counter()
  starts = range(first.stop, args.n_test, args.test_block)
  for start in tqdm(starts, desc='test blocks', unit='block'):
    block = x_test[start:start + args.test_block]
    means.append(np.asarray(
        predict_fn('nngp', batched(block, x_train, 'nngp'))))
  mean = np.concatenate(means)
  accuracy = float(np.mean(np.argmax(mean, axis=1) == labels))
  report('test', time.perf_counter() - t0, accuracy=round(accuracy, 4))

  summary = dict(peak_over_kernel=round(_peak_gb() / kernel_gb, 3))
  if args.small:
    direct = nt.predict.gp_inference(k_train_train, y_train,
                                     diag_reg=args.diag_reg)
    expected = np.asarray(direct('nngp', batched(x_test, x_train,
                                                 'nngp')))
    summary['rel_error_vs_cholesky'] = float(
        f'{np.linalg.norm(mean - expected) / np.linalg.norm(expected):.3g}')
  report('total', 0., **summary)


if __name__ == '__main__':
  main()
