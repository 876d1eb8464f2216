"""Predictions from feature maps (`nt.experimental.features`) through
`nt.predict` with a `LowRankKernel`, against the exact kernels.

Workloads (`--workloads`, comma-separated):

* `digits`: test accuracy of kernel regression with features `F` of about
  `--digits_dim` (8,192) columns (RANDFEAT ReLUs of that width for the NNGP,
  half of it for the NTK, whose final Dense concatenates two feature sets)
  against exact NNGP and NTK regression
  (`gp_inference` on the exact `stax` kernel, the same `diag_reg`), for a
  2-hidden-layer ReLU FCN on `digits` (1,200 train / 597 test) and two small
  CNNs on `digit_images` (800 / 400): `cnn` (stride-2 3x3 convolution, ReLU,
  2x2 average pooling, flatten; ReLU features of `dim / 16` per position)
  and `cnn_gap` (global average pooling instead; `dim` per position), whose
  nearly constant kernel makes its centred part, which decides the
  predictions, hard to approximate. Also the relative Frobenius error of the
  features' train kernel and of its centred part.
* `million`: `--n` (1,000,000) synthetic points of 784 features, drawn block
  by block from a seeded RNG (a block of inputs at a time is held), targets of
  a random 2-layer ReLU teacher plus noise; NTK features of a 2-hidden-layer
  ReLU FCN (`--method`, `--dim`); regression end to end: feature row blocks ->
  `F^T F`, `F^T y` -> `D x D` solve -> predictions on `--n_test` (10,000)
  test points, with stage times, peak RSS and the test MSE against the
  trivial predictor (the train mean).
* `myrtle`: `benchmarks/features_myrtle.py`: the features of a Myrtle-5
  CNTK on `--myrtle_images` (10,000) synthetic 32x32x3 images timed against
  the exact kernel (timed on a subset, extrapolated by pairs and by blocks),
  and the relative kernel error on the first `--myrtle_error_images` (200).

Each measurement prints one JSON line. Usage:

  PYTHONPATH=$PWD python benchmarks/features.py --workloads digits
  PYTHONPATH=$PWD python benchmarks/features.py --workloads million --n 50000
"""
import argparse
import json
import os
import resource
import sys
import time

import jax
from jax import random
import numpy as np

import neural_tangents as nt
from neural_tangents import stax
from neural_tangents.experimental import features as ft

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                '..', 'examples'))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import datasets  # pylint: disable=g-import-not-at-top,wrong-import-position

W_STD, B_STD = 1.5, 0.05
DIAG_REG = 1e-2


def _peak_rss_gb():
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def _emit(**record):
  print(json.dumps(record), flush=True)


def _relative_error(a, b):
  return float(np.linalg.norm(a - b) / np.linalg.norm(b))


# digits


def _centred(k):
  """`k` with row, column and overall means removed (the part of a kernel
  that regression with an intercept sees)."""
  return k - k.mean(0) - k.mean(1)[:, None] + k.mean()


def _fcn(dim):
  relu = lambda: ft.ReluFeatures('RANDFEAT', dim, dim, dim)
  features = ft.serial(ft.DenseFeatures(1, W_STD, B_STD), relu(),
                       ft.DenseFeatures(1, W_STD, B_STD), relu(),
                       ft.DenseFeatures(1, W_STD, B_STD))
  _, _, kernel_fn = stax.serial(stax.Dense(1, W_STD, B_STD), stax.Relu(),
                                stax.Dense(1, W_STD, B_STD), stax.Relu(),
                                stax.Dense(1, W_STD, B_STD))
  return features, kernel_fn, 256, 100


def _cnn_layers(pooling):
  """A stride-2 3x3 convolution and a ReLU, then `pooling` and a readout."""
  return stax.serial(stax.Conv(1, (3, 3), (2, 2), 'SAME', W_STD, B_STD),
                     stax.Relu(), *pooling, stax.Dense(1, W_STD, B_STD))


