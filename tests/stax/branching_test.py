"""Tests of `FanOut`, `FanInSum`, `FanInProd`, `FanInConcat`."""
from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents import stax
from tests import test_utils



_inputs = test_utils.stax_inputs


# Branches after a shared first layer: (name, branch A, branch B), each a
# function of its output width (ignored by width-preserving branches).
_BRANCHES = (
    ('dense_dense', lambda w: stax.Dense(w, 1.2),
     lambda w: stax.Dense(w, 0.9, 0.2)),
    ('relu_dense_identity',
     lambda w: stax.serial(stax.Relu(), stax.Dense(w, 1.3, 0.1)),
     lambda w: stax.Identity()),
    ('relu_dense_erf_dense',
     lambda w: stax.serial(stax.Relu(), stax.Dense(w, 1.3, 0.1)),
     lambda w: stax.serial(stax.Erf(), stax.Dense(w, 0.7, 0.3))),
)


def _first_layer(width=8):
  return stax.Dense(width, 1.5, 0.3)


def _branch_kernels(branch, x1, x2, width=8):
  """Kernels of `first layer -> branch`, computed without any fan-in."""
  kernel_fn = stax.serial(_first_layer(width), branch(width))[2]
  return test_utils.kernels(kernel_fn, x1, x2)


def _fan_in_kernels(branch_a, branch_b, fan_in, x1, x2, width=8,
                    width_b=None):
  net = stax.serial(_first_layer(width), stax.FanOut(2),
                    stax.parallel(branch_a(width), branch_b(width_b or width)),
                    fan_in)
  return test_utils.kernels(net[2], x1, x2)


