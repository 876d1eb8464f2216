"""Tests of the bit-level power-of-2 helpers against `frexp` / `ldexp`."""
from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.utils import scaling
from tests import test_utils


def _special_values(dtype) -> np.ndarray:
  """0, subnormals, the normal range's ends, inf, NaN and random values."""
  info = np.finfo(dtype)
  tiny, smallest = info.tiny, info.smallest_subnormal
  values = [0., -0., smallest, -smallest, 3 * smallest, tiny / 2, tiny / 3,
            tiny * (1 - info.eps), tiny, -tiny, 2 * tiny, info.max, -info.max,
            1., 0.5, 0.75, 2., -3., np.inf, -np.inf, np.nan, -np.nan]
  rng = np.random.RandomState(0)
  exponents = rng.randint(info.minexp - info.nmant, info.maxexp, 2000)
  random = rng.uniform(-1, 1, 2000) * np.power(2., exponents.astype(float))
  return np.concatenate([np.array(values, dtype), random.astype(dtype)])


class ScalingTest(test_utils.NeuralTangentsTestCase):

  @parameterized.parameters(np.float32, np.float64)
  def test_exponent_of_is_frexp(self, dtype):
    x = jnp.asarray(_special_values(dtype))
    expected = jnp.frexp(x)[1]
    for fn in (scaling.exponent_of, jax.jit(scaling.exponent_of)):
      out = fn(x)
      self.assertEqual(out.dtype, expected.dtype)
      np.testing.assert_array_equal(out, expected)

  @parameterized.parameters(np.float32, np.float64)
  def test_power_of_two_is_ldexp(self, dtype):
    info = np.finfo(dtype)
    exponent = jnp.arange(info.minexp - 60, info.maxexp + 60)
    clipped = jnp.clip(exponent, info.minexp, info.maxexp - 1)
    expected = jnp.ldexp(jnp.ones(exponent.shape, dtype), clipped)
    for fn in (scaling.power_of_two, jax.jit(scaling.power_of_two,
                                             static_argnums=1)):
      out = fn(exponent, dtype)
      self.assertEqual(out.dtype, dtype)
      np.testing.assert_array_equal(out, expected)
    # Exact powers of 2, all normal.
    np.testing.assert_array_equal(
        np.asarray(out, np.float64), np.ldexp(1., np.asarray(clipped)))

  @parameterized.parameters(np.float32, np.float64)
  def test_scale_above(self, dtype):
    x = jnp.asarray(_special_values(dtype))
    x = jnp.where(jnp.isnan(x), 1, x)
    m = scaling.scale_above(x)
    # The largest power of 2 <= max(x, 1), capped at 2^-minexp.
    info = np.finfo(dtype)
    e = jnp.minimum(jnp.frexp(jnp.maximum(x, 1))[1] - 1, -info.minexp)
    np.testing.assert_array_equal(m, jnp.ldexp(jnp.ones_like(x), e))

  def test_no_gradient(self):
    grad = jax.grad(lambda x: scaling.scale_above(x) * x)(jnp.float32(10.))
    self.assertEqual(float(grad), 8.)


if __name__ == '__main__':
  absltest.main()
