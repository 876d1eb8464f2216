"""Kernels in the on-disk store of `nt.batch(..., store=...)`, read by rows.

`nt.batch(kernel_fn, batch_size, store_on_device=False, store=path)` returns
zarr arrays chunked by its blocks. The predict functions with
`solver='cg'` take them (or the store's directory) as the train-train and
test-train kernels and never hold them whole: a `StoredKernel` reads blocks
of rows (one chunk row at a time, the next one read by a thread while the
current one is multiplied), so a solve needs memory for about two row blocks
plus `O(n * targets)`. With `StoredKernel(k, cache_bytes=...)` it also keeps
the row blocks it reads, up to that many bytes, in memory: a solve then reads
the disk once for them and multiplies them at memory speed in every later
iteration (a kernel that fits in the budget costs one pass over the disk).

Before a kernel is used, its store's records (`complete/<i>_<j>`) must cover
every chunk: a store missing a block (a batched call killed half way) is
refused with the blocks and the fix (run the batched call again; it computes
only the missing blocks). Each row block's chunk files are checked against
the SHA-256 of their records when first read, so a damaged block is never
used as the kernel.

Under JAX's distributed runtime (`jax.process_count() > 1`, as for
`nt.batch`) the row blocks are dealt to the processes (block `i` to process
`i % count`): each reads only its blocks, and products are summed over the
processes with `multihost_utils.process_allgather`, so that every process
holds the same results.

Example:
  >>> import tempfile, os
  >>> import numpy as np
  >>> import neural_tangents as nt
  >>> from neural_tangents import stax
  >>> _, _, kernel_fn = stax.serial(stax.Dense(8), stax.Relu(), stax.Dense(1))
  >>> x = np.random.RandomState(0).randn(6, 3).astype(np.float32)
  >>> path = os.path.join(tempfile.mkdtemp(), 'k.zarr')
  >>> k = nt.batch(kernel_fn, 3, store_on_device=False, store=path)(
  ...     x, None, 'nngp')
  >>> stored = StoredKernel(k)
  >>> stored.shape, stored.block_rows
  ((6, 6), 3)
"""
import concurrent.futures
import os
import sys
from typing import Any, Iterator, Optional

import numpy as np

from neural_tangents._src.batching import direct_reads
from neural_tangents._src.batching.processes import ProcessGroup
from neural_tangents._src.batching.store import bytes_checksum
from neural_tangents._src.batching.store import check_metadata
from neural_tangents._src.batching.store import file_checksum
from neural_tangents._src.batching.store import import_zarr
from neural_tangents._src.batching.store import recorded_chunks
from neural_tangents._src.batching.store import store_root
from neural_tangents._src.predict.kernel_rows import KernelRows


def is_zarr_array(k: Any) -> bool:
  """Whether `k` is a zarr array (without importing zarr)."""
  return type(k).__module__.startswith('zarr.') and hasattr(k, 'chunks')


def is_store_path(k: Any) -> bool:
  """Whether `k` is the path of a kernel store directory."""
  return (isinstance(k, (str, os.PathLike)) and
          os.path.isdir(os.path.join(os.fspath(k), 'complete')))


def open_store_leaf(path: Any, field: Optional[str], name: str) -> Any:
  """The zarr array of a store's leaf: the only one, or `field` ('nngp',
  'ntk') of a store of several."""
  zarr = import_zarr()
  path = os.fspath(path)
  leaves = sorted(d for d in os.listdir(path) if d.startswith('leaf') and
                  os.path.isdir(os.path.join(path, d)))
  if len(leaves) == 1:
    check_metadata(path, leaves[0])  # Before zarr parses an edited one.
    return zarr.open_array(os.path.join(path, leaves[0]), mode='r')
  wanted = f'leaf_{field}'
  if field is not None and wanted in leaves:
    check_metadata(path, wanted)
    return zarr.open_array(os.path.join(path, wanted), mode='r')
  raise ValueError(
      f'`{name}={path!r}` is a kernel store with leaves {leaves}; cannot tell '
      f'which to use{"" if field is None else f" for {field!r}"}. Pass the '
      'zarr array of the kernel (what the batched call returned, e.g. '
      '`k.ntk`) instead of the directory.')


