"""Solving with the regularized train-train kernel `K + r I` of `predict`.

Three solvers, chosen by the `solver` argument of the predict functions:

* `'cholesky'` (the default at infinite time): `K + r I = L L^T`, about
  `n^3 / 3` flops and one `n x n` factor. On the CPU backend it runs in SciPy
  (LAPACK `potrf`, no compilation), factoring one copy of the kernel in place.
  A kernel that is singular to working precision falls back to the
  eigendecomposition's pseudo-inverse (with a warning); an indefinite one
  raises a `ValueError` naming the `diag_reg` that would make it positive
  definite.
* `'eigh'`: `K + r I = V diag(l) V^T`, about `9 n^3` flops; needed for finite
  training times, and used there whatever `solver` is. Eigenvalues below the
  round-off level `4 sqrt(n) eps l_max` are treated as zero (pseudo-inverse).
* `'cg'`: preconditioned conjugate gradients, all targets at once (one
  product with a block of vectors per iteration), with a rank-`r` pivoted
  Cholesky preconditioner `P = L_r L_r^T + s I`. It needs only products with
  `K` and `r` of its rows, so the kernel may be a device array, a host numpy
  array, an `np.memmap` (as `nt.batch(..., store_on_device=False)` returns,
  or a file on disk), a `KernelRows` computing row blocks on the fly, or a
  `stored.StoredKernel` reading them from an `nt.batch` store; host kernels
  are multiplied in blocks of rows, so the solve adds only `O(n * targets)`
  memory. Iterates are float64; float32 host kernels are multiplied in
  float32 (the memory-bandwidth bound), with the residual replaced by the
  exact float64 one whenever it fell by `REPLACEMENT_DECREASE` and before
  stopping. Convergence is reported in a `SolveInfo`.

Example:
  >>> import numpy as np
  >>> from neural_tangents._src.predict.solve import factorize
  >>> x = np.random.RandomState(0).randn(50, 3)
  >>> k = np.exp(-((x[:, None] - x[None]) ** 2).sum(-1))
  >>> y = np.ones((50, 1))
  >>> solver = factorize(k, 1e-2, diag_reg_absolute_scale=True, solver='cg',
  ...                    tol=1e-8)
  >>> a = solver.solve(y)
  >>> bool(np.allclose(k @ a + 1e-2 * a, y, atol=1e-6))
  True
  >>> solver.info.converged
  True
"""
import math
from typing import Any, Callable, NamedTuple, Optional, Union
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg

from neural_tangents._src.batching.options import progress_bar_class
from neural_tangents._src.predict.kernel_rows import host_view
from neural_tangents._src.predict.kernel_rows import is_traced
from neural_tangents._src.predict.kernel_rows import kernel_matmul
from neural_tangents._src.predict.kernel_rows import KernelRows
from neural_tangents._src.predict.kernel_rows import on_host
from neural_tangents._src.predict.kernel_rows import rows_of
from neural_tangents._src.predict.kernel_rows import to_device
from neural_tangents._src.predict.options import solve_options
from neural_tangents._src.predict.options import SolveOptions
from neural_tangents._src.utils import linalg


Array = Any  # jax.Array, np.ndarray or np.memmap.

# Eigenvalues (or Cholesky pivots) of a computed `n x n` kernel that are
# exactly singular in exact arithmetic come out up to ~`sqrt(n) * eps *
# lambda_max` (measured on low-rank and duplicated-point kernels, float32 and
# float64); below `NOISE_FLOOR` times that they are treated as zero, since
# inverting round-off would blow up predictions. The `n * eps` of `lstsq`
# would be too high: on a 2,000-point float32 ReLU NTK (condition number 2e4)
# it drops half the spectrum and moves predictions by 0.17 where float32 is
# accurate to 3e-4.
NOISE_FLOOR = 4.

