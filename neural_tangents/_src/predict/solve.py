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
import concurrent.futures
import math
import os
from typing import Any, Callable, Iterator, NamedTuple, Optional, Union
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg

from neural_tangents._src.batching.options import progress_bar_class
from neural_tangents._src.predict.options import solve_options
from neural_tangents._src.predict.options import SolveOptions


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

# Host kernels are multiplied in blocks of rows of about this many bytes.
BLOCK_BYTES = 64 * 2**20


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


class KernelRows:
  """An `n x n` kernel given by blocks of its rows, never held whole.

  Args:
    rows_fn: `rows_fn(start, stop)` returning rows `start:stop` of the kernel,
      `(stop - start, n)`, e.g. `lambda a, b: kernel_fn(x_train[a:b],
      x_train, 'nngp')`.
    n: number of rows and columns.
    diagonal: the kernel's diagonal `(n,)` (needed for the regularizer's
      scale and the preconditioner); computed from row blocks if `None`.
    block_rows: rows per call of `rows_fn` in products.
    dtype: dtype of the rows.

  Example:
    >>> import numpy as np
    >>> from neural_tangents.predict import KernelRows
    >>> x = np.random.RandomState(0).randn(6, 2)
    >>> k = KernelRows(lambda a, b: x[a:b] @ x.T + 1., 6, block_rows=4)
    >>> k.shape, bool(np.allclose(k.rows(0, 6), x @ x.T + 1.))
    ((6, 6), True)
  """

  def __init__(self, rows_fn: Callable[[int, int], Any], n: int,
               diagonal: Optional[Any] = None, block_rows: int = 1024,
               dtype: Any = np.float32):
    if not callable(rows_fn):
      raise TypeError(f'`rows_fn` must be callable as rows_fn(start, stop); '
                      f'got a {type(rows_fn).__name__}. Pass a function '
                      'returning rows start:stop, e.g. `lambda a, b: '
                      "kernel_fn(x[a:b], x, 'nngp')`.")
    if not isinstance(n, (int, np.integer)) or n < 1:
      raise ValueError(f'`n` must be a positive int; got {n!r}. Pass the '
                       'number of rows (and columns) of the kernel.')
    if (not isinstance(block_rows, (int, np.integer)) or
        isinstance(block_rows, (bool, np.bool_)) or block_rows < 1):
      raise ValueError(f'`block_rows` must be an int >= 1; got '
                       f'{block_rows!r}. Pass the rows per call of `rows_fn`, '
                       'e.g. block_rows=1024.')
    if diagonal is not None and np.shape(diagonal) != (n,):
      raise ValueError(f'`diagonal` must have shape ({n},) (one entry per row '
                       f'of the kernel, `n`={n}); got shape '
                       f'{np.shape(diagonal)}. Pass the kernel\'s diagonal, or '
                       'None to compute it from row blocks.')
    self.rows_fn = rows_fn
    self.shape = (int(n), int(n))
    self.ndim = 2
    self.block_rows = int(block_rows)
    self._diagonal = None if diagonal is None else np.asarray(diagonal)
    self.dtype = np.dtype(dtype)

  # Whether reading one row costs about `n` entries (the pivoted Cholesky
  # preconditioner then reads its pivots' rows one by one); a kernel read by
  # whole row blocks (`StoredKernel`) says False and is read in one pass.
  single_rows_are_cheap = True

  def rows(self, start: int, stop: int) -> np.ndarray:
    rows = np.asarray(self.rows_fn(start, stop))
    if rows.shape != (stop - start, self.shape[1]):
      raise ValueError(
          f'`rows_fn({start}, {stop})` of a `KernelRows` with n={self.shape[0]} '
          f'must return rows {start}:{stop} of the kernel, of shape '
          f'({stop - start}, {self.shape[0]}); got shape {rows.shape}. Check '
          '`n` (the number of training points) and that `rows_fn` returns '
          'the rows against all of them, e.g. `lambda a, b: '
          "kernel_fn(x[a:b], x, 'nngp')`.")
    return rows

  def row_blocks(self) -> Iterator[tuple[int, int, np.ndarray]]:
    """`(start, stop, rows)` of every block of `block_rows` rows."""
    n = self.shape[0]
    for start in range(0, n, self.block_rows):
      stop = min(n, start + self.block_rows)
      yield start, stop, self.rows(start, stop)

  def combine(self, partial: np.ndarray) -> np.ndarray:
    """`partial`, whose rows `row_blocks` gave, as the whole result (a
    kernel whose blocks are dealt to processes sums theirs)."""
    return partial

  def diagonal(self) -> np.ndarray:
    if self._diagonal is None:
      n = self.shape[0]
      self._diagonal = np.concatenate([
          np.diagonal(self.rows(a, min(a + self.block_rows, n))[:, a:])
          for a in range(0, n, self.block_rows)])
    return self._diagonal


