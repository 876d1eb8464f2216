"""Derivatives of kernels with respect to the inputs on the diagonal `x1 =
x2` (issue 51, item 2).

Where `x1 = x2`, the Cauchy-Schwarz gap `q1 q2 - c^2` of every pair of equal
examples is at its minimum 0 and their correlation at its maximum 1, where
the kernel maps clamp them against rounding; a clamp that halved or dropped
derivatives there (or a square root of the gap, which is like `|x1 - x2|`)
left first derivatives right, these vanishing, but second derivatives wrong.
Every derivative is checked against float64 central finite differences of
the kernel itself: `jax.jacfwd` and `jax.jacrev` (the whole Jacobian), and a
second-order `jvp`, at `x2 is x1`, `x2` equal to `x1` but another array, and
`x2=None`.
"""
from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp

from neural_tangents import stax
from neural_tangents._src.stax import kernel_maps
from tests import test_utils

_NONLINEARITIES = {
    'erf': stax.Erf,
    'sin': stax.Sin,
    'gelu': stax.Gelu,
    'relu': stax.Relu,
    'numerical': lambda: stax.ElementwiseNumerical(jnp.cos, deg=25),
}


def _kernel_fn(name, depth):
  """`depth` of `Dense(1, 2., 0.01)` and the nonlinearity (2: the issue's)."""
  phi = _NONLINEARITIES[name]
  return stax.serial(*[stax.Dense(1, 2., 0.01), phi()] * depth)[2]


def _function_of_inputs(kernel_fn, case):
  """`(F, z)`: the kernels as a function `F` of one array `z`, at `x1 = x2`.

  `is`: `kernel_fn(z, z)`; `none`: `kernel_fn(z, None)`; `equal`: `z`
  stacks `x1` and an equal but distinct `x2`, with independent tangents.
  """
  x = jnp.cos(jax.random.normal(jax.random.PRNGKey(1), (3, 1, 2, 3)))
  get = ('nngp', 'ntk')
  if case == 'is':
    return (lambda z: tuple(kernel_fn(z, z, get))), x
  if case == 'none':
    return (lambda z: tuple(kernel_fn(z, None, get))), x
  return (lambda z: tuple(kernel_fn(z[0], z[1], get))), jnp.stack([x, x + 0.])


def _relative_errors(actual, expected):
  return [test_utils.relative_error(a, e) for a, e in zip(actual, expected)]


# (nonlinearity, case, depth): every nonlinearity with independent tangents
# of equal inputs (the case of the issue), the other cases for two of them,
# and the two-layer network once (each check compiles four programs,
# which takes about four times as long for two layers).
_CASES = [(f'{name}_{case}_{depth}', name, case, depth) for name, case, depth in
          test_utils.full_tier_cases(
              [(name, 'equal', 1) for name in _NONLINEARITIES] +
              [('erf', 'is', 1), ('numerical', 'none', 1), ('sin', 'equal', 2)],
              [(name, case, 1) for name in _NONLINEARITIES
               for case in ('is', 'none')
               if (name, case) not in (('erf', 'is'), ('numerical', 'none'))] +
              [(name, 'equal', 2) for name in _NONLINEARITIES
               if name != 'sin'])]


class RoundingClipTest(test_utils.NeuralTangentsTestCase):

  def test_clips_values_and_passes_every_derivative(self):
    x = jnp.array([-1.5, -1., 0.3, 1., 1. + 1e-15, 2.])
    clip = lambda x: kernel_maps.rounding_clip(x, -1., 1.)
    self.assertAllClose(clip(x), jnp.clip(x, -1., 1.), rtol=0, atol=0)
    cube = lambda x: clip(x)**3  # d/dx (x^3) = 3 x^2, d2/dx2 = 6 x
    for xi in x:
      ci = jnp.clip(xi, -1., 1.)
      self.assertAllClose(jax.grad(cube)(xi), 3 * ci**2)
      self.assertAllClose(jax.grad(jax.grad(cube))(xi), 6 * ci)
    floor = lambda x: kernel_maps.rounding_clip(x, 0., None)
    self.assertEqual(float(floor(jnp.array(-1e-17))), 0.)
    self.assertEqual(float(jax.grad(floor)(0.)), 1.)  # `maximum`: 0.5.


