"""Linear algebra of the gradient flow `df/ds = -Theta (f - y) / n`: the
eigendecomposition of a PSD train-train kernel, relaxation factors per time,
and posterior covariances."""
import math
from typing import Any, NamedTuple, Optional

import jax.numpy as jnp

from neural_tangents._src.predict.layout import Array
from neural_tangents._src.predict.layout import ArrayOrScalar


def _regularize(k: Array, diag_reg: float,
                diag_reg_absolute_scale: bool) -> Array:
  """`k + diag_reg * mean(diag(k)) * I`, or `k + diag_reg * I` if absolute."""
  scale = 1. if diag_reg_absolute_scale else jnp.trace(k) / k.shape[0]
  return k + diag_reg * scale * jnp.eye(k.shape[0], dtype=k.dtype)


# Eigenvalues of computed `n x n` kernels that are exactly singular in exact
# arithmetic come out up to ~`sqrt(n) * eps * lambda_max` (measured on
# low-rank and duplicated-point kernels, float32 and float64); below
# `_NOISE_FLOOR` times that they are treated as zero, since inverting round-off
# would blow up predictions. The `n * eps` of `lstsq` would be too high: on a
# 2,000-point float32 ReLU NTK (condition number 2e4) it drops half the
# spectrum and moves predictions by 0.17 where float32 is accurate to 3e-4.
_NOISE_FLOOR = 4.


class _Eigen(NamedTuple):
  """Eigendecomposition of a PSD matrix, with negligible eigenvalues masked.

  Attributes:
    evals: eigenvalues, with masked ones replaced by 1 (never divided by 0).
    evecs: orthonormal eigenvectors as columns.
    positive: mask of the eigenvalues above the numerical zero.
  """
  evals: Array
  evecs: Array
  positive: Array


def _eigh_psd(k: Array) -> _Eigen:
  """Eigendecomposition of a symmetric PSD `k` (round-off negatives -> 0)."""
  k = (k + k.T) / 2
  evals, evecs = jnp.linalg.eigh(k)
  cutoff = (_NOISE_FLOOR * math.sqrt(k.shape[0]) * jnp.finfo(evals.dtype).eps *
            jnp.maximum(evals[-1], 0))
  positive = evals > cutoff
  return _Eigen(jnp.where(positive, evals, 1.), evecs, positive)


def _flow_times(t: Optional[ArrayOrScalar], rate: float,
                dtype: Any) -> tuple[Optional[Array], tuple[int, ...]]:
  """Flattened flow times `rate * t` and the shape of `t`; `None`: infinity."""
  if t is None:
    return None, ()
  t = jnp.asarray(t, dtype)
  return t.reshape(-1) * rate, t.shape


def _lead(x: Array, t_shape: tuple[int, ...]) -> Array:
  """`x` with `len(t_shape)` leading unit axes, to add to per-time outputs."""
  return x.reshape((1,) * len(t_shape) + x.shape)


def _relaxation(eig: _Eigen, tau: Optional[Array]) -> Array:
  """`1 - exp(-lambda tau)`, shape `(n_times, n_evals)`; 1 at infinite time."""
  if tau is None:
    return eig.positive.astype(eig.evals.dtype)[None]
  return jnp.where(eig.positive[None],
                   -jnp.expm1(-eig.evals[None] * tau[:, None]), 0.)


def _integrated_relaxation(eig: _Eigen, tau: Optional[Array]) -> Array:
  """`(1 - exp(-lambda tau)) / lambda`: `1 / lambda` at infinite time.

  Zero on masked eigenvalues: for a PSD kernel of train and test points
  together, the test-train kernel vanishes on the null space of the train-train
  kernel, so these directions carry nothing to the test set.
  """
  return _relaxation(eig, tau) / eig.evals[None]


def _scaled_product(left: Array, scales: Array, right: Array) -> Array:
  """`left @ diag(scales[i]) @ right` for each row `i` of `scales`."""
  return jnp.einsum('ij,tj,jk->tik', left, scales, right)


def _posterior_covariance(b: Array, scales: Array, k_test_test: Array,
                          d: Array, middle: Optional[Array],
                          evals: Array) -> Array:
  """Covariance of `f_0(x) - A f_0(X)` with `A = B diag(scales) V^T`.

  With `K` the NNGP, `f_0` has covariance `K`, so the covariance is
  `K** - A K*^T - K* A^T + A K A^T`, where `D = V^T K*^T` and
  `middle = V^T K V`. `middle=None` means that `V` diagonalizes `K` with
  eigenvalues `evals` (the NNGP-trained case), saving a cubic product.

  Args:
    b: `(M*, M)`, the test-train kernel driving the flow times `V`.
    scales: `(T, M)`, flow factors per time.
    k_test_test: `(M*, M*)` NNGP.
    d: `(M, M*)`.
    middle: `(M, M)` or None.
    evals: `(M,)`, used when `middle` is None.

  Returns:
    `(T, M*, M*)` covariances.
  """
  cross = _scaled_product(b, scales, d)
  b_scaled = b[None] * scales[:, None, :]
  if middle is None:
    b_scaled = b_scaled * jnp.sqrt(evals)[None, None]
    inner = b_scaled @ jnp.swapaxes(b_scaled, -1, -2)
  else:
    inner = b_scaled @ middle @ jnp.swapaxes(b_scaled, -1, -2)
  cov = k_test_test[None] - cross - jnp.swapaxes(cross, -1, -2) + inner
  # Round-off makes the sum slightly asymmetric; a covariance is symmetric.
  return (cov + jnp.swapaxes(cov, -1, -2)) / 2
