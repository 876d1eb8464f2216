"""Tests of `FanOut`, `FanInSum`, `FanInProd`, `FanInConcat`."""
from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp

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


if __name__ == '__main__':
  absltest.main()
