"""Tests of `Dense`, `Identity` and `Flatten`: Monte Carlo, shapes, errors."""
from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents import stax
from tests import test_utils
from tests import upstream_reference



_inputs = test_utils.stax_inputs


def _float32_monte_carlo_errors(network, x1, x2):
  """`monte_carlo_errors` with float32 inputs and params."""
  with jax.enable_x64(False):
    x1, x2 = (jnp.asarray(x, jnp.float32) for x in (x1, x2))
    return test_utils.monte_carlo_errors(*network, x1, x2)


class DenseTest(test_utils.NeuralTangentsTestCase):

  # One estimate in the default tier (all with NT_TEST_FULL=1). Exact
  # references: `test_single_dense_kernel_is_exact`,
  # `test_single_standard_dense_ntk_is_exact` (Jacobian contraction),
  # `test_standard_parameterization_matches_reference` (two layers, `s`) and
  # elementwise_test's `test_one_hidden_layer_matches_numpy` (Dense -> Relu ->
  # Dense in closed form).
  @parameterized.named_parameters(*test_utils.full_tier_cases(
      [('ntk_bias', 'ntk', 0.3, (1, 1), (1, 1))],
      [('ntk_no_bias', 'ntk', None, (1, 1), (1, 1)),
       ('standard_bias', 'standard', 0.3, (1, 1), (1, 1)),
       # Hidden layer of 2 * 512 channels, read as 512 nominal ones.
       ('standard_s', 'standard', 0.3, (1, 2), (2, 1))]))
  def test_matches_monte_carlo(self, parameterization, b_std, s1, s2):
    width = 1024 // s1[1]
    network = stax.serial(
        stax.Dense(width, W_std=1.5, b_std=b_std,
                   parameterization=parameterization, s=s1),
        stax.Relu(),
        stax.Dense(256, W_std=1.2, b_std=b_std,
                   parameterization=parameterization, s=s2))
    nngp_err, ntk_err = _float32_monte_carlo_errors(network, *_inputs())
    self.assertLess(nngp_err, test_utils.MC_TOL)
    self.assertLess(ntk_err, test_utils.MC_TOL)

  def test_single_dense_kernel_is_exact(self):
    # One Dense layer on inputs: nngp = W_std^2 x1.x2 / d + b_std^2 exactly,
    # and the NTK adds the NNGP (W and b gradients) to W_std^2 * 0.
    x1, x2 = _inputs()
    _, _, kernel_fn = stax.Dense(7, W_std=1.3, b_std=0.4)
    k = kernel_fn(x1, x2, ('nngp', 'ntk'))
    expected = 1.3**2 * x1 @ x2.T / x1.shape[1] + 0.4**2
    self.assertAllClose(k.nngp, expected)
    self.assertAllClose(k.ntk, expected)

  @parameterized.named_parameters(
      ('bias', 0.4, (1, 1)),
      ('no_bias', None, (1, 1)),
      ('bias_s', 0.4, (2, 3)),
      ('no_bias_s', None, (3, 2)),
  )
  def test_single_standard_dense_ntk_is_exact(self, b_std, s):
    # At any width, the NTK of one standard layer `x @ W / sqrt(s0) + b` is
    # `x1 . x2 / s0 + [bias]`: compare with the explicit Jacobian contraction.
    x1, x2 = _inputs()
    init_fn, apply_fn, kernel_fn = stax.Dense(
        3, W_std=1.3, b_std=b_std, parameterization='standard', s=s)
    _, ntk = test_utils.monte_carlo_kernels(init_fn, apply_fn, x1, x2, 1,
                                            jax.random.PRNGKey(0))
    k = kernel_fn(x1, x2, ('nngp', 'ntk'))
    self.assertAllClose(k.ntk, ntk)
    self.assertAllClose(
        k.ntk, x1 @ x2.T / s[0] + (0. if b_std is None else 1.))
    self.assertAllClose(
        k.nngp, 1.3**2 * x1 @ x2.T / x1.shape[1] + (b_std or 0.)**2)

  def test_standard_params_have_width_s1_out_dim_and_nominal_fan_in(self):
    # W ~ N(0, W_std^2 / (fan_in / s0)) of shape (fan_in, s1 * out_dim).
    fan_in, out_dim, s = 512, 256, (2, 2)
    init_fn, apply_fn, kernel_fn = stax.Dense(
        out_dim, W_std=1.5, b_std=0.5, parameterization='standard', s=s)
    out_shape, (W, b) = init_fn(jax.random.PRNGKey(0), (-1, fan_in))
    self.assertEqual(out_shape, (-1, s[1] * out_dim))
    self.assertEqual(W.shape, (fan_in, s[1] * out_dim))
    self.assertEqual(b.shape, (1, s[1] * out_dim))
    self.assertAllClose(np.var(W) * fan_in / s[0] / 1.5**2, 1., rtol=0.02)
    self.assertAllClose(np.var(b) / 0.5**2, 1., rtol=0.25)
    x = jax.random.normal(jax.random.PRNGKey(1), (2, fan_in))
    self.assertAllClose(apply_fn((W, b), x), x @ W / np.sqrt(s[0]) + b)
    k = kernel_fn(x, None)
    self.assertEqual(k.shape1, (2, s[1] * out_dim))

  def test_standard_parameterization_matches_reference(self):
    # Cases `standard_s` and `standard_s23` of `upstream_reference`.
    ref = upstream_reference.load()
    x1, x2 = ref['x1'], ref['x2']
    nets = {
        'standard_s': stax.serial(
            stax.Dense(7, 1.3, 0.2, parameterization='standard', s=(1, 2)),
            stax.Relu(),
            stax.Dense(3, 1.1, 0.1, parameterization='standard', s=(2, 1))),
        'standard_s23': stax.serial(
            stax.Dense(7, 1.3, 0.2, parameterization='standard'),
            stax.Relu(),
            stax.Dense(3, 1.1, 0.1, parameterization='standard', s=(2, 3))),
    }
    for case, (init_fn, apply_fn, kernel_fn) in nets.items():
      same = kernel_fn(x1, None, ('nngp', 'ntk'))
      diff = kernel_fn(x1, x2, ('nngp', 'ntk'))
      for name, value in (('nngp_same', same.nngp), ('ntk_same', same.ntk),
                          ('nngp_diff', diff.nngp), ('ntk_diff', diff.ntk)):
        self.assertAllClose(value, ref[f'{case}/{name}'],
                            rtol=upstream_reference.RTOL, atol=0, msg=name)
    init_fn, apply_fn, _ = nets['standard_s']
    _, params = init_fn(jax.random.PRNGKey(3), x1.shape)
    stored = [ref[f'standard_s/param{i}'] for i in range(4)]
    self.assertEqual([p.shape for p in jax.tree_util.tree_leaves(params)],
                     [p.shape for p in stored])
    params = jax.tree_util.tree_unflatten(
        jax.tree_util.tree_structure(params), stored)
    self.assertAllClose(apply_fn(params, x1), ref['standard_s/apply'],
                        rtol=upstream_reference.RTOL, atol=0)

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

  @parameterized.named_parameters(
      ('int', 2, TypeError), ('length_1', (1,), ValueError),
      ('zero', (1, 0), ValueError), ('float', (1.5, 1), TypeError))
  def test_bad_s_raises(self, s, error):
    with self.assertRaisesRegex(error, r'`s` must be a pair of positive ints.*'
                                r'got .*Pass e\.g\. s=\(1, 1\)'):
      stax.Dense(3, parameterization='standard', s=s)

  def test_bad_batch_axis_out_raises(self):
    with self.assertRaisesRegex(ValueError, r'`batch_axis_out` of `Flatten` '
                                r'must be 0 or 1.*got 2\. Pass 0'):
      stax.Flatten(batch_axis_out=2)