class SolveInfo(NamedTuple):
  """How a solve went.

  Attributes:
    solver: 'cholesky', 'eigh' or 'cg'.
    iterations: conjugate-gradient iterations of the last solve (0 for
      direct solvers).
    residual: largest relative residual `|(K + r I) x - b| / |b|` over the
      targets of the last solve (CG: the true residual, recomputed).
    converged: whether `residual <= tol` (always True for direct solvers).
  """
  solver: str
  iterations: int = 0
  residual: float = 0.
  converged: bool = True


def all_on_host(*arrays: Any) -> bool:
  """Whether every array is concrete and in host memory (numpy or CPU JAX):
  then numpy computes with them without compiling anything."""
  return all(a is None or (not is_traced(a) and on_host(a))
             for a in arrays)


def compute_dtype(dtype: Any) -> np.dtype:
  """Half precision is solved in float32 (LAPACK has no float16); integer and
  boolean kernels in JAX's default float (float32, or float64 under x64), as
  `jnp` arithmetic would promote them."""
  dtype = np.dtype(dtype)
  if not np.issubdtype(dtype, np.inexact):
    return np.dtype(jnp.result_type(float))
  if dtype.itemsize < 4:
    return np.dtype(np.float32)
  return dtype


def diagonal(k: Any) -> Any:
  if isinstance(k, KernelRows):
    return k.diagonal()
  if isinstance(k, np.ndarray):
    return np.diagonal(k)
  return jnp.diagonal(k)


def check_symmetric(k: Any, name: str = 'k_train_train',
                    n_probe: int = 8) -> None:
  """Raises `ValueError` if `k` is visibly not symmetric.

  Compares `n_probe` rows with the same columns (`O(n_probe * n)` reads, no
  copy of `k`), to a tolerance of `sqrt(eps) * max |k|` on those entries:
  kernels computed in blocks are symmetric only up to round-off.
  """
  if is_traced(k) or isinstance(k, KernelRows):
    return
  with jax.ensure_compile_time_eval():
    _check_symmetric(host_view(k), name, n_probe)


def _check_symmetric(k: Any, name: str, n_probe: int) -> None:
  n = k.shape[0]
  idx = np.unique(np.linspace(0, n - 1, min(n, n_probe)).astype(int))
  if isinstance(k, np.ndarray):
    rows, cols = np.asarray(k[idx]), np.asarray(k[:, idx]).T
  else:  # A device array: only the probed rows and columns come over.
    rows, cols = np.asarray(k[idx]), np.asarray(k[:, idx].T)
  eps = np.finfo(compute_dtype(rows.dtype)).eps
  diff = np.abs(rows.astype(np.float64) - cols)
  if diff.max() > math.sqrt(eps) * np.abs(rows).max():
    i, j = np.unravel_index(np.argmax(diff), rows.shape)
    raise ValueError(
        f'`{name}` is not symmetric: entry ({idx[i]}, {j}) is '
        f'{rows[i, j]!r} but ({j}, {idx[i]}) is {cols[i, j]!r}. A train-train '
        'kernel relates the training points to themselves and must be '
        'symmetric: pass `kernel_fn(x_train, None)` (or `(k + k.T) / 2`).')


def regularizer(k: Any, diag_reg: float, diag_reg_absolute_scale: bool
                ) -> Any:
  """The value `r` added to the diagonal: `diag_reg` times the mean diagonal
  entry of `k`, or `diag_reg` itself if absolute."""
  if diag_reg_absolute_scale:
    return diag_reg
  d = diagonal(k)
  if isinstance(d, np.ndarray):
    return diag_reg * float(np.mean(d, dtype=np.float64))
  return diag_reg * jnp.trace(k) / k.shape[0]


# Eigendecomposition.


class Eigen(NamedTuple):
  """Eigendecomposition of a PSD matrix, with negligible eigenvalues masked.

  Attributes:
    evals: eigenvalues, with masked ones replaced by 1 (never divided by 0).
    evecs: orthonormal eigenvectors as columns.
    positive: mask of the eigenvalues above the numerical zero.
  """
  evals: Array
  evecs: Array
  positive: Array


