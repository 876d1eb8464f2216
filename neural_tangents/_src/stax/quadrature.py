"""Gaussian expectations by Gauss-Hermite quadrature, differentiable to any
order: the kernel map of `ElementwiseNumerical`.

For `(u, v) ~ N(0, [[q1, c], [c, q2]])`, `E[f(u) g(v)]` is a sum over the
`deg x deg` product grid of Gauss-Hermite nodes, with `u = sqrt(q1) z1`,
`v = sqrt(q2) (rho z1 + sqrt(1 - rho^2) z2)` for independent standard normal
`z1`, `z2` (`rho = c / sqrt(q1 q2)`); it is exact for polynomials of degree
up to `2 deg - 1` in each variable.

The sum is a smooth function of `(q1, q2, c)` (even in `sqrt(1 - rho^2)`,
the nodes being symmetric), but autodiff through that square root loses
its second derivatives on the diagonal `rho = 1` (`x1 = x2`), where the
root's derivative is infinite and is taken as 0. So the derivatives are
given by Price's theorem and Stein's lemma instead, as expectations of the
same kind, whose own derivatives follow by the same rule:

  d E[f(u) g(v)] / dc  = E[f'(u) g'(v)]
  d E[f(u) g(v)] / dq1 = E[f''(u) g(v)] / 2
                       = (E[u f'(u) g(v)] - c E[f'(u) g'(v)]) / (2 q1)

(the second form, from `E[u h(u, v)] = q1 E[dh/du] + c E[dh/dv]`, needs only
first derivatives, and so stays right for functions with kinks, whose
second derivative autodiff takes to be 0). Derivatives of `f` are taken by
autodiff.
"""
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.stax.kernel_maps import correlation
from neural_tangents._src.stax.kernel_maps import KernelMap
from neural_tangents._src.stax.kernel_maps import safe_sqrt
from neural_tangents._src.utils.quadrature import gauss_hermite

Array = jax.Array
Fn = Callable[[Array], Array]


@functools.lru_cache(maxsize=None)
def _nodes_and_weights(deg: int) -> tuple[np.ndarray, np.ndarray]:
  """Gauss-Hermite nodes and weights for the weight `exp(-z^2 / 2)` (of any
  degree: `utils.quadrature.gauss_hermite`)."""
  return gauss_hermite(deg)


def _quadrature(f: Fn, g: Fn, deg: int, q1: Array, q2: Array,
                c: Array) -> Array:
  """The quadrature sum of `E[f(u) g(v)]` (arguments of one shape)."""
  nodes, weights = _nodes_and_weights(deg)
  _, rho = correlation(q1, q2, c)
  z = jnp.asarray(nodes, c.dtype)
  w = jnp.asarray(weights, c.dtype)
  ex = lambda x: x[..., None, None]
  # Grid axes (z1, z2) last, with explicit size-1 axes for the batch ones.
  grid = lambda x: jnp.reshape(x, (1,) * c.ndim + x.shape)
  u = ex(safe_sqrt(q1)) * grid(z[:, None])
  v = ex(safe_sqrt(q2)) * (ex(rho) * grid(z[:, None]) +
                           ex(safe_sqrt(1 - rho**2)) * grid(z[None, :]))
  return jnp.sum(grid(w[:, None] * w[None, :]) * f(u) * g(v), axis=(-2, -1))


def elementwise_derivative(f: Fn) -> Fn:
  """`f'` of an elementwise `f`, by forward-mode autodiff."""
  return lambda x: jax.jvp(f, (x,), (jnp.ones_like(x),))[1]


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1, 2))
def gaussian_expectation(f: Fn, g: Fn, deg: int, q1: Array, q2: Array,
                         c: Array) -> Array:
  """`E[f(u) g(v)]`, `(u, v) ~ N(0, [[q1, c], [c, q2]])`, by quadrature.

  Args:
    f, g: elementwise functions.
    deg: quadrature degree.
    q1, q2, c: variances and covariance, of one shape.

  Returns:
    The expectations, of the shape of `c`; differentiable to any order (see
    the module docstring).
  """
  return _quadrature(f, g, deg, q1, q2, c)


@gaussian_expectation.defjvp
def _gaussian_expectation_jvp(f, g, deg, primals, tangents):
  q1, q2, c = primals
  dq1, dq2, dc = tangents
  df, dg = elementwise_derivative(f), elementwise_derivative(g)
  expect = lambda a, b: gaussian_expectation(a, b, deg, q1, q2, c)
  cross = expect(df, dg)

  def half_ratio(dq, q):  # dq / (2 q); no variance, no derivative (u = 0).
    positive = q > 0
    return jnp.where(positive, dq / (2 * jnp.where(positive, q, 1)), 0)

  w1, w2 = half_ratio(dq1, q1), half_ratio(dq2, q2)
  tangent = (cross * (dc - c * (w1 + w2)) +
             expect(lambda u: u * df(u), g) * w1 +
             expect(f, lambda v: v * dg(v)) * w2)
  return expect(f, g), tangent


def quadrature_kernel_map(fn: Fn, df: Fn, deg: int) -> KernelMap:
  """Kernel map of any `fn` by Gauss-Hermite quadrature of degree `deg`:
  `(E[fn(u) fn(v)], E[df(u) df(v)])` by `gaussian_expectation`."""

  def kernel_map(q1, q2, c, compute_dot):
    q1, q2, c = jnp.broadcast_arrays(q1, q2, c)
    nngp = gaussian_expectation(fn, fn, deg, q1, q2, c)
    dot = gaussian_expectation(df, df, deg, q1, q2, c) if compute_dot else None
    return nngp, dot
  return kernel_map