def as_row_kernel(k: Any, name: str, field: Optional[str] = None) -> Any:
  """`k` as a `StoredKernel` if it is a zarr array or a store's directory;
  anything else as it is."""
  if is_store_path(k):
    k = open_store_leaf(k, field, name)
  if is_zarr_array(k):
    return StoredKernel(k, name)
  return k


class StoredKernel(KernelRows):
  """A 2D kernel in a zarr array (an `nt.batch` store), read by row blocks.

  Args:
    array: the zarr array, `(n1, n2)`, as `nt.batch(...,
      store_on_device=False, store=path)` returns it.
    name: the argument it was passed as (for messages).
    group: the processes sharing the row blocks (default: those of JAX's
      runtime).
    cache_bytes: bytes of row blocks kept in memory once read (the first
      blocks read, whole blocks only; default 0: every pass reads the disk).
      Each process caches its own blocks, up to this budget.

  Attributes:
    block_rows: rows per block (the store's chunk rows).
    reads: `{row block index: times read from the store}` by this process
      (a block served from the cache is not read again).
    cached_blocks: the indices of the row blocks held in memory.

  Raises:
    ValueError: if `array` is not 2D, or its store does not record every
      chunk as finished.
  """

  # Reading one row reads its whole row of chunks: the preconditioner reads
  # its pivots' columns in one pass instead.
  single_rows_are_cheap = False

  def __init__(self, array: Any, name: str = 'k_train_train',
               group: Optional[ProcessGroup] = None, *,
               cache_bytes: int = 0):
    if not is_zarr_array(array):
      raise TypeError(
          f'`StoredKernel` reads a zarr array (what `nt.batch(..., '
          f'store_on_device=False, store=path)` returns, or '
          f'`zarr.open_array(path)`); got a {type(array).__name__}. Pass an '
          f'in-memory kernel directly as `{name}`: it needs no wrapper.')
    if len(array.shape) != 2:
      raise ValueError(
          f'`{name}` is a stored array of shape {tuple(array.shape)}; a '
          'stored kernel must be 2D, `(n1, n2)`: store the kernel with '
          "`get='nngp'` or `'ntk'` of a kernel without output axes.")
    self.array = array
    self.name = name
    self.shape = tuple(int(s) for s in array.shape)
    self.ndim = 2
    self.dtype = np.dtype(array.dtype)
    self.block_rows = int(array.chunks[0])
    self.group = group if group is not None else ProcessGroup.current()
    self.reads = {}
    self._diagonal = None
    if (isinstance(cache_bytes, bool) or
        not isinstance(cache_bytes, (int, np.integer)) or cache_bytes < 0):
      raise ValueError(
          f'`cache_bytes={cache_bytes!r}` must be a non-negative integer: '
          'the bytes of row blocks to keep in memory (0 to read every pass '
          'from the store, e.g. `4 * 2**30` for 4 GiB).')
    self.cache_bytes = int(cache_bytes)
    self._cache = {}
    self._chunk_files = self._check_complete()
    self._verified = set()
    self._finite = set()  # Row blocks checked for NaN and inf.
    self._raw = self._raw_chunks()
    self._reader = None  # A `direct_reads.FileReader`, made on first use.

  # --- the store's records --------------------------------------------------

  def _chunk_grid(self) -> tuple[int, int]:
    return tuple(-(-s // c) for s, c in zip(self.shape, self.array.chunks))

  def _check_complete(self) -> Optional[dict]:
    """`{(i, j): (chunk file, checksum)}`, or None for an array outside a
    store (nothing to check); raises if a chunk has no record."""
    root = store_root(self.array)
    if root is None:
      return None
    records = recorded_chunks(root)
    leaf = os.path.relpath(
        os.path.join(os.fspath(self.array.store.root), self.array.path or ''),
        root)
    check_metadata(root, leaf.replace(os.sep, '/'))
    files, missing = {}, []
    rows, columns = self._chunk_grid()
    for i in range(rows):
      for j in range(columns):
        key = os.path.join(
            leaf, self.array.metadata.encode_chunk_key((i, j))).replace(
                os.sep, '/')
        if key in records:
          files[(i, j)] = (os.path.join(root, key), records[key])
        else:
          missing.append((i, j))
    if missing:
      shown = ', '.join(map(str, missing[:8])) + (
          f' and {len(missing) - 8} more' if len(missing) > 8 else '')
      raise ValueError(
          f'`{self.name}` (the store {root!r}) is incomplete: {len(missing)} '
          f'of its {rows} x {columns} blocks were never finished: {shown}. '
          'Run the batched function (`nt.batch(kernel_fn, batch_size, '
          'store=...)`) on the same inputs again: it computes only the '
          'missing blocks. Then predict from the store.')
    return files

  def _refuse_if_damaged(self, chunk: tuple[int, int], path: str,
                         expected: Optional[str], found: Optional[str]
                         ) -> None:
    if expected is not None and found != expected:
      why = ('the chunk file is missing' if found is None else
             'the chunk file does not match its checksum')
      raise ValueError(
          f'Block {chunk} of `{self.name}` ({path}) is damaged: {why}. '
          'Run the batched function on the same inputs again: it '
          'recomputes damaged blocks. Then predict from the store.')

  def _verify_row_block(self, i: int) -> None:
    """Checks row block `i`'s chunk files against their records, once."""
    if self._chunk_files is None or i in self._verified:
      return
    for j in range(self._chunk_grid()[1]):
      path, expected = self._chunk_files[(i, j)]
      self._refuse_if_damaged((i, j), path, expected, file_checksum(path))
    self._verified.add(i)

  def _raw_chunks(self) -> bool:
    """Whether each chunk file is its whole chunk's bytes in C order and
    this machine's byte order (a store written uncompressed, as `nt.batch`
    writes it), so that a row block is decoded from the very bytes its
    checksum is computed from: one read of the disk instead of two."""
    codecs = getattr(self.array.metadata, 'codecs', None)
    if self._chunk_files is None or not codecs or len(codecs) != 1:
      return False
    codec = codecs[0]
    endian = getattr(getattr(codec, 'endian', None), 'value', None)
    return (type(codec).__name__ == 'BytesCodec' and
            (endian == sys.byteorder or self.dtype.itemsize == 1))

  # --- reading --------------------------------------------------------------

  def owns(self, block: int) -> bool:
    """Whether row block `block` is this process's."""
    return block % self.group.count == self.group.index

  def rows(self, start: int, stop: int) -> np.ndarray:
    first, last = start // self.block_rows, (stop - 1) // self.block_rows
    for i in range(first, last + 1):
      self._verify_row_block(i)
      self.reads[i] = self.reads.get(i, 0) + 1
    return np.asarray(self.array[start:stop])

  @property
  def cached_blocks(self) -> list[int]:
    return sorted(self._cache)

  def _row_block(self, i: int) -> np.ndarray:
    """Row block `i`, from the cache or read (and cached if it fits)."""
    if i in self._cache:
      return self._cache[i]
    start = i * self.block_rows
    stop = min(self.shape[0], start + self.block_rows)
    held = sum(block.nbytes for block in self._cache.values())
    cache = held + (stop - start) * self.shape[1] * self.dtype.itemsize <= (
        self.cache_bytes)
    # A block kept here need not stay in the page cache too: holding both
    # fills memory and slows every later read (measured 4x at 10 GB).
    rows = self._raw_row_block(i, start, stop, cache) if self._raw else None
    if rows is None:
      rows = self.rows(start, stop)
    if i not in self._finite:
      self._refuse_if_not_finite(rows, start)
      self._finite.add(i)
    if cache:
      rows.flags.writeable = False
      self._cache[i] = rows
    return rows

  def _refuse_if_not_finite(self, rows: np.ndarray, start: int,
                            column_start: int = 0) -> None:
    """Raises naming the first NaN / inf entry of `rows`, the entries from
    row `start` and column `column_start` of the kernel."""
    finite = np.isfinite(rows)
    if finite.all():
      return
    r, c = (int(i) for i in np.argwhere(~finite)[0])
    value = rows[r, c]
    r, c = r + start, c + column_start
    chunk = (r // self.array.chunks[0], c // self.array.chunks[1])
    raise ValueError(
        f'`{self.name}` contains NaN or inf values (first at row {r}, '
        f'column {c}: {value}, in block {chunk} of the store); the kernel '
        'must be finite. Check how it was computed (NaN inputs, overflow in '
        'float16/float32: try float64 with '
        '`jax.config.update("jax_enable_x64", True)`), then compute the '
        'store again into a new directory.')

  def _raw_row_block(self, i: int, start: int, stop: int,
                     drop_pages: bool = False) -> Optional[np.ndarray]:
    """Row block `i` from its chunk files' bytes, each checked against its
    record on the first read; None if a file is not a whole raw chunk.

    The files are read by two threads into reused buffers, past the page
    cache where the OS allows it (`direct_reads`), and each is copied into
    its columns of the block from the bytes its checksum was computed on.
    `drop_pages` asks the OS to drop files read through the page cache
    (the block is kept here).
    """
    chunk_rows, chunk_columns = self.array.chunks
    chunk_bytes = chunk_rows * chunk_columns * self.dtype.itemsize
    verify = i not in self._verified
    if self._reader is None:
      self._reader = direct_reads.FileReader(chunk_bytes, buffers=2)
    out = np.empty((stop - start, self.shape[1]), self.dtype)

    def read(j):  # Threads: reads, hashing and copies release the GIL.
      path, expected = self._chunk_files[(i, j)]
      with self._reader.read(path, drop_pages) as data:
        if data is None or len(data) != chunk_bytes:
          # Missing, truncated or oversized (the reader does not read a file
          # larger than a chunk): `rows` checks the whole file against its
          # record, naming what is wrong, or reads what zarr can decode.
          return False
        if verify:
          self._refuse_if_damaged((i, j), path, expected,
                                  bytes_checksum(data))
        a = j * chunk_columns
        b = min(self.shape[1], a + chunk_columns)
        out[:, a:b] = np.frombuffer(data, self.dtype).reshape(
            chunk_rows, chunk_columns)[:stop - start, :b - a]
      return True

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
      if not all(pool.map(read, range(self._chunk_grid()[1]))):
        return None
    self._verified.add(i)
    self.reads[i] = self.reads.get(i, 0) + 1
    return out

  def row_blocks(self) -> Iterator[tuple[int, int, np.ndarray]]:
    """`(start, stop, rows)` of this process's row blocks, each read by a
    thread while the one before is used (or taken from the cache)."""
    n = self.shape[0]
    starts = [a for a in range(0, n, self.block_rows)
              if self.owns(a // self.block_rows)]
    if not starts:
      return
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
      read = lambda a: self._row_block(a // self.block_rows)
      pending = pool.submit(read, starts[0])
      for index, start in enumerate(starts):
        rows = pending.result()
        if index + 1 < len(starts):
          pending = pool.submit(read, starts[index + 1])
        yield start, min(n, start + self.block_rows), rows

  def combine(self, partial: np.ndarray) -> np.ndarray:
    """The sum over processes of `partial` (each process's rows filled)."""
    if not self.group.distributed:
      return partial
    return np.sum(self.group.gather(partial), axis=0)

  def columns(self, indices: np.ndarray) -> np.ndarray:
    """`K[:, indices]` (float64) in one pass over the row blocks (a
    symmetric kernel's columns are its rows)."""
    out = np.zeros((self.shape[0], len(indices)))
    for start, stop, rows in self.row_blocks():
      out[start:stop] = rows[:, indices]
    return self.combine(out)

  def diagonal(self) -> np.ndarray:
    if self._diagonal is None:
      n = self.shape[0]
      d = np.zeros(n, np.float64)
      for a in range(0, n, self.block_rows):
        if self.owns(a // self.block_rows):
          b = min(n, a + self.block_rows)
          self._verify_row_block(a // self.block_rows)
          d[a:b] = np.diagonal(np.asarray(self.array[a:b, a:b]))
          bad = np.flatnonzero(~np.isfinite(d[a:b]))
          if bad.size:  # The first non-finite diagonal entry, as a 1 x 1.
            i = a + int(bad[0])
            self._refuse_if_not_finite(d[i:i + 1, None], i, i)
      self._diagonal = self.combine(d).astype(self.dtype)
    return self._diagonal


def whole(k: Any) -> Any:
  """A row-block kernel read whole into memory (for what needs all of it at
  once, e.g. a covariance); any other `k` as it is."""
  if isinstance(k, KernelRows):
    return k.rows(0, k.shape[0])
  return k
