"""Tests of `LayerNorm`: Monte Carlo, an independent apply_fn, representations,
masking and errors."""
from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents import stax
from neural_tangents._src.stax.masking import MaskedArray
from neural_tangents._src.utils import kernel as kernel_lib
from tests import test_utils



_inputs = test_utils.graded_inputs


def _numpy_layer_norm(x, axes, eps):
  mean = np.mean(x, axis=axes, keepdims=True)
  var = np.mean((x - mean)**2, axis=axes, keepdims=True)
  return (x - mean) / np.sqrt(var + eps)


class LayerNormTest(test_utils.NeuralTangentsTestCase):

  # One estimate in the default tier (all with NT_TEST_FULL=1); the kernel
  # map is pinned exactly by `test_kernels_are_divided_by_root_variances`.
  @parameterized.named_parameters(*test_utils.full_tier_cases(
      [('fc_channels', (3, 4), (2, 4), -1, stax.Relu)],
      [('sequence_positions_and_channels', (2, 3, 2), (1, 3, 2), (1, 2),
        stax.Gelu),
       ('image_one_spatial_axis', (1, 2, 2, 2), (1, 2, 2, 2), (-2, -1),
        stax.Erf)]))
  def test_kernel_matches_monte_carlo(self, shape1, shape2, axis, nonlin):
    def network(normalize):
      return stax.serial(
          stax.Dense(1024, W_std=1.5, b_std=0.3),
          stax.LayerNorm(axis=axis) if normalize else stax.Identity(),
          nonlin(), stax.Dense(512, W_std=1.2, b_std=0.2))

    init_fn, apply_fn, kernel_fn = network(True)
    with jax.enable_x64(False):
      x1, x2 = _inputs(shape1, shape2)
      k = kernel_fn(x1, x2, ('nngp', 'ntk'))
      nngp, ntk = test_utils.monte_carlo_kernels(
          init_fn, apply_fn, x1, x2, 48, jax.random.PRNGKey(1), batch_size=24)
      # Examples of different norms: without the normalization the kernel is
      # visibly different.
      unnormalized = network(False)[2](x1, x2, 'nngp')
    self.assertLess(test_utils.relative_error(nngp, k.nngp), test_utils.MC_TOL)
    self.assertLess(test_utils.relative_error(ntk, k.ntk), test_utils.MC_TOL)
    self.assertGreater(test_utils.relative_error(nngp, unnormalized),
                       test_utils.MC_TOL)

  # Per-position and whole-example statistics; per-position on sequences
  # and one axis of images with NT_TEST_FULL=1.
  @parameterized.named_parameters(*test_utils.full_tier_cases(
      [('fc_channels', (3, 4), (2, 4), -1),
       ('sequence_positions_and_channels', (2, 3, 2), (3, 3, 2), (1, 2))],
      [('sequence_channels', (2, 3, 2), (3, 3, 2), -1),
       ('image_one_spatial_axis', (2, 2, 3, 2), (1, 2, 3, 2), (-2, -1))]))
  def test_kernels_are_divided_by_root_variances(self, shape1, shape2, axis):
    # Inside a network (NTK != NNGP below): both kernels are those below
    # divided by `sqrt(v1 v2)`, `v` each example's variance averaged over the
    # normalized positions.
    with jax.enable_x64(True):
      x1, x2 = _inputs(shape1, shape2, np.float64)
      below = stax.serial(stax.Dense(3, W_std=1.5, b_std=0.3), stax.Relu(),
                          stax.Dense(3, W_std=1.2, b_std=0.2))
      k_below = below[2](x1, x2)
      k = stax.LayerNorm(axis=axis, eps=0.)[2](k_below)
      n_spatial = len(shape1) - 2
      axes = {a % len(shape1) for a in
              ((axis,) if isinstance(axis, int) else axis)}
      def variances(cov):  # (N, S_1, S_1', ...) -> (N, S_1, ...)
        v = np.asarray(cov)
        for _ in range(n_spatial):
          v = np.diagonal(v, axis1=1, axis2=2)  # moved last
        for i in range(n_spatial):  # mean over normalized positions
          if 1 + i in axes:
            v = np.mean(v, axis=1 + i, keepdims=True)
        return v
      v1, v2 = variances(k_below.cov1), variances(k_below.cov2)
      # `sqrt(v1 v2)` in the (N1, N2, S_1, S_1', ...) layout.
      order = [0, 1]
      for i in range(n_spatial):
        order += [2 + i, 2 + n_spatial + i]
      v1 = v1.reshape(v1.shape[:1] + (1,) + v1.shape[1:] + (1,) * n_spatial)
      v2 = v2.reshape((1,) + v2.shape[:1] + (1,) * n_spatial + v2.shape[1:])
      norm = np.sqrt(np.transpose(v1 * v2, order))
      self.assertGreater(test_utils.relative_error(k_below.ntk, k_below.nngp),
                         0.1)
      self.assertAllClose(k.nngp, np.asarray(k_below.nngp) / norm,
                          rtol=1e-10, atol=1e-12)
      self.assertAllClose(k.ntk, np.asarray(k_below.ntk) / norm, rtol=1e-10,
                          atol=1e-12)

  def test_kernel_divides_by_root_mean_variances(self):
    # Dense -> LayerNorm over (positions, channels): a closed form in numpy.
    with jax.enable_x64(True):
      x1, x2 = _inputs((2, 3, 2), (3, 3, 2), np.float64)
      _, _, kernel_fn = stax.serial(stax.Dense(5, W_std=1.3, b_std=0.4),
                                    stax.LayerNorm(axis=(1, 2), eps=0.))
      k = kernel_fn(x1, x2, ('nngp', 'ntk', 'cov1', 'cov2'))
      a, b = np.asarray(x1), np.asarray(x2)
      cov = lambda u, v: 1.69 * np.einsum('isc,jtc->ijst', u, v) / 2 + 0.16
      var = lambda u: np.mean(1.69 * np.sum(u**2, -1) / 2 + 0.16, -1)
      expected = cov(a, b) / np.sqrt(
          var(a)[:, None, None, None] * var(b)[None, :, None, None])
      self.assertAllClose(k.nngp, expected, rtol=1e-12, atol=1e-12)
      # After one Dense the NTK equals the NNGP (W and b gradients).
      self.assertAllClose(k.ntk, expected, rtol=1e-12, atol=1e-12)
      self.assertAllClose(
          k.cov1,
          np.einsum('iist->ist', cov(a, a)) / var(a)[:, None, None],
          rtol=1e-12, atol=1e-12)

  @parameterized.named_parameters(
      ('channels', (3, 4, 5), -1),
      ('positions_and_channels', (3, 4, 5), (1, 2)),
      ('image', (2, 3, 4, 5), (1, 2, 3)), ('fc', (3, 5), 1))
  def test_apply_fn_normalizes(self, shape, axis):
    _, apply_fn, _ = stax.LayerNorm(axis=axis, eps=1e-6)
    with jax.enable_x64(True):
      x = np.random.RandomState(0).randn(*shape) * 3 + 1
      out = apply_fn((), jnp.asarray(x))
      axes = (axis,) if isinstance(axis, int) else axis
      self.assertAllClose(out, _numpy_layer_norm(x, axes, 1e-6), rtol=1e-12,
                          atol=1e-12)
      self.assertAllClose(np.mean(np.asarray(out), axes), 0 * np.mean(x, axes),
                          rtol=0, atol=1e-12)

  def test_init_and_apply_shapes_agree(self):
    init_fn, apply_fn, _ = stax.serial(stax.Dense(6), stax.LayerNorm((1, 2)),
                                       stax.Dense(3))
    out_shape, params = init_fn(jax.random.PRNGKey(0), (-1, 4, 2))
    self.assertEqual(out_shape, (-1, 4, 3))
    self.assertEqual(apply_fn(params, jnp.ones((5, 4, 2))).shape, (5, 4, 3))

  @parameterized.named_parameters(
      ('fc', (3, 4), -1), ('sequence', (3, 4, 2), -1),
      ('sequence_all', (3, 4, 2), (1, 2)), ('image', (2, 3, 3, 2), (1, 3)))
  def test_representations_agree(self, shape, axis):
    x1, _ = _inputs(shape, shape)
    _, _, kernel_fn = stax.serial(stax.Dense(3, b_std=0.3),
                                  stax.LayerNorm(axis=axis), stax.Relu(),
                                  stax.Dense(3, b_std=0.1),
                                  stax.LayerNorm(axis=axis))
    full = kernel_fn(x1, x1, diagonal_batch=False)
    rev = kernel_fn(x1, x1[::-1], diagonal_batch=False)
    self.assertAllClose((rev.nngp, rev.ntk, rev.cov2),
                        (full.nngp[:, ::-1], full.ntk[:, ::-1],
                         full.cov1[::-1, ::-1]))
    diag = kernel_fn(x1, None, diagonal_spatial=True)
    spatial_diag = lambda x, n: (kernel_lib.spatial_diagonal(x, n)
                                 if len(shape) > 2 else x)
    self.assertAllClose(
        (diag.nngp, diag.ntk, diag.cov1),
        (spatial_diag(full.nngp, 2), spatial_diag(full.ntk, 2),
         kernel_lib.batch_diagonal(spatial_diag(full.cov1, 2))))
    # Normalized over channels only, every variance is 1.
    if axis == -1:
      self.assertAllClose(
          kernel_lib.batch_diagonal(spatial_diag(full.nngp, 2)),
          np.ones((shape[0],) + shape[1:-1]), rtol=1e-5, atol=1e-5)

  def test_other_layouts(self):
    # Channels first, batch second: the same kernel as the default layout.
    x1, x2 = _inputs((3, 4, 2), (2, 4, 2))
    to_cfirst = lambda x: jnp.transpose(x, (2, 0, 1))  # (C, N, S)
    _, _, kernel_fn = stax.serial(stax.Dense(3, b_std=0.3),
                                  stax.LayerNorm(axis=(1, 2)), stax.Erf())
    _, _, kernel_fn_t = stax.serial(
        stax.Dense(3, b_std=0.3, batch_axis=1, channel_axis=0),
        stax.LayerNorm(axis=(0, 2), batch_axis=1, channel_axis=0), stax.Erf())
    self.assertAllClose(kernel_fn_t(to_cfirst(x1), to_cfirst(x2)),
                        kernel_fn(x1, x2))

  @parameterized.named_parameters(('float32', np.float32),
                                  ('float64', np.float64))
  def test_zero_rows_are_finite(self, dtype):
    with jax.enable_x64(dtype == np.float64):
      x = jnp.asarray(np.stack([np.zeros(4), np.ones(4), -np.ones(4)]), dtype)
      for b_std in (0.3, None):
        _, _, kernel_fn = stax.serial(stax.Dense(2, b_std=b_std),
                                      stax.LayerNorm(), stax.Relu(),
                                      stax.Dense(2))
        k = kernel_fn(x, None, diagonal_batch=False)
        self.assertFinite(k)
        self.assertEqual(k.nngp.dtype, dtype)
      # Without a bias the zero row stays zero: 0 / sqrt(0 + eps).
      self.assertAllClose(k.nngp[0], np.zeros(3), rtol=0, atol=0)

  def test_masked_positions_are_left_out(self):
    # A masked sequence has the kernel of its unmasked part.
    x = np.random.RandomState(0).randn(2, 5, 3)
    x[1, 3:] = 0.
    mask = np.zeros((2, 5, 1), bool)
    mask[1, 3:] = True
    init_fn, apply_fn, kernel_fn = stax.serial(
        stax.Dense(8, b_std=0.3), stax.LayerNorm(axis=(1, 2)), stax.Erf())
    masked = MaskedArray(jnp.asarray(x, jnp.float32), jnp.asarray(mask))
    k = kernel_fn(masked, None, 'nngp')
    short = kernel_fn(jnp.asarray(x[1:, :3], jnp.float32), None, 'nngp')
    self.assertAllClose(k[1, 1, :3, :3], short[0, 0])
    self.assertAllClose(k[1, 1, 3:], np.zeros((2, 5)), rtol=0, atol=0)
    _, params = init_fn(jax.random.PRNGKey(0), (-1, 5, 3))
    out = apply_fn(params, masked)
    short_out = apply_fn(params, jnp.asarray(x[1:, :3], jnp.float32))
    self.assertAllClose(out.masked_value[1, :3], short_out[0])

  @parameterized.named_parameters(
      ('no_channel_axis', lambda: stax.LayerNorm(axis=1), (2, 3, 4),
       'axis.*channel'),
      ('batch_axis', lambda: stax.LayerNorm(axis=(0, 2)), (2, 3, 4),
       'axis.*batch'),
      ('out_of_range', lambda: stax.LayerNorm(axis=3), (2, 3, 4), 'axis'),
      ('layout', lambda: stax.LayerNorm(channel_axis=1), (2, 3, 4),
       'channel_axis'),
  )
  def test_invalid_axis_raises(self, make, shape, message):
    _, _, kernel_fn = stax.serial(stax.Dense(2), make())
    with self.assertRaisesRegex(ValueError, message):
      kernel_fn(jnp.ones(shape), None)

  def test_non_gaussian_input_raises(self):
    for layers in ([stax.LayerNorm()], [stax.Dense(2), stax.Relu(),
                                        stax.LayerNorm()]):
      _, _, kernel_fn = stax.serial(*layers)
      with self.assertRaisesRegex(ValueError, 'LayerNorm.*Gaussian.*Dense'):
        kernel_fn(jnp.ones((2, 3)), None)

  def test_invalid_arguments_raise(self):
    with self.assertRaisesRegex(TypeError, 'axis'):
      stax.LayerNorm(axis='channels')
    with self.assertRaisesRegex(TypeError, 'axis'):
      stax.LayerNorm(axis=())
    with self.assertRaisesRegex(ValueError, 'eps.*-1'):
      stax.LayerNorm(eps=-1.)