class DiagonalDerivativesTest(test_utils.NeuralTangentsTestCase):

  @parameterized.named_parameters(*_CASES)
  def test_derivatives_match_finite_differences(self, name, case, depth):
    f, z = _function_of_inputs(_kernel_fn(name, depth), case)
    f = jax.jit(f)
    # The arc-cosine kernels are not smooth at equal examples with different
    # tangents: the NTK has a `|x1 - x2|` term (a kink), the NNGP a
    # `|x1 - x2|^3` one (finite differences of its second derivative err by
    # ~h). Only the NNGP is checked there.
    kink = name == 'relu' and case == 'equal'
    keep = (lambda k: k[:1]) if kink else (lambda k: k)
    # First derivatives: the whole Jacobian, forward and reverse mode,
    # along random directions.
    jacobians = [jax.jit(jacobian(f))(z) for jacobian in (jax.jacfwd,
                                                          jax.jacrev)]
    axes = tuple(range(-z.ndim, 0))
    h = 1e-6
    for seed in (5, 6):
      d = jax.random.normal(jax.random.PRNGKey(seed), z.shape)
      numerical = [(a - b) / (2 * h) for a, b in zip(f(z + h * d),
                                                     f(z - h * d))]
      for jacobian, mode in zip(jacobians, ('jacfwd', 'jacrev')):
        along = [jnp.tensordot(j, d, (axes, tuple(range(z.ndim))))
                 for j in jacobian]
        errors = _relative_errors(keep(along), keep(numerical))
        self.assertLess(max(errors), 1e-7, f'{mode}: {errors}')
    # Second derivatives along a direction.
    d = jax.random.normal(jax.random.PRNGKey(7), z.shape)
    second = jax.jit(lambda z: jax.jvp(
        lambda z: jax.jvp(f, (z,), (d,))[1], (z,), (d,))[1])(z)
    h = 1e-4
    numerical = [(a - 2 * b + c) / h**2 for a, b, c in zip(
        f(z + h * d), f(z), f(z - h * d))]
    errors = _relative_errors(keep(second), keep(numerical))
    self.assertLess(max(errors), 1e-3 if kink else 1e-6, errors)

  @parameterized.named_parameters(*test_utils.full_tier_cases(
      [('sin', 'sin')], [('erf', 'erf'), ('gelu', 'gelu'),
                         ('numerical', 'numerical')]))
  def test_second_order_taylor_expansion_in_float32(self, name):
    # The check: `k(x1 + dx1, x2 + dx2) ~ k + jvp + jvp(jvp) / 2` at
    # `x2 = x1`, with small independent tangents, in float32 (off by 3e-3
    # relative for `Sin` when second derivatives were wrong; third-order
    # terms are ~1e-5 here).
    with jax.enable_x64(False):
      kernel_fn = _kernel_fn(name, 2)
      x = jnp.cos(jax.random.normal(jax.random.PRNGKey(1), (3, 1, 2, 3)))
      dx = [0.01 * jax.random.normal(jax.random.PRNGKey(seed), x.shape)
            for seed in (2, 3)]
      f = lambda a, b: tuple(kernel_fn(a, b, ('nngp', 'ntk')))
      first = lambda a, b: jax.jvp(f, (a, b), tuple(dx))[1]
      k, k1, k2 = jax.jit(lambda a, b: (f(a, b), first(a, b), jax.jvp(
          first, (a, b), tuple(dx))[1]))(x, x)
      exact = f(x + dx[0], x + dx[1])
    for a, b, c, e in zip(k, k1, k2, exact):
      self.assertLess(test_utils.relative_error(a + b + c / 2, e), 1e-4)


if __name__ == '__main__':
  absltest.main()