def _noise_cutoff(n: int, dtype: Any, lambda_max: Any) -> Any:
  if is_traced(lambda_max):
    return (NOISE_FLOOR * math.sqrt(n) * jnp.finfo(dtype).eps *
            jnp.maximum(lambda_max, 0))
  return (NOISE_FLOOR * math.sqrt(n) * float(np.finfo(dtype).eps) *
          max(float(lambda_max), 0.))


def _suggested_diag_reg(lambda_min: float, cutoff: float, scale: float,
                        diag_reg: float, absolute: bool) -> float:
  """The smallest `diag_reg` (2 significant digits, rounded up) for which the
  smallest eigenvalue clears twice the round-off level."""
  needed = 2. * cutoff - lambda_min
  value = diag_reg + needed / (1. if absolute else scale)
  exponent = math.floor(math.log10(value))
  return math.ceil(value / 10.**(exponent - 1)) * 10.**(exponent - 1)


def not_psd_error(name: str, lambda_min: float, lambda_max: float,
                  suggested: float) -> ValueError:
  return ValueError(
      f'`{name}` plus `diag_reg` is not positive semi-definite: its smallest '
      f'eigenvalue is {lambda_min:.3g} (largest {lambda_max:.3g}), beyond '
      'round-off. Pass `diag_reg` >= '
      f'{suggested:.2g} (the smallest value that makes it positive definite '
      'to working precision), or check how the kernel was computed (a '
      'kernel is PSD; float64 avoids round-off).')


def eigh_psd(k: Array, name: str = 'k_train_train',
             diag_reg: float = 0., scale: float = 1.,
             absolute: bool = True) -> Eigen:
  """Eigendecomposition of a symmetric PSD `k` (round-off negatives -> 0).

  Raises a `ValueError` (when `k` is concrete) if an eigenvalue is negative
  beyond round-off; `diag_reg`, `scale` and `absolute` only word it.
  """
  k = (k + k.T) / 2
  evals, evecs = linalg.eigh(k)
  cutoff = _noise_cutoff(k.shape[0], evals.dtype, evals[-1])
  if not is_traced(evals):
    lambda_min, lambda_max = float(evals[0]), float(evals[-1])
    if lambda_min < -float(cutoff) and lambda_max > 0:
      raise not_psd_error(name, lambda_min, lambda_max, _suggested_diag_reg(
          lambda_min, float(cutoff), scale, diag_reg, absolute))
  positive = evals > cutoff
  return Eigen(jnp.where(positive, evals, 1.), evecs, positive)


class EighSolver:
  """`(K + r I)^+ b` through an eigendecomposition."""

  def __init__(self, eig: Eigen):
    self.eig = eig
    self.info = SolveInfo('eigh')

  def solve(self, b: Array) -> Array:
    eig = self.eig
    scale = jnp.where(eig.positive, 1. / eig.evals, 0.)
    return eig.evecs @ (scale[:, None] * (eig.evecs.T @ b))

  def half_solve(self, b: Array) -> Array:
    """`C b` with `C^T C = (K + r I)^+`."""
    eig = self.eig
    scale = jnp.where(eig.positive, 1. / jnp.sqrt(eig.evals), 0.)
    return scale[:, None] * (eig.evecs.T @ b)


# Cholesky.


class CholeskySolver:
  """`(K + r I)^{-1} b` through `K + r I = L L^T` (host SciPy or JAX)."""

  def __init__(self, factor: Any, on_host: bool):
    self.factor = factor
    self.on_host = on_host
    self.info = SolveInfo('cholesky')

  def solve(self, b: Array) -> Array:
    if self.on_host and not is_traced(b):
      b = np.asarray(b, self.factor.dtype)
      return to_device(scipy.linalg.cho_solve((self.factor, True), b,
                                              check_finite=False))
    return linalg.cho_solve(self.factor, b)

  def half_solve(self, b: Array) -> Array:
    """`L^{-1} b`, so that `(L^{-1} b)^T (L^{-1} b) = b^T (K + r I)^{-1} b`."""
    if self.on_host and not is_traced(b):
      b = np.asarray(b, self.factor.dtype)
      return to_device(scipy.linalg.solve_triangular(
          self.factor, b, lower=True, check_finite=False))
    return linalg.solve_lower_triangular(self.factor, b)


