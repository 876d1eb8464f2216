"""Tests of `AvgPool`, `SumPool`, `GlobalAvgPool` and `GlobalSumPool`.

Pooling is a fixed linear map, so on raw inputs its kernel is exactly the
covariance of the pooled inputs, and inside networks its NNGP and NTK are the
kernels below with the pooling applied to both sides; one Monte Carlo estimate
(helpers in `test_utils`) checks a finite network, all with NT_TEST_FULL=1.
"""
from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents import stax
from neural_tangents._src.stax.masking import MaskedArray
from neural_tangents._src.utils.kernel import Kernel
from tests import test_utils
from tests.test_utils import assert_matches_monte_carlo
from tests.test_utils import empirical_ntk_errors
from tests.test_utils import kernels
from tests.test_utils import maybe_masked_inputs
from tests.test_utils import WIDTH

inputs = test_utils.correlated_inputs

_1D = ((2, 7, 3), (1, 7, 3))
_2D = ((2, 5, 4, 2), (1, 5, 4, 2))


def values(y):
  return getattr(y, 'masked_value', y)


_POOLS = (
    ('avg_1d_valid_strided', stax.AvgPool, _1D,
     dict(window_shape=(3,), strides=(2,), padding='VALID')),
    ('avg_1d_same_normalized', stax.AvgPool, _1D,
     dict(window_shape=(4,), padding='SAME', normalize_edges=True)),
    ('avg_1d_circular', stax.AvgPool, _1D,
     dict(window_shape=(3,), strides=(2,), padding='CIRCULAR')),
    ('avg_2d_same', stax.AvgPool, _2D,
     dict(window_shape=(3, 2), strides=(2, 1), padding='SAME')),
    ('avg_2d_same_normalized', stax.AvgPool, _2D,
     dict(window_shape=(3, 3), strides=(1, 2), padding='SAME',
          normalize_edges=True)),
    ('avg_2d_circular', stax.AvgPool, _2D,
     dict(window_shape=(2, 3), padding='CIRCULAR')),
    ('sum_1d_same', stax.SumPool, _1D,
     dict(window_shape=(3,), strides=(2,), padding='SAME')),
    ('sum_2d_valid', stax.SumPool, _2D,
     dict(window_shape=(2, 2), strides=(1, 2), padding='VALID')),
    ('global_avg_1d', stax.GlobalAvgPool, _1D, {}),
    ('global_avg_2d', stax.GlobalAvgPool, _2D, {}),
    ('global_sum_2d', stax.GlobalSumPool, _2D, {}),
)


