"""Tests of `GlobalSelfAttention`: Monte Carlo, masking, shapes, errors."""
from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

import neural_tangents as nt
from neural_tangents import stax
from neural_tangents._src.stax import attention
from tests import test_utils

# NTK estimates use fewer samples (Jacobians are costly), so are noisier.
_NTK_MC_TOL = 0.07
_WIDTH = 512


def _exp_decay(d):
  return jnp.exp(-d / 2)


def _inputs(two_d: bool):
  shape1, shape2 = (((2, 2, 3, 3), (2, 2, 3, 3)) if two_d else
                    ((3, 4, 3), (2, 4, 3)))
  return test_utils.random_inputs(shape1, shape2)


def _attention(n_heads=1, n_chan_out=256, **kwargs):
  """Attention of total key / value width `_WIDTH` split over the heads."""
  width = _WIDTH // n_heads
  return stax.GlobalSelfAttention(n_chan_out, width, width, n_heads, **kwargs)


def _network(hidden: bool, **kwargs):
  """Attention on raw inputs, or after a wide hidden layer (`hidden`): a
  summed positional embedding has as many channels as the attention's
  inputs, which must then be wide."""
  layers = [stax.Dense(_WIDTH, W_std=1.5), stax.Relu()] if hidden else []
  return stax.serial(*layers, _attention(**kwargs))


# name, 2D inputs, hidden layer, layer kwargs, a wrong variant's kwargs,
# (NNGP samples, NTK samples). The default tier covers each mechanism, each
# positional embedding, both scalings, 1D and 2D inputs and a hidden layer;
# the rest (`_MC_FULL_CASES`) run with NT_TEST_FULL=1. (Several heads of
# SOFTMAX after a hidden layer: `test_different_spatial_sizes_read_out_by_
# pooling` too.)
_MC_FULL_CASES = (
    ('softmax_hidden', False, True,
     dict(n_heads=2, W_out_std=1.2, b_std=0.1),
     dict(n_heads=2, W_out_std=1.2, b_std=0.1, attention_mechanism='IDENTITY'),
     (128, 24)),
    # Gaussian logits: noisier estimates, more heads and samples.
    ('sqrt_identity_concat', False, False,
     dict(linear_scaling=False, attention_mechanism='IDENTITY', n_heads=64,
          pos_emb_type='CONCAT', n_chan_pos_emb=_WIDTH, val_pos_emb=True),
     dict(linear_scaling=False, attention_mechanism='IDENTITY', n_heads=64),
     (256, 32)),
    ('sqrt_relu', False, False,
     dict(linear_scaling=False, attention_mechanism='RELU', n_heads=32),
     dict(linear_scaling=False, attention_mechanism='ABS', n_heads=32),
     (512, 128)),
)
_MC_CASES = (
    ('identity_2d', True, False,
     dict(attention_mechanism='IDENTITY', W_key_std=0.8),
     dict(attention_mechanism='RELU', W_key_std=0.8), (128, 24)),
    ('abs', False, False,
     dict(attention_mechanism='ABS', W_query_std=2.),
     dict(attention_mechanism='IDENTITY', W_query_std=2.), (128, 24)),
    ('relu', False, False,
     dict(attention_mechanism='RELU', W_value_std=1.5, b_std=0.2),
     dict(attention_mechanism='ABS', W_value_std=1.5, b_std=0.2), (128, 24)),
    ('softmax_sum_decay', False, True,
     dict(pos_emb_type='SUM', pos_emb_decay_fn=_exp_decay, W_pos_emb_std=1.5),
     dict(pos_emb_type='SUM', W_pos_emb_std=1.5), (128, 24)),
    ('softmax_concat_values_2d', True, False,
     dict(pos_emb_type='CONCAT', n_chan_pos_emb=_WIDTH,
          pos_emb_decay_fn=_exp_decay, val_pos_emb=True, pos_emb_p_norm=1),
     dict(pos_emb_type='CONCAT', n_chan_pos_emb=_WIDTH,
          pos_emb_decay_fn=_exp_decay, pos_emb_p_norm=1), (128, 24)),
    ('sqrt_abs_2d', True, False,
     dict(linear_scaling=False, attention_mechanism='ABS', n_heads=32),
     dict(linear_scaling=False, attention_mechanism='IDENTITY', n_heads=32),
     (512, 0)),
)


