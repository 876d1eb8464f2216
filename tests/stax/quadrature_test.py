"""`quadrature.gaussian_expectation`: Gauss-Hermite expectations and their
derivatives (Price's theorem, Stein's lemma) against closed forms."""
from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.stax import kernel_maps
from neural_tangents._src.stax import quadrature
from tests import test_utils

_relu = lambda x: jnp.maximum(x, 0)


def _as_function_of_vector(fn):
  return lambda v: fn(v[0], v[1], v[2])


class GaussianExpectationTest(test_utils.NeuralTangentsTestCase):

  @parameterized.named_parameters(('diagonal', (0.7, 0.7, 0.7)),
                                  ('off_diagonal', (0.7, 1.3, 0.5)),
                                  ('opposite', (0.7, 0.7, -0.7)))
  def test_smooth_function_derivatives_match_closed_form(self, point):
    # `E[sin(u) sin(v)]` in closed form (`sin_kernel_map`): the gradient and
    # the Hessian in `(q1, q2, c)`, on the diagonal `q1 = q2 = c` too (where
    # autodiff through the quadrature's `sqrt(1 - rho^2)` loses them).
    closed = lambda q1, q2, c: kernel_maps.sin_kernel_map(1., 1., 0.)(
        q1, q2, c, False)[0]
    quad = lambda q1, q2, c: quadrature.gaussian_expectation(
        jnp.sin, jnp.sin, 25, q1, q2, c)
    p = jnp.array(point, jnp.float64)
    derivatives = {'grad': jax.grad, 'hessian': jax.hessian,
                   'jacrev(jacrev)': lambda f: jax.jacrev(jax.jacrev(f))}
    for name, derivative in derivatives.items():
      self.assertAllClose(derivative(_as_function_of_vector(quad))(p),
                          derivative(_as_function_of_vector(closed))(p),
                          rtol=1e-12, atol=1e-12, msg=name)

  def test_derivatives_of_a_function_with_a_kink(self):
    # The variance derivatives take only first derivatives of `fn`
    # (Stein's lemma), so they stay right where autodiff's second derivative
    # of `fn` misses a delta (ReLU: it would give 0 for d/dq).
    closed = lambda q1, q2, c: kernel_maps.relu_kernel_map(q1, q2, c,
                                                           False)[0]
    quad = lambda q1, q2, c: quadrature.gaussian_expectation(
        _relu, _relu, 100, q1, q2, c)
    p = jnp.array([0.8, 1.5, 0.6], jnp.float64)
    expected = jax.grad(_as_function_of_vector(closed))(p)
    got = jax.grad(_as_function_of_vector(quad))(p)
    np.testing.assert_allclose(got, expected, rtol=2e-2)
    self.assertGreater(float(expected[0]), 0.05)

  def test_zero_variance_gives_finite_derivatives(self):
    quad = lambda q1, q2, c: quadrature.gaussian_expectation(
        jnp.cos, jnp.cos, 10, q1, q2, c)
    p = jnp.array([0., 1., 0.], jnp.float64)
    self.assertFinite(jax.grad(_as_function_of_vector(quad))(p))
    self.assertFinite(jax.hessian(_as_function_of_vector(quad))(p))

  def test_value_is_the_quadrature(self):
    # E[u^2 v^2] = q1 q2 + 2 c^2, exact for polynomials of low degree.
    square = lambda x: x**2
    q1, q2, c = jnp.array(0.7), jnp.array(1.3), jnp.array(-0.4)
    self.assertAllClose(
        quadrature.gaussian_expectation(square, square, 5, q1, q2, c),
        q1 * q2 + 2 * c**2)


if __name__ == '__main__':
  absltest.main()