def _cnn(dim):
  """2x2 average pooling of the 8x8 ReLU maps, flattened: 16 positions, so
  ReLU features of `dim / 16` per position make `dim` columns."""
  layers = _cnn_layers((stax.AvgPool((2, 2), (2, 2)), stax.Flatten()))
  return (ft.from_stax(layers, feature_dim=max(1, dim // 16)), layers[2],
          16, 20)


def _cnn_gap(dim):
  """Global average pooling: features of `dim` per position, `dim` columns."""
  layers = _cnn_layers((stax.GlobalAvgPool(),))
  return ft.from_stax(layers, feature_dim=dim), layers[2], 16, 20


def run_digits(args):
  for net, dataset, n_train, n_test, build in (
      ('fcn', 'digits', 1200, 597, _fcn),
      ('cnn', 'digit_images', 800, 400, _cnn),
      ('cnn_gap', 'digit_images', 800, 400, _cnn_gap)):
    data = datasets.load(dataset, n_train, n_test)
    kernel_fn, batch, kernel_batch = build(args.digits_dim)[1:]
    start = time.perf_counter()
    kernel_fn = nt.batch(kernel_fn, batch_size=kernel_batch)
    k_train = kernel_fn(data.x_train, None, ('nngp', 'ntk'))
    k_test = kernel_fn(data.x_test, data.x_train, ('nngp', 'ntk'))
    exact_seconds = time.perf_counter() - start
    for kernel in ('nngp', 'ntk'):
      # The NTK features of a final Dense concatenate the NNGP and NTK
      # features of its input: halve the widths so both F have ~dim columns.
      width = args.digits_dim if kernel == 'nngp' else args.digits_dim // 2
      init_fn, feature_fn = build(width)[0]
      shapes, params = init_fn(random.PRNGKey(0), data.x_train.shape)
      feature_dim = shapes[0 if kernel == 'nngp' else 1][-1]
      start = time.perf_counter()
      exact = nt.predict.gp_inference(getattr(k_train, kernel), data.y_train,
                                      DIAG_REG)('nngp', getattr(k_test, kernel))
      exact_solve_seconds = time.perf_counter() - start
      start = time.perf_counter()
      lr_train, lr_test = (nt.predict.LowRankKernel.from_features(
          feature_fn, params, x, batch_size=batch, kernel=kernel)
                           for x in (data.x_train, data.x_test))
      approx = nt.predict.gp_inference(lr_train, data.y_train, DIAG_REG)(
          'nngp', lr_test)
      feature_seconds = time.perf_counter() - start
      dense = np.asarray(getattr(k_train, kernel), np.float64)
      approx_train = lr_train.dense()
      acc_exact = datasets.accuracy(np.asarray(exact), data.y_test)
      acc_feat = datasets.accuracy(np.asarray(approx), data.y_test)
      _emit(workload='digits', net=net, dataset=dataset, kernel=kernel,
            n_train=n_train, n_test=n_test, method='RANDFEAT',
            relu_dim=width, feature_dim=feature_dim, diag_reg=DIAG_REG,
            exact_accuracy=acc_exact, feature_accuracy=acc_feat,
            accuracy_difference=acc_feat - acc_exact,
            train_kernel_rel_error=_relative_error(approx_train, dense),
            centred_kernel_rel_error=_relative_error(
                _centred(approx_train), _centred(dense)),
            exact_kernel_seconds=round(exact_seconds, 2),
            exact_solve_seconds=round(exact_solve_seconds, 2),
            feature_regression_seconds=round(feature_seconds, 2),
            peak_rss_gb=round(_peak_rss_gb(), 2))


# million


INPUT_DIM, LATENT_DIM, TEACHER_WIDTH = 784, 16, 64
INPUT_NOISE, TARGET_NOISE = 0.1, 0.1


class _Data:
  """Synthetic points on a 16-dimensional subspace of 784 features (plus
  isotropic noise), as images lie near a low-dimensional set; targets of a
  random 2-layer ReLU teacher of the latent point, plus noise. The
  projection and the teacher are shared by all splits; block `i` of split
  `seed` is drawn from the RNG seeded `(seed, i)`, so blocks are redrawn,
  never stored."""

  def __init__(self, seed, block):
    self.seed, self.block = seed, block
    r = np.random.default_rng(2**31)  # Shared by train and test.
    self.projection = r.standard_normal((LATENT_DIM, INPUT_DIM),
                                        np.float32) / np.sqrt(LATENT_DIM)
    self.w1 = r.standard_normal((LATENT_DIM, TEACHER_WIDTH), np.float32)
    self.w2 = r.standard_normal((TEACHER_WIDTH, 1), np.float32)

  def _block(self, start, stop):
    assert start % self.block == 0 and stop - start <= self.block
    r = np.random.default_rng((self.seed, start // self.block))
    z = r.standard_normal((self.block, LATENT_DIM), np.float32)
    noise = r.standard_normal((self.block, INPUT_DIM), np.float32)
    y_noise = r.standard_normal((self.block, 1), np.float32)
    return z[:stop - start], noise[:stop - start], y_noise[:stop - start]

  def inputs(self, start, stop):
    z, noise, _ = self._block(start, stop)
    return z @ self.projection + INPUT_NOISE * noise

  def targets(self, start, stop):
    z, _, y_noise = self._block(start, stop)
    h = np.maximum(z @ self.w1 / np.sqrt(LATENT_DIM), 0.)
    return h @ self.w2 / np.sqrt(TEACHER_WIDTH) + TARGET_NOISE * y_noise


def _timed_rows(rows, clock, key, progress=None):
  def timed(start, stop):
    t0 = time.perf_counter()
    clock.setdefault(key + '_first_call', t0)
    out = rows(start, stop)
    clock[key] = clock.get(key, 0.) + time.perf_counter() - t0
    if progress is not None:
      progress.update(stop - start)
    return out
  return timed


def run_million(args):
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  block = args.block
  train, test = _Data(0, block), _Data(1, block)
  clock = {}
  start = time.perf_counter()
  y_train = np.concatenate([
      train.targets(a, min(a + block, args.n))
      for a in tqdm(range(0, args.n, block), desc='targets', file=sys.stderr)])
  y_test = np.concatenate([test.targets(a, min(a + block, args.n_test))
                           for a in range(0, args.n_test, block)])
  clock['targets'] = time.perf_counter() - start

  d = args.dim
  relu = lambda: ft.ReluFeatures(args.method, feature_dim0=d, feature_dim1=d,
                                 sketch_dim=d, poly_sketch_dim=d)
  init_fn, feature_fn = ft.serial(
      ft.DenseFeatures(1, W_STD, B_STD), relu(),
      ft.DenseFeatures(1, W_STD, B_STD), relu(),
      ft.DenseFeatures(1, W_STD, B_STD))
  shapes, params = init_fn(random.PRNGKey(0), (block, INPUT_DIM))
  bar = tqdm(total=args.n, desc='features, F^T F', file=sys.stderr)
  k_train = nt.predict.LowRankKernel.from_features(
      feature_fn, params, train.inputs, args.n, batch_size=block)
  k_train = nt.predict.LowRankKernel(
      _timed_rows(k_train.rows, clock, 'train_features', bar),
      args.n, block_rows=block)
  k_test = nt.predict.LowRankKernel.from_features(
      feature_fn, params, test.inputs, args.n_test, batch_size=block)
  k_test = nt.predict.LowRankKernel(
      _timed_rows(k_test.rows, clock, 'test_features'),
      args.n_test, block_rows=block)

  start = time.perf_counter()
  predict_fn = nt.predict.gp_inference(k_train, y_train, args.diag_reg)
  mean = np.asarray(predict_fn('ntk', k_test))
  total = time.perf_counter() - start
  bar.close()
  # The train pass and the D x D eigendecomposition end where the test
  # features start.
  pass_and_solve = clock['test_features_first_call'] - start
  mse = float(np.mean((mean - y_test)**2))
  baseline = float(np.mean((y_train.mean() - y_test)**2))
  _emit(workload='million', n=args.n, n_test=args.n_test,
        input_dim=INPUT_DIM, method=args.method, relu_dim=d,
        feature_dim=shapes[1][-1], block=block,
        diag_reg=args.diag_reg, dtype=str(mean.dtype),
        targets_seconds=round(clock['targets'], 1),
        train_features_seconds=round(clock['train_features'], 1),
        gram_and_solve_seconds=round(
            pass_and_solve - clock['train_features'], 1),
        test_seconds=round(total - pass_and_solve, 1),
        total_seconds=round(total + clock['targets'], 1),
        peak_rss_gb=round(_peak_rss_gb(), 2),
        test_mse=mse, baseline_mse=baseline, mse_ratio=mse / baseline,
        load_average=os.getloadavg()[0], cpus=os.cpu_count())


# Workloads by name: each takes the parsed arguments and prints JSON lines.
# Add a workload by writing its `run_*` function and naming it here.
def run_myrtle(args):
  """`features_myrtle.run` (Myrtle-5 CNTK features vs the exact kernel)."""
  import features_myrtle  # pylint: disable=g-import-not-at-top
  for record in features_myrtle.run(num_images=args.myrtle_images,
                                    error_images=args.myrtle_error_images):
    _emit(**record)


WORKLOADS = {'digits': run_digits, 'million': run_million,
             'myrtle': run_myrtle}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--workloads', default='digits,million',
                      help=f'comma-separated, of {sorted(WORKLOADS)}')
  parser.add_argument('--digits_dim', type=int, default=8192)
  parser.add_argument('--n', type=int, default=1_000_000)
  parser.add_argument('--n_test', type=int, default=10_000)
  parser.add_argument('--dim', type=int, default=1024,
                      help='ReLU feature widths; the NTK features F of the '
                      'final Dense have 2 dim + 1 columns')
  parser.add_argument('--method', default='RANDFEAT')
  parser.add_argument('--block', type=int, default=4096)
  parser.add_argument('--diag_reg', type=float, default=1e-3)
  parser.add_argument('--myrtle_images', type=int, default=10_000)
  parser.add_argument('--myrtle_error_images', type=int, default=200)
  args = parser.parse_args(argv)
  names = args.workloads.split(',')
  for name in names:
    if name not in WORKLOADS:
      parser.error(f'unknown workload {name!r}; pick from {sorted(WORKLOADS)}')
  for name in names:
    WORKLOADS[name](args)


if __name__ == '__main__':
  main()