class ExactKernelTest(test_utils.NeuralTangentsTestCase):
  """On raw inputs, the kernel is the covariance of the pooled inputs."""

  @parameterized.named_parameters(
      *[(name + suffix, layer, shapes, args, masked)
        for name, layer, shapes, args in _POOLS
        for suffix, masked in (('', False), ('_masked', True))])
  def test_kernel_is_covariance_of_pooled_inputs(self, layer, shapes, args,
                                                 masked):
    x1, x2, mask_constant = maybe_masked_inputs(shapes, masked)
    init_fn, apply_fn, kernel_fn = layer(**args)
    kwargs = dict(mask_constant=mask_constant)
    y1 = values(apply_fn((), x1, **kwargs))
    y2 = values(apply_fn((), x2, **kwargs))
    k = kernels(kernel_fn, x1, x2, ('nngp', 'cov1', 'cov2'), **kwargs)
    self.assertAllClose(k.nngp, test_utils.pair_covariance(y1, y2))
    # `cov1` / `cov2` keep each example's covariance with itself.
    for cov, y in ((k.cov1, y1), (k.cov2, y2)):
      full = test_utils.pair_covariance(y, y)
      self.assertAllClose(cov, jnp.stack([full[i, i] for i in range(len(y))]))
    self.assertEqual(init_fn(None, (-1,) + x1.shape[1:])[0],
                     (-1,) + y1.shape[1:])
    self.assertFinite(k)

  def test_avg_pool_matches_explicit_windows(self):
    # One dimension by hand: SAME padding of a window of 3 pads (1, 1); with
    # `normalize_edges` the edge windows average 2 entries, otherwise 3.
    x = jnp.arange(1., 5.).reshape(1, 4, 1)
    for normalize_edges, expected in ((True, [1.5, 2., 3., 3.5]),
                                      (False, [1., 2., 3., 7 / 3])):
      _, apply_fn, _ = stax.AvgPool((3,), padding='SAME',
                                    normalize_edges=normalize_edges)
      self.assertAllClose(apply_fn((), x)[0, :, 0], jnp.array(expected))
    _, apply_fn, _ = stax.AvgPool((3,), padding='CIRCULAR')
    self.assertAllClose(apply_fn((), x)[0, :, 0],
                        jnp.array([7 / 3, 2., 3., 8 / 3]))

  def test_masked_average_is_over_unmasked_entries(self):
    x = jnp.array([1., 2., 3., 4.]).reshape(1, 4, 1)
    mask = jnp.array([False, False, True, True]).reshape(1, 4, 1)
    _, apply_fn, _ = stax.AvgPool((2,), padding='VALID')
    out = apply_fn((), MaskedArray(x, mask))
    self.assertAllClose(out.masked_value[0, :, 0], jnp.array([1.5, 2., 0.]))
    self.assertEqual(out.mask[0, :, 0].tolist(), [False, False, True])
    _, apply_fn, _ = stax.GlobalAvgPool()
    out = apply_fn((), MaskedArray(x, mask))  # Published: still masked.
    self.assertAllClose(out.masked_value, jnp.array([[1.5]]))
    self.assertEqual(out.mask.tolist(), [[False]])

  @parameterized.parameters(stax.AvgPool, stax.SumPool)
  def test_channels_first_equals_channels_last(self, layer):
    x1, x2 = inputs(*_2D)
    last = layer((3, 2), (2, 1), 'SAME')
    first = layer((3, 2), (2, 1), 'SAME', batch_axis=1, channel_axis=0)
    cnhw = lambda x: jnp.transpose(x, (3, 0, 1, 2))
    self.assertAllClose(kernels(first[2], cnhw(x1), cnhw(x2)),
                        kernels(last[2], x1, x2))
    self.assertAllClose(first[1]((), cnhw(x1)), cnhw(last[1]((), x1)))
    self.assertEqual(first[0](None, (2, -1, 5, 4))[0], (2, -1, 3, 4))

  def test_global_pool_channels_first(self):
    x = inputs(*_2D)[0]
    init_fn, apply_fn, kernel_fn = stax.GlobalAvgPool(batch_axis=1,
                                                      channel_axis=0)
    cnhw = jnp.transpose(x, (3, 0, 1, 2))
    self.assertEqual(init_fn(None, (2, -1, 5, 4))[0], (2, -1))
    self.assertAllClose(apply_fn((), cnhw), jnp.mean(x, (1, 2)).T)
    self.assertAllClose(kernels(kernel_fn, cnhw, None, 'nngp'),
                        kernels(stax.GlobalAvgPool()[2], x, None, 'nngp'))