class FlattenTest(test_utils.NeuralTangentsTestCase):

  @test_utils.full_tier_only  # Exact: test_kernels_are_position_averages.
  def test_matches_monte_carlo_on_images(self):
    network = stax.serial(
        stax.Dense(1024, W_std=1.5, b_std=0.2), stax.Relu(), stax.Flatten(),
        stax.Dense(256, W_std=1.1, b_std=0.1))
    nngp_err, ntk_err = _float32_monte_carlo_errors(
        network, *_inputs((2, 3, 2, 3), (2, 3, 2, 3)))
    self.assertLess(nngp_err, test_utils.MC_TOL)
    self.assertLess(ntk_err, test_utils.MC_TOL)

  def test_kernels_are_position_averages(self):
    # Flattened positions are independent channels: both kernels are those
    # below averaged over the pairs of equal positions.
    below = stax.serial(stax.Dense(8, W_std=1.5, b_std=0.2), stax.Relu(),
                        stax.Dense(8, W_std=1.2, b_std=0.1))
    x1, x2 = _inputs((2, 3, 2, 3), (2, 3, 2, 3))
    k_below = below[2](x1, x2, diagonal_spatial=True)
    k = stax.Flatten()[2](k_below)
    self.assertGreater(test_utils.relative_error(k_below.ntk, k_below.nngp),
                       0.1)
    self.assertAllClose(k.nngp, jnp.mean(k_below.nngp, (2, 3)))
    self.assertAllClose(k.ntk, jnp.mean(k_below.ntk, (2, 3)))

  def test_flatten_needs_only_spatial_diagonal(self):
    _, _, kernel_fn = stax.serial(stax.Dense(8), stax.Relu(), stax.Flatten(),
                                  stax.Dense(1))
    x1, x2 = _inputs((2, 4, 3), (3, 4, 3))
    full = kernel_fn(x1, x2, 'ntk')
    # The input kernel is built diagonal (cheapest), whatever is requested.
    jaxpr = jax.make_jaxpr(lambda a, b: kernel_fn(a, b, 'ntk'))(x1, x2)
    self.assertNotIn('4,4', str(jaxpr).replace(' ', ''))
    self.assertAllClose(kernel_fn(x1, x2, 'ntk', diagonal_spatial=True), full)

  @parameterized.parameters((0, 0, -1), (1, 1, 0))
  def test_kernel_axes(self, batch_axis_out, batch_axis, channel_axis):
    # As published: batch axis 0 and channel axis -1 unless
    # `batch_axis_out=1` (then the channel axis is the other one, 0).
    _, _, kernel_fn = stax.serial(stax.Dense(3), stax.Flatten(
        batch_axis_out=batch_axis_out))
    x1, x2 = _inputs((2, 4, 3), (3, 4, 3))
    k = kernel_fn(x1, x2)
    self.assertEqual((k.batch_axis, k.channel_axis), (batch_axis, channel_axis))
    self.assertEqual(k.shape1, (2, 12) if batch_axis_out == 0 else (12, 2))

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