class FanInAlgebraTest(test_utils.NeuralTangentsTestCase):
  """Fan-in kernels against the kernels of their branches, computed apart.

  Independent branches of infinitely wide networks are independent GPs whose
  parameters' gradients are orthogonal, so a sum adds NNGPs and NTKs, a
  product multiplies NNGPs and follows the product rule for NTKs, and a
  channel concatenation averages both with the branches' channel counts as
  weights. These identities hold exactly, at any input.
  """

  @parameterized.named_parameters(*_BRANCHES)
  def test_fan_in_sum_is_sum_of_branch_kernels(self, branch_a, branch_b):
    x1, x2 = _inputs()
    a = _branch_kernels(branch_a, x1, x2)
    b = _branch_kernels(branch_b, x1, x2)
    k = _fan_in_kernels(branch_a, branch_b, stax.FanInSum(), x1, x2)
    self.assertAllClose(k.nngp, a.nngp + b.nngp)
    self.assertAllClose(k.ntk, a.ntk + b.ntk)

  @parameterized.named_parameters(*_BRANCHES)
  def test_fan_in_prod_is_product_with_ntk_product_rule(self, branch_a,
                                                         branch_b):
    x1, x2 = _inputs()
    a = _branch_kernels(branch_a, x1, x2)
    b = _branch_kernels(branch_b, x1, x2)
    k = _fan_in_kernels(branch_a, branch_b, stax.FanInProd(), x1, x2)
    self.assertAllClose(k.nngp, a.nngp * b.nngp)
    self.assertAllClose(k.ntk, a.ntk * b.nngp + a.nngp * b.ntk)

  @parameterized.named_parameters(
      ('dense_dense', _BRANCHES[0][1], _BRANCHES[0][2], 5, 3),
      ('relu_dense_erf_dense', _BRANCHES[2][1], _BRANCHES[2][2], 2, 7),
  )
  def test_fan_in_concat_is_channel_weighted_mean(self, branch_a, branch_b,
                                                  width_a, width_b):
    x1, x2 = _inputs()
    a = _branch_kernels(branch_a, x1, x2, width_a)
    b = _branch_kernels(branch_b, x1, x2, width_b)
    k = _fan_in_kernels(branch_a, branch_b, stax.FanInConcat(), x1, x2,
                        width=width_a, width_b=width_b)
    total = width_a + width_b
    self.assertAllClose(k.nngp, (width_a * a.nngp + width_b * b.nngp) / total)
    self.assertAllClose(k.ntk, (width_a * a.ntk + width_b * b.ntk) / total)
    self.assertNotAlmostEqual(float(jnp.max(jnp.abs(k.nngp - (
        a.nngp + b.nngp) / 2))), 0., 3, 'the weights must matter here')

  def test_fan_in_concat_spatial_is_block_diagonal(self):
    # Independent Dense branches: positions of different branches have zero
    # covariance, each branch's block is its own kernel.
    x1, x2 = _inputs((3, 2, 4), (2, 2, 4))
    branch_a, branch_b = _BRANCHES[0][1], _BRANCHES[0][2]
    a = _branch_kernels(branch_a, x1, x2)
    b = _branch_kernels(branch_b, x1, x2)
    k = _fan_in_kernels(branch_a, branch_b, stax.FanInConcat(axis=1), x1, x2)
    self.assertEqual(k.nngp.shape, (3, 2, 4, 4))
    for name in ('nngp', 'ntk'):
      full, ka, kb = getattr(k, name), getattr(a, name), getattr(b, name)
      self.assertAllClose(full[..., :2, :2], ka)
      self.assertAllClose(full[..., 2:, 2:], kb)
      self.assertAllClose(full[..., :2, 2:], jnp.zeros_like(ka))
      self.assertAllClose(full[..., 2:, :2], jnp.zeros_like(kb))


  def test_fan_in_concat_batch_is_block_diagonal(self):
    x1, x2 = _inputs()
    branch_a, branch_b = _BRANCHES[1][1:]
    net = stax.serial(_first_layer(), stax.FanOut(2),
                      stax.parallel(branch_a(8), stax.Dense(8, 0.9, 0.2)),
                      stax.FanInConcat(axis=0))
    init_fn, _, kernel_fn = net
    self.assertEqual(init_fn(jax.random.PRNGKey(0), (-1, x1.shape[1]))[0],
                     (-1, 8))
    get = ('nngp', 'ntk', 'cov1')
    k = test_utils.kernels(kernel_fn, x1, x2, get)
    ka, kb = (test_utils.kernels(
        stax.serial(_first_layer(), branch)[2], x1, x2, get)
              for branch in (branch_a(8), stax.Dense(8, 0.9, 0.2)))
    n1, n2 = len(x1), len(x2)
    self.assertEqual(k.nngp.shape, (2 * n1, 2 * n2))
    self.assertEqual(jax.eval_shape(kernel_fn, x1, x2).shape1[0], 2 * n1)
    for name in ('nngp', 'ntk'):
      out = getattr(k, name)
      self.assertAllClose(out[:n1, :n2], getattr(ka, name))
      self.assertAllClose(out[n1:, n2:], getattr(kb, name))
      self.assertAllClose(out[:n1, n2:], jnp.zeros((n1, n2)))
      self.assertAllClose(out[n1:, :n2], jnp.zeros((n1, n2)))
    self.assertAllClose(k.cov1, jnp.concatenate([ka.cov1, kb.cov1]))
    # Branches not ending in their own affine layer are correlated: refused.
    _, _, shared_fn = stax.serial(
        _first_layer(), stax.FanOut(2),
        stax.parallel(stax.Identity(), stax.Identity()),
        stax.FanInConcat(axis=0))
    with self.assertRaisesRegex(ValueError, r'FanInConcat\(axis=0\).*End each '
                                'branch'):
      shared_fn(x1, x2)


