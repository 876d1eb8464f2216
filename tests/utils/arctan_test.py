"""Tests of the vectorizable `arctan2` against `numpy.arctan2`."""
from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.utils.arctan import arctan2
from tests import test_utils


def _ulp_error(actual, expected, dtype) -> float:
  expected = np.asarray(expected, dtype)
  spacing = np.spacing(np.abs(expected))
  return float(np.max(np.abs(np.asarray(actual, np.float64) -
                             expected.astype(np.float64)) / spacing))


class Arctan2Test(test_utils.NeuralTangentsTestCase):

  @parameterized.parameters(np.float32, np.float64)
  def test_within_ulps_of_numpy(self, dtype):
    rng = np.random.RandomState(0)
    # Every octant and reduction branch, tiny ratios, and the arccos use:
    # `atan2(sqrt(1 - rho^2), rho)` for rho in [-1, 1].
    rho = np.linspace(-1, 1, 20001)
    y = np.concatenate([rng.randn(40000), 1e-30 * rng.randn(1000),
                        np.sqrt(np.maximum(1 - rho**2, 1e-32))])
    x = np.concatenate([rng.randn(40000), rng.randn(1000), rho])
    y, x = y.astype(dtype), x.astype(dtype)
    out = jax.jit(arctan2)(y, x)
    self.assertEqual(out.dtype, dtype)
    # `numpy.arctan2` (the platform's libm) is itself within about 1 ulp.
    self.assertLessEqual(_ulp_error(out, np.arctan2(y, x), dtype), 3)

  def test_signed_zeros_and_axes(self):
    for y, x in [(0., 0.), (-0., 0.), (0., -0.), (-0., -0.), (0., -1.),
                 (-0., -1.), (1., 0.), (-1., 0.), (2., 2.), (-3., -3.)]:
      out = float(arctan2(np.float64(y), np.float64(x)))
      expected = np.arctan2(y, x)
      self.assertEqual(out, expected, msg=f'atan2({y}, {x})')
      self.assertEqual(np.signbit(out), np.signbit(expected))
    self.assertTrue(np.isnan(arctan2(np.float64(np.nan), np.float64(1.))))

  def test_gradient_matches_jnp(self):
    y = jnp.array([0.3, -2., 1e-3, 0.5])
    x = jnp.array([-0.7, 0.1, 1., -1e-3])
    for argnum in (0, 1):
      ours = jax.vmap(jax.grad(arctan2, argnum))(y, x)
      reference = jax.vmap(jax.grad(jnp.arctan2, argnum))(y, x)
      self.assertAllClose(ours, reference)
    self.assertAllClose(jax.grad(arctan2, (0, 1))(0., 0.), (0., 0.))


if __name__ == '__main__':
  absltest.main()