def _pool_both_sides(apply_fn, k, n_spatial):
  """A `(N1, N2, S_1, S_1', ...)` kernel with the linear map `apply_fn` of a
  pooling layer applied to the positions of each side: `P K P^T`."""
  n1, n2 = k.shape[:2]
  spatial1 = k.shape[2::2]
  spatial2 = k.shape[3::2]
  # (N1, S..., [N2, S'...]) -> pool the first side's positions.
  x = jnp.transpose(k, (0,) + tuple(range(2, 2 + 2 * n_spatial, 2)) + (1,) +
                    tuple(range(3, 3 + 2 * n_spatial, 2)))
  y = apply_fn((), x.reshape((n1,) + spatial1 + (-1,)))
  t1 = y.shape[1:-1]
  y = y.reshape((n1,) + t1 + (n2,) + spatial2)
  # (N2, S'..., [N1, T...]) -> pool the second side's positions.
  m = len(t1)
  y = jnp.transpose(y, tuple(range(m + 1, 2 * m + 2 + n_spatial - m)) +
                    tuple(range(m + 1)))
  z = apply_fn((), y.reshape((n2,) + spatial2 + (-1,)))
  t2 = z.shape[1:-1]
  z = z.reshape((n2,) + t2 + (n1,) + t1)
  # (N2, T'..., N1, T...) -> (N1, N2, T_1, T_1', ...).
  order = [m + 1, 0]
  for i in range(m):
    order += [m + 2 + i, 1 + i]
  return jnp.transpose(z, order)


_REPRESENTATIVE_POOLS = ('avg_1d_circular', 'avg_2d_same_normalized',
                         'sum_2d_valid', 'global_avg_1d', 'global_sum_2d')


class KernelOfPooledNetworkTest(test_utils.NeuralTangentsTestCase):
  """Pooling is linear: after it, the NNGP and the NTK are those before it
  with the pooling applied to the positions of each side."""

  # Each kind of pooling, padding and dimension (every pooling with
  # NT_TEST_FULL=1); `ExactKernelTest` checks each on raw inputs.
  @parameterized.named_parameters(*test_utils.full_tier_cases(
      [p[:4] for p in _POOLS if p[0] in _REPRESENTATIVE_POOLS],
      [p[:4] for p in _POOLS if p[0] not in _REPRESENTATIVE_POOLS]))
  def test_kernels_are_pooled_kernels_below(self, layer, shapes, args):
    x1, x2 = inputs(*shapes)
    n_spatial = len(shapes[0]) - 2
    below = stax.serial(stax.Dense(3, W_std=1.5, b_std=0.3), stax.Relu(),
                        stax.Dense(3, W_std=1.2, b_std=0.2))
    pool = layer(**args)

    @jax.jit
    def both(x1, x2):
      k_below = below[2](x1, x2)
      return k_below, pool[2](k_below)
    k_below, k = both(x1, x2)
    for name in ('nngp', 'ntk'):
      self.assertAllClose(
          getattr(k, name),
          _pool_both_sides(pool[1], getattr(k_below, name), n_spatial),
          msg=name)
    # The NTK below differs from the NNGP: a map confusing them would fail.
    self.assertGreater(
        test_utils.relative_error(k_below.ntk, k_below.nngp), 0.1)


def pool_net(pool, n_spatial):
  """`out_chan` -> Conv, Relu, `pool`, then a 1x1 Conv (Dense after global
  pooling) readout of `out_chan` channels."""
  is_global = pool[0].__name__.startswith('Global')

  def net(out_chan):
    readout = (stax.Dense(out_chan, W_std=1.2, b_std=0.1) if is_global else
               stax.Conv(out_chan, (1,) * n_spatial, W_std=1.2, b_std=0.1))
    return stax.serial(
        stax.Conv(WIDTH, (2,) * n_spatial, padding='SAME', W_std=1.5,
                  b_std=0.3),
        stax.Relu(), pool, readout)
  return net


def _float32(*xs):
  return [None if x is None else jnp.asarray(x, jnp.float32) for x in xs]