class AttentionMonteCarloTest(test_utils.NeuralTangentsTestCase):

  @parameterized.named_parameters(
      *test_utils.full_tier_cases(_MC_CASES, _MC_FULL_CASES))
  def test_matches_monte_carlo(self, two_d, hidden, kwargs, wrong_kwargs,
                               n_samples):
    x1, x2 = _inputs(two_d)
    init_fn, apply_fn, kernel_fn = _network(hidden, **kwargs)
    n_nngp, n_ntk = n_samples
    key = jax.random.PRNGKey(0)
    k = kernel_fn(x1, x2, ('nngp', 'ntk'))
    nngp, _ = test_utils.monte_carlo_kernels(
        init_fn, apply_fn, x1, x2, n_nngp, key, compute_ntk=False,
        batch_size=64)
    self.assertLess(test_utils.relative_error(nngp, k.nngp), test_utils.MC_TOL)
    wrong = _network(hidden, **wrong_kwargs)[2](x1, x2, ('nngp', 'ntk'))
    # The estimate tells the right kernel from a plausible wrong one.
    self.assertGreater(test_utils.relative_error(nngp, wrong.nngp),
                       2 * test_utils.MC_TOL)
    if n_ntk:
      _, ntk = test_utils.monte_carlo_kernels(init_fn, apply_fn, x1, x2,
                                              n_ntk, key, batch_size=8)
      self.assertLess(test_utils.relative_error(ntk, k.ntk), _NTK_MC_TOL)
      self.assertGreater(test_utils.relative_error(ntk, wrong.ntk),
                         2 * test_utils.MC_TOL)

  def test_masked_matches_monte_carlo(self):
    x1, x2 = _inputs(False)
    mask1 = jnp.zeros((3, 4, 1), bool).at[0, 3:].set(True).at[2, 1:].set(True)
    mask2 = jnp.zeros((2, 4, 1), bool).at[1, 2:].set(True)
    x1 = stax.MaskedArray(x1, mask1)
    x2 = stax.MaskedArray(x2, mask2)
    init_fn, apply_fn, kernel_fn = _network(
        False, attention_mechanism='SOFTMAX', b_std=0.3)
    values = lambda p, x, **kw: apply_fn(p, x, **kw).masked_value
    nngp_err, ntk_err = test_utils.monte_carlo_errors(
        init_fn, values, kernel_fn, x1, x2, n_nngp=128, n_ntk=24,
        batch_size=8)
    self.assertLess(nngp_err, test_utils.MC_TOL)
    self.assertLess(ntk_err, test_utils.MC_TOL)
    k = kernel_fn(x1, x2, 'nngp')
    self.assertAllClose(k[0, :, 3], jnp.zeros_like(k[0, :, 3]))
    unmasked = kernel_fn(x1.masked_value, x2.masked_value, 'nngp')
    self.assertGreater(test_utils.relative_error(unmasked, k),
                       2 * test_utils.MC_TOL)


  def test_different_spatial_sizes_read_out_by_pooling(self):
    # Issue 21 item 9: x1 of 4 positions and x2 of 3, read out by global
    # pooling; the kernel against a wide finite network.
    x1, x2 = test_utils.random_inputs((3, 4, 3), (2, 3, 3))
    net = lambda mechanism: stax.serial(
        stax.Dense(_WIDTH, W_std=1.5), stax.Relu(),
        _attention(n_heads=2, attention_mechanism=mechanism, b_std=0.1),
        stax.GlobalAvgPool())
    init_fn, apply_fn, kernel_fn = net('SOFTMAX')
    k = kernel_fn(x1, x2, 'nngp')
    self.assertEqual(k.shape, (3, 2))
    nngp, _ = test_utils.monte_carlo_kernels(
        init_fn, apply_fn, x1, x2, 128, jax.random.PRNGKey(0),
        compute_ntk=False, batch_size=64)
    self.assertLess(test_utils.relative_error(nngp, k), test_utils.MC_TOL)
    wrong = net('IDENTITY')[2](x1, x2, 'nngp')
    self.assertGreater(test_utils.relative_error(nngp, wrong),
                       2 * test_utils.MC_TOL)
    # Positional embeddings have one spatial shape.
    with self.assertRaisesRegex(ValueError, r"different spatial shapes.*"
                                r"pos_emb_type='SUM'.*pos_emb_type='NONE'"):
      stax.serial(stax.Dense(_WIDTH), _attention(pos_emb_type='SUM'),
                  stax.GlobalAvgPool())[2](x1, x2, 'nngp')