def _host_cholesky(k: Any, reg: float, dtype: np.dtype) -> Optional[np.ndarray]:
  """Lower Cholesky factor of `k + reg I` in one host copy of `k`; `None` if
  a pivot is not positive beyond round-off."""
  # One C-ordered copy; its transpose is the Fortran-ordered array LAPACK
  # factors in place (the same matrix, `k` being symmetric).
  a = np.array(k, dtype=dtype, order='C', copy=True).T
  n = a.shape[0]
  a.flat[::n + 1] += np.asarray(reg, dtype)
  max_diag = float(np.max(a.flat[::n + 1]))
  try:
    c, _ = scipy.linalg.cho_factor(a, lower=True, overwrite_a=True,
                                   check_finite=False)
  except np.linalg.LinAlgError:
    return None
  pivots = np.square(c.flat[::n + 1].astype(np.float64))
  if not pivots.min() > float(_noise_cutoff(n, dtype, max_diag)):
    return None
  # LAPACK leaves the strict upper triangle as it was (the kernel).
  return c


def _device_cholesky(k: Array, reg: Any) -> Array:
  return _jit_cholesky(k, jnp.asarray(reg, k.dtype))


@jax.jit
def _jit_cholesky(k: Array, reg: Array) -> Array:
  n = k.shape[0]
  return linalg.cholesky(k + reg * jnp.eye(n, dtype=k.dtype))


# Conjugate gradients.


class _PivotedCholesky(NamedTuple):
  """`P = L L^T + s I` and the Cholesky factor of `s I + L^T L`."""
  low_rank: np.ndarray
  shift: float
  inner: np.ndarray

  def apply_inverse(self, v: np.ndarray) -> np.ndarray:
    """`P^{-1} v` by the Woodbury identity."""
    if self.low_rank.shape[1] == 0:
      return v / self.shift
    w = scipy.linalg.cho_solve((self.inner, True), self.low_rank.T @ v)
    return (v - self.low_rank @ w) / self.shift


def pivoted_cholesky_preconditioner(k: Any, reg: float, rank: int
                                    ) -> _PivotedCholesky:
  """Rank-`rank` pivoted Cholesky `L L^T ~ k`, from `rank` rows of `k`.

  The preconditioner is `P = L L^T + s I` with `s = reg + mean(diag(k -
  L L^T))`: the residual's mean eigenvalue stands in for the residual.

  Each step pivots on the largest remaining diagonal entry. A kernel read
  by whole row blocks (`single_rows_are_cheap` False: a store on disk) is
  read once: the pivots are then chosen among a pool of `2 * rank`
  candidates drawn (seeded) with probabilities proportional to the
  diagonal, whose columns one pass over the row blocks gives (all indices
  when `n <= 2 * rank`, the same preconditioner as row by row).
  """
  n = k.shape[0]
  d = np.array(diagonal(k), np.float64)
  scale = max(float(np.mean(d)), np.finfo(np.float64).tiny)
  rank = min(rank, n)
  low_rank = np.zeros((n, rank))
  used = 0
  allowed, pool_columns = None, None
  if isinstance(k, KernelRows) and not k.single_rows_are_cheap and rank:
    pool = _pivot_pool(d, min(n, 2 * rank))
    pool_columns = dict(zip(pool.tolist(), k.columns(pool).T))
    allowed = np.full(n, -np.inf)
    allowed[pool] = 0.
  for j in range(rank):
    i = int(np.argmax(d if allowed is None else d + allowed))
    if d[i] <= 1e-12 * scale:
      break
    row = (rows_of(k, i, i + 1).reshape(-1).astype(np.float64)
           if pool_columns is None else pool_columns[i])
    col = (row - low_rank[:, :j] @ low_rank[i, :j]) / math.sqrt(d[i])
    low_rank[:, j] = col
    d -= col**2
    d[i] = 0.
    used = j + 1
  low_rank = low_rank[:, :used]
  shift = float(reg) + max(float(np.mean(np.maximum(d, 0.))), 0.)
  if shift <= 0.:
    shift = 1e-7 * scale
  inner = np.linalg.cholesky(shift * np.eye(used) + low_rank.T @ low_rank)
  return _PivotedCholesky(low_rank, shift, inner)


