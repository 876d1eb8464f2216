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
  """`(R, R)` features `F` with `F F^T = k`, for a PSD `(R, R)` matrix `k`.

  A row whose variance `k[i, i]` is not finite (a NaN or infinite input)
  gets NaN features, and the others are the factor of the rest of `k`, as
  if that row were not there: one bad row does not make every entry NaN.
  Computed in float32 at least (LAPACK has no float16), returned in the
  dtype of `k`.
  """
  dtype = k.dtype
  k = k.astype(jnp.promote_types(dtype, jnp.float32))
  bad = ~jnp.isfinite(jnp.diagonal(k))
  k = jnp.where(bad[:, None] | bad[None, :], 0, k)
  k = (k + k.T) / 2
  eigenvalues, eigenvectors = linalg.eigh(k)
  out = eigenvectors * jnp.sqrt(jnp.maximum(eigenvalues, 0))[None, :]
  return jnp.where(bad[:, None], jnp.nan, out).astype(dtype)


def gram(rows: Array) -> Array:
  """`rows @ rows.T`, the `(R, R)` Gram matrix of `(R, C)` rows."""
  return rows @ rows.T