class AttentionTest(test_utils.NeuralTangentsTestCase):

  @parameterized.named_parameters(
      ('softmax', 'SOFTMAX', True),
      ('abs', 'ABS', True),
      ('sqrt_identity', 'IDENTITY', False),
      ('sqrt_relu', 'RELU', False),
  )
  def test_masked_equals_truncated(self, mechanism, linear_scaling):
    # Masked keys are ignored: padded-and-masked sequences give the kernel
    # and outputs of the unpadded ones, and zero at the padding.
    x = jax.random.normal(jax.random.PRNGKey(3), (2, 3, 2))
    padded = jnp.concatenate([x, jnp.full((2, 2, 2), 5.)], axis=1)
    init_fn, apply_fn, kernel_fn = stax.serial(
        stax.Dense(8, b_std=0.2), stax.Relu(),
        stax.GlobalSelfAttention(
            8, 4, 4, 2, linear_scaling=linear_scaling,
            attention_mechanism=mechanism, b_std=0.3, pos_emb_type='SUM',
            pos_emb_decay_fn=_exp_decay),
        stax.Dense(3))
    k = kernel_fn(padded, None, ('nngp', 'ntk'), mask_constant=5.)
    k_short = kernel_fn(x, None, ('nngp', 'ntk'))
    self.assertAllClose(k.nngp[:, :, :3, :3], k_short.nngp)
    self.assertAllClose(k.ntk[:, :, :3, :3], k_short.ntk)
    self.assertAllClose(k.nngp[:, :, 3:], jnp.zeros((2, 2, 2, 5)))
    # Finite network (without positional embeddings, whose params depend on
    # the length).
    init_fn, apply_fn, _ = stax.serial(
        stax.Dense(8, b_std=0.2), stax.Relu(),
        stax.GlobalSelfAttention(8, 4, 4, 2, linear_scaling=linear_scaling,
                                 attention_mechanism=mechanism, b_std=0.3))
    _, params = init_fn(jax.random.PRNGKey(0), x.shape)
    out = apply_fn(params, padded, mask_constant=5.)
    self.assertIsInstance(out, stax.MaskedArray)
    self.assertAllClose(out.masked_value[:, :3], apply_fn(params, x))
    self.assertAllClose(out.masked_value[:, 3:], jnp.zeros((2, 2, 8)))

  @parameterized.named_parameters(
      ('linear', dict()),
      ('sqrt_relu', dict(linear_scaling=False, attention_mechanism='RELU')),
      ('concat', dict(pos_emb_type='CONCAT', n_chan_pos_emb=3,
                      val_pos_emb=True)),
  )
  def test_representations_agree(self, kwargs):
    x1, x2 = _inputs(True)
    _, _, kernel_fn = stax.serial(stax.Dense(8, b_std=0.1), stax.Relu(),
                                  stax.GlobalSelfAttention(8, 4, 4, 2,
                                                           **kwargs),
                                  stax.Relu())
    full = kernel_fn(x1, x2, diagonal_batch=False)
    diag = kernel_fn(x1, x2, diagonal_batch=True, diagonal_spatial=True)
    self.assertAllClose(diag.nngp, jnp.einsum('nmaabb->nmab', full.nngp))
    self.assertAllClose(diag.ntk, jnp.einsum('nmaabb->nmab', full.ntk))
    self.assertAllClose(diag.cov1, jnp.einsum('nnaabb->nab', full.cov1))
    self.assertAllClose(diag.cov2, jnp.einsum('nnaabb->nab', full.cov2))
    # `x2=None` is the same as `x2=x1`, up to the arc-cosine's rounding on
    # the batch diagonal: with `x2=None` its correlation is exactly 1, with an
    # explicit `x2=x1` it is 1 - eps, whose angle ~ sqrt(eps) (~1e-8 in
    # float64).
    same = kernel_fn(x1, None)
    other = kernel_fn(x1, x1)
    rtol = max(1e-7, test_utils.tolerance(x1.dtype))
    self.assertAllClose(same.nngp, other.nngp, rtol=rtol, atol=rtol)
    self.assertAllClose(same.ntk, other.ntk, rtol=rtol, atol=rtol)

  @parameterized.named_parameters(
      ('none', dict(), 3, 3, None),
      ('concat', dict(pos_emb_type='CONCAT', n_chan_pos_emb=5,
                      val_pos_emb=True), 8, 8, 5),
      ('sum_sqrt', dict(pos_emb_type='SUM', linear_scaling=False,
                        attention_mechanism='IDENTITY', b_std=0.1), 3, 3, 3),
  )
  def test_shapes_and_params(self, kwargs, c_k, c_v, c_pe):
    init_fn, apply_fn, kernel_fn = stax.GlobalSelfAttention(
        7, 4, 6, 2, channel_axis=1, batch_axis=0, **kwargs)
    x = jnp.ones((2, 3, 5, 4))  # (N, C, H, W)
    out_shape, params = init_fn(jax.random.PRNGKey(0), x.shape)
    self.assertEqual(out_shape, (2, 7, 5, 4))
    query_W, key_W, val_W, out_W, b, pos_emb = params
    linear = kwargs.get('linear_scaling', True)
    self.assertEqual(query_W is None, linear)
    if not linear:
      self.assertEqual(query_W.shape, (2, c_k, 4))
    self.assertEqual(key_W.shape, (2, c_k, 4))
    self.assertEqual(val_W.shape, (2, c_v, 6))
    self.assertEqual(out_W.shape, (12, 7))
    self.assertEqual(b is None, 'b_std' not in kwargs)
    if c_pe is None:
      self.assertIsNone(pos_emb)
    else:
      self.assertEqual(pos_emb.shape, (1, c_pe, 5, 4))
    self.assertEqual(apply_fn(params, x).shape, out_shape)
    k = kernel_fn(x, None)
    self.assertEqual(k.nngp.shape, (2, 2, 5, 5, 4, 4))
    self.assertEqual(k.shape1, out_shape)

  def test_channel_axis_layout_matches_default(self):
    x1, x2 = _inputs(True)
    kwargs = dict(pos_emb_type='SUM', pos_emb_decay_fn=_exp_decay)
    _, _, kernel_fn = stax.GlobalSelfAttention(8, 4, 4, 2, **kwargs)
    _, _, kernel_fn_t = stax.GlobalSelfAttention(8, 4, 4, 2, batch_axis=1,
                                                 channel_axis=0, **kwargs)
    to_t = lambda x: jnp.moveaxis(x, (0, -1), (1, 0))
    k = kernel_fn(x1, x2, ('nngp', 'cov1'))
    k_t = kernel_fn_t(to_t(x1), to_t(x2), ('nngp', 'cov1'))
    self.assertAllClose(k.nngp, k_t.nngp)
    self.assertAllClose(k.cov1, k_t.cov1)

  def test_errors(self):
    x = jnp.ones((2, 4, 3))
    _, _, kernel_fn = stax.GlobalSelfAttention(8, 4, 4, 1,
                                               linear_scaling=False)
    with self.assertRaisesRegex(NotImplementedError, 'softmax.*closed form'):
      kernel_fn(x, None)
    with self.assertRaisesRegex(ValueError, 'attention_mechanism'):
      stax.GlobalSelfAttention(8, 4, 4, 1, attention_mechanism='GELU')
    with self.assertRaisesRegex(ValueError, 'pos_emb_type'):
      stax.GlobalSelfAttention(8, 4, 4, 1, pos_emb_type='ROTARY')
    init_fn, _, kernel_fn = stax.GlobalSelfAttention(
        8, 4, 4, 1, pos_emb_type='SUM', n_chan_pos_emb=5)
    with self.assertRaisesRegex(ValueError, 'n_chan_pos_emb.*CONCAT'):
      init_fn(jax.random.PRNGKey(0), x.shape)
    with self.assertRaisesRegex(ValueError, 'n_chan_pos_emb.*CONCAT'):
      kernel_fn(x, None)
    # A decay whose covariance is not positive semi-definite.
    _, _, kernel_fn = stax.GlobalSelfAttention(
        8, 4, 4, 1, pos_emb_type='SUM', pos_emb_decay_fn=lambda d: d)
    with self.assertRaisesRegex(ValueError, 'pos_emb_decay_fn.*semi-definite'):
      kernel_fn(x, None)
    with self.assertRaisesRegex(ValueError, 'n_heads'):
      stax.GlobalSelfAttention(8, 4, 4, 0)

  def test_enums_are_accepted(self):
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 2))
    k_str = stax.GlobalSelfAttention(
        4, 4, 4, 1, attention_mechanism='relu', pos_emb_type='concat')[2](
            x, None, 'nngp')
    k_enum = stax.GlobalSelfAttention(
        4, 4, 4, 1, attention_mechanism=stax.AttentionMechanism.RELU,
        pos_emb_type=stax.PositionalEmbedding.CONCAT)[2](x, None, 'nngp')
    self.assertAllClose(k_str, k_enum)

  def test_abs_kernel_map_matches_sampling(self):
    # E|u||v| and E[sign(u) sign(v)] for (u, v) ~ N(0, [[q1, c], [c, q2]]).
    z = np.random.RandomState(0).randn(2, 2_000_000)
    for q1, q2, c in ((1., 2., 0.5), (0.5, 3., -1.1), (2., 2., 1.9)):
      a = np.sqrt(q1)
      u = a * z[0]
      v = c / a * z[0] + np.sqrt(q2 - c**2 / q1) * z[1]
      nngp, dot = attention._abs_kernel_map(jnp.array(q1), jnp.array(q2),
                                            jnp.array(c), True)
      np.testing.assert_allclose(nngp, np.mean(np.abs(u * v)), rtol=5e-3)
      np.testing.assert_allclose(dot, np.mean(np.sign(u * v)), atol=5e-3)


class AttentionEmpiricalNtkTest(test_utils.NeuralTangentsTestCase):

  def test_empirical_ntk_converges(self):
    if not hasattr(nt, 'empirical_ntk_fn'):
      self.skipTest('`nt.empirical_ntk_fn` is not available.')
    x1, x2 = _inputs(False)

    def network(width):
      return stax.serial(
          stax.GlobalSelfAttention(width, width, width, 1, b_std=0.1),
          stax.Relu(), stax.Dense(1))

    exact = network(1)[2](x1, x2, 'ntk')
    errors = []
    for width in (32, 1024):
      init_fn, apply_fn, _ = network(width)
      ntk_fn = nt.empirical_ntk_fn(apply_fn, trace_axes=(-1,))
      errors.append(np.mean([
          test_utils.relative_error(
              ntk_fn(x1, x2, init_fn(jax.random.PRNGKey(seed), x1.shape)[1]),
              exact) for seed in range(3)]))
    self.assertLess(errors[1], errors[0] / 2)
    self.assertLess(errors[1], 0.2)


if __name__ == '__main__':
  absltest.main()
