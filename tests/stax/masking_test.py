"""Tests of masking: `MaskedArray`, `mask_constant=`, `@supports_masking`."""
from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents import stax
from neural_tangents._src.stax import masking
from neural_tangents._src.stax import protocol
from tests import test_utils

_PAD = 7.  # Padding value, masked with `mask_constant`.


def _sequences(lengths=(4, 2, 3), max_length=5, n_chan=3, seed=1):
  """Padded sequences `(N, max_length, C)` and their `(N, L, 1)` mask."""
  x = jax.random.normal(jax.random.PRNGKey(seed),
                        (len(lengths), max_length, n_chan))
  mask = jnp.arange(max_length)[None, :, None] >= jnp.array(
      lengths)[:, None, None]
  return jnp.where(mask, _PAD, x), mask


def _values(apply_fn):
  """`apply_fn` returning the plain array behind a `MaskedArray` output."""
  def f(params, x, **kwargs):
    out = apply_fn(params, x, **kwargs)
    return out.masked_value if isinstance(out, stax.MaskedArray) else out
  return f


@stax.layer
def _Unmaskable():
  """A layer that does not declare masking support."""
  init_fn = lambda rng, input_shape: (input_shape, ())
  apply_fn = lambda params, x, **kwargs: x

  @stax.requires()
  def kernel_fn(k, **kwargs):
    return k

  return init_fn, apply_fn, kernel_fn