def _is_traced(k: Any) -> bool:
  return isinstance(k, jax.core.Tracer)


def _on_host(k: Any) -> bool:
  """Whether `k` is (or can be used as) a host array without a device copy."""
  if isinstance(k, (np.ndarray, KernelRows)):
    return True
  return (not _is_traced(k) and
          all(d.platform == 'cpu' for d in k.devices()))


def all_on_host(*arrays: Any) -> bool:
  """Whether every array is concrete and in host memory (numpy or CPU JAX):
  then numpy computes with them without compiling anything."""
  return all(a is None or (not _is_traced(a) and _on_host(a))
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
  if _is_traced(k) or isinstance(k, KernelRows):
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
  if _is_traced(lambda_max):
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
  evals, evecs = jnp.linalg.eigh(k)
  cutoff = _noise_cutoff(k.shape[0], evals.dtype, evals[-1])
  if not _is_traced(evals):
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
    if self.on_host and not _is_traced(b):
      b = np.asarray(b, self.factor.dtype)
      return jnp.asarray(scipy.linalg.cho_solve((self.factor, True), b,
                                                check_finite=False))
    return jax.scipy.linalg.cho_solve((self.factor, True), b)

  def half_solve(self, b: Array) -> Array:
    """`L^{-1} b`, so that `(L^{-1} b)^T (L^{-1} b) = b^T (K + r I)^{-1} b`."""
    if self.on_host and not _is_traced(b):
      b = np.asarray(b, self.factor.dtype)
      return jnp.asarray(scipy.linalg.solve_triangular(
          self.factor, b, lower=True, check_finite=False))
    return jax.scipy.linalg.solve_triangular(self.factor, b, lower=True)


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
  return jnp.linalg.cholesky(k + reg * jnp.eye(n, dtype=k.dtype))


# Conjugate gradients.


def _row_block(k: Any, n: int) -> int:
  if isinstance(k, KernelRows):
    return k.block_rows
  # float64 rows, at most an eighth of the kernel at a time (a kernel may be
  # rectangular, e.g. test-train, or have no rows or columns).
  columns = max(1, k.shape[-1])
  return max(1, min(BLOCK_BYTES // (8 * columns), -(-n // 8)))


def _rows(k: Any, start: int, stop: int) -> np.ndarray:
  if isinstance(k, KernelRows):
    return k.rows(start, stop)
  return np.asarray(k[start:stop])


def host_view(k: Any) -> Any:
  """`k` as a numpy array without a copy where it lives in host memory (CPU
  JAX arrays); device arrays and `KernelRows` as they are."""
  if isinstance(k, (np.ndarray, KernelRows)) or not _on_host(k):
    return k
  return np.asarray(k)


class _Operand:
  """`v` of `k @ v`, in float64 and (made on first use) in float32."""

  def __init__(self, v: np.ndarray):
    self.float64 = np.asarray(v, np.float64)
    self._lower = {}

  def of(self, dtype: np.dtype) -> np.ndarray:
    if dtype not in self._lower:
      self._lower[dtype] = self.float64.astype(dtype)
    return self._lower[dtype]


# Exact products convert rows to float64 this many rows at a time, one range
# of rows per core: each piece's product reads all of `v` (`n x targets`),
# so pieces of fewer rows would spend their time re-reading it (measured on
# 2 cores at n = 20,000: 64 rows 2.4x a bare float32 product, 3 rows 6.5x,
# one float64 copy of 167-row blocks 11x).
EXACT_PIECE_ROWS = 64

_POOL: Optional[concurrent.futures.ThreadPoolExecutor] = None


def _exact_product(rows: np.ndarray, v: np.ndarray) -> np.ndarray:
  """`rows @ v` with `rows` converted to float64 piece by piece into a
  reused buffer, each core converting its own range of rows (numpy releases
  the GIL), instead of writing and reading one float64 copy of all rows."""
  global _POOL
  n_rows, columns = rows.shape
  out = np.empty((n_rows, v.shape[1]), np.float64)
  piece = EXACT_PIECE_ROWS

  def convert_and_multiply(lo: int, hi: int) -> None:
    buffer = np.empty((min(piece, hi - lo), columns), np.float64)
    for a in range(lo, hi, piece):
      b = min(hi, a + piece)
      np.copyto(buffer[:b - a], rows[a:b])
      np.matmul(buffer[:b - a], v, out=out[a:b])

  workers = min(os.cpu_count() or 1, -(-n_rows // piece))
  if workers <= 1:
    convert_and_multiply(0, n_rows)
    return out
  if _POOL is None:
    _POOL = concurrent.futures.ThreadPoolExecutor(os.cpu_count())
  bounds = np.linspace(0, n_rows, workers + 1).astype(int)
  for done in [_POOL.submit(convert_and_multiply, lo, hi)
               for lo, hi in zip(bounds[:-1], bounds[1:])]:
    done.result()
  return out


def _block_product(rows: Any, v: _Operand, exact: bool) -> np.ndarray:
  """`rows @ v` in float64: exact to float64 round-off (`exact`), or in the
  rows' own precision (float32 BLAS for float32 rows, at the memory-bandwidth
  bound) with a float64 result."""
  rows = np.asarray(rows)
  if rows.dtype == np.float64:
    return rows @ v.float64
  if exact:
    return _exact_product(rows, v.float64)
  dtype = np.promote_types(rows.dtype, np.float32)
  return np.asarray(rows.astype(dtype, copy=False) @ v.of(dtype), np.float64)


def kernel_matmul(k: Any, v: np.ndarray, exact: bool = True) -> np.ndarray:
  """`k @ v` as a float64 array.

  Host kernels go by blocks of rows (block-sized temporaries, no `n x n`
  one). With `exact` (the default) the entries of `k` are multiplied in
  float64, so the product is exact to float64 round-off whatever the
  kernel's dtype and conjugate gradients can certify residuals below the
  kernel's `eps * cond`; otherwise in the kernel's own precision, about 8x
  faster for float32 kernels (the conversion to float64 dominates), with
  errors of `eps * |K| |v|`. Device kernels multiply in their own dtype.
  """
  n = k.shape[0]
  if not isinstance(k, (np.ndarray, KernelRows)):
    return np.asarray(k @ jnp.asarray(v, k.dtype), np.float64)
  v = _Operand(v)
  if isinstance(k, KernelRows):
    out = np.zeros((n, v.float64.shape[1]), np.float64)
    for start, stop, rows in k.row_blocks():
      out[start:stop] = _block_product(rows, v, exact)
    return k.combine(out)
  out = np.empty((n, v.float64.shape[1]), np.float64)
  step = _row_block(k, n)
  for start in range(0, n, step):
    stop = min(n, start + step)
    out[start:stop] = _block_product(k[start:stop], v, exact)
  return out


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
    row = (_rows(k, i, i + 1).reshape(-1).astype(np.float64)
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
    if _is_traced(b):
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
  if not _is_traced(k):
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
  if solver == 'cg' and _is_traced(k):
    raise ValueError('`solver="cg"` needs a concrete kernel, not one traced '
                     'under `jit`; use solver="cholesky" inside `jit`.')
  scale = float(np.mean(np.asarray(diagonal(k), np.float64))) if not (
      _is_traced(k)) else 1.
  if solver == 'cg':
    return CGSolver(k, float(reg), options.tol, options.maxiter,
                    options.preconditioner_rank, name,
                    diag_reg=float(diag_reg), scale=scale,
                    absolute=diag_reg_absolute_scale,
                    progress=options.progress)

  dtype = compute_dtype(k.dtype)
  if solver == 'cholesky' and not _is_traced(k):
    if _on_host(k):
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
  eig = eigh_psd(k_reg, name, float(diag_reg) if not _is_traced(diag_reg)
                 else 0., scale, diag_reg_absolute_scale)
  n_zero = 0 if _is_traced(k) else int(jnp.sum(~eig.positive))
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
