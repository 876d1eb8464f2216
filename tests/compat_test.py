"""Parity with the published Neural Tangents 0.6.5 on its own reference outputs.

`tests/data/upstream-0.6.5.npz` (a copy of `shared/compat/upstream-0.6.5.npz`,
with its README as `tests/data/upstream-0.6.5.README.md`, read through
`upstream_reference`) holds outputs of the
published 0.6.5 release (float64) on the inputs stored with them; the README
describes each case. Every case is rebuilt here with this project's API
and compared: kernels, shapes of params and `apply_fn` outputs at 1e-6
relative, predictions at 1e-8 relative. Random draws are not compared (the
bits of `jax.random` changed since then), only the shapes of `init_fn`'s
params and `apply_fn` of the stored params.
"""
from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents import predict
from neural_tangents import stax
from tests import upstream_reference

_KERNEL_RTOL = upstream_reference.RTOL
_PREDICT_RTOL = 1e-8


def _standard_s_network():
  return stax.serial(
      stax.Dense(7, 1.3, 0.2, parameterization='standard', s=(1, 2)),
      stax.Relu(),
      stax.Dense(3, 1.1, 0.1, parameterization='standard', s=(2, 1)))


def _standard_s23_network():
  return stax.serial(
      stax.Dense(7, 1.3, 0.2, parameterization='standard'),
      stax.Relu(),
      stax.Dense(3, 1.1, 0.1, parameterization='standard', s=(2, 3)))


class CompatTest(parameterized.TestCase):
  """Each case of `shared/compat/README.md` against the published outputs."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.ref = upstream_reference.load()

  def assert_close(self, actual, name, rtol):
    desired = self.ref[name]
    actual = np.asarray(actual)
    self.assertEqual(actual.shape, desired.shape, name)
    np.testing.assert_allclose(
        actual, desired, rtol=rtol,
        atol=rtol * float(np.max(np.abs(desired))), err_msg=name)

  def assert_kernels(self, kernel_fn, case, x1, x2, **kwargs):
    same = kernel_fn(x1, None, ('nngp', 'ntk'), **kwargs)
    diff = kernel_fn(x1, x2, ('nngp', 'ntk'), **kwargs)
    for suffix, kernels in (('same', same), ('diff', diff)):
      self.assert_close(kernels.nngp, f'{case}/nngp_{suffix}', _KERNEL_RTOL)
      self.assert_close(kernels.ntk, f'{case}/ntk_{suffix}', _KERNEL_RTOL)

  @parameterized.named_parameters(
      ('standard_s', _standard_s_network),
      ('standard_s23', _standard_s23_network))
  def test_standard_parameterization_kernels(self, network):
    case = network.__name__[1:-len('_network')]
    _, _, kernel_fn = network()
    self.assert_kernels(kernel_fn, case, self.ref['x1'], self.ref['x2'])

  def test_standard_parameterization_param_shapes(self):
    init_fn, _, _ = _standard_s_network()
    _, params = init_fn(jax.random.PRNGKey(3), self.ref['x1'].shape)
    shapes = [np.shape(p) for p in jax.tree_util.tree_leaves(params)]
    self.assertEqual(shapes,
                     [self.ref[f'standard_s/param{i}'].shape for i in range(4)])

  def test_standard_parameterization_apply(self):
    init_fn, apply_fn, _ = _standard_s_network()
    _, params = init_fn(jax.random.PRNGKey(3), self.ref['x1'].shape)
    treedef = jax.tree_util.tree_structure(params)
    stored = jax.tree_util.tree_unflatten(
        treedef, [jnp.asarray(self.ref[f'standard_s/param{i}'])
                  for i in range(4)])
    self.assert_close(apply_fn(stored, self.ref['x1']), 'standard_s/apply',
                      _KERNEL_RTOL)

  def test_aggregate_apply(self):
    _, apply_fn, _ = stax.Aggregate()
    out = apply_fn((), self.ref['seq1'], pattern=self.ref['pattern1'])
    self.assert_close(out, 'aggregate/apply', _KERNEL_RTOL)

  def test_aggregate_network_kernels(self):
    _, _, kernel_fn = stax.serial(stax.Dense(4), stax.Aggregate(), stax.Relu(),
                                  stax.GlobalSumPool(), stax.Dense(2))
    kernels = kernel_fn(self.ref['seq1'], self.ref['seq2'], ('nngp', 'ntk'),
                        pattern=(self.ref['pattern1'], self.ref['pattern2']))
    self.assert_close(kernels.nngp, 'aggregate_net/nngp_diff', _KERNEL_RTOL)
    self.assert_close(kernels.ntk, 'aggregate_net/ntk_diff', _KERNEL_RTOL)

  def _predict_kernel_fn(self):
    _, _, kernel_fn = stax.serial(stax.Dense(1, 1.5, 0.1), stax.Relu(),
                                  stax.Dense(1))
    return kernel_fn

  @parameterized.product(get=('nngp', 'ntk'), t=(1.0, None))
  def test_gradient_descent_mse_ensemble(self, get, t):
    predict_fn = predict.gradient_descent_mse_ensemble(
        self._predict_kernel_fn(), self.ref['pred_xtr'], self.ref['pred_ytr'],
        diag_reg=1e-4)
    mean, cov = predict_fn(t, self.ref['pred_xte'], get, compute_cov=True)
    self.assert_close(mean, f'ensemble/{get}_{t}_mean', _PREDICT_RTOL)
    self.assert_close(cov, f'ensemble/{get}_{t}_cov', _PREDICT_RTOL)

  def test_gp_inference(self):
    kernel_fn = self._predict_kernel_fn()
    xtr, xte = self.ref['pred_xtr'], self.ref['pred_xte']
    predict_fn = predict.gp_inference(
        kernel_fn(xtr, None, ('nngp', 'ntk')), self.ref['pred_ytr'],
        diag_reg=1e-4)
    mean, cov = predict_fn('ntk', kernel_fn(xte, xtr, ('nngp', 'ntk')),
                           kernel_fn(xte, None, ('nngp', 'ntk')))
    self.assert_close(mean, 'gp/ntk_mean', _PREDICT_RTOL)
    self.assert_close(cov, 'gp/ntk_cov', _PREDICT_RTOL)


if __name__ == '__main__':
  absltest.main()
