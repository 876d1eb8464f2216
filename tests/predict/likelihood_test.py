"""`nt.predict.log_marginal_likelihood` against SciPy, and its gradients
against central finite differences, in float64."""
from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg

import neural_tangents as nt
from neural_tangents import stax
from tests import test_utils


def _fcn(hp):
  return stax.serial(stax.Dense(8, hp['W_std'], hp['b_std']), stax.Relu(),
                     stax.Dense(1, hp['W_std'], hp['b_std']))


def _cnn(hp):
  return stax.serial(stax.Conv(8, (2, 2), W_std=hp['W_std'],
                               b_std=hp['b_std']), stax.Relu(),
                     stax.AvgPool((2, 2)), stax.Flatten(),
                     stax.Dense(1, hp['W_std'], hp['b_std']))


def _rbf_erf(hp):
  return stax.serial(stax.Dense(8, hp['W_std'], hp['b_std']), stax.Erf(),
                     stax.Dense(1, hp['W_std'], hp['b_std']),
                     stax.Rbf(gamma=hp['gamma']),
                     stax.Dense(1, hp['W_std'], hp['b_std']))


_NETS = {'fcn': (_fcn, (7, 3)), 'cnn': (_cnn, (6, 4, 4, 2)),
         'rbf_erf': (_rbf_erf, (7, 3))}
# `gamma` is used by 'rbf_erf' only (elsewhere its gradient is 0).
_HP = {'W_std': 1.3, 'b_std': 0.2, 'gamma': 0.7, 'diag_reg': 0.05}


def _reference(k, y, r):
  """float64 SciPy: `slogdet` and `solve`, per output column."""
  k = np.asarray(k, np.float64)
  a = k + r * np.eye(k.shape[0])
  sign, log_det = np.linalg.slogdet(a)
  assert sign > 0
  fit = np.sum(y * scipy.linalg.solve(a, y, assume_a='pos'), axis=0)
  return -0.5 * (fit + log_det + k.shape[0] * np.log(2 * np.pi))