def _pivot_pool(d: np.ndarray, size: int) -> np.ndarray:
  """`size` indices drawn without replacement with probabilities
  proportional to the diagonal `d` (seeded: the same on every process)."""
  weights = np.maximum(d, 0.)
  if np.count_nonzero(weights) < size:
    return np.sort(np.argsort(-weights, kind='stable')[:size])
  rng = np.random.default_rng(0)
  return np.sort(rng.choice(d.shape[0], size=size, replace=False,
                            p=weights / weights.sum()))


# Conjugate gradients multiplying in the kernel's precision replace their
# updated residual by the exact one (one float64 product) whenever it has
# fallen by this factor since the last exact one (about sqrt(eps) of float32,
# as in reliable-update CG: the drift stays below the residual).
REPLACEMENT_DECREASE = 1e-3

# Steps of the Lanczos iteration that estimates the extreme eigenvalues of an
# indefinite `K + r I` for the error message (exact when `n` is at most this).
LANCZOS_STEPS = 64


def lanczos_extremes(matmul: Callable[[np.ndarray], np.ndarray],
                     start: np.ndarray, steps: int) -> tuple[float, float]:
  """Smallest and largest Ritz values of a symmetric operator after `steps`
  Lanczos steps from `start` (full reorthogonalization, float64).

  The smallest is an upper bound on the smallest eigenvalue, the largest a
  lower bound on the largest; both are exact once the Krylov space is
  invariant (at the latest after `n` steps).
  """
  n = start.shape[0]
  basis = np.zeros((n, min(steps, n)))
  alphas, betas = [], []
  v = start / np.linalg.norm(start)
  for j in range(basis.shape[1]):
    basis[:, j] = v
    w = matmul(v[:, None])[:, 0]
    alphas.append(float(v @ w))
    w -= basis[:, :j + 1] @ (basis[:, :j + 1].T @ w)
    w -= basis[:, :j + 1] @ (basis[:, :j + 1].T @ w)
    beta = float(np.linalg.norm(w))
    if beta <= 1e-12 * max(abs(a) for a in alphas) or j + 1 == basis.shape[1]:
      break
    betas.append(beta)
    v = w / beta
  ritz = scipy.linalg.eigvalsh_tridiagonal(np.array(alphas),
                                           np.array(betas[:len(alphas) - 1]))
  return float(ritz[0]), float(ritz[-1])