class BranchingTest(test_utils.NeuralTangentsTestCase):

  def test_residual_and_concat_match_monte_carlo(self):
    # One small float32 case of the whole pipeline: a residual `FanInSum`,
    # then a channel `FanInConcat` of unequal widths, each followed by layers
    # that depend on its output kernel.
    with jax.enable_x64(False):
      init_fn, apply_fn, kernel_fn = stax.serial(
          stax.Dense(256, 1.5, 0.3), stax.FanOut(2),
          stax.parallel(stax.serial(stax.Relu(), stax.Dense(256, 1.3, 0.1)),
                        stax.Identity()),
          stax.FanInSum(), stax.Relu(), stax.FanOut(2),
          stax.parallel(stax.Dense(128), stax.Dense(384, 0.7)),
          stax.FanInConcat(), stax.Dense(256, 1.2))
      x1, x2 = _inputs()
      nngp_err, ntk_err = test_utils.monte_carlo_errors(
          init_fn, apply_fn, jax.jit(kernel_fn, static_argnums=2), x1, x2,
          key=test_utils.fast_key(0), n_nngp=128, n_ntk=32)
    self.assertLess(nngp_err, test_utils.MC_TOL)
    self.assertLess(ntk_err, test_utils.MC_TOL)

  def test_concat_spatial_diagonal_agrees_with_full(self):
    _, _, kernel_fn = stax.serial(
        stax.Dense(8, 1.5, 0.3), stax.FanOut(2),
        stax.parallel(stax.Relu(), stax.Dense(8)), stax.FanInConcat(axis=1),
        stax.Dense(8), stax.Relu())
    x1, x2 = _inputs((3, 2, 4), (2, 2, 4))
    full = test_utils.kernels(kernel_fn, x1, x2)
    diag = test_utils.kernels(kernel_fn, x1, x2, diagonal_spatial=True)
    self.assertEqual(full.nngp.shape, (3, 2, 4, 4))
    self.assertEqual(diag.nngp.shape, (3, 2, 4))
    for f, d in zip(full, diag):
      self.assertAllClose(jnp.diagonal(f, axis1=2, axis2=3), d)

  def test_shapes(self):
    init_fn, apply_fn, _ = stax.serial(
        stax.FanOut(3),
        stax.parallel(stax.Dense(4), stax.Dense(5), stax.Dense(6)),
        stax.FanInConcat())
    out_shape, params = init_fn(jax.random.PRNGKey(0), (-1, 3))
    self.assertEqual(out_shape, (-1, 15))
    self.assertEqual(apply_fn(params, jnp.ones((2, 3))).shape, (2, 15))

  def test_fan_in_sum_of_mismatched_shapes_raises(self):
    init_fn, apply_fn, kernel_fn = stax.serial(
        stax.FanOut(2), stax.parallel(stax.Dense(4), stax.Dense(5)),
        stax.FanInSum())
    msg = r'`FanInSum` needs inputs of the same shape.*\(-1, 4\).*\(-1, 5\)'
    with self.assertRaisesRegex(ValueError, msg):
      init_fn(jax.random.PRNGKey(0), (-1, 3))
    with self.assertRaisesRegex(ValueError, '`FanInSum` needs inputs of the '
                                'same shape.*same `Dense'):
      kernel_fn(jnp.ones((2, 3)), None)
    with self.assertRaisesRegex(ValueError, '`FanInSum` needs inputs'):
      stax.FanInSum()[1]((), [jnp.ones((2, 4)), jnp.ones((2, 5))])

  def test_nonlinearity_after_channel_concat_raises(self):
    _, _, kernel_fn = stax.serial(
        stax.Dense(4), stax.FanOut(2),
        stax.parallel(stax.Dense(4), stax.Dense(4, 2.)), stax.FanInConcat(),
        stax.Relu())
    with self.assertRaisesRegex(ValueError, 'Put a `Dense`'):
      kernel_fn(jnp.ones((2, 3)), None)

  def test_fan_in_concat_axis_out_of_range_raises(self):
    init_fn, _, kernel_fn = stax.serial(
        stax.FanOut(2), stax.parallel(stax.Dense(4), stax.Dense(4)),
        stax.FanInConcat(axis=5))
    msg = (r'`axis`=5 of `FanInConcat` is out of range for inputs of rank 2. '
           r'Pass an axis in \[-2, 2\)')
    with self.assertRaisesRegex(ValueError, msg):
      init_fn(jax.random.PRNGKey(0), (-1, 3))
    with self.assertRaisesRegex(ValueError, msg):
      kernel_fn(jnp.ones((2, 3)), None)

  def test_fan_out_invalid_num_raises(self):
    with self.assertRaisesRegex(ValueError, '`num` must be a positive int'):
      stax.FanOut(0)