class LayerNormMagnitudeTest(parameterized.TestCase):
  """Issue 21 items 3 and 12: LayerNorm at large inputs in float32."""

  def test_scale_invariant_for_huge_inputs(self):
    kernel_fn = stax.serial(stax.Dense(8), stax.LayerNorm(), stax.Dense(1))[2]
    x = np.random.RandomState(0).randn(3, 4)
    want = kernel_fn(x, None, 'nngp')
    # (Not small inputs: there `eps` dominates the variance by design.)
    for c in (1e5, 1e15, 1e19):
      got = kernel_fn(x.astype(np.float32) * np.float32(c), None, 'nngp')
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6,
                                 err_msg=f'c={c}')

  @parameterized.parameters(('dense', 1e21), ('dense', 1e30),
                            ('conv', 1e19), ('conv', 1e35))
  def test_scale_invariant_past_float32_overflow(self, first, scale):
    # Issue 29 item 6: the input covariance overflows float32 (~1e40 and
    # more); it is carried scaled to `LayerNorm` (zeros or NaN before).
    if first == 'dense':
      net = stax.serial(stax.Dense(8), stax.LayerNorm(), stax.Dense(1))
      x = np.random.RandomState(0).randn(3, 4)
    else:
      net = stax.serial(stax.Conv(4, (2, 2), padding='SAME'),
                        stax.LayerNorm(axis=(1, 2, 3)), stax.Flatten(),
                        stax.Dense(1))
      x = np.random.RandomState(0).randn(3, 4, 4, 2)
    kernel_fn = jax.jit(net[2], static_argnames='get')
    want = kernel_fn(x, None, get=('nngp', 'ntk'))
    got = kernel_fn((x * scale).astype(np.float32), None, get=('nngp', 'ntk'))
    for g, w in zip(got, want):
      self.assertEqual(g.dtype, np.float32)
      np.testing.assert_allclose(np.asarray(g, np.float64), w, rtol=1e-5,
                                 atol=1e-6)

  def test_relu_layer_norm_network_finite_at_1e15(self):
    kernel_fn = stax.serial(stax.Dense(8), stax.Relu(), stax.Dense(8),
                            stax.LayerNorm(), stax.Dense(1))[2]
    x = np.random.RandomState(0).randn(3, 4)
    want = kernel_fn(x, None, ('nngp', 'ntk'))
    got = kernel_fn(x.astype(np.float32) * np.float32(1e15), None,
                    ('nngp', 'ntk'))
    np.testing.assert_allclose(got.nngp, want.nngp, rtol=1e-5, atol=1e-6)
    # The NTK of the layers below LayerNorm is divided by the variance, so
    # it is scale-invariant too.
    np.testing.assert_allclose(got.ntk, want.ntk, rtol=1e-4, atol=1e-5)


if __name__ == '__main__':
  absltest.main()