class MaskingTest(test_utils.NeuralTangentsTestCase):

  def test_unmask_fn_returns_zeroed_arrays(self):
    x, mask = _sequences()
    init_fn, apply_fn, _ = stax.serial(stax.Dense(4, b_std=0.5), stax.Relu())
    _, params = init_fn(jax.random.PRNGKey(0), x.shape)
    masked = apply_fn(params, x, mask_constant=_PAD)
    self.assertIsInstance(masked, stax.MaskedArray)
    unmasked = stax.unmask_fn(apply_fn)(params, x, mask_constant=_PAD)
    self.assertIsInstance(unmasked, jax.Array)
    self.assertAllClose(unmasked, jnp.where(masked.mask, 0.,
                                            masked.masked_value))
    self.assertAllClose(unmasked[1, 2:], jnp.zeros((3, 4)))
    self.assertGreater(float(jnp.abs(unmasked[1, :2]).max()), 0.)
    # Pytrees of outputs; masked entries are zeroed even if they were not;
    # plain outputs pass through.
    fanned = stax.unmask_fn(lambda: [stax.MaskedArray(jnp.ones_like(x), mask),
                                     x])()
    self.assertAllClose(fanned[0], jnp.where(mask, 0., 1.) * jnp.ones_like(x))
    self.assertIs(fanned[1], x)

  def test_masked_array_and_mask_constant_agree(self):
    x, mask = _sequences()
    _, apply_fn, kernel_fn = stax.serial(stax.Dense(16, b_std=0.3),
                                         stax.Relu(), stax.Dense(4))
    params = stax.serial(stax.Dense(16, b_std=0.3), stax.Relu(),
                         stax.Dense(4))[0](jax.random.PRNGKey(0), x.shape)[1]
    k_array = kernel_fn(stax.MaskedArray(x, mask), None)
    k_const = kernel_fn(x, None, mask_constant=_PAD)
    self.assertAllClose(k_array.nngp, k_const.nngp)
    self.assertAllClose(k_array.ntk, k_const.ntk)
    out_array = apply_fn(params, stax.MaskedArray(x, mask))
    out_const = apply_fn(params, x, mask_constant=_PAD)
    self.assertIsInstance(out_array, stax.MaskedArray)
    self.assertAllClose(out_array.masked_value, out_const.masked_value)
    np.testing.assert_array_equal(out_array.mask, out_const.mask)
    self.assertEqual(out_array.mask.shape, (3, 5, 1))

  def test_masked_entries_are_zero_and_the_rest_matches_truncation(self):
    # Masked positions: zero in outputs and kernels. Unmasked ones: exactly
    # as if the padding were not there (position-wise network).
    x, _ = _sequences(lengths=(3, 3, 3))
    init_fn, apply_fn, kernel_fn = stax.serial(
        stax.Dense(16, b_std=0.5), stax.Erf(c=0.4), stax.Dense(4, b_std=0.2))
    _, params = init_fn(jax.random.PRNGKey(0), x.shape)
    out = apply_fn(params, x, mask_constant=_PAD)
    self.assertAllClose(out.masked_value[:, 3:], jnp.zeros((3, 2, 4)))
    self.assertAllClose(out.masked_value[:, :3], apply_fn(params, x[:, :3]))
    k = kernel_fn(x, None, mask_constant=_PAD)
    k_short = kernel_fn(x[:, :3], None)
    for name in ('nngp', 'ntk'):
      full = getattr(k, name)
      self.assertAllClose(full[:, :, :3, :3], getattr(k_short, name))
      self.assertAllClose(full[:, :, 3:], jnp.zeros_like(full[:, :, 3:]))
      self.assertAllClose(full[:, :, :, 3:], jnp.zeros_like(full[:, :, :, 3:]))
    self.assertAllClose(k.cov1[:, 3:], jnp.zeros_like(k.cov1[:, 3:]))
    self.assertEqual(k.mask1.shape, (3, 5, 1))

  def test_matches_monte_carlo(self):
    x1, mask1 = _sequences(lengths=(4, 2, 5))
    x2, mask2 = _sequences(lengths=(3, 5), seed=2)
    init_fn, apply_fn, kernel_fn = stax.serial(
        stax.Dense(512, W_std=1.5, b_std=0.5), stax.Erf(c=0.5),
        stax.Dense(256, W_std=1.3, b_std=0.2))
    x1 = stax.MaskedArray(x1, mask1)
    x2 = stax.MaskedArray(x2, mask2)
    with jax.enable_x64(False):  # Inputs and params in float32.
      f32 = lambda x: stax.MaskedArray(jnp.asarray(x.masked_value,
                                                   jnp.float32), x.mask)
      nngp_err, ntk_err = test_utils.monte_carlo_errors(
          init_fn, _values(apply_fn), kernel_fn, f32(x1), f32(x2), n_nngp=128,
          n_ntk=24, batch_size=8)
    self.assertLess(nngp_err, test_utils.MC_TOL)
    self.assertLess(ntk_err, test_utils.MC_TOL)
    # The test can tell masking from none: without the mask the padding
    # (`_PAD`, large) dominates the kernel.
    k_unmasked = kernel_fn(x1.masked_value, x2.masked_value, 'nngp')
    k = kernel_fn(x1, x2, 'nngp')
    self.assertGreater(test_utils.relative_error(k_unmasked, k), 0.5)

  def test_flatten_flattens_the_mask(self):
    # As published, the output stays a `MaskedArray`, the mask flattened
    # with the activations.
    x, mask = _sequences(lengths=(3, 3, 3))
    init_fn, apply_fn, kernel_fn = stax.serial(
        stax.Dense(8, b_std=0.5), stax.Erf(c=0.5), stax.Flatten())
    _, params = init_fn(jax.random.PRNGKey(0), x.shape)
    out = apply_fn(params, x, mask_constant=_PAD)
    self.assertIsInstance(out, stax.MaskedArray)
    self.assertEqual(out.masked_value.shape, (3, 40))
    self.assertAllClose(out.masked_value.reshape(3, 5, 8)[:, 3:],
                        jnp.zeros((3, 2, 8)))
    np.testing.assert_array_equal(
        out.mask, np.repeat(np.arange(5) >= 3, 8)[None].repeat(3, 0))
    k = kernel_fn(x, None, mask_constant=_PAD)
    # Flattened zeros count among the features: 3 of 5 positions are live.
    k_short = kernel_fn(x[:, :3], None)
    self.assertAllClose(k.nngp, 3 / 5 * k_short.nngp)
    self.assertAllClose(k.ntk, 3 / 5 * k_short.ntk)

  def test_x1_masked_x2_not(self):
    x1, mask1 = _sequences(lengths=(2, 5))
    x2, _ = _sequences(lengths=(5, 5, 5), seed=2)
    _, _, kernel_fn = stax.serial(stax.Dense(8, b_std=0.1), stax.Relu(),
                                  stax.Dense(3, b_std=0.1))
    k = kernel_fn(stax.MaskedArray(x1, mask1), x2)
    self.assertIsNone(k.mask2)
    self.assertAllClose(k.nngp[0, :, 2:], jnp.zeros_like(k.nngp[0, :, 2:]))
    self.assertTrue(np.all(np.asarray(k.nngp[0, :, :2, :]) != 0))
    self.assertTrue(np.all(np.asarray(k.nngp[1]) != 0))

  @parameterized.product(diagonal_batch=[True, False],
                         diagonal_spatial=[True, False])
  def test_representations_agree(self, diagonal_batch, diagonal_spatial):
    x, mask = _sequences()
    _, _, kernel_fn = stax.serial(stax.Dense(8, b_std=0.3), stax.Erf(c=0.2),
                                  stax.Dense(3, b_std=0.1))
    x = stax.MaskedArray(x, mask)
    full = kernel_fn(x, None, diagonal_batch=False, diagonal_spatial=False)
    k = kernel_fn(x, None, diagonal_batch=diagonal_batch,
                  diagonal_spatial=diagonal_spatial)
    expected = full.cov1
    nngp = full.nngp
    if diagonal_batch:
      expected = jnp.moveaxis(jnp.diagonal(expected, 0, 0, 1), -1, 0)
    if diagonal_spatial:
      n = 1 if diagonal_batch else 2
      expected = jnp.moveaxis(jnp.diagonal(expected, 0, n, n + 1), -1, n)
      nngp = jnp.moveaxis(jnp.diagonal(nngp, 0, 2, 3), -1, 2)
    self.assertAllClose(k.cov1, expected)
    self.assertAllClose(k.nngp, nngp)

  def test_pooling_masks_or_refuses(self):
    # Global average pooling of masked sequences averages over the unmasked
    # positions, or (for a pooling layer without masking support) refuses.
    x, mask = _sequences(lengths=(3, 3, 3))
    init_fn, apply_fn, kernel_fn = stax.serial(
        stax.Dense(16, b_std=0.1), stax.Relu(), stax.GlobalAvgPool())
    masked = stax.MaskedArray(x, mask)
    if not (protocol.kernel_spec(kernel_fn).supports_masking and
            protocol.kernel_spec(stax.GlobalAvgPool()[2]).supports_masking):
      with self.assertRaisesRegex(ValueError, 'GlobalAvgPool.*mask'):
        kernel_fn(masked, None)
      return
    k = kernel_fn(masked, None, ('nngp', 'ntk'))
    k_short = kernel_fn(x[:, :3], None, ('nngp', 'ntk'))
    self.assertAllClose(k, k_short)
    _, params = init_fn(jax.random.PRNGKey(0), x.shape)
    self.assertAllClose(_values(apply_fn)(params, masked),
                        apply_fn(params, x[:, :3]))

  # Exact: pooling_test's `ExactKernelTest` (masked cases) and
  # `test_masked_average_is_over_unmasked_entries`; this file's
  # `test_matches_monte_carlo` estimates a masked network.
  @test_utils.full_tier_only
  def test_pooling_matches_monte_carlo(self):
    if not protocol.kernel_spec(stax.GlobalAvgPool()[2]).supports_masking:
      self.skipTest('`GlobalAvgPool` does not support masking.')
    x1, mask1 = _sequences(lengths=(4, 2, 5))
    x2, mask2 = _sequences(lengths=(3, 1), seed=2)
    init_fn, apply_fn, kernel_fn = stax.serial(
        stax.Dense(512, W_std=1.5, b_std=0.5), stax.Relu(),
        stax.GlobalAvgPool(), stax.Dense(256, W_std=1.3, b_std=0.2))
    x1 = stax.MaskedArray(x1, mask1)
    x2 = stax.MaskedArray(x2, mask2)
    nngp_err, ntk_err = test_utils.monte_carlo_errors(
        init_fn, _values(apply_fn), kernel_fn, x1, x2, n_nngp=128, n_ntk=24,
        batch_size=8)
    self.assertLess(nngp_err, test_utils.MC_TOL)
    self.assertLess(ntk_err, test_utils.MC_TOL)
    # Pooling zero-filled, unmasked inputs (all positions) is far off.
    zero_filled = lambda x: jnp.where(x.mask, 0., x.masked_value)
    k_zeros = kernel_fn(zero_filled(x1), zero_filled(x2), 'nngp')
    self.assertGreater(
        test_utils.relative_error(k_zeros, kernel_fn(x1, x2, 'nngp')),
        2 * test_utils.MC_TOL)

  def test_layer_without_masking_refuses_masked_inputs(self):
    x, mask = _sequences()
    _, apply_fn, kernel_fn = stax.serial(stax.Dense(4), _Unmaskable())
    params = stax.serial(stax.Dense(4), _Unmaskable())[0](
        jax.random.PRNGKey(0), x.shape)[1]
    with self.assertRaisesRegex(ValueError, '_Unmaskable.*does not support'):
      kernel_fn(stax.MaskedArray(x, mask), None)
    with self.assertRaisesRegex(ValueError, '_Unmaskable.*does not support'):
      apply_fn(params, x, mask_constant=_PAD)
    # Unmasked inputs are fine.
    self.assertEqual(kernel_fn(x, None, 'nngp').shape, (3, 3, 5, 5))

  def test_bad_masks_raise(self):
    x, mask = _sequences()
    _, _, kernel_fn = stax.Dense(4)
    with self.assertRaisesRegex(ValueError, 'mask.*rank'):
      kernel_fn(stax.MaskedArray(x, mask[..., 0]), None)
    with self.assertRaisesRegex(TypeError, 'mask.*boolean'):
      kernel_fn(stax.MaskedArray(x, mask.astype(jnp.float32)), None)

  def test_channelwise_input_mask(self):
    # A mask varying over input channels is exact for the first `Dense` (it
    # sees zeros), after which positions are masked iff all channels were.
    x = jax.random.normal(jax.random.PRNGKey(3), (2, 4, 3))
    mask = jnp.zeros(x.shape, bool).at[0, 1, 0].set(True).at[1, 2].set(True)
    init_fn, apply_fn, kernel_fn = stax.serial(stax.Dense(8, b_std=0.1),
                                               stax.Relu())
    k = kernel_fn(stax.MaskedArray(x, mask), None)
    zeroed = jnp.where(mask, 0., x)
    k_zeroed = kernel_fn(zeroed, None)
    # Only position 2 of example 1 is masked on all channels.
    expected = k_zeroed.nngp.at[1, :, 2, :].set(0.).at[:, 1, :, 2].set(0.)
    self.assertAllClose(k.nngp, expected)
    self.assertGreater(float(jnp.min(jnp.abs(k_zeroed.nngp[1, 1, 2]))), 0.)
    self.assertEqual(k.mask1.shape, (2, 4, 1))
    _, params = init_fn(jax.random.PRNGKey(0), x.shape)
    out = apply_fn(params, stax.MaskedArray(x, mask))
    np.testing.assert_array_equal(out.mask[..., 0],
                                  jnp.zeros((2, 4), bool).at[1, 2].set(True))

  def test_jit_and_pytree(self):
    x, mask = _sequences()
    masked = stax.MaskedArray(x, mask)
    leaves = jax.tree_util.tree_leaves(masked)
    self.assertLen(leaves, 2)
    _, _, kernel_fn = stax.serial(stax.Dense(4, b_std=0.1), stax.Relu())
    jitted = jax.jit(kernel_fn, static_argnames='get')
    self.assertAllClose(jitted(masked, None, get='nngp'),
                        kernel_fn(masked, None, 'nngp'))

  def test_position_mask_layout(self):
    mask = jnp.zeros((2, 1, 3, 4), bool).at[1, 0, 2].set(True)
    pm = masking.position_mask(mask, (2, 5, 3, 4), batch_axis=0,
                               channel_axis=-1)
    self.assertEqual(pm.shape, (2, 5, 3))
    self.assertTrue(bool(pm[1, 4, 2]))
    self.assertEqual(int(pm.sum()), 5)
    # Channel axis first, batch axis last.
    pm_t = masking.position_mask(jnp.transpose(mask, (3, 1, 2, 0)),
                                 (4, 5, 3, 2), batch_axis=-1, channel_axis=0)
    np.testing.assert_array_equal(pm_t, pm)


if __name__ == '__main__':
  absltest.main()