def _two_masked_inputs(shape=(3, 5, 4)):
  """Two inputs (branches of a `parallel`) masked at different positions.

  Input `a` masks trailing positions 3, 4 of example 0 and 4 of example 2;
  input `b` masks positions 2 to 4 of example 0 and position 1 of example 1,
  so that entries masked in one input only exist in each.
  """
  x1, x2 = test_utils.correlated_inputs(shape, (2,) + shape[1:])
  y1, y2 = test_utils.correlated_inputs(shape, (2,) + shape[1:], seed=3)
  mask = test_utils.mask_positions
  positions = lambda n, cells: jnp.zeros((n, shape[1]), bool).at[
      tuple(zip(*cells))].set(True)
  a1 = mask(x1, positions(3, [(0, 3), (0, 4), (2, 4)]))
  a2 = mask(x2, positions(2, [(1, 4)]))
  b1 = mask(y1, positions(3, [(0, 2), (0, 3), (0, 4), (1, 1)]))
  b2 = mask(y2, positions(2, [(0, 0), (1, 4)]))
  return [a1, b1], [a2, b2]


def _stacked_inputs(net):
  """`net(out_chan)` of two inputs as a network of one stacked input
  `(2, N, ...)`, for the Monte Carlo estimator, which takes one array."""
  def stacked(out_chan):
    init_fn, apply_fn, kernel_fn = net(out_chan)
    init = lambda key, shape: init_fn(key, [shape[1:]] * 2)
    apply = lambda params, x, **kwargs: apply_fn(params, [x[0], x[1]],
                                                 **kwargs)
    kernel = lambda x1, x2, get=None, **kwargs: kernel_fn(
        [x1[0], x1[1]], [x2[0], x2[1]], get, **kwargs)
    return init, apply, kernel
  return stacked


def _two_input_net(fan_in, widths=(256, 256)):
  return lambda out: stax.serial(
      stax.parallel(stax.Dense(widths[0], 1.3, 0.2),
                    stax.serial(stax.Dense(widths[1], 1.1), stax.Erf())),
      fan_in, stax.Dense(out, 1.2, 0.1))


