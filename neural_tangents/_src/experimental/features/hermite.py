"""Hermite expansions of activations, and so of their dual kernels.

With the normalized (probabilists') Hermite polynomials
`h_k = He_k / sqrt(k!)`, orthonormal under the standard normal `z`, an
activation at scale `sigma` expands as `phi(sigma z) = sum_k a_k(sigma)
h_k(z)` with

  a_k(sigma) = E[phi(sigma z) h_k(z)],

and, as `E[h_k(z_1) h_j(z_2)] = delta_kj rho^k` for standard normals of
correlation `rho` (Mehler), the dual kernel of `phi` at variances
`sigma_1^2`, `sigma_2^2` and covariance `sigma_1 sigma_2 rho` is

  E[phi(u) phi(v)] = sum_k a_k(sigma_1) a_k(sigma_2) rho^k

(O'Donnell 2014, ch. 11; Daniely et al. 2016; Han et al. 2022, arXiv
2209.04121, section 3). The derivative's dual, which the NTK needs, has the
coefficients `b_k(sigma) = E[phi'(sigma z) h_k(z)] = sqrt(k + 1)
a_{k+1}(sigma) / sigma` (Gaussian integration by parts), so it needs no
derivative of `phi`. The expectations are Gauss-Hermite quadratures: nodes
and weights from NumPy, `phi` evaluated in JAX at each row's `sigma` (so the
norms of the inputs are exact, not assumed to be 1).

Truncating at degree `p` leaves `sum_{k > p} a_k(sigma_1) a_k(sigma_2)
rho^k`: geometrically small for smooth activations (for `erf`, the ratio is
`2 sigma^2 / (1 + 2 sigma^2)`), algebraically for kinks (ReLU: `k^{-3/2}`
for `a_k^2`).

Example:
  >>> sigma = jnp.ones((2, 1))
  >>> a = hermite_coefficients(lambda x: x, sigma, 3, 20)
  >>> np.round(np.asarray(a[0]), 6) + 0.  # `+ 0.` turns any -0. into 0.
  array([0., 1., 0., 0.], dtype=float32)
"""
import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


@functools.lru_cache(maxsize=None)
def _quadrature(degree: int, n_nodes: int) -> tuple[np.ndarray, np.ndarray]:
  """Nodes `(n,)` and `weights[i] * h_k(nodes[i])` `(n, degree + 1)`."""
  nodes, weights = np.polynomial.hermite_e.hermegauss(n_nodes)
  weights = weights / math.sqrt(2 * math.pi)
  h = np.zeros((degree + 1, n_nodes))
  h[0] = 1
  if degree >= 1:
    h[1] = nodes
  for k in range(1, degree):
    h[k + 1] = (nodes * h[k] - math.sqrt(k) * h[k - 1]) / math.sqrt(k + 1)
  return nodes, (weights[None, :] * h).T


def hermite_coefficients(fn: Callable[[Array], Array], sigma: Array,
                         degree: int, n_quadrature: int) -> Array:
  """`a_k(sigma) = E[fn(sigma z) h_k(z)]` for `k = 0..degree`.

  Args:
    fn: the activation, elementwise on JAX arrays.
    sigma: `(R, 1)` standard deviations (the norms of the input rows).
    degree: the largest degree `p`.
    n_quadrature: the number of Gauss-Hermite nodes.

  Returns:
    `(R, p + 1)` coefficients.
  """
  nodes, weighted = _quadrature(degree, n_quadrature)
  values = fn(sigma * jnp.asarray(nodes, sigma.dtype)[None, :])
  return values @ jnp.asarray(weighted, sigma.dtype)


def derivative_coefficients(fn: Callable[[Array], Array], sigma: Array,
                            degree: int, n_quadrature: int) -> Array:
  """`b_k(sigma) = E[fn'(sigma z) h_k(z)]` for `k = 0..degree`.

  `sqrt(k + 1) a_{k+1}(sigma) / sigma` where `sigma > 0`; at `sigma = 0`,
  `b_k = fn'(0) [k = 0]` (by `jax.grad`).

  Args and returns as `hermite_coefficients`.
  """
  a = hermite_coefficients(fn, sigma, degree + 1, n_quadrature)
  positive = sigma > 0
  scale = jnp.sqrt(jnp.arange(1, degree + 2, dtype=sigma.dtype))[None, :]
  b = scale * a[:, 1:] / jnp.where(positive, sigma, 1)
  at_zero = jax.grad(lambda t: jnp.sum(fn(t)))(jnp.zeros((), sigma.dtype))
  first = (jnp.arange(degree + 1) == 0).astype(sigma.dtype)[None, :]
  return jnp.where(positive, b, at_zero * first)
