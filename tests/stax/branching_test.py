"""Tests of `FanOut`, `FanInSum`, `FanInProd`, `FanInConcat`."""
from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents import stax
import test_utils


_MC_TOL = 0.05

_inputs = test_utils.stax_inputs


_NETWORKS = {
    'residual_sum': lambda: stax.serial(
        stax.Dense(1024, 1.5, 0.3), stax.FanOut(2),
        stax.parallel(stax.serial(stax.Relu(), stax.Dense(1024, 1.3, 0.1)),
                      stax.Identity()),
        stax.FanInSum(), stax.Relu(), stax.Dense(256, 1.1, 0.1)),
    'product': lambda: stax.serial(
        stax.Dense(1024, 1.5, 0.3), stax.FanOut(2),
        stax.parallel(stax.Dense(1024, 1.2), stax.Dense(1024, 0.9, 0.2)),
        stax.FanInProd(), stax.Dense(256)),
    'concat_channels': lambda: stax.serial(
        stax.Dense(1024, 1.5, 0.3), stax.FanOut(2),
        stax.parallel(stax.serial(stax.Relu(), stax.Dense(512)),
                      stax.Dense(1536, 0.7)),
        stax.FanInConcat(), stax.Dense(1024, 1.2), stax.Relu(),
        stax.Dense(256)),
    'concat_spatial': lambda: stax.serial(
        stax.Dense(1024, 1.5, 0.3), stax.FanOut(2),
        stax.parallel(stax.Relu(), stax.Identity()),
        stax.FanInConcat(axis=1), stax.Dense(1024, 1.2), stax.Relu(),
        stax.Flatten(), stax.Dense(256)),
}


class BranchingTest(test_utils.NeuralTangentsTestCase):

  @parameterized.parameters(sorted(_NETWORKS))
  def test_matches_monte_carlo(self, name):
    init_fn, apply_fn, kernel_fn = _NETWORKS[name]()
    shape = (3, 2, 4) if name == 'concat_spatial' else (3, 6)
    x1, x2 = _inputs(shape, (2,) + shape[1:])
    nngp_err, ntk_err = test_utils.monte_carlo_errors(
        init_fn, apply_fn, kernel_fn, x1, x2)
    self.assertLess(nngp_err, _MC_TOL)
    self.assertLess(ntk_err, _MC_TOL)

  def test_concat_spatial_diagonal_agrees_with_full(self):
    _, _, kernel_fn = stax.serial(
        stax.Dense(8, 1.5, 0.3), stax.FanOut(2),
        stax.parallel(stax.Relu(), stax.Dense(8)), stax.FanInConcat(axis=1),
        stax.Dense(8), stax.Relu())
    x1, x2 = _inputs((3, 2, 4), (2, 2, 4))
    full = kernel_fn(x1, x2, ('nngp', 'ntk'))
    diag = kernel_fn(x1, x2, ('nngp', 'ntk'), diagonal_spatial=True)
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

  def test_fan_out_invalid_num_raises(self):
    with self.assertRaisesRegex(ValueError, '`num` must be a positive int'):
      stax.FanOut(0)


if __name__ == '__main__':
  absltest.main()