class MonteCarloTest(test_utils.NeuralTangentsTestCase):
  """Wide finite networks, in float32: one representative in the default
  tier; pooling's kernel maps are pinned exactly by `ExactKernelTest` (raw
  and masked inputs) and `KernelOfPooledNetworkTest` (NNGP and NTK inside a
  network)."""

  @parameterized.named_parameters(*test_utils.full_tier_cases(
      [('avg_2d_same_normalized_masked', stax.AvgPool, _2D,
        dict(window_shape=(3, 2), strides=(2, 1), padding='SAME',
             normalize_edges=True), True)],
      [('avg_1d_circular', stax.AvgPool, _1D,
        dict(window_shape=(3,), strides=(2,), padding='CIRCULAR'), False),
       ('sum_1d_valid_masked', stax.SumPool, _1D,
        dict(window_shape=(3,), strides=(2,), padding='VALID'), True),
       ('sum_2d_same', stax.SumPool, _2D,
        dict(window_shape=(2, 2), padding='SAME'), False),
       ('global_avg_2d_masked', stax.GlobalAvgPool, _2D, {}, True),
       ('global_sum_1d', stax.GlobalSumPool, _1D, {}, False)]))
  def test_matches_monte_carlo(self, layer, shapes, args, masked):
    x1, x2, mask_constant = maybe_masked_inputs(shapes, masked)
    n_spatial = len(shapes[0]) - 2
    with jax.enable_x64(False):
      x1, x2 = _float32(x1, x2)
      assert_matches_monte_carlo(self, pool_net(layer(**args), n_spatial),
                                 x1, x2, mask_constant=mask_constant)

  # Exact: `KernelOfPooledNetworkTest` pins the pairing of all taps.
  @test_utils.full_tier_only
  def test_pooling_is_not_a_diagonal_convolution(self):
    # Pooling pairs all taps of two windows; a wrong kernel pairing only equal
    # taps (as a shared filter would) gives the kernel of `Conv` instead,
    # which the Monte Carlo tolerance rejects.
    x1, x2 = inputs(*_1D)
    args = dict(strides=(2,), padding='SAME')
    net = lambda out_chan: stax.serial(
        stax.Conv(WIDTH, (2,), padding='SAME', W_std=1.5, b_std=0.3),
        stax.Relu(), stax.AvgPool((3,), **args),
        stax.Conv(out_chan, (1,), W_std=1.2))
    wrong = lambda out_chan: stax.serial(
        stax.Conv(WIDTH, (2,), padding='SAME', W_std=1.5, b_std=0.3),
        stax.Relu(), stax.Conv(out_chan, (3,), W_std=1., **args),
        stax.Conv(out_chan, (1,), W_std=1.2))
    assert_matches_monte_carlo(self, net, x1, x2, wrong_net=wrong)


class EmpiricalNtkTest(test_utils.NeuralTangentsTestCase):

  # One pooling in the default tier (all with NT_TEST_FULL=1); the NTK of
  # each pooling is pinned exactly by `KernelOfPooledNetworkTest`.
  @parameterized.named_parameters(*test_utils.full_tier_cases(
      [('avg', stax.AvgPool((2, 2), padding='SAME', normalize_edges=True))],
      [('sum', stax.SumPool((2, 2), (2, 1), padding='CIRCULAR')),
       ('global_avg', stax.GlobalAvgPool())]))
  def test_empirical_ntk_converges_to_analytic(self, pool):
    x1, x2 = inputs(*_2D)
    is_global = pool[0].__name__.startswith('Global')
    net = lambda width: stax.serial(
        stax.Conv(width, (2, 2), padding='SAME', W_std=1.5, b_std=0.3),
        stax.Relu(), pool,
        stax.Dense(1) if is_global else stax.Conv(1, (2, 2), padding='SAME'))
    empirical_ntk_errors(self, net, x1, x2)