class OverflowTest(parameterized.TestCase):
  """Issue 21 item 3: an overflowing kernel is inf, never finite garbage."""

  @parameterized.parameters(None, 0.1)
  def test_deep_relu_network_float32(self, b_std):
    dense, relu = stax.Dense(64, W_std=3., b_std=b_std), stax.Relu()
    x = np.random.RandomState(0).randn(3, 4)
    for depth in (40, 60):
      kernel_fn = stax.serial(*[dense, relu] * depth, stax.Dense(1))[2]
      want = np.asarray(kernel_fn(x, None, 'nngp'))  # float64
      got = np.asarray(kernel_fn(x.astype(np.float32), None, 'nngp'),
                       np.float64)
      finite = np.abs(want) < np.finfo(np.float32).max / 2
      # 40 layers: ~1e26, representable (float32 gave all zeros before); 60
      # layers: ~1e39, beyond float32.
      self.assertEqual(np.all(finite), depth == 40)
      np.testing.assert_allclose(got[finite], want[finite], rtol=1e-4)
      self.assertTrue(np.all(np.isinf(got[~finite])), got)

  def test_dense_hyperparameters_must_be_numbers(self):
    with self.assertRaisesRegex(TypeError, r"`W_std` of `Dense`.*'1'.*W_std=1"):
      stax.Dense(4, W_std='1')
    with self.assertRaisesRegex(TypeError, r'`b_std` of `Dense`.*or None'):
      stax.Dense(4, b_std='0.1')
    stax.Dense(4, W_std=np.float32(2.), b_std=jnp.array(0.1))  # accepted


if __name__ == '__main__':
  absltest.main()
