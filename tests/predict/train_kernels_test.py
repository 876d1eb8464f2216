"""Tests of `predict/train_kernels.py`: `TrainKernels` solves and
eigendecomposes the regularized train kernel (against float64 numpy), loads
and factors each kernel once across calls, and keeps traced values only for
the call that traced them."""
from unittest import mock

from absl.testing import absltest
import jax
import numpy as np

from neural_tangents import predict
from neural_tangents import stax
from neural_tangents._src.predict import solve
from neural_tangents._src.predict.layout import output_layout
from neural_tangents._src.predict.options import solve_options
from neural_tangents._src.predict.train_kernels import TrainKernels
from tests import test_utils


def _problem(n=10, seed=0):
  r = np.random.RandomState(seed)
  x = r.randn(n, 4)
  nngp = np.exp(-((x[:, None] - x[None]) ** 2).sum(-1) / 8) + 0.1  # PSD.
  ntk = 2. * nngp + x @ x.T / 4
  return {'nngp': nngp, 'ntk': ntk}, r.randn(n, 2)


def _train(kernels, y, loads, **options):
  def load(names):
    loads.append(names)
    return {name: kernels[name] for name in names}
  return TrainKernels(y, output_layout(y, (-1,)), solve_options(**options),
                      load)


class TrainKernelsTest(test_utils.NeuralTangentsTestCase):

  def test_weights_eigen_and_prior_match_float64_numpy(self):
    kernels, y = _problem()
    train = _train(kernels, y, [], diag_reg=1e-2)
    ntk = kernels['ntk']
    k_reg = ntk + 1e-2 * np.mean(np.diag(ntk)) * np.eye(len(ntk))
    _, weights = train.weights('ntk')
    self.assertAllClose(weights, np.linalg.solve(k_reg, y), rtol=1e-9,
                        atol=1e-9)
    eig, y_eigen = train.eigen('ntk')
    v = np.asarray(eig.evecs)
    self.assertAllClose(v @ np.diag(eig.evals) @ v.T, k_reg, rtol=1e-9,
                        atol=1e-9)
    self.assertAllClose(y_eigen, v.T @ y, rtol=1e-9, atol=1e-9)
    self.assertAllClose(train.prior_in_eigenbasis('ntk', 'nngp'),
                        v.T @ kernels['nngp'] @ v, rtol=1e-9, atol=1e-9)
    self.assertEqual(train.solve_info['ntk'].solver, 'eigh')

  def test_each_kernel_loaded_and_factored_once_across_calls(self):
    kernels, y = _problem()
    loads = []
    train = _train(kernels, y, loads, diag_reg=1e-3)
    with mock.patch.object(solve, 'factorize_with',
                           wraps=solve.factorize_with) as factorize:
      for _ in range(2):
        with train.one_call():
          train.weights('ntk')
          train.eigen('ntk')
          train.matrices(('nngp', 'ntk'))
      # One Cholesky and one eigendecomposition of the NTK, over two calls.
      self.assertEqual(
          [c.args[1].solver for c in factorize.call_args_list],
          ['cholesky', 'eigh'])
    self.assertEqual(loads, [('ntk',), ('nngp',)])

  def test_traced_values_kept_only_within_one_call(self):
    kernels, y = _problem()
    loads = []

    def load(names):
      loads.append(names)
      return {name: kernels[name] * scale for name in names}

    scale = None

    @jax.jit
    def traced(s):
      nonlocal scale
      scale = s
      train = TrainKernels(y, output_layout(y, (-1,)),
                           solve_options(diag_reg=1e-2), load)
      with train.one_call():
        _, weights = train.weights('ntk')
        train.eigen('ntk')
      with train.one_call():
        train.matrix('ntk')
      self.assertEqual(train._cache, {})  # Nothing traced outlives a call.
      return weights

    weights = traced(2.)
    self.assertEqual(loads, [('ntk',), ('ntk',)])
    concrete = _train({'ntk': 2. * kernels['ntk']}, y, [], diag_reg=1e-2)
    self.assertAllClose(weights, concrete.weights('ntk')[1], rtol=1e-9,
                        atol=1e-9)

  def test_ensemble_under_jit_calls_kernel_fn_once_per_kernel_and_call(self):
    _, _, kernel_fn = stax.serial(stax.Dense(8), stax.Relu(), stax.Dense(1))
    calls = []

    def counted(x1, x2, get, **kwargs):  # Not pairwise: no joint call.
      calls.append((np.shape(x1)[0], None if x2 is None else np.shape(x2)[0]))
      return kernel_fn(x1, x2, get, **kwargs)

    r = np.random.RandomState(0)
    x_train, x_test, y = r.randn(5, 3), r.randn(2, 3), r.randn(5, 1)
    predict_fn = predict.gradient_descent_mse_ensemble(counted, x_train, y,
                                                       diag_reg=1e-3)
    fn = jax.jit(lambda x: predict_fn(None, x, 'ntk', compute_cov=True))
    out = fn(x_test)
    self.assertEqual(sorted(calls, key=str), [(2, 5), (2, None), (5, None)])
    self.assertAllClose(out.mean,
                        predict_fn(None, x_test, 'ntk', True).mean,
                        rtol=1e-8, atol=1e-8)


if __name__ == '__main__':
  absltest.main()
