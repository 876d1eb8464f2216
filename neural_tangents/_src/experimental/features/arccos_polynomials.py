"""Polynomials with non-negative coefficients close to the arc-cosine duals.

The normalized arc-cosine kernels (Cho & Saul 2009) of orders 0 and 1,

  kappa_0(rho) = 1 - arccos(rho) / pi
  kappa_1(rho) = (sqrt(1 - rho^2) + (pi - arccos(rho)) rho) / pi

are the duals of the step and the ReLU: for `(u, v)` standard normal with
correlation `rho`, `E[step(u) step(v)] = kappa_0(rho) / 2` and
`E[relu(u) relu(v)] = kappa_1(rho) / 2`. Both are power series in `rho` with
non-negative coefficients, but the series converge slowly at `rho = 1`
(`kappa_0` has a square-root cusp there), so truncating them is a poor
approximation. Instead the coefficients `c_j >= 0` of `sum_{j <= p} c_j
rho^j` are fit by non-negative least squares on Chebyshev nodes of
`[-1, 1]`, with a heavy weight on `rho = 1` (the diagonal of the kernel,
which then stays exact up to about 1e-3 and keeps deep compositions on
scale). Non-negative coefficients make `sqrt(c_j)` real: each term is the
kernel of scaled tensor powers `sqrt(c_j) x^{(x) j}` (Zandieh et al. 2021,
arXiv 2106.07880, section 4).

Maximal errors on `[-1, 1]`: `kappa_1` about 4e-4 at degree 8 and 1e-4 at
16; `kappa_0` 0.033 at 8, 0.023 at 16 (at the cusp).

Example:
  >>> c = arccos_coefficients(1, 8)
  >>> bool(abs(np.polyval(c[::-1], 1.) - 1) < 1e-3)
  True
"""
import functools

import numpy as np

_N_NODES = 2000
_DIAGONAL_WEIGHT = 100.


def kappa0(rho: np.ndarray) -> np.ndarray:
  """`1 - arccos(rho) / pi`, the normalized arc-cosine kernel of order 0."""
  return 1 - np.arccos(np.clip(rho, -1, 1)) / np.pi


def kappa1(rho: np.ndarray) -> np.ndarray:
  """`(sqrt(1 - rho^2) + (pi - arccos rho) rho) / pi`, of order 1."""
  rho = np.clip(rho, -1, 1)
  return (np.sqrt(1 - rho**2) + (np.pi - np.arccos(rho)) * rho) / np.pi


def nonnegative_least_squares(a: np.ndarray, b: np.ndarray,
                              tol: float = 1e-12) -> np.ndarray:
  """`argmin_{x >= 0} |a x - b|` by the active set method of Lawson & Hanson.

  Example:
    >>> nonnegative_least_squares(np.eye(2), np.array([1., -1.]))
    array([1., 0.])
  """
  n = a.shape[1]
  passive = np.zeros(n, bool)
  x = np.zeros(n)
  gradient = a.T @ (b - a @ x)
  for _ in range(3 * n + 3):
    candidates = np.where(passive, -np.inf, gradient)
    if passive.all() or candidates.max() <= tol:
      break
    passive[np.argmax(candidates)] = True
    while True:
      z = np.zeros(n)
      z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
      if np.all(z[passive] > 0):
        x = z
        break
      # Step towards `z` until a coefficient reaches 0, and drop it.
      blocking = passive & (z <= 0)
      alpha = np.min(x[blocking] / (x[blocking] - z[blocking]))
      x = x + alpha * (z - x)
      passive &= x > tol
      x[~passive] = 0
    gradient = a.T @ (b - a @ x)
  return x


@functools.lru_cache(maxsize=None)
def _fit(order: int, degree: int) -> tuple[float, ...]:
  kappa = {0: kappa0, 1: kappa1}[order]
  nodes = np.cos(np.pi * (np.arange(_N_NODES) + 0.5) / _N_NODES)
  nodes = np.concatenate([nodes, [1.]])
  weights = np.ones_like(nodes)
  weights[-1] = _DIAGONAL_WEIGHT
  powers = nodes[:, None]**np.arange(degree + 1)[None, :]
  coef = nonnegative_least_squares(powers * weights[:, None],
                                   kappa(nodes) * weights)
  return tuple(float(c) for c in coef)


def arccos_coefficients(order: int, degree: int) -> np.ndarray:
  """Non-negative `c_0..c_p` with `sum_j c_j rho^j ~ kappa_order(rho)`.

  Args:
    order: 0 (the step's dual) or 1 (the ReLU's).
    degree: the degree `p >= 0` of the polynomial.

  Returns:
    A float64 array of `p + 1` coefficients, in increasing degree.
  """
  if order not in (0, 1):
    raise ValueError(f'`order` must be 0 or 1; got {order!r}.')
  return np.array(_fit(order, int(degree)))
