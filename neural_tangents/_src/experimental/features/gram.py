"""Exact features of a batch from its kernel matrix.

A positive semi-definite `K = U diag(lambda) U^T` (`R x R`) is the Gram
matrix of the rows of `F = U diag(sqrt(max(lambda, 0)))`: `F F^T = K` up to
rounding (negative eigenvalues are rounding errors of a PSD matrix and are
clipped). The features depend on the whole batch: they are exact for the
rows they were computed from, and not comparable across batches.

Example:
  >>> k = jnp.array([[2., 1.], [1., 2.]])
  >>> f = gram_features(k)
  >>> np.allclose(f @ f.T, k)
  True
"""
import jax
import jax.numpy as jnp

from neural_tangents._src.utils import linalg

Array = jax.Array


def gram_features(k: Array) -> Array:
  """`(R, R)` features `F` with `F F^T = k`, for a PSD `(R, R)` matrix `k`."""
  k = (k + k.T) / 2
  eigenvalues, eigenvectors = linalg.eigh(k)
  return eigenvectors * jnp.sqrt(jnp.maximum(eigenvalues, 0))[None, :]


def gram(rows: Array) -> Array:
  """`rows @ rows.T`, the `(R, R)` Gram matrix of `(R, C)` rows."""
  return rows @ rows.T