class CGSolver:
  """`(K + r I)^{-1} b` by preconditioned conjugate gradients.

  All columns of `b` are iterated together (one block product with `K` per
  iteration); a solve stops when every column has a relative residual
  `<= tol`, or after `maxiter` iterations with a `RuntimeWarning`.

  `K + r I` must be positive semi-definite, as for Cholesky: a diagonal
  entry or a search direction of negative curvature (`p^T (K + r I) p <
  -c |p|^2`, `c` the round-off level of `eigh_psd`) proves it is not, and
  raises the `ValueError` of `not_psd_error`, its eigenvalues estimated by
  Lanczos from that direction. `diag_reg`, `scale` and `absolute` only word
  that message (as for `eigh_psd`).
  """

  def __init__(self, k: Any, reg: float, tol: float, maxiter: Optional[int],
               rank: int, name: str = 'k_train_train', diag_reg: float = 0.,
               scale: float = 1., absolute: bool = True,
               progress: bool = False):
    self.k = host_view(k)
    self.progress = progress
    self.reg = float(reg)
    self.tol = float(tol)
    self.maxiter = maxiter
    self.name = name
    self._wording = (float(diag_reg), float(scale), bool(absolute))
    self.info = SolveInfo('cg', converged=False)
    self.out_dtype = compute_dtype(k.dtype)
    d = np.asarray(diagonal(self.k), np.float64) + self.reg
    # Round-off level of `K + r I`: `lambda_max >= max(d)`.
    self.cutoff = float(_noise_cutoff(d.shape[0], self.out_dtype,
                                      float(np.max(d))))
    if float(np.min(d)) < -self.cutoff:
      start = np.zeros(d.shape[0])
      start[int(np.argmin(d))] = 1.
      raise self._not_psd(start)
    self.precondition = (pivoted_cholesky_preconditioner(k, reg, rank)
                         if rank else None)

  def _not_psd(self, direction: np.ndarray) -> ValueError:
    """The error for an indefinite `K + r I`, seen along `direction`."""
    n = direction.shape[0]
    # A little of a fixed random vector, so that the Krylov space also
    # reaches the top of the spectrum when `direction` is an eigenvector.
    mix = np.random.RandomState(0).randn(n)
    start = (direction / np.linalg.norm(direction) +
             1e-2 * mix / np.linalg.norm(mix))
    lambda_min, lambda_max = lanczos_extremes(self.matmul, start,
                                              LANCZOS_STEPS)
    d = np.asarray(diagonal(self.k), np.float64) + self.reg
    # Diagonal entries are Rayleigh quotients: they bound both extremes.
    lambda_min = min(lambda_min, float(np.min(d)))
    lambda_max = max(lambda_max, float(np.max(d)))
    cutoff = float(_noise_cutoff(n, self.out_dtype, lambda_max))
    diag_reg, scale, absolute = self._wording
    return not_psd_error(self.name, lambda_min, lambda_max,
                         _suggested_diag_reg(lambda_min, cutoff, scale,
                                             diag_reg, absolute))

  def matmul(self, v: np.ndarray, exact: bool = True) -> np.ndarray:
    return kernel_matmul(self.k, v, exact) + self.reg * v

  def _apply_preconditioner(self, r: np.ndarray) -> np.ndarray:
    if self.precondition is None:
      return r
    return self.precondition.apply_inverse(r)

  def solve(self, b: Array, progress: Optional[bool] = None) -> Array:
    """`(K + r I)^{-1} b`; `progress` (default: the solver's) shows a bar of
    the iterations and the residual."""
    progress = self.progress if progress is None else progress
    if is_traced(b):
      raise ValueError('`solver="cg"` solves on concrete values, but got '
                       'targets traced under `jit`; call `predict_fn` '
                       'outside `jit`, or use solver="cholesky".')
    b = np.asarray(b, np.float64)
    n = b.shape[0]
    b_norm = np.linalg.norm(b, axis=0)
    b_norm = np.where(b_norm > 0, b_norm, 1.)
    maxiter = self.maxiter if self.maxiter is not None else 10 * n
    x = np.zeros_like(b)
    r = b.copy()
    z = self._apply_preconditioner(r)
    p = z.copy()
    rz = np.sum(r * z, axis=0)
    iterations = 0
    # Products in the kernel's precision while they make progress (float32
    # kernels: float32 BLAS, ~8x faster than float64 products).
    exact = np.dtype(self.k.dtype).itemsize >= 8  # float64: always exact.
    checked = True  # Whether `r` is the exact residual `b - (K + r I) x`.
    last_exact = 1.  # The relative exact residual at the last check.
    bar = None
    if progress:
      bar = progress_bar_class()(total=maxiter, desc='conjugate gradients',
                                 unit='it')
    try:
      while True:
        relative = np.max(np.linalg.norm(r, axis=0) / b_norm)
        if (relative <= self.tol or iterations >= maxiter or
            (not exact and relative <= REPLACEMENT_DECREASE * last_exact)):
          if checked:
            break
          # The updated residual drifts from the exact one by ~eps |K| |x|
          # (eps of the products): replace it by the exact one, and stop
          # only if that is small enough.
          r = b - self.matmul(x)
          checked = True
          relative = np.max(np.linalg.norm(r, axis=0) / b_norm)
          if relative <= self.tol or iterations >= maxiter:
            break
          if not exact and relative > 0.5 * last_exact:
            exact = True  # Products in the kernel's precision stall.
          last_exact = relative
          z = self._apply_preconditioner(r)
          p = z.copy()  # A restart: the old directions fit the old `r`.
          rz = np.sum(r * z, axis=0)
        q = self.matmul(p, exact=exact)
        checked = False
        pq = np.sum(p * q, axis=0)
        curvature = pq / np.maximum(np.sum(p * p, axis=0),
                                    np.finfo(np.float64).tiny)
        if np.min(curvature) < -self.cutoff:
          raise self._not_psd(p[:, int(np.argmin(curvature))])
        alpha = np.divide(rz, pq, out=np.zeros_like(rz), where=pq > 0)
        x += alpha * p
        r -= alpha * q
        z = self._apply_preconditioner(r)
        rz_new = np.sum(r * z, axis=0)
        beta = np.divide(rz_new, rz, out=np.zeros_like(rz), where=rz > 0)
        p = z + beta * p
        rz = rz_new
        iterations += 1
        if bar is not None:
          bar.update(1)
          bar.set_postfix(residual=float(
              np.max(np.linalg.norm(r, axis=0) / b_norm)))
    finally:
      if bar is not None:
        bar.close()
    # The true residual (`r` was just recomputed exactly, or no step taken).
    residual = float(np.max(np.linalg.norm(r, axis=0) / b_norm))
    converged = residual <= self.tol
    self.info = SolveInfo('cg', iterations, residual, converged)
    if not converged:
      warnings.warn(
          f'Conjugate gradients on `{self.name}` did not converge: relative '
          f'residual {residual:.2e} > tol={self.tol:g} after {iterations} '
          'iterations. Raise `maxiter` or the preconditioner rank, raise '
          '`diag_reg` (conditioning), or use `solver="cholesky"`.',
          RuntimeWarning, stacklevel=3)
    # float64 (numpy): products with it keep the solve's accuracy, where a
    # float32 `x` (entries up to `cond` times `b`) would lose ~eps32 * cond.
    return x

  def half_solve(self, b: Array) -> Array:
    raise NotImplementedError(
        '`CGSolver.half_solve` does not exist: conjugate gradients have no '
        'square-root factor. Call `solve(b)` instead.')