class ShapeTest(test_utils.NeuralTangentsTestCase):

  @parameterized.named_parameters(
      ('avg_3d', stax.AvgPool((2, 1, 2), (1, 1, 2), 'SAME'), (2, 3, 3, 4, 2)),
      ('sum_3d', stax.SumPool((2, 2, 2)), (2, 3, 3, 4, 2)),
      ('global_sum_3d', stax.GlobalSumPool(), (2, 3, 3, 4, 2)),
      ('avg_channels_first', stax.AvgPool((2, 3), batch_axis=0,
                                          channel_axis=1), (2, 3, 4, 5)),
  )
  def test_apply_shape_is_init_shape(self, layer, shape):
    init_fn, apply_fn, kernel_fn = layer
    out_shape, params = init_fn(None, (-1,) + shape[1:])
    x = jnp.ones(shape)
    self.assertEqual(params, ())
    self.assertEqual((-1,) + apply_fn(params, x).shape[1:], out_shape)
    k = kernels(kernel_fn, x, None, None)
    self.assertEqual(k.shape1, (2,) + out_shape[1:])
    self.assertTrue(np.all(np.isfinite(k.nngp)))


def _kernel_of_inputs_of_different_sizes(x1, x2):
  """The input `Kernel` of `(N1, S..., C)` `x1` and `(N2, S'..., C)` `x2`,
  built by hand: full spatial covariances, batch-diagonal `cov1` / `cov2`."""
  self_cov = lambda y: jnp.stack(
      [test_utils.pair_covariance(a[None], a[None])[0, 0] for a in y])
  nngp = test_utils.pair_covariance(x1, x2)
  return Kernel(nngp=nngp, ntk=jnp.zeros_like(nngp), cov1=self_cov(x1),
                cov2=self_cov(x2), mask1=None, mask2=None, x1_is_x2=False,
                is_gaussian=False, is_reversed=False, is_input=True,
                diagonal_batch=True, diagonal_spatial=False,
                shape1=x1.shape, shape2=x2.shape, batch_axis=0,
                channel_axis=-1)


def _explicit_conv_relu_global_avg_pool(x1, x2, b_std):
  """NNGP and NTK of `serial(Conv(_, (2,), padding='SAME', b_std=b_std),
  Relu(), GlobalAvgPool(), Dense(1))` on sequences, by explicit loops over
  positions (each input zero-padded by one position at its end)."""
  pad = lambda x: np.pad(np.asarray(x), ((0, 0), (0, 1), (0, 0)))
  p1, p2 = pad(x1), pad(x2)
  cov = lambda a, b: (a @ b.T) / a.shape[-1]

  def conv(a, b, h, g):  # nngp' of positions h of `a` and g of `b`.
    return sum(cov(a[h + i], b[g + i]) for i in range(2)) / 2 + b_std**2

  nngp = np.zeros((len(x1), len(x2)))
  ntk = np.zeros_like(nngp)
  for n, a in enumerate(p1):
    for m, b in enumerate(p2):
      for h in range(x1.shape[1]):
        for g in range(x2.shape[1]):
          q, q1, q2 = conv(a, b, h, g), conv(a, a, h, h), conv(b, b, g, g)
          t = np.arccos(np.clip(q / np.sqrt(q1 * q2), -1, 1))
          relu = np.sqrt(q1 * q2) / (2 * np.pi) * (np.sin(t) +
                                                   (np.pi - t) * np.cos(t))
          # The conv's NTK equals its NNGP (inputs have a zero NTK).
          relu_ntk = q * (np.pi - t) / (2 * np.pi)
          nngp[n, m] += relu
          ntk[n, m] += relu_ntk
  size = x1.shape[1] * x2.shape[1]
  return nngp / size, ntk / size + nngp / size


