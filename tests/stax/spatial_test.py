"""Tests of `ImageResize`, `Index` / `Slice` and `DotGeneral`.

These layers are constant linear maps of positions, so on raw inputs their
kernel must equal, exactly, the covariance of their outputs; Monte Carlo
checks them inside wide networks.
"""
from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents import stax
from neural_tangents._src.stax import inputs
from tests import test_utils



def _inputs(spatial=(5, 4), n1=2, n2=3, n_chan=3):
  return test_utils.random_inputs((n1,) + spatial + (n_chan,),
                                  (n2,) + spatial + (n_chan,))


class _ExactMixin:
  """Checks a kernel on raw inputs against the covariance of the outputs."""

  def assertKernelIsOutputCovariance(self, layer, x1, x2, apply_kwargs1=None,
                                     apply_kwargs2=None, **kernel_kwargs):
    _, apply_fn, kernel_fn = layer
    y1 = apply_fn((), x1, **(apply_kwargs1 or {}))
    y2 = apply_fn((), x2, **(apply_kwargs2 or {}))
    # Both representations of each kind of axis, in two calls.
    for diagonal_batch, diagonal_spatial in ((True, False), (False, True)):
      k = kernel_fn(x1, x2, diagonal_batch=diagonal_batch,
                    diagonal_spatial=diagonal_spatial, **kernel_kwargs)
      expected = inputs.inputs_to_kernel(
          y1, y2, diagonal_batch=diagonal_batch,
          diagonal_spatial=diagonal_spatial, compute_ntk=True,
          batch_axis=k.batch_axis, channel_axis=k.channel_axis)
      msg = f'diagonal_batch={diagonal_batch} spatial={diagonal_spatial}'
      self.assertEqual(k.shape1, y1.shape, msg)
      self.assertEqual(k.shape2, y2.shape, msg)
      for name in ('nngp', 'cov1', 'cov2', 'ntk'):
        self.assertAllClose(getattr(k, name), getattr(expected, name),
                            rtol=1e-4, atol=1e-5, msg=f'{name} {msg}')


def _channels_last(apply_fn, channel_axis):
  """`apply_fn` with its output's channel axis moved last (for Monte Carlo)."""
  def f(params, x, **kwargs):
    return jnp.moveaxis(apply_fn(params, x, **kwargs), channel_axis, -1)
  return f


