"""Predictions that follow the published release's conventions (issue 28):
the ensemble's train-set flow with `diag_reg > 0` (against the published
numbers and an explicit float64 eigendecomposition) and the ODE solver's
train-only outputs without `fx_test_0` (against `gradient_descent_mse`)."""
from absl.testing import absltest
import jax.numpy as jnp
import numpy as np

from neural_tangents import predict
from neural_tangents import stax
from tests import test_utils


def _erf_network():
  return stax.serial(stax.Dense(512, W_std=1.5, b_std=0.05), stax.Erf(),
                     stax.Dense(1, W_std=1.5, b_std=0.05))


class PublishedTrainSetFlowTest(test_utils.NeuralTangentsTestCase):
  """`x_test=None` at finite `t` with `diag_reg > 0`: the regularized flow."""

  def setUp(self):
    super().setUp()
    _, _, self.kernel_fn = _erf_network()
    self.x = np.linspace(-3., 3., 5).reshape(5, 1)
    self.y = np.sin(self.x)
    self.predict_fn = predict.gradient_descent_mse_ensemble(
        self.kernel_fn, self.x, self.y, diag_reg=1e-4)

  def test_published_numbers(self):
    # Neural Tangents 0.6.5 on these inputs, float64 (issue 28, item 3).
    def check(actual, published, rtol):
      self.assertAllClose(np.ravel(actual)[:len(published)],
                          np.array(published), rtol=rtol, atol=1e-8)
    out = self.predict_fn(1., None, 'ntk', compute_cov=True)
    check(out.mean, [-0.48750289, -0.52126977], 1e-7)
    check(out.covariance, [0.01533389, -0.01479894, 0.00352081], 1e-6)
    out = self.predict_fn(1., None, 'nngp', compute_cov=True)
    check(out.mean, [-0.43175719, -0.403282], 1e-7)
    check(out.covariance, [0.1240882, 0.09750255, 0.0035723], 1e-6)
    check(self.predict_fn(100., None, 'nngp'), [-0.34565996, -0.77494162],
          1e-7)

  def test_matches_explicit_eigendecomposition(self):
    # `(l, V)` of `K + r trace(K) / n I`, times `t` and `lr` together.
    k = self.kernel_fn(self.x, None)
    n, t, lr = 5, np.array([0.5, 3.]), 2.
    predict_fn = predict.gradient_descent_mse_ensemble(
        self.kernel_fn, self.x, self.y, learning_rate=lr, diag_reg=1e-3)
    out = predict_fn(t, None, ('nngp', 'ntk', 'ntkgp'), compute_cov=True)
    for name, flow, prior in (('nngp', k.nngp, None), ('ntk', k.ntk, k.nngp),
                              ('ntkgp', k.ntk, None)):
      flow = np.asarray(flow)
      reg = flow + 1e-3 * np.trace(flow) / n * np.eye(n)
      l, v = np.linalg.eigh(reg)
      l = np.maximum(l, 0.)
      for i, s in enumerate(lr * t / n):
        mean = v @ np.diag(1. - np.exp(-l * s)) @ v.T @ self.y
        if prior is None:
          cov = v @ np.diag(l * np.exp(-2. * l * s)) @ v.T
        else:
          e = v @ np.diag(np.exp(-l * s)) @ v.T
          cov = e @ np.asarray(prior) @ e
        got = getattr(out, name)
        self.assertAllClose(got.mean[i], mean, rtol=1e-8, atol=1e-10)
        self.assertAllClose(got.covariance[i], cov, rtol=1e-8, atol=1e-10)


class PublishedOdeOutputsTest(test_utils.NeuralTangentsTestCase):
  """`gradient_descent`'s `predict_fn(t, fx_train_0, None, k_test_train)`."""

  def test_train_outputs_only_without_fx_test_0(self):
    _, _, kernel_fn = _erf_network()
    x = np.linspace(-3., 3., 6).reshape(6, 1)
    x_test = np.array([[0.3], [-1.1]])
    y = np.sin(x)
    k = kernel_fn(x, None, 'ntk')
    k_test = kernel_fn(x_test, x, 'ntk')
    mse = lambda fx, y_hat: 0.5 * jnp.mean((fx - y_hat)**2)
    ode_fn = predict.gradient_descent(mse, k, y)
    exact_fn = predict.gradient_descent_mse(k, y)
    out = ode_fn(2., 0., None, k_test)
    self.assertIsInstance(out, jnp.ndarray)  # Not a (train, test) tuple.
    self.assertEqual(out.shape, y.shape)
    self.assertAllClose(out, exact_fn(2., 0., None, k_test), rtol=1e-6,
                        atol=1e-6)
    # With `fx_test_0` both, as before.
    fx_train, fx_test = ode_fn(2., 0., 0., k_test)
    self.assertAllClose((fx_train, fx_test), exact_fn(2., 0., 0., k_test),
                        rtol=1e-6, atol=1e-6)


if __name__ == '__main__':
  absltest.main()
