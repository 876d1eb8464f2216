"""Tests of `Dense`, `Identity` and `Flatten`: Monte Carlo, shapes, errors."""
from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents import stax
import test_utils

jax.config.update('jax_enable_x64', True)

_MC_TOL = 0.05  # relative to the kernel's largest entry.

_inputs = test_utils.stax_inputs


class DenseTest(test_utils.NeuralTangentsTestCase):

  @parameterized.named_parameters(
      ('ntk_bias', 'ntk', 0.3),
      ('ntk_no_bias', 'ntk', None),
      ('standard_bias', 'standard', 0.3),
  )
  def test_matches_monte_carlo(self, parameterization, b_std):
    init_fn, apply_fn, kernel_fn = stax.serial(
        stax.Dense(1024, W_std=1.5, b_std=b_std,
                   parameterization=parameterization),
        stax.Relu(),
        stax.Dense(256, W_std=1.2, b_std=b_std,
                   parameterization=parameterization))
    x1, x2 = _inputs()
    nngp_err, ntk_err = test_utils.monte_carlo_errors(
        init_fn, apply_fn, kernel_fn, x1, x2)
    self.assertLess(nngp_err, _MC_TOL)
    self.assertLess(ntk_err, _MC_TOL)

  def test_single_dense_kernel_is_exact(self):
    # One Dense layer on inputs: nngp = W_std^2 x1.x2 / d + b_std^2 exactly,
    # and the NTK adds the NNGP (W and b gradients) to W_std^2 * 0.
    x1, x2 = _inputs()
    _, _, kernel_fn = stax.Dense(7, W_std=1.3, b_std=0.4)
    k = kernel_fn(x1, x2, ('nngp', 'ntk'))
    expected = 1.3**2 * x1 @ x2.T / x1.shape[1] + 0.4**2
    self.assertAllClose(k.nngp, expected)
    self.assertAllClose(k.ntk, expected)

  def test_param_layout(self):
    init_fn, apply_fn, _ = stax.Dense(5, W_std=2., b_std=0.5)
    out_shape, (W, b) = init_fn(jax.random.PRNGKey(0), (-1, 3))
    self.assertEqual(out_shape, (-1, 5))
    self.assertEqual(W.shape, (3, 5))
    self.assertEqual(b.shape, (1, 5))
    x = jnp.ones((4, 3))
    self.assertAllClose(apply_fn((W, b), x),
                        2. / np.sqrt(3) * x @ W + 0.5 * b)
    _, (_, b_none) = stax.Dense(5)[0](jax.random.PRNGKey(0), (-1, 3))
    self.assertIsNone(b_none)

  def test_channel_axis(self):
    init_fn, apply_fn, kernel_fn = stax.Dense(4, channel_axis=1, b_std=0.1)
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 5))
    out_shape, params = init_fn(jax.random.PRNGKey(1), (-1, 3, 5))
    self.assertEqual(out_shape, (-1, 4, 5))
    self.assertEqual(params[1].shape, (1, 4, 1))
    self.assertEqual(apply_fn(params, x).shape, (2, 4, 5))
    nngp = kernel_fn(x, None, 'nngp')
    expected = jnp.einsum('ich,jcg->ijhg', x, x) / 3 + 0.01
    self.assertAllClose(nngp, expected)

  @parameterized.parameters(0, -3)
  def test_nonpositive_out_dim_raises(self, out_dim):
    with self.assertRaisesRegex(ValueError, f'`out_dim`.*{out_dim}.*Dense'):
      stax.Dense(out_dim)

  def test_bad_parameterization_raises(self):
    with self.assertRaisesRegex(ValueError, '`parameterization`'):
      stax.Dense(3, parameterization='mup')


class FlattenTest(test_utils.NeuralTangentsTestCase):

  def test_matches_monte_carlo_on_images(self):
    init_fn, apply_fn, kernel_fn = stax.serial(
        stax.Dense(1024, W_std=1.5, b_std=0.2), stax.Relu(), stax.Flatten(),
        stax.Dense(256, W_std=1.1, b_std=0.1))
    x1, x2 = _inputs((2, 3, 2, 3), (2, 3, 2, 3))
    nngp_err, ntk_err = test_utils.monte_carlo_errors(
        init_fn, apply_fn, kernel_fn, x1, x2)
    self.assertLess(nngp_err, _MC_TOL)
    self.assertLess(ntk_err, _MC_TOL)

  def test_flatten_needs_only_spatial_diagonal(self):
    _, _, kernel_fn = stax.serial(stax.Dense(8), stax.Relu(), stax.Flatten(),
                                  stax.Dense(1))
    x1, x2 = _inputs((2, 4, 3), (3, 4, 3))
    full = kernel_fn(x1, x2, 'ntk')
    # The input kernel is built diagonal (cheapest), whatever is requested.
    jaxpr = jax.make_jaxpr(lambda a, b: kernel_fn(a, b, 'ntk'))(x1, x2)
    self.assertNotIn('4,4', str(jaxpr).replace(' ', ''))
    self.assertAllClose(kernel_fn(x1, x2, 'ntk', diagonal_spatial=True), full)

  @parameterized.parameters(0, 1)
  def test_shapes(self, batch_axis_out):
    init_fn, apply_fn, _ = stax.Flatten(batch_axis_out=batch_axis_out)
    x = jnp.ones((2, 3, 4))
    out_shape, params = init_fn(None, (-1, 3, 4))
    out = apply_fn(params, x)
    self.assertEqual(out.shape, (2, 12) if batch_axis_out == 0 else (12, 2))
    self.assertEqual(out_shape,
                     (-1, 12) if batch_axis_out == 0 else (12, -1))


class IdentityTest(test_utils.NeuralTangentsTestCase):

  def test_identity(self):
    init_fn, apply_fn, kernel_fn = stax.Identity()
    x1, x2 = _inputs()
    self.assertEqual(init_fn(None, (-1, 6))[0], (-1, 6))
    self.assertAllClose(apply_fn((), x1), x1)
    self.assertAllClose(kernel_fn(x1, x2, 'nngp'), x1 @ x2.T / 6)


if __name__ == '__main__':
  absltest.main()
