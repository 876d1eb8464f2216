"""Kernels as blocks of rows, and their products with vectors on the host.

`KernelRows` is a kernel given by blocks of rows (computed on the fly, or
read from a store: `stored.StoredKernel`), never held whole. `kernel_matmul`
multiplies a host kernel (a numpy array, an `np.memmap`, a `KernelRows`)
with a block of vectors by blocks of rows, in float64 arithmetic (`exact`)
or in the kernel's own precision (float32 BLAS at the memory-bandwidth
bound); device kernels multiply in their own dtype. `solve.py`'s conjugate
gradients use both.

Example:
  >>> import numpy as np
  >>> k = np.arange(12.).reshape(3, 4)[:, :3].astype(np.float32)
  >>> kernel_matmul(k, np.ones((3, 1))).ravel()
  array([ 3., 15., 27.])
"""
import concurrent.futures
import functools
import os
from typing import Any, Callable, Iterator, Optional

import jax
import jax.numpy as jnp
import numpy as np

# Host kernels are multiplied in blocks of rows of about this many bytes.
BLOCK_BYTES = 64 * 2**20


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


def is_traced(k: Any) -> bool:
  return isinstance(k, jax.core.Tracer)


def on_host(k: Any) -> bool:
  """Whether `k` is (or can be used as) a host array without a device copy."""
  if isinstance(k, (np.ndarray, KernelRows)):
    return True
  return (not is_traced(k) and
          all(d.platform == 'cpu' for d in k.devices()))


def to_device(x: Any) -> jax.Array:
  """`jnp.asarray(x)` of a host array, by `jax.device_put`: the same array
  (dtype canonicalized alike, uncommitted), without the small program that
  `jnp.asarray` compiles for each new shape of a numpy array.

  Example:
    >>> to_device(np.ones((2, 3), np.float32)).shape
    (2, 3)
  """
  return jax.device_put(np.asarray(x))


def row_block(k: Any, n: int) -> int:
  if isinstance(k, KernelRows):
    return k.block_rows
  # float64 rows, at most an eighth of the kernel at a time (a kernel may be
  # rectangular, e.g. test-train, or have no rows or columns).
  columns = max(1, k.shape[-1])
  return max(1, min(BLOCK_BYTES // (8 * columns), -(-n // 8)))


def rows_of(k: Any, start: int, stop: int) -> np.ndarray:
  """Rows `start:stop` of `k` as a host array.

  Rows of a device kernel are read by one program per number of rows (the
  start is an argument): a slice with a constant start compiles a program
  per start, which on an accelerator (~0.1-1 s a compilation) made the
  preconditioner's 100 single-row reads of a TPU kernel take minutes.
  """
  if isinstance(k, KernelRows):
    return k.rows(start, stop)
  if isinstance(k, jax.Array) and not on_host(k):
    return np.asarray(_device_rows(k, start, stop - start))
  return np.asarray(k[start:stop])


@functools.partial(jax.jit, static_argnums=2)
def _device_rows(k: jax.Array, start: Any, size: int) -> jax.Array:
  return jax.lax.dynamic_slice_in_dim(k, start, size)


def host_view(k: Any) -> Any:
  """`k` as a numpy array without a copy where it lives in host memory (CPU
  JAX arrays); device arrays and `KernelRows` as they are."""
  if isinstance(k, (np.ndarray, KernelRows)) or not on_host(k):
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
  step = row_block(k, n)
  for start in range(0, n, step):
    stop = min(n, start + step)
    out[start:stop] = _block_product(k[start:stop], v, exact)
  return out