class ImageResizeTest(test_utils.NeuralTangentsTestCase, _ExactMixin):

  @parameterized.named_parameters(
      ('linear_up_down', (-1, 8, 3, -1), 'linear', True),
      ('bilinear_no_antialias', (-1, 3, 7, -1), 'bilinear', False),
      ('nearest', (-1, 7, 2, -1), 'nearest', True),
      ('cubic', (-1, 6, -1, -1), 'cubic', True),
      ('lanczos3', (-1, 3, 6, -1), 'lanczos3', True),
      ('lanczos5_keep', (-1, 5, 8, 3), 'lanczos5', True),
  )
  def test_kernel_is_output_covariance(self, shape, method, antialias):
    x1, x2 = _inputs()
    self.assertKernelIsOutputCovariance(
        stax.ImageResize(shape, method, antialias=antialias), x1, x2)

  def test_matches_monte_carlo(self):
    x1, x2 = _inputs(spatial=(3, 2), n1=2, n2=2)
    init_fn, apply_fn, kernel_fn = stax.serial(
        stax.Dense(512, W_std=1.5, b_std=0.2), stax.Relu(),
        stax.ImageResize((-1, 4, 3, -1), 'linear'),
        stax.Dense(256, W_std=1.2))
    nngp_err, ntk_err = test_utils.monte_carlo_errors(
        init_fn, apply_fn, kernel_fn, x1, x2, n_nngp=128, n_ntk=16,
        batch_size=8)
    self.assertLess(nngp_err, test_utils.MC_TOL)
    self.assertLess(ntk_err, test_utils.MC_TOL)

  def test_resizing_channels_or_batch_raises(self):
    x1, _ = _inputs()
    init_fn, apply_fn, kernel_fn = stax.ImageResize((-1, 4, 4, 6), 'linear')
    for call in (lambda: kernel_fn(x1, None),
                 lambda: apply_fn((), x1),
                 lambda: init_fn(None, x1.shape)):
      with self.assertRaisesRegex(ValueError,
                                  r'`shape`.*channel axis 3.*Pass -1'):
        call()
    _, _, kernel_fn = stax.ImageResize((4, 4, 4, -1), 'linear')
    with self.assertRaisesRegex(ValueError, r'`shape`.*batch axis'):
      kernel_fn(x1, None)
    _, _, kernel_fn = stax.ImageResize((-1, 4, -1), 'linear')
    with self.assertRaisesRegex(ValueError, '`shape` must have one entry'):
      kernel_fn(x1, None)
    with self.assertRaisesRegex(ValueError, '`method`'):
      stax.ImageResize((-1, 4, 4, -1), 'bogus')
    _, _, kernel_fn = stax.ImageResize((-1, 0, 4, -1), 'linear')
    with self.assertRaisesRegex(ValueError, r'`shape`.*\(-1, 0, 4, -1\).*'
                                r'e\.g\. `\(-1, 16, 16, -1\)`'):
      kernel_fn(x1, None)

  def test_shapes(self):
    init_fn, apply_fn, kernel_fn = stax.ImageResize((-1, 2, 9, -1), 'cubic')
    out_shape, params = init_fn(None, (-1, 5, 4, 3))
    self.assertEqual(out_shape, (-1, 2, 9, 3))
    x1, _ = _inputs()
    self.assertEqual(apply_fn(params, x1).shape, (2, 2, 9, 3))
    self.assertEqual(kernel_fn(x1, None, 'nngp').shape, (2, 2, 2, 2, 9, 9))


