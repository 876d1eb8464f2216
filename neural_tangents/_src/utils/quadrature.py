"""Gauss-Hermite quadrature: nodes and weights for expectations over a
standard normal variable, at any degree."""
import numpy as np
import scipy.special


# Above this degree NumPy's `hermgauss` overflows (NaN weights from 360 on).
_NUMPY_HERMGAUSS_MAX_DEG = 300


def gauss_hermite(deg: int) -> tuple[np.ndarray, np.ndarray]:
  """Nodes and weights of the `deg`-point Gauss rule for `E[g(z)]`, `z`
  standard normal (weights summing to 1).

  NumPy's `hermgauss` up to degree 300 (as always), SciPy's
  `roots_hermitenorm` above, where `hermgauss` overflows to NaN weights.

  Example:
    >>> z, w = gauss_hermite(3)
    >>> float(np.sum(w * z**4))  # E[z^4] = 3
    3.0000000000000004
  """
  if deg <= _NUMPY_HERMGAUSS_MAX_DEG:
    nodes, weights = np.polynomial.hermite.hermgauss(deg)
    # Nodes for the weight exp(-z^2 / 2).
    return np.sqrt(2) * nodes, weights / np.sqrt(np.pi)
  nodes, weights = scipy.special.roots_hermitenorm(deg)
  return nodes, weights / np.sqrt(2 * np.pi)