Solver = Union[CholeskySolver, EighSolver, CGSolver]


def factorize(k: Any, diag_reg: float, diag_reg_absolute_scale: bool = False,
              solver: str = 'cholesky', *, tol: float = 1e-5,
              maxiter: Optional[int] = None, preconditioner_rank: int = 100,
              name: str = 'k_train_train') -> Solver:
  """A solver for `K + r I`, `r` the regularizer of `diag_reg`.

  Args:
    k: `(n, n)` train-train kernel: a JAX array, a numpy array or memmap, or
      a `KernelRows` (CG only).
    diag_reg: regularizer, relative to the mean diagonal entry of `k` unless
      `diag_reg_absolute_scale`.
    diag_reg_absolute_scale: whether `diag_reg` is absolute.
    solver: 'cholesky', 'eigh' or 'cg' (see the module docstring). Traced
      kernels (under `jit`) use 'eigh' for 'cholesky'.
    tol: CG: relative residual to reach.
    maxiter: CG: maximum iterations (`None`: `10 n`).
    preconditioner_rank: CG: rank of the pivoted Cholesky preconditioner
      (0: none).
    name: the kernel's argument name, for messages.

  Returns:
    An object with `solve(b)` (`(n, m) -> (n, m)`) and `info` (`SolveInfo`);
    direct solvers also have `half_solve(b)`.

  Raises:
    ValueError: for `diag_reg < 0`, a visibly asymmetric `k`, or a `k` not
      positive semi-definite beyond round-off.
  """
  return factorize_with(k, solve_options(
      solver, diag_reg, diag_reg_absolute_scale, tol, maxiter,
      preconditioner_rank), name)