class IndexTest(test_utils.NeuralTangentsTestCase, _ExactMixin):

  def test_slice_helper(self):
    self.assertEqual(stax.Slice[:, 1:, ::2],
                     (slice(None), slice(1, None), slice(None, None, 2)))
    self.assertEqual(stax.Slice[..., 3], (Ellipsis, 3))

  @parameterized.named_parameters(
      ('spatial_slices', stax.Slice[:, 1:4, ::2]),
      ('spatial_int', stax.Slice[:, 2]),
      ('negative_int_ellipsis', stax.Slice[..., -1, :]),
      ('batch_slice', stax.Slice[1:]),
      ('everything', stax.Slice[::-1, 3:0:-1, 1::2, :]),
  )
  def test_kernel_is_output_covariance(self, idx):
    x1, x2 = _inputs()
    self.assertKernelIsOutputCovariance(stax.Index(idx), x1, x2)

  @parameterized.named_parameters(('inputs', ()),
                                  ('after_dense', (stax.Dense(8),)))
  def test_channel_index_is_not_implemented(self, before):
    x1, x2 = jnp.ones((2, 3)), jnp.ones((1, 3))
    init_fn, apply_fn, kernel_fn = stax.serial(
        *before, stax.Index(stax.Slice[..., 1:3]))
    _, params = init_fn(jax.random.PRNGKey(0), x1.shape)
    self.assertEqual(apply_fn(params, x1).shape[-1], 2)
    with self.assertRaisesRegex(
        NotImplementedError, r'`Index` with `idx`=.*indexes the channel axis'
        r'.*Index the inputs before calling `kernel_fn`'):
      kernel_fn(x1, x2)

  def test_matches_monte_carlo(self):
    x1, x2 = _inputs(spatial=(5,), n1=3, n2=2)
    init_fn, apply_fn, kernel_fn = stax.serial(
        stax.Dense(512, W_std=1.5, b_std=0.2), stax.Relu(),
        stax.Index(stax.Slice[:, ::2]), stax.Dense(256, W_std=1.2))
    nngp_err, ntk_err = test_utils.monte_carlo_errors(
        init_fn, apply_fn, kernel_fn, x1, x2, n_nngp=128, n_ntk=24,
        batch_size=8)
    self.assertLess(nngp_err, test_utils.MC_TOL)
    self.assertLess(ntk_err, test_utils.MC_TOL)

  def test_masked(self):
    x1, _ = _inputs()
    mask = jnp.zeros((2, 5, 4, 1), bool).at[0, 1:3].set(True)
    idx = stax.Slice[:, 1:, ::2]
    _, apply_fn, kernel_fn = stax.serial(stax.Dense(4, b_std=0.5),
                                         stax.Index(idx))
    params = stax.serial(stax.Dense(4, b_std=0.5), stax.Index(idx))[0](
        jax.random.PRNGKey(0), x1.shape)[1]
    masked = stax.MaskedArray(x1, mask)
    out = apply_fn(params, masked)
    self.assertEqual(out.mask.shape, (2, 4, 2, 1))
    np.testing.assert_array_equal(out.mask, mask[:, 1:, ::2])
    k = kernel_fn(masked, None)
    self.assertEqual(k.mask1.shape, (2, 4, 2, 1))
    _, _, kernel_fn_dense = stax.Dense(4, b_std=0.5)
    k_dense = kernel_fn_dense(masked, None)
    self.assertAllClose(k.nngp, k_dense.nngp[:, :, 1:, 1:, ::2, ::2])
    self.assertAllClose(k.nngp[0, :, :2], jnp.zeros_like(k.nngp[0, :, :2]))

  @parameterized.named_parameters(('slice', stax.Slice[:, 1:]),
                                  ('int', stax.Slice[:, 1]))
  def test_kernel_axes(self, idx):
    # The channel axis is recorded as -1 when it is last, as `Dense` does.
    k = stax.Index(idx)[2](*_inputs())
    self.assertEqual((k.batch_axis, k.channel_axis), (0, -1))

  def test_errors(self):
    x1, x2 = _inputs()
    # An int that would remove the batch or channel axis: the published
    # release's NotImplementedError, with a message that says the fix.
    for idx, axis in ((stax.Slice[0], 'batch'), (stax.Slice[-1], 'batch'),
                      (stax.Slice[..., 0], 'channel'),
                      (stax.Slice[..., 1], 'channel')):
      with self.assertRaisesRegex(NotImplementedError,
                                  rf'`idx`.*{axis} axis.*slice'):
        stax.Index(idx)[2](x1, x2)
      with self.assertRaisesRegex(NotImplementedError,
                                  rf'`idx`.*{axis} axis.*slice'):
        stax.Index(idx)[1]((), x1)
    with self.assertRaisesRegex(TypeError, '`idx`.*Slice'):
      stax.Index(stax.Slice[:, None])
    with self.assertRaisesRegex(ValueError, '`idx`.*rank'):
      stax.Index(stax.Slice[:, :, :, :, :])[2](x1, x2)
    with self.assertRaisesRegex(ValueError, r'`idx`.*at most one `\.\.\.`.*'
                                r'Spell out'):
      stax.Index(stax.Slice[..., 1:, ...])[2](x1, x2)
    with self.assertRaisesRegex(ValueError, r'`idx`=.*axis 1 of size '
                                f'{x1.shape[1]} with 99.*Pass an index in'):
      stax.Index(stax.Slice[:, 99])[2](x1, x2)

  def test_shapes(self):
    init_fn, apply_fn, _ = stax.Index(stax.Slice[:, 1, ::2])
    out_shape, params = init_fn(None, (-1, 5, 4, 3))
    self.assertEqual(out_shape, (-1, 2, 3))
    x1, _ = _inputs()
    self.assertEqual(apply_fn(params, x1).shape, (2, 2, 3))


