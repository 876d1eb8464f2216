"""Tests of `Conv`, `ConvTranspose` and `ConvLocal`.

Analytic kernels of one layer are checked against exact Jacobian
contractions (any width), on masked and unmasked inputs; one Monte Carlo
estimate of a wide float32 network per layer family
(`test_utils.monte_carlo_kernels`, all with NT_TEST_FULL=1) and the
empirical NTK as width grows check networks; the spatially diagonal
representation against the full one (and that it never builds full
covariances); `apply_fn` against `init_fn` shapes and against `jax.lax`; bad
arguments against their error messages. Monte Carlo helpers are in
`test_utils`.
"""
import functools
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from neural_tangents import stax
from neural_tangents._src.stax import convolution
from neural_tangents._src.stax import windows
from neural_tangents._src.stax.inputs import inputs_to_kernel
from neural_tangents._src.utils import kernel as kernel_lib
from neural_tangents._src.utils import row_blocks
from tests import test_utils
from tests.test_utils import assert_matches_monte_carlo
from tests.test_utils import empirical_ntk_errors
from tests.test_utils import kernels
from tests.test_utils import maybe_masked_inputs
from tests.test_utils import WIDTH


inputs = test_utils.correlated_inputs
key = test_utils.fast_key


def conv_net(layer, first, second):
  """`layer(WIDTH, **first)` -> Relu -> `layer(out_chan, **second)`."""
  return lambda out_chan: stax.serial(
      layer(WIDTH, W_std=1.5, b_std=0.3, **first), stax.Relu(),
      layer(out_chan, W_std=1.2, b_std=0.2, **second))


_1D = ((2, 7, 3), (1, 7, 3))
_2D = ((2, 5, 4, 2), (1, 5, 4, 2))


def _float32_monte_carlo(test, net, x1, x2, **kwargs):
  """`assert_matches_monte_carlo` with float32 inputs and params."""
  with jax.enable_x64(False):
    x1, x2 = (jnp.asarray(x, jnp.float32) for x in (x1, x2))
    assert_matches_monte_carlo(test, net, x1, x2, **kwargs)


def _jacobian_kernels(layer_args, x1, x2, mask_constant):
  """Exact NNGP and NTK of one linear layer on inputs, from Jacobians.

  The layer is linear in its params, so its NTK `J(x1) J(x2)^T` does not
  depend on their values; in the NTK parameterization the params are
  standard normal and the NNGP `E[f(x1) f(x2)^T]` is the same contraction,
  which the parameterization does not change.
  """
  layer, args = layer_args
  def ntk(**kwargs):
    init_fn, apply_fn, _ = layer(**dict(args, **kwargs))
    return test_utils.monte_carlo_kernels(
        init_fn, test_utils.plain_outputs(apply_fn, mask_constant), x1, x2, 1,
        key(0))[1]
  nngp = ntk(parameterization='ntk')
  return nngp, (nngp if args['parameterization'] == 'ntk' else ntk())