class DifferentSpatialSizesTest(test_utils.NeuralTangentsTestCase):
  """`x1` and `x2` of different spatial sizes (issue 21 item 9): the kernel
  of a network read out by global pooling exists and is computed with the
  windows of each side."""

  def test_global_pooling_matches_explicit_sums(self):
    x1, _ = inputs((2, 5, 3), (1, 5, 3))
    x2, _ = inputs((3, 4, 3), (1, 4, 3), seed=3)
    net = stax.serial(stax.Conv(8, (2,), padding='SAME', b_std=0.3),
                      stax.Relu(), stax.GlobalAvgPool(), stax.Dense(1))
    k = net[2](_kernel_of_inputs_of_different_sizes(x1, x2))
    nngp, ntk = _explicit_conv_relu_global_avg_pool(x1, x2, 0.3)
    self.assertEqual(k.nngp.shape, (2, 3))
    self.assertAllClose(k.nngp, nngp, rtol=1e-10, atol=1e-12)
    self.assertAllClose(k.ntk, ntk, rtol=1e-10, atol=1e-12)
    # Not the kernel of `x2` zero-padded to the size of `x1`.
    padded = jnp.pad(x2, ((0, 0), (0, 1), (0, 0)))
    self.assertGreater(
        float(jnp.max(jnp.abs(net[2](x1, padded, 'nngp') - k.nngp))), 1e-3)

  # VALID padding with NT_TEST_FULL=1 (as
  # `test_kernel_fn_of_different_sizes_matches_monte_carlo`, which covers it).
  @parameterized.named_parameters(*test_utils.full_tier_cases(
      [('same', 'SAME'), ('circular', 'CIRCULAR')], [('valid', 'VALID')]))
  def test_windows_of_each_side_in_two_dimensions(self, padding):
    # Windows, pooling and resizing of each side: each side's covariance is
    # that of its inputs alone, and swapping the sides transposes `nngp`.
    x1, _ = inputs((2, 6, 5, 2), (1, 6, 5, 2))
    x2, _ = inputs((3, 4, 5, 2), (1, 4, 5, 2), seed=3)
    net = stax.serial(stax.Conv(8, (3, 2), (2, 1), padding=padding),
                      stax.Relu(),
                      stax.AvgPool((2, 2), padding='SAME'),
                      stax.ImageResize((-1, 3, 3, -1), 'linear'),
                      stax.GlobalSumPool(), stax.Dense(1))
    # Jitted: one compilation per input shape instead of every op's.
    kernel_fn = jax.jit(net[2], static_argnames=('get', 'diagonal_batch'))
    k = kernel_fn(_kernel_of_inputs_of_different_sizes(x1, x2))
    swapped = kernel_fn(_kernel_of_inputs_of_different_sizes(x2, x1))
    self.assertEqual(k.nngp.shape, (2, 3))
    self.assertAllClose(k.nngp, swapped.nngp.T, rtol=1e-12, atol=1e-14)
    self.assertAllClose(k.ntk, swapped.ntk.T, rtol=1e-12, atol=1e-14)
    # The hand-built input kernel is the one `kernel_fn` builds.
    same = kernel_fn(_kernel_of_inputs_of_different_sizes(x1, x1[:1]))
    self.assertAllClose(same.nngp, kernel_fn(x1, x1[:1], 'nngp'), rtol=1e-12,
                        atol=1e-14)
    self.assertAllClose(k.cov1, kernel_fn(x1, None, 'cov1',
                                          diagonal_batch=True),
                        rtol=1e-12, atol=1e-14)
    self.assertAllClose(k.cov2, kernel_fn(x2, None, 'cov1',
                                          diagonal_batch=True),
                        rtol=1e-12, atol=1e-14)

  def test_layers_comparing_positions_one_to_one_raise(self):
    x1, _ = inputs((2, 5, 3), (1, 5, 3))
    x2, _ = inputs((3, 4, 3), (1, 4, 3), seed=3)
    k = _kernel_of_inputs_of_different_sizes(x1, x2)
    flatten = stax.serial(stax.Conv(4, (2,)), stax.Relu(), stax.Flatten())
    with self.assertRaisesRegex(ValueError, r'one to one.*\(4,\) and \(3,\).*'
                                r'Pass `x2` of the same spatial shape'):
      flatten[2](k)
    with self.assertRaisesRegex(ValueError, r'`ConvLocal` needs `x1` and `x2` '
                                r'of the same spatial shape.*Pass `x2`'):
      stax.ConvLocal(4, (2,))[2](k)


  # Exact: `test_global_pooling_matches_explicit_sums` (explicit sums over
  # positions) and `test_windows_of_each_side_in_two_dimensions`.
  @test_utils.full_tier_only
  def test_kernel_fn_of_different_sizes_matches_monte_carlo(self):
    # Issue 21 item 9 end to end: `kernel_fn(x1, x2)` with x1 5x4 and x2 3x3
    # images, read out by global pooling, against a wide finite network.
    x1, x2 = test_utils.random_inputs((2, 5, 4, 2), (3, 3, 3, 2))
    net = lambda out: stax.serial(
        stax.Conv(WIDTH, (2, 2), padding='SAME', b_std=0.3), stax.Relu(),
        stax.AvgPool((2, 2), padding='SAME'), stax.Conv(WIDTH, (2, 2)),
        stax.Erf(), stax.GlobalAvgPool(), stax.Dense(out))
    wrong = lambda out: stax.serial(
        stax.Conv(WIDTH, (2, 2), padding='SAME', b_std=0.3), stax.Relu(),
        stax.AvgPool((2, 2), padding='SAME'), stax.Conv(WIDTH, (2, 2)),
        stax.Relu(), stax.GlobalAvgPool(), stax.Dense(out))
    assert_matches_monte_carlo(self, net, x1, x2, wrong_net=wrong)

  @parameterized.named_parameters(
      ('flatten', lambda: [stax.Conv(4, (2, 2)), stax.Flatten()],
       'compares their positions one to one'),
      ('spatial_output', lambda: [stax.Conv(4, (2, 2), padding='SAME'),
                                  stax.Relu(), stax.Dense(1)],
       'output is still spatial'))
  def test_outputs_that_compare_positions_raise(self, layers, message):
    x1, x2 = test_utils.random_inputs((2, 5, 4, 2), (3, 3, 3, 2))
    kernel_fn = stax.serial(*layers())[2]
    with self.assertRaisesRegex(ValueError, message + r'.*GlobalAvgPool'):
      kernel_fn(x1, x2, 'nngp')