class DotGeneralTest(test_utils.NeuralTangentsTestCase, _ExactMixin):

  @parameterized.named_parameters(
      # Inputs (N, 5, 4, C).
      ('lhs_contract_first', dict(
          lhs=(6, 5), dimension_numbers=(((1,), (1,)), ((), ())))),
      ('rhs_contract_second', dict(
          rhs=(4, 7), dimension_numbers=(((2,), (0,)), ((), ())))),
      ('rhs_contract_both', dict(
          rhs=(5, 4, 2, 3), dimension_numbers=(((1, 2), (0, 1)), ((), ())))),
      ('rhs_batch_spatial', dict(
          rhs=(4, 5, 2), dimension_numbers=(((1,), (1,)), ((2,), (0,))))),
      ('outer', dict(rhs=(2,), dimension_numbers=(((), ()), ((), ())))),
  )
  def test_kernel_is_output_covariance(self, kwargs):
    kwargs = dict(kwargs)
    for name in ('lhs', 'rhs'):
      if name in kwargs:
        kwargs[name] = jax.random.normal(jax.random.PRNGKey(7), kwargs[name])
    x1, x2 = _inputs()
    self.assertKernelIsOutputCovariance(stax.DotGeneral(**kwargs), x1, x2)

  def test_matches_monte_carlo(self):
    x1, x2 = _inputs(spatial=(5,), n1=3, n2=2)
    mix = jax.random.normal(jax.random.PRNGKey(7), (5, 3)) / 2
    # (N, 5, C) . (5, 3) -> (N, C, 3): channels move to axis 1.
    init_fn, apply_fn, kernel_fn = stax.serial(
        stax.Dense(512, W_std=1.5, b_std=0.2), stax.Relu(),
        stax.DotGeneral(rhs=mix, dimension_numbers=(((1,), (0,)), ((), ()))),
        stax.Dense(256, W_std=1.2, channel_axis=1))
    nngp_err, ntk_err = test_utils.monte_carlo_errors(
        init_fn, _channels_last(apply_fn, 1), kernel_fn, x1, x2, n_nngp=128,
        n_ntk=24, batch_size=8)
    self.assertLess(nngp_err, test_utils.MC_TOL)
    self.assertLess(ntk_err, test_utils.MC_TOL)

  def _masked_sequences(self):
    """`(N, 5, C)` sequences of lengths (5, 3) and (4,), masks `(N, 5, 1)`,
    and a `(5, 3)` map whose last output reads only positions 3 and 4."""
    x1, x2 = _inputs(spatial=(5,), n1=2, n2=1)
    lengths1, lengths2 = jnp.array([5, 3]), jnp.array([4])
    mask1 = jnp.arange(5)[None, :, None] >= lengths1[:, None, None]
    mask2 = jnp.arange(5)[None, :, None] >= lengths2[:, None, None]
    mix = jax.random.normal(jax.random.PRNGKey(7), (5, 3))
    mix = mix.at[:3, 2].set(0.)
    return (stax.MaskedArray(x1, mask1), stax.MaskedArray(x2, mask2), mix)

  def test_masked_is_zeroed_inputs(self):
    m1, m2, mix = self._masked_sequences()
    layer = stax.DotGeneral(rhs=mix, dimension_numbers=(((1,), (0,)),
                                                        ((), ())))
    _, apply_fn, kernel_fn = layer
    zeroed1 = jnp.where(m1.mask, 0., m1.masked_value)
    zeroed2 = jnp.where(m2.mask, 0., m2.masked_value)
    out = apply_fn((), m1)
    self.assertAllClose(out.masked_value, apply_fn((), zeroed1))
    # (N, C, 3): output 2 of example 1 (length 3) reads only masked inputs.
    expected_mask = jnp.zeros((2, 1, 3), bool).at[1, 0, 2].set(True)
    self.assertArraysEqual(out.mask, expected_mask)
    # A per-entry mask (from `mask_constant`) gives the same positions.
    constant = apply_fn((), jnp.where(m1.mask, 1e3, m1.masked_value),
                        mask_constant=1e3)
    self.assertArraysEqual(constant.mask,
                           jnp.broadcast_to(expected_mask, out.shape))
    self.assertAllClose(constant.masked_value, out.masked_value)
    k = kernel_fn(m1, m2)
    k_zeroed = kernel_fn(zeroed1, zeroed2)
    for name in ('nngp', 'ntk', 'cov1', 'cov2'):
      self.assertAllClose(getattr(k, name), getattr(k_zeroed, name),
                          msg=name)
    self.assertArraysEqual(k.mask1, expected_mask)
    self.assertArraysEqual(k.mask2, jnp.zeros((1, 1, 3), bool))
    self.assertKernelIsOutputCovariance(layer, zeroed1, zeroed2)

  def assertArraysEqual(self, actual, expected):
    np.testing.assert_array_equal(np.asarray(actual), np.asarray(expected))

  def test_masked_matches_monte_carlo(self):
    m1, m2, mix = self._masked_sequences()
    init_fn, apply_fn, kernel_fn = stax.serial(
        stax.Dense(512, W_std=1.5, b_std=0.2), stax.Relu(),
        stax.DotGeneral(rhs=mix / 2, dimension_numbers=(((1,), (0,)),
                                                        ((), ()))),
        stax.Dense(256, W_std=1.2, b_std=0.1, channel_axis=1))
    values = lambda params, x, **kw: apply_fn(params, x, **kw).masked_value
    nngp_err, ntk_err = test_utils.monte_carlo_errors(
        init_fn, _channels_last(values, 1), kernel_fn, m1, m2, n_nngp=128,
        n_ntk=24, batch_size=8)
    self.assertLess(nngp_err, test_utils.MC_TOL)
    self.assertLess(ntk_err, test_utils.MC_TOL)

  def test_kernel_axes(self):
    # The channel axis is recorded as -1 when it is last, as `Dense` does.
    x1, x2 = _inputs()
    lhs = stax.DotGeneral(lhs=jnp.ones((6, 5)),
                          dimension_numbers=(((1,), (1,)), ((), ())))
    rhs = stax.DotGeneral(rhs=jnp.ones((4, 7)),
                          dimension_numbers=(((2,), (0,)), ((), ())))
    for (_, _, kernel_fn), axes in ((lhs, (1, -1)), (rhs, (0, 2))):
      k = kernel_fn(x1, x2)
      self.assertEqual((k.batch_axis, k.channel_axis), axes)

  def test_no_constant_is_identity(self):
    x1, x2 = _inputs()
    k = stax.DotGeneral()[2](x1, x2)
    k_id = stax.Identity()[2](x1, x2)
    self.assertAllClose(k.nngp, k_id.nngp)
    self.assertAllClose(stax.DotGeneral()[1]((), x1), x1)

  def test_errors(self):
    x1, x2 = _inputs()
    with self.assertRaisesRegex(ValueError, r'`lhs` \(shape \(2, 5\)\).*'
                                r'`rhs` \(shape \(5, 2\)\).*not both'):
      stax.DotGeneral(lhs=jnp.ones((2, 5)), rhs=jnp.ones((5, 2)))
    _, apply_fn, kernel_fn = stax.DotGeneral(
        rhs=jnp.ones((3, 2)), dimension_numbers=(((3,), (0,)), ((), ())))
    self.assertEqual(apply_fn((), x1).shape, (2, 5, 4, 2))
    with self.assertRaisesRegex(ValueError,
                                r'`dimension_numbers`.*channel axis 3.*Dense'):
      kernel_fn(x1, x2)
    _, _, kernel_fn = stax.DotGeneral(
        lhs=jnp.ones((2,)), dimension_numbers=(((0,), (0,)), ((), ())))
    with self.assertRaisesRegex(ValueError, r'`dimension_numbers`.*batch axis'):
      kernel_fn(x1, x2[:2])

  def test_shapes(self):
    init_fn, apply_fn, _ = stax.DotGeneral(
        lhs=jnp.ones((6, 5)), dimension_numbers=(((1,), (1,)), ((), ())))
    out_shape, params = init_fn(None, (-1, 5, 4, 3))
    self.assertEqual(out_shape, (6, -1, 4, 3))
    x1, _ = _inputs()
    self.assertEqual(apply_fn(params, x1).shape, (6, 2, 4, 3))


if __name__ == '__main__':
  absltest.main()