class ExactLikelihoodTest(test_utils.NeuralTangentsTestCase):

  def _setup(self, net):
    make, shape = _NETS[net]
    rng = np.random.RandomState(0)
    x = rng.randn(*shape)
    y = rng.randn(shape[0], 2)
    return make, x, y

  def _value(self, make, x, y, hp, get):
    kernel_fn = make(hp)[2]
    return nt.predict.log_marginal_likelihood(
        kernel_fn(x, None, ('nngp', 'ntk')), y, diag_reg=hp['diag_reg'],
        get=get)

  @test_utils.sample_product(net=tuple(_NETS), get=('nngp', 'ntk'))
  def test_matches_scipy(self, net, get):
    make, x, y = self._setup(net)
    out = self._value(make, x, y, _HP, get)
    k = getattr(make(_HP)[2](x, None, ('nngp', 'ntk')), get)
    r = _HP['diag_reg'] * np.trace(np.asarray(k)) / k.shape[0]
    expected = _reference(k, y, r)
    np.testing.assert_allclose(out.per_output, expected, rtol=1e-10)
    np.testing.assert_allclose(out.total, expected.sum(), rtol=1e-10)

  @test_utils.sample_product(net=tuple(_NETS), get=('nngp', 'ntk'))
  def test_gradient_matches_finite_differences(self, net, get):
    make, x, y = self._setup(net)
    value = lambda hp: self._value(make, x, y, hp, get).total
    grads = jax.jit(jax.grad(value))(_HP)
    for name in _HP:
      h = 1e-5 * _HP[name]
      up, down = dict(_HP), dict(_HP)
      up[name] += h
      down[name] -= h
      fd = (float(value(up)) - float(value(down))) / (2 * h)
      np.testing.assert_allclose(grads[name], fd, rtol=1e-6, atol=1e-9,
                                 err_msg=name)
    if net == 'rbf_erf':
      self.assertGreater(abs(float(grads['gamma'])), 1e-3)

  def test_gets_and_absolute_diag_reg(self):
    make, x, y = self._setup('fcn')
    kernels = make(_HP)[2](x, None, ('nngp', 'ntk'))
    both = nt.predict.log_marginal_likelihood(
        kernels, y, 0.1, diag_reg_absolute_scale=True)
    self.assertEqual(both._fields, ('nngp', 'ntk'))
    np.testing.assert_allclose(both.ntk.per_output,
                               _reference(kernels.ntk, y, 0.1), rtol=1e-10)
    ntkgp = nt.predict.log_marginal_likelihood(
        kernels, y, 0.1, diag_reg_absolute_scale=True, get='ntkgp')
    np.testing.assert_allclose(ntkgp.total, both.ntk.total, rtol=1e-14)
    array = nt.predict.log_marginal_likelihood(kernels.nngp, y, 0.1, True)
    np.testing.assert_allclose(array.total, both.nngp.total, rtol=1e-14)

  def test_bad_inputs_raise(self):
    make, x, y = self._setup('fcn')
    k = make(_HP)[2](x, None, 'nngp')
    with self.assertRaisesRegex(ValueError, 'NaN or inf'):
      bad = y.copy()
      bad[0, 0] = np.nan
      nt.predict.log_marginal_likelihood(k, bad)
    with self.assertRaisesRegex(ValueError, 'diag_reg'):
      nt.predict.log_marginal_likelihood(k, y, -1.)
    indefinite = np.diag(np.array([1., 1., -0.5, 1., 1., 1., 1.]))
    with self.assertRaisesRegex(ValueError, 'not positive definite.*'
                                'diag_reg >= 0.5'):
      nt.predict.log_marginal_likelihood(indefinite, y, 0., True)
    with self.assertRaisesRegex(ValueError, 'shape \\(7, 7\\)'):
      nt.predict.log_marginal_likelihood(k[:5, :5], y)
    with self.assertRaisesRegex(ValueError, 'trace_axes'):
      nt.predict.log_marginal_likelihood(k, y, trace_axes=())
    with self.assertRaisesRegex(ValueError, 'no "ntk" kernel'):
      nt.predict.log_marginal_likelihood(
          make(_HP)[2](x, None, ('nngp',)), y, get='ntk')

  def test_huge_and_tiny_scales_are_finite(self):
    # The log-likelihood of targets scaled by s shifts by -n log s per
    # column, exactly: no overflow in the determinant.
    make, x, y = self._setup('fcn')
    k = np.asarray(make(_HP)[2](x, None, 'nngp'))
    base = nt.predict.log_marginal_likelihood(k, y, 0.01).per_output
    for s in (1e-100, 1e100):
      out = nt.predict.log_marginal_likelihood(k * s**2, y * s, 0.01)
      self.assertFinite(out)
      np.testing.assert_allclose(out.per_output,
                                 base - y.shape[0] * np.log(s), rtol=1e-10)


class FitTest(test_utils.NeuralTangentsTestCase):

  def test_fit_compiles_once_and_improves(self):
    make, shape = _NETS['rbf_erf']
    rng = np.random.RandomState(1)
    x = rng.randn(*shape)
    y = np.sin(x[:, :1]) + 0.1 * rng.randn(shape[0], 1)
    traces = []

    def kernel_fn_of(hp):
      traces.append(1)  # Runs when the objective is traced.
      return make(dict(hp, W_std=1.3, b_std=0.2))[2]

    init = {'gamma': 2., 'diag_reg': 0.5}
    fit = nt.predict.fit_hyperparameters(kernel_fn_of, x, y, init,
                                         maxiter=15)
    self.assertLen(traces, 1)
    self.assertGreater(fit.iterations, 1)
    self.assertGreater(fit.log_likelihood, fit.initial_log_likelihood + 1.)
    # The reported values are the likelihood at the fitted hyperparameters.
    k = make(dict(fit.hyperparameters, W_std=1.3, b_std=0.2))[2](
        x, None, 'nngp')
    np.testing.assert_allclose(
        nt.predict.log_marginal_likelihood(
            k, y, fit.hyperparameters['diag_reg']).total,
        fit.log_likelihood, rtol=1e-10)

  def test_bad_init_raises(self):
    of = lambda hp: _fcn(dict(hp, b_std=0.1))[2]
    x, y = np.ones((3, 2)), np.ones((3, 1))
    with self.assertRaisesRegex(ValueError, 'positive'):
      nt.predict.fit_hyperparameters(of, x, y, {'W_std': -1.})
    with self.assertRaisesRegex(ValueError, 'non-empty dict'):
      nt.predict.fit_hyperparameters(of, x, y, {})


if __name__ == '__main__':
  absltest.main()