class ConvTest(test_utils.NeuralTangentsTestCase):

  # One representative in the default tier (all with NT_TEST_FULL=1): each
  # layer's kernel map is pinned exactly by `SingleLayerTest`.
  @parameterized.named_parameters(*test_utils.full_tier_cases(
      # Each case also names a change of padding that keeps the shapes but
      # must fail the tolerance (in the first or second layer).
      [('2d_circular_then_same_masked', _2D,
        dict(filter_shape=(3, 3), padding='CIRCULAR'),
        dict(filter_shape=(2, 3), strides=(2, 1), padding='SAME'),
        (dict(padding='SAME'), {}), True)],
      [('1d_valid_strided_then_same_masked', _1D,
        dict(filter_shape=(3,), strides=(2,), padding='VALID'),
        dict(filter_shape=(2,), padding='SAME'),
        # (CIRCULAR instead of SAME in the second layer moves the masked
        # kernel by less than the tolerance: 0.096.)
        ({}, dict(filter_shape=(3,))), True),
       ('1d_circular', _1D,
        dict(filter_shape=(3,), padding='CIRCULAR'),
        dict(filter_shape=(4,), strides=(2,), padding='CIRCULAR'),
        (dict(padding='SAME'), {}), False),
       ('2d_same_strided_then_valid', _2D,
        dict(filter_shape=(3, 2), strides=(2, 1), padding='SAME'),
        dict(filter_shape=(2, 2), strides=(1, 2), padding='VALID'),
        (dict(padding='CIRCULAR'), {}), False)]))
  def test_matches_monte_carlo(self, shapes, first, second, wrong, masked):
    x1, x2, mask_constant = maybe_masked_inputs(shapes, masked)
    wrong_net = conv_net(stax.Conv, dict(first, **wrong[0]),
                         dict(second, **wrong[1]))
    _float32_monte_carlo(self, conv_net(stax.Conv, first, second),
                         x1, x2, wrong_net=wrong_net,
                         mask_constant=mask_constant)

  @test_utils.full_tier_only  # Exact: SingleLayerTest (3D inputs).
  def test_3d_matches_monte_carlo(self):
    x1, x2 = inputs((2, 3, 3, 2, 1), (1, 3, 3, 2, 1))
    net = conv_net(stax.Conv, dict(filter_shape=(2, 2, 2), padding='SAME'),
                   dict(filter_shape=(2, 1, 2), strides=(1, 1, 2)))
    assert_matches_monte_carlo(self, net, x1, x2, n_samples=32)

  # Exact: SingleLayerTest (standard parameterization) and
  # `test_channels_first_equals_channels_last`.
  @test_utils.full_tier_only
  def test_channels_first_standard_parameterization_matches_monte_carlo(self):
    # NCHW inputs and hidden layer, an OIHW filter; the readout turns the
    # layout back to channels last for the Monte Carlo estimator.
    x1, x2 = inputs((2, 2, 4, 3), (1, 2, 4, 3))
    net = conv_net(
        stax.Conv,
        dict(filter_shape=(3, 2), padding='VALID', parameterization='standard',
             dimension_numbers=('NCHW', 'OIHW', 'NCHW')),
        dict(filter_shape=(2, 2), padding='SAME', parameterization='standard',
             dimension_numbers=('NCHW', 'HWIO', 'NHWC')))
    assert_matches_monte_carlo(self, net, x1, x2)

  @parameterized.parameters('VALID', 'SAME', 'CIRCULAR')
  def test_channels_first_equals_channels_last(self, padding):
    x1, x2 = inputs(*_2D)
    args = dict(filter_shape=(3, 2), strides=(2, 1), padding=padding,
                W_std=1.3, b_std=0.4)
    args2 = dict(args, filter_shape=(2, 2), strides=(1, 2))
    last = stax.serial(stax.Conv(3, **args), stax.Relu(),
                       stax.Conv(2, **args2))
    dn = ('NCHW', 'OIHW', 'NCHW')
    first = stax.serial(stax.Conv(3, dimension_numbers=dn, **args),
                        stax.Relu(),
                        stax.Conv(2, dimension_numbers=dn, **args2))
    nchw = lambda x: jnp.transpose(x, (0, 3, 1, 2))
    self.assertAllClose(kernels(first[2], nchw(x1), nchw(x2)),
                        kernels(last[2], x1, x2))
    # Same function: OIHW params are the HWIO ones transposed.
    shape, params = last[0](key(0), x1.shape)
    def to_nchw(param):
      if not param:  # Relu
        return param
      W, b = param
      return jnp.transpose(W, (3, 2, 0, 1)), jnp.transpose(b, (0, 3, 1, 2))

    params_nchw = [to_nchw(p) for p in params]
    self.assertAllClose(first[1](params_nchw, nchw(x1)),
                        nchw(last[1](params, x1)))
    self.assertEqual(first[0](key(0), nchw(x1).shape)[0],
                     tuple(shape[i] for i in (0, 3, 1, 2)))

  def test_circular_is_translation_equivariant(self):
    x = inputs(*_2D)[0]
    init_fn, apply_fn, _ = stax.Conv(3, (3, 2), padding='CIRCULAR', b_std=1.)
    _, params = init_fn(key(0), x.shape)
    self.assertAllClose(apply_fn(params, jnp.roll(x, (1, 2), (1, 2))),
                        jnp.roll(apply_fn(params, x), (1, 2), (1, 2)))

  def test_apply_matches_lax(self):
    x = inputs(*_2D)[0]
    init_fn, apply_fn, _ = stax.Conv(3, (3, 2), (2, 1), 'SAME', W_std=2.,
                                     b_std=0.5)
    _, (W, b) = init_fn(key(0), x.shape)
    self.assertEqual(W.shape, (3, 2, 2, 3))
    self.assertEqual(b.shape, (1, 1, 1, 3))
    expected = 2. / np.sqrt(3 * 2 * 2) * lax.conv_general_dilated(
        x, W, (2, 1), 'SAME', dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
    self.assertAllClose(apply_fn((W, b), x), expected + 0.5 * b)

  def test_single_conv_kernel_on_inputs_is_exact(self):
    # nngp'[h, h'] = W_std^2 / f sum_i <x[h + i], x'[h' + i]> / C + b_std^2.
    x1, x2 = inputs(*_1D)
    _, _, kernel_fn = stax.Conv(4, (2,), W_std=1.3, b_std=0.2)
    k = kernels(kernel_fn, x1, x2)
    cov = jnp.einsum('ahc,bgc->abhg', x1, x2) / 3
    expected = 1.3**2 * (cov[:, :, :-1, :-1] + cov[:, :, 1:, 1:]) / 2 + 0.04
    self.assertAllClose(k.nngp, expected)
    self.assertAllClose(k.ntk, expected)

  def test_diagonal_batch_false(self):
    x1, x2 = inputs(*_2D)
    _, _, kernel_fn = conv_net(
        stax.Conv, dict(filter_shape=(3, 2), padding='SAME'),
        dict(filter_shape=(2, 2)))(1)
    full = kernels(kernel_fn, x1, x2, None, diagonal_batch=False)
    diag = kernels(kernel_fn, x1, x2, None, diagonal_batch=True)
    self.assertAllClose(kernel_lib.batch_diagonal(full.cov1), diag.cov1)
    self.assertAllClose(kernel_lib.batch_diagonal(full.cov2), diag.cov2)
    self.assertAllClose(full.nngp, diag.nngp)

  def test_padding_strings_are_case_insensitive(self):
    x = inputs(*_1D)[0]
    ks = [kernels(stax.Conv(2, (3,), padding=p)[2], x, None, 'nngp')
          for p in ('same', 'Same', stax.Padding.SAME)]
    self.assertAllClose(ks[0], ks[1])
    self.assertAllClose(ks[0], ks[2])


  @parameterized.parameters(('SAME', True), ('CIRCULAR', True),
                            ('VALID', False))
  def test_blocked_window_sums_match_whole_sums(self, padding, blocked):
    # Large full covariances are window-summed in place, a block of rows at a
    # time (`row_blocks`), when the sum keeps their shape (not for 'VALID');
    # thresholds of 0 and 1 byte force one-row blocks here. The taps are
    # summed in the same order: only XLA's fusion differs.
    x = jax.random.normal(key(0), (3, 2, 5, 5, 4, 4))
    dims = [windows.conv_window(5, 3, 1, stax.Padding(padding)),
            windows.conv_window(4, 2, 1, stax.Padding(padding))]
    # A new function each time: JAX caches traces per function.
    sums = lambda: lambda x: convolution.conv_covariance(x, 2, dims, False)
    whole = jax.jit(sums())(x)
    with mock.patch.object(row_blocks, 'BLOCKED_ABOVE_BYTES', 0), \
         mock.patch.object(row_blocks, 'BLOCK_BYTES', 1):
      self.assertEqual('scan' in str(jax.make_jaxpr(sums())(x)), blocked)
      self.assertLess(test_utils.relative_error(jax.jit(sums())(x), whole),
                      1e-6)

_LAYERS = (('conv', stax.Conv), ('conv_transpose', stax.ConvTranspose),
           ('conv_local', stax.ConvLocal))


class StandardParameterizationTest(test_utils.NeuralTangentsTestCase):

  @parameterized.named_parameters(
      ('bias', 0.2, (1, 1)),
      ('no_bias', None, (1, 1)),
      ('bias_s', 0.2, (3, 2)),
      ('no_bias_s', None, (2, 3)),
  )
  def test_single_standard_conv_ntk_is_exact(self, b_std, s):
    # The NTK of one standard layer `conv(x, W) / sqrt(s0) + b` in closed
    # form: `sum_i x1[h + i] . x2[h' + i] / s0 + [1 with a bias]`, summed over
    # the filter offsets `i` of the zero-padded ('SAME') inputs. A missing
    # bias term or `s0` fails it; the Jacobian contraction agrees.
    x1, x2 = inputs(*_1D)
    init_fn, apply_fn, kernel_fn = stax.Conv(
        2, (3,), padding='SAME', W_std=1.3, b_std=b_std,
        parameterization='standard', s=s)
    k = kernels(kernel_fn, x1, x2)
    pad = lambda x: jnp.pad(x, ((0, 0), (1, 1), (0, 0)))
    size = x1.shape[1]
    expected = sum(
        jnp.einsum('ahc,bgc->abhg', pad(x1)[:, i:i + size],
                   pad(x2)[:, i:i + size]) for i in range(3)) / s[0]
    expected += 0. if b_std is None else 1.
    self.assertAllClose(k.ntk, expected)
    _, ntk = test_utils.monte_carlo_kernels(init_fn, apply_fn, x1, x2, 1,
                                            key(0))
    self.assertAllClose(ntk, expected)

  @parameterized.named_parameters(*_LAYERS)
  def test_params_have_width_s1_out_chan_and_nominal_fan_in(self, layer):
    # W ~ N(0, W_std^2 / (fan_in / s0)), `s1 * out_chan` output channels.
    in_chan, out_chan, s = 64, 32, (2, 3)
    init_fn, apply_fn, kernel_fn = layer(
        out_chan, (2, 2), W_std=1.5, b_std=0.5, parameterization='standard',
        s=s)
    x = inputs((2, 3, 3, in_chan), (1, 3, 3, in_chan))[0]
    out_shape, (W, b) = init_fn(key(0), x.shape)
    self.assertEqual(out_shape[-1], s[1] * out_chan)
    self.assertEqual(W.shape[-2:], (in_chan, s[1] * out_chan))
    self.assertEqual(b.shape[-1], s[1] * out_chan)
    fan_in = in_chan * 4
    self.assertAllClose(np.var(W) * fan_in / s[0] / 1.5**2, 1., rtol=0.05)
    out = apply_fn((W, b), x)
    self.assertEqual(out.shape, out_shape)
    self.assertAllClose(out - apply_fn((W, jnp.zeros_like(b)), x),
                        jnp.broadcast_to(b, out.shape))
    self.assertEqual(kernel_fn(x, None).shape1, out_shape)

  def test_conv_apply_divides_by_sqrt_s0(self):
    x = inputs(*_2D)[0]
    init_fn, apply_fn, _ = stax.Conv(3, (3, 2), padding='SAME', W_std=2.,
                                     b_std=0.5, parameterization='standard',
                                     s=(4, 1))
    _, (W, b) = init_fn(key(0), x.shape)
    expected = lax.conv_general_dilated(
        x, W, (1, 1), 'SAME', dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
    self.assertAllClose(apply_fn((W, b), x), expected / 2 + b)


class SingleLayerTest(test_utils.NeuralTangentsTestCase):
  """One layer on (masked) inputs: NNGP and NTK are exact Jacobian
  contractions (`_jacobian_kernels`), at any width."""

  @test_utils.sample_product(
      layer=dict(_LAYERS),
      padding=('VALID', 'SAME', 'CIRCULAR'),
      geometry={
          '1d_stride2': (_1D, dict(filter_shape=(3,), strides=(2,))),
          '2d': (_2D, dict(filter_shape=(3, 2), strides=(1, 2))),
          '3d': (((2, 3, 3, 2, 1), (1, 3, 3, 2, 1)),
                 dict(filter_shape=(2, 1, 2), strides=(1, 1, 2))),
      },
      # (parameterization, bias and `s`, masked inputs), coupled.
      variant={
          'ntk_bias': ('ntk', dict(b_std=0.2, s=(1, 1)), False),
          'ntk_no_bias_masked': ('ntk', dict(b_std=None, s=(1, 1)), True),
          'standard_bias_s_masked': ('standard', dict(b_std=0.2, s=(3, 2)),
                                     True),
          'standard_no_bias_s': ('standard', dict(b_std=None, s=(2, 3)),
                                 False),
      })
  def test_kernels_are_jacobian_contractions(self, layer, padding, geometry,
                                             variant):
    shapes, args = geometry
    parameterization, bias, masked = variant
    x1, x2, mask_constant = maybe_masked_inputs(shapes, masked)
    args = dict(args, out_chan=2, padding=padding, W_std=1.3, **bias)
    kwargs = dict(mask_constant=mask_constant) if masked else {}
    k = kernels(layer(parameterization=parameterization, **args)[2], x1, x2,
                **kwargs)
    nngp, ntk = _jacobian_kernels(
        (layer, dict(args, parameterization=parameterization)), x1, x2,
        mask_constant)
    self.assertAllClose(k.nngp, nngp, msg='nngp')
    self.assertAllClose(k.ntk, ntk, msg='ntk')


class NoSpatialDimensionsTest(test_utils.NeuralTangentsTestCase):

  @parameterized.named_parameters(*_LAYERS)
  def test_empty_filter_shape_is_dense(self, layer):
    # As published, `filter_shape=()` on `(N, C)` inputs is a `Dense` layer:
    # the same params (from the same key), outputs and kernels.
    x1, x2 = test_utils.stax_inputs()
    for parameterization in ('ntk', 'standard'):
      conv = layer(4, (), W_std=1.3, b_std=0.2,
                   parameterization=parameterization)
      dense = stax.Dense(4, W_std=1.3, b_std=0.2,
                         parameterization=parameterization)
      conv_shape, conv_params = conv[0](jax.random.PRNGKey(0), x1.shape)
      dense_shape, dense_params = dense[0](jax.random.PRNGKey(0), x1.shape)
      self.assertEqual(conv_shape, dense_shape)
      self.assertAllClose(conv_params, dense_params)
      self.assertAllClose(conv[1](conv_params, x1),
                          dense[1](dense_params, x1))
      self.assertAllClose(tuple(conv[2](x1, x2, ('nngp', 'ntk'))),
                          tuple(dense[2](x1, x2, ('nngp', 'ntk'))))

  def test_empty_filter_shape_rejects_strides(self):
    with self.assertRaisesRegex(
        ValueError, r'`strides`.*filter_shape=\(\).*\(2,\).*Pass strides=None'):
      stax.Conv(4, (), strides=(2,))


class ConvTransposeTest(test_utils.NeuralTangentsTestCase):

  @parameterized.named_parameters(*test_utils.full_tier_cases(
      # Masked trailing positions wrap around as zeros, as SAME padding's:
      # the wrong network changes the first filter instead.
      [('1d_circular_masked', ((2, 4, 3), (1, 4, 3)),
        dict(filter_shape=(3,), strides=(2,), padding='CIRCULAR'),
        dict(filter_shape=(3,), padding='CIRCULAR'),
        (dict(filter_shape=(2,)), {}), True)],
      [('1d_same_stride2', ((2, 4, 3), (1, 4, 3)),
        dict(filter_shape=(3,), strides=(2,), padding='SAME'),
        dict(filter_shape=(2,), padding='VALID'),
        (dict(padding='CIRCULAR'), {}), False),
       ('2d_valid_then_same', ((2, 3, 2, 2), (1, 3, 2, 2)),
        dict(filter_shape=(2, 3), strides=(2, 1), padding='VALID'),
        dict(filter_shape=(2, 2), padding='SAME'),
        ({}, dict(padding='CIRCULAR')), False)]))
  def test_matches_monte_carlo(self, shapes, first, second, wrong, masked):
    x1, x2, mask_constant = maybe_masked_inputs(shapes, masked)
    _float32_monte_carlo(
        self, conv_net(stax.ConvTranspose, first, second), x1, x2,
        wrong_net=conv_net(stax.ConvTranspose, dict(first, **wrong[0]),
                           dict(second, **wrong[1])),
        mask_constant=mask_constant)

  @parameterized.parameters('VALID', 'SAME')
  def test_apply_matches_lax_conv_transpose(self, padding):
    x = inputs(*_2D)[0]
    init_fn, apply_fn, _ = stax.ConvTranspose(3, (3, 2), (2, 3), padding)
    out_shape, (W, b) = init_fn(key(0), (-1,) + x.shape[1:])
    self.assertIsNone(b)
    out = apply_fn((W, b), x)
    expected = lax.conv_transpose(x, W, (2, 3), padding,
                                  dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
    self.assertAllClose(out, expected / np.sqrt(3 * 2 * 2))
    self.assertEqual(out_shape, (-1,) + out.shape[1:])

  def test_circular_is_same_on_periodic_inputs(self):
    # Away from the edges, CIRCULAR equals SAME; and shifting the input by one
    # position shifts the output by `stride` positions.
    x = inputs(*_1D)[0]
    circular = stax.ConvTranspose(3, (3,), (2,), 'CIRCULAR')
    same = stax.ConvTranspose(3, (3,), (2,), 'SAME')
    _, params = circular[0](key(0), x.shape)
    out = circular[1](params, x)
    self.assertEqual(out.shape, (2, 14, 3))
    self.assertAllClose(out[:, 2:-2], same[1](params, x)[:, 2:-2])
    self.assertAllClose(circular[1](params, jnp.roll(x, 1, 1)),
                        jnp.roll(out, 2, 1))


class ConvLocalTest(test_utils.NeuralTangentsTestCase):

  # Exact: SingleLayerTest; `test_2d_full_covariance_after_nonlinearity_...`
  # is the default tier's estimate of this layer.
  @test_utils.full_tier_only
  @parameterized.named_parameters(('unmasked', False), ('masked', True))
  def test_1d_matches_monte_carlo(self, masked):
    x1, x2, mask_constant = maybe_masked_inputs(_1D, masked)
    first = dict(filter_shape=(3,), padding='SAME')
    second = dict(filter_shape=(2,), strides=(2,), padding='VALID')
    # Untied readout weights have a copy per output position: vmap fewer
    # initializations at once.
    assert_matches_monte_carlo(
        self, conv_net(stax.ConvLocal, first, second), x1, x2,
        wrong_net=conv_net(stax.Conv, first, second), batch_size=4,
        mask_constant=mask_constant)

  def test_2d_full_covariance_after_nonlinearity_matches_monte_carlo(self):
    # ConvLocal's output is zero off the spatial diagonal, but a bias and a
    # nonlinearity after it are not: pooling must see the true off-diagonal.
    x1, x2 = inputs(*_2D)
    net = lambda out_chan: stax.serial(
        stax.ConvLocal(WIDTH, (2, 2), (2, 1), padding='CIRCULAR', W_std=1.5,
                       b_std=0.3),
        stax.Relu(), stax.AvgPool((2, 2), padding='SAME'),
        stax.Conv(out_chan, (1, 1), W_std=1.2, b_std=0.1))
    _float32_monte_carlo(self, net, x1, x2)

  def test_tied_weights_equal_conv(self):
    x = inputs(*_2D)[0]
    args = dict(filter_shape=(3, 2), strides=(2, 1), padding='CIRCULAR',
                W_std=1.4, b_std=0.3)
    conv = stax.Conv(4, **args)
    local = stax.ConvLocal(4, **args)
    out_shape, (W, b) = conv[0](key(0), x.shape)
    local_shape, (W_local, b_local) = local[0](key(0), x.shape)
    self.assertEqual(out_shape, local_shape)
    self.assertEqual(W_local.shape, (3, 4, 3, 2, 2, 4))
    self.assertEqual(b_local.shape, (1, 3, 4, 4))
    tied = (jnp.broadcast_to(W, W_local.shape),
            jnp.broadcast_to(b, b_local.shape))
    self.assertAllClose(local[1](tied, x), conv[1]((W, b), x))

  def test_kernel_is_zero_off_diagonal(self):
    x1, x2 = inputs(*_1D)
    _, _, kernel_fn = stax.ConvLocal(3, (3,), padding='SAME', b_std=0.1)
    k = kernels(kernel_fn, x1, x2)
    off_diagonal = (1 - jnp.eye(7)).reshape(1, 1, 7, 7)
    self.assertAllClose(k.nngp * off_diagonal, jnp.zeros_like(k.nngp))
    self.assertAllClose(k.ntk * off_diagonal, jnp.zeros_like(k.ntk))
    conv = kernels(stax.Conv(3, (3,), padding='SAME', b_std=0.1)[2], x1, x2,
                   'nngp')
    self.assertAllClose(kernel_lib.spatial_diagonal(k.nngp, 2),
                        kernel_lib.spatial_diagonal(conv, 2))


class EmpiricalNtkTest(test_utils.NeuralTangentsTestCase):

  # Conv in the default tier (all with NT_TEST_FULL=1); every layer's NTK is
  # pinned exactly by SingleLayerTest.
  @parameterized.named_parameters(*test_utils.full_tier_cases(
      [('conv', stax.Conv)],
      [('conv_transpose', stax.ConvTranspose), ('conv_local', stax.ConvLocal)]))
  def test_empirical_ntk_converges_to_analytic(self, layer):
    x1, x2 = inputs(*_2D)
    net = lambda width: stax.serial(
        layer(width, (2, 2), (2, 1), 'CIRCULAR', W_std=1.5, b_std=0.3),
        stax.Relu(), layer(1, (2, 2), padding='SAME', W_std=1.2, b_std=0.2))
    empirical_ntk_errors(self, net, x1, x2)


def _eval_init_shape(init_fn, input_shape):
  """`init_fn(key, input_shape)` with params as shapes, without computing."""
  out_shapes = []

  def init(rng):
    out_shape, params = init_fn(rng, input_shape)
    out_shapes.append(out_shape)
    return params

  params = jax.eval_shape(init, key(0))
  return out_shapes[0], params


class ShapeTest(test_utils.NeuralTangentsTestCase):

  @parameterized.product(
      layer=(stax.Conv, stax.ConvTranspose, stax.ConvLocal),
      padding=('VALID', 'SAME', 'CIRCULAR'))
  def test_apply_shape_is_init_shape(self, layer, padding):
    cases = (((2, 7, 3), (3,), (2,), None),
             ((2, 5, 4, 2), (3, 2), (2, 1), None),
             ((2, 2, 5, 4), (2, 3), (1, 2), ('NCHW', 'OIHW', 'NHWC')),
             ((1, 3, 3, 4, 2), (2, 1, 2), (1, 2, 1), None))
    for shape, filter_shape, strides, dimension_numbers in cases:
      init_fn, apply_fn, kernel_fn = layer(
          4, filter_shape, strides, padding, b_std=0.1,
          dimension_numbers=dimension_numbers)
      # Shapes only: trace, without compiling.
      out_shape, params = _eval_init_shape(init_fn, (-1,) + shape[1:])
      x = jax.ShapeDtypeStruct(shape, jnp.float32)
      out = jax.eval_shape(apply_fn, params, x)
      self.assertEqual((-1,) + out.shape[1:], out_shape, (shape, layer))
      k = jax.eval_shape(functools.partial(kernel_fn, x2=None,
                                           diagonal_spatial=True), x)
      self.assertEqual(k.shape1, out.shape)
      out_spec = (dimension_numbers[2] if dimension_numbers else
                  'N' + 'S' * (len(shape) - 2) + 'C')
      spatial = [d for a, d in zip(out_spec, out.shape) if a not in 'NC']
      self.assertEqual(k.nngp.shape, (shape[0], shape[0]) + tuple(spatial))


class ErrorTest(test_utils.NeuralTangentsTestCase):

  @parameterized.named_parameters(
      ('conv', stax.Conv), ('conv_local', stax.ConvLocal))
  def test_filter_larger_than_input_with_valid_padding(self, layer):
    init_fn, apply_fn, kernel_fn = layer(3, (6, 2))
    x = jnp.ones((2, 5, 4, 2))
    message = r'`filter_shape`=\(6, 2\).*larger than its input.*"VALID".*"SAME"'
    with self.assertRaisesRegex(ValueError, message):
      init_fn(key(0), (-1, 5, 4, 2))
    with self.assertRaisesRegex(ValueError, message):
      kernel_fn(x, None, 'nngp')
    # The same filter is fine with padding.
    self.assertEqual(layer(3, (6, 2), padding='SAME')[0](key(0), x.shape)[0],
                     (2, 5, 4, 3))

  @parameterized.named_parameters(
      ('conv', stax.Conv), ('conv_transpose', stax.ConvTranspose),
      ('conv_local', stax.ConvLocal))
  def test_strides_of_wrong_length(self, layer):
    with self.assertRaisesRegex(
        ValueError, r'`strides`.*one entry per spatial dimension.*\(2\).*'
        r'Pass 2 values'):
      layer(3, (3, 3), strides=(2,))

  @parameterized.named_parameters(
      ('conv', stax.Conv), ('conv_transpose', stax.ConvTranspose),
      ('conv_local', stax.ConvLocal))
  def test_unknown_padding(self, layer):
    with self.assertRaisesRegex(
        ValueError, r'`padding`.*"VALID", "SAME", "CIRCULAR".*\'FULL\'.*'
        r'padding="SAME"'):
      layer(3, (3,), padding='FULL')

  def test_input_rank_must_match_filter(self):
    init_fn, _, kernel_fn = stax.Conv(3, (3, 3), padding='SAME')
    with self.assertRaisesRegex(ValueError, r'rank 4.*NHWC.*\(2, 5, 3\)'):
      init_fn(key(0), (2, 5, 3))
    with self.assertRaisesRegex(ValueError, r'rank 4'):
      kernel_fn(jnp.ones((2, 5, 3)), None, 'nngp')

  def test_bad_dimension_numbers(self):
    with self.assertRaisesRegex(ValueError, r'`dimension_numbers`.*NHWC.*'
                                r'not a valid layout'):
      stax.Conv(3, (3, 3), dimension_numbers=('NHWC', 'HWIO', 'NHC'))

  def test_parameterization_is_parsed_as_dense_parses_it(self):
    x = jnp.ones((2, 4, 4, 3))
    expected = stax.Conv(2, (2, 2), parameterization='standard')[2](x, None)
    for value in ('STANDARD', stax.Parameterization.STANDARD):
      got = stax.Conv(2, (2, 2), parameterization=value)[2](x, None)
      self.assertAllClose(got, expected, rtol=0, atol=0)
    with self.assertRaisesRegex(
        ValueError, r"`parameterization='nkt'`.*\['NTK', 'STANDARD'\].*"
        r'Pass e.g. parameterization='):
      stax.ConvLocal(2, (2, 2), parameterization='nkt')

  def test_bad_filter_shape_and_out_chan(self):
    with self.assertRaisesRegex(ValueError, r'`filter_shape`.*positive ints'):
      stax.Conv(3, (3, 0))
    with self.assertRaisesRegex(ValueError, r'`out_chan`.*positive'):
      stax.Conv(0, (3, 3))
    with self.assertRaisesRegex(TypeError, r'`out_chan`.*positive int'):
      stax.Conv(2.5, (3, 3))


def _jaxpr_ndims(jaxpr) -> set[int]:
  """Ranks of every value computed in a (closed) jaxpr, sub-jaxprs included."""
  ndims = set()
  for eqn in jaxpr.eqns:
    ndims.update(len(v.aval.shape) for v in eqn.outvars)
    for param in eqn.params.values():
      for sub in (param if isinstance(param, (list, tuple)) else [param]):
        inner = getattr(sub, 'jaxpr', sub)
        if hasattr(inner, 'eqns'):
          ndims |= _jaxpr_ndims(inner)
  return ndims


class RepresentationTest(test_utils.NeuralTangentsTestCase):

  @parameterized.named_parameters(
      ('conv', stax.Conv), ('conv_transpose', stax.ConvTranspose),
      ('conv_local', stax.ConvLocal))
  def test_cnn_read_out_by_flatten_never_builds_full_covariance(self, layer):
    x1, x2 = inputs(*_2D)
    net = stax.serial(layer(3, (2, 2), padding='SAME', b_std=0.1),
                      stax.Relu(),
                      layer(3, (2, 1), (2, 1), padding='CIRCULAR'),
                      stax.Relu(), stax.Flatten(), stax.Dense(1))
    fn = lambda a, b: net[2](a, b, get=('nngp', 'ntk'))
    # Full spatial covariances of 2D activations have 6 axes, diagonal 4.
    self.assertLess(max(_jaxpr_ndims(jax.make_jaxpr(fn)(x1, x2).jaxpr)), 6)
    # Started from a full input kernel, every layer computes full covariances
    # (which the check sees) and the result is the same.
    k_in = inputs_to_kernel(x1, x2, diagonal_batch=True,
                            diagonal_spatial=False, compute_ntk=True)
    full_fn = lambda k: net[2](k, get=('nngp', 'ntk'))
    self.assertIn(6, _jaxpr_ndims(jax.make_jaxpr(full_fn)(k_in).jaxpr))
    self.assertAllClose(jax.jit(fn)(x1, x2), jax.jit(full_fn)(k_in))
    # Asking for spatially diagonal outputs of a CNN also avoids them.
    cnn = stax.serial(layer(3, (2, 2), padding='SAME', b_std=0.1),
                      stax.Relu(), layer(3, (2, 1), (2, 1), padding='VALID'))
    diag_fn = lambda a, b: cnn[2](a, b, get='ntk', diagonal_spatial=True)
    self.assertLess(max(_jaxpr_ndims(jax.make_jaxpr(diag_fn)(x1, x2).jaxpr)),
                    6)


if __name__ == '__main__':
  absltest.main()