def factorize_with(k: Any, options: SolveOptions,
                   name: str = 'k_train_train') -> Solver:
  """`factorize` with options already checked by `options.solve_options`."""
  if not is_traced(k):
    k = host_view(k)  # CPU arrays: numpy views, checked without compiling.
  check_symmetric(k, name)
  # A concrete kernel is factored now even when called under `jit`.
  with jax.ensure_compile_time_eval():
    return _factorize(k, options, name)


def _factorize(k: Any, options: SolveOptions, name: str) -> Solver:
  solver, diag_reg = options.solver, options.diag_reg
  diag_reg_absolute_scale = options.diag_reg_absolute_scale
  if isinstance(k, KernelRows) and solver != 'cg':
    raise ValueError(f'`{name}` is given by row blocks (`KernelRows`), which '
                     f'only `solver="cg"` can use; got solver={solver!r}. '
                     'Pass solver="cg", or the kernel as an array.')
  reg = regularizer(k, diag_reg, diag_reg_absolute_scale)
  if solver == 'cg' and is_traced(k):
    raise ValueError('`solver="cg"` needs a concrete kernel, not one traced '
                     'under `jit`; use solver="cholesky" inside `jit`.')
  scale = float(np.mean(np.asarray(diagonal(k), np.float64))) if not (
      is_traced(k)) else 1.
  if solver == 'cg':
    return CGSolver(k, float(reg), options.tol, options.maxiter,
                    options.preconditioner_rank, name,
                    diag_reg=float(diag_reg), scale=scale,
                    absolute=diag_reg_absolute_scale,
                    progress=options.progress)

  dtype = compute_dtype(k.dtype)
  if solver == 'cholesky' and not is_traced(k):
    # float64 on a TPU: XLA has no Cholesky there, SciPy factors it.
    if on_host(k) or linalg.factored_on_host(k):
      factor = _host_cholesky(np.asarray(k), float(reg), dtype)
      if factor is not None:
        return CholeskySolver(factor, on_host=True)
    else:
      factor = _device_cholesky(jnp.asarray(k, dtype), reg)
      pivots = jnp.square(jnp.diagonal(factor))
      max_diag = jnp.max(jnp.diagonal(k)) + reg
      if bool(jnp.min(pivots) > _noise_cutoff(k.shape[0], dtype, max_diag)):
        return CholeskySolver(factor, on_host=False)
      del factor
  k_reg = jnp.asarray(k, dtype)
  k_reg = k_reg + reg * jnp.eye(k.shape[0], dtype=dtype)
  eig = eigh_psd(k_reg, name, float(diag_reg) if not is_traced(diag_reg)
                 else 0., scale, diag_reg_absolute_scale)
  n_zero = 0 if is_traced(k) else int(jnp.sum(~eig.positive))
  if solver == 'cholesky' and n_zero:
    lambda_max = float(eig.evals[-1])
    cutoff = float(_noise_cutoff(k.shape[0], dtype, lambda_max))
    suggested = _suggested_diag_reg(0., cutoff, scale, float(diag_reg),
                                    diag_reg_absolute_scale)
    warnings.warn(
        f'`{name}` plus `diag_reg` is singular to working precision '
        f'({n_zero} of {k.shape[0]} eigenvalues below {cutoff:.2g}, the '
        f'largest {lambda_max:.3g}), so predictions use its pseudo-inverse '
        '(the minimum-norm interpolant) from an eigendecomposition, about 25x '
        'slower than a Cholesky. For a ridge solution by Cholesky pass '
        f'`diag_reg` >= {suggested:.2g}.', RuntimeWarning, stacklevel=3)
  return EighSolver(eig)