class BranchMaskingTest(test_utils.NeuralTangentsTestCase):
  """Masked inputs through `FanOut`, `parallel` and the fan-ins.

  Semantics (those of every masked layer, see `masking`): masked entries are
  zero. `FanOut` copies its input's mask to each output; an entry of a sum is
  masked iff it is in every input (otherwise it holds the other inputs'
  values), of a product iff it is in any input (a zero factor), and a
  concatenation concatenates the masks. Kernels are checked against Monte
  Carlo estimates of the finite network's zero-filled outputs.
  """

  def test_fan_out_residual_network_of_the_issue(self):
    # The reproducer of issue 51: a masked input through `FanOut`.
    x = np.random.RandomState(0).randn(4, 6, 5).astype(np.float32)
    x[1, 4:] = 1e9
    x[3, 2:] = 1e9
    net = lambda out, width=8: stax.serial(
        stax.Dense(width), stax.Relu(), stax.FanOut(2),
        stax.parallel(stax.Dense(width), stax.Dense(width)), stax.FanInSum(),
        stax.Relu(), stax.Dense(out))
    k = net(1)[2](x, None, 'ntk', mask_constant=1e9)
    self.assertEqual(k.shape, (4, 4, 6, 6))
    self.assertAllClose(k[3, :, 2:], jnp.zeros((4, 4, 6)))
    self.assertAllClose(k[:, 1, :, 4:], jnp.zeros((4, 6, 2)))
    x = jnp.asarray(x[1:], jnp.float64)
    test_utils.assert_matches_monte_carlo(
        self, lambda out: net(out, 128), x, x[:2], mask_constant=1e9)

  def test_fan_out_copies_the_mask(self):
    x = test_utils.maybe_masked_inputs(((2, 5, 2), (2, 5, 2)), True)[0]
    _, apply_fn, kernel_fn = stax.FanOut(3)
    outs = apply_fn((), x, mask_constant=test_utils.MASK)
    ks = kernel_fn(x, None, mask_constant=test_utils.MASK)
    self.assertLen(outs, 3)
    self.assertLen(ks, 3)
    expected = x == test_utils.MASK
    for out, k in zip(outs, ks):
      np.testing.assert_array_equal(out.mask, expected)
      np.testing.assert_array_equal(k.mask1, expected)
      np.testing.assert_array_equal(k.mask2, expected)
      self.assertAllClose(out.masked_value, jnp.where(expected, 0., x))

  @parameterized.named_parameters(
      ('sum', stax.FanInSum, jnp.logical_and),
      ('prod', stax.FanInProd, jnp.logical_or),
  )
  def test_fan_in_combines_masks(self, fan_in, combine):
    (a, b), _ = _two_masked_inputs()
    masked = lambda x: jnp.all(x == test_utils.MASK, -1, keepdims=True)
    expected = combine(masked(a), masked(b))
    init_fn, apply_fn, kernel_fn = stax.serial(
        stax.parallel(stax.Dense(4), stax.Dense(4)), fan_in())
    _, params = init_fn(jax.random.PRNGKey(0), [a.shape, b.shape])
    out = apply_fn(params, [a, b], mask_constant=test_utils.MASK)
    np.testing.assert_array_equal(out.mask, expected)
    self.assertAllClose(out.masked_value,
                        jnp.where(expected, 0., out.masked_value))
    self.assertGreater(float(jnp.min(jnp.abs(jnp.where(
        expected, 1., out.masked_value)))), 0.)
    k = kernel_fn([a, b], None, mask_constant=test_utils.MASK)
    np.testing.assert_array_equal(k.mask1, expected)
    np.testing.assert_array_equal(k.mask2, expected)
    # An input without a mask masks nothing: with one, a sum is unmasked, a
    # product masked as the other input.
    a_only = [stax.MaskedArray(a, a == test_utils.MASK),
              jnp.where(b == test_utils.MASK, 0., b)]
    out = apply_fn(params, a_only)
    k = kernel_fn(a_only, None)
    if fan_in is stax.FanInSum:
      self.assertNotIsInstance(out, stax.MaskedArray)
      self.assertIsNone(k.mask1)
    else:
      for mask in (out.mask, k.mask1, k.mask2):
        np.testing.assert_array_equal(mask, masked(a))

  @parameterized.named_parameters(('channels', -1), ('spatial', 1),
                                  ('batch', 0))
  def test_fan_in_concat_concatenates_masks(self, axis):
    (a, b), _ = _two_masked_inputs()
    masked = lambda x: jnp.all(x == test_utils.MASK, -1, keepdims=True)
    init_fn, apply_fn, kernel_fn = stax.serial(
        stax.parallel(stax.Dense(4), stax.Dense(3 if axis == -1 else 4)),
        stax.FanInConcat(axis))
    _, params = init_fn(jax.random.PRNGKey(0), [a.shape, b.shape])
    out = apply_fn(params, [a, b], mask_constant=test_utils.MASK)
    widths = (4, 3) if axis == -1 else (1, 1)
    expected = jnp.concatenate(
        [jnp.broadcast_to(masked(a), a.shape[:-1] + (widths[0],)),
         jnp.broadcast_to(masked(b), b.shape[:-1] + (widths[1],))], axis)
    np.testing.assert_array_equal(out.mask, expected)
    k = kernel_fn([a, b], None, mask_constant=test_utils.MASK)
    np.testing.assert_array_equal(k.mask1, expected)
    self.assertEqual(k.nngp.shape[:2], (out.shape[0],) * 2)

  @parameterized.named_parameters(*test_utils.full_tier_cases(
      [('sum', stax.FanInSum(), (256, 256)),
       ('concat_channels', stax.FanInConcat(), (256, 128))],
      [('prod', stax.FanInProd(), (256, 256)),
       ('concat_spatial', stax.FanInConcat(axis=1), (256, 256))]))
  def test_fan_in_of_differently_masked_inputs_matches_monte_carlo(
      self, fan_in, widths):
    x1, x2 = _two_masked_inputs()
    net = _two_input_net(fan_in, widths)
    test_utils.assert_matches_monte_carlo(
        self, _stacked_inputs(net), jnp.stack(x1), jnp.stack(x2),
        mask_constant=test_utils.MASK)
    # The masks matter: without them the (large) masked values dominate.
    k = test_utils.kernels(net(1)[2], x1, x2)
    k_masked = test_utils.kernels(net(1)[2], x1, x2,
                                  mask_constant=test_utils.MASK)
    self.assertGreater(test_utils.relative_error(k.nngp, k_masked.nngp), 0.5)


if __name__ == '__main__':
  absltest.main()