class ErrorTest(test_utils.NeuralTangentsTestCase):

  @parameterized.parameters(stax.AvgPool, stax.SumPool)
  def test_window_larger_than_input_with_valid_padding(self, layer):
    init_fn, apply_fn, kernel_fn = layer((6, 2))
    message = (r'`window_shape`=\(6, 2\).*larger than its input.*"VALID".*'
               r'"SAME"')
    with self.assertRaisesRegex(ValueError, message):
      init_fn(None, (-1, 5, 4, 2))
    with self.assertRaisesRegex(ValueError, message):
      apply_fn((), jnp.ones((2, 5, 4, 2)))
    with self.assertRaisesRegex(ValueError, message):
      kernel_fn(jnp.ones((2, 5, 4, 2)), None, 'nngp')

  @parameterized.parameters(stax.AvgPool, stax.SumPool)
  def test_strides_of_wrong_length(self, layer):
    with self.assertRaisesRegex(
        ValueError, r'`strides`.*one entry per entry of `window_shape` '
        r'\(2\).*\(2,\).*Pass 2 values'):
      layer((2, 2), (2,))

  @parameterized.parameters(stax.AvgPool, stax.SumPool)
  def test_unknown_padding(self, layer):
    with self.assertRaisesRegex(
        ValueError, r'`padding`.*"VALID", "SAME", "CIRCULAR".*\'REFLECT\'.*'
        r'padding="SAME"'):
      layer((2, 2), padding='REFLECT')

  def test_window_rank_must_match_inputs(self):
    init_fn, _, _ = stax.AvgPool((2, 2))
    with self.assertRaisesRegex(ValueError, r'`window_shape`=\(2, 2\).*2 '
                                r'entries.*1 spatial dimensions'):
      init_fn(None, (-1, 5, 3))


if __name__ == '__main__':
  absltest.main()
