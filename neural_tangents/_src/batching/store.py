"""The resumable on-disk kernel of `nt.batch(..., store=path)`.

A store is a directory holding

* one zarr array per output leaf (`<leaf>/`), chunked exactly by the blocks of
  the batch grid, so that every block is a whole chunk (two processes never
  write the same chunk file, and rewriting a block is idempotent);
* `fingerprint.json`: what the kernel is of (shapes, dtypes and a SHA-256 of
  the inputs, the arguments, the batch size and the kernel function's code
  and constants); a call whose fingerprint differs is refused;
* `complete/<i>_<j>`: one record per finished block `(i, j)`, created
  (atomically, by rename) only after the block's chunk files of every leaf
  are written and flushed to disk (`fsync`). It holds the SHA-256 of each of
  those chunk files, and of each leaf's metadata (`<leaf>/zarr.json`: dtype,
  byte order, shape, chunks; an edited one is refused, naming it, since it
  would reinterpret intact chunks), verified when the store is opened: a
  block whose chunk
  is damaged (overwritten, truncated) or missing is recomputed with a
  `RuntimeWarning` naming it (or, in a read-only store, refused with a
  `ValueError` naming it), never served as the kernel. A block without a
  record is simply computed again.

A process killed at any point therefore loses at most the blocks in flight,
and a block is never marked complete with wrong data: a chunk written without
its record is simply written again by the next call.

zarr (`pip install "neural-tangents[store]"`) is imported only when a store
is used. Chosen over `.npy` memory maps because its chunks are separate files
written atomically (a torn write cannot corrupt a finished neighbour), it
is read lazily by numpy, dask and xarray, and it handles the block layout
(chunks) itself.

Example:
  >>> fingerprint_of(lambda x1, x2: x1 @ x2.T, (jnp.ones((3, 2)), None),
  ...                ('ntk',), {}, 2)[:16]  # doctest: +ELLIPSIS
  '...'
"""
import hashlib
import json
import os
import types
from typing import Any, Callable, Iterable, Optional
import warnings

import jax
import numpy as np

from neural_tangents._src.batching.splitting import is_array
from neural_tangents._src.batching.splitting import partition_static
from neural_tangents._src.batching.splitting import Task

_FINGERPRINT = 'fingerprint.json'
_COMPLETE = 'complete'
_METADATA = 'zarr.json'  # A zarr v3 array's metadata file.
# How deep `fingerprint_of` follows the functions a kernel function closes
# over (`serial` of `serial` of layers is a few levels).
_MAX_DEPTH = 12


def import_zarr() -> Any:
  """The `zarr` module, or an ImportError that says how to install it."""
  try:
    import zarr  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ImportError(
        '`store=` needs the optional `zarr` package, which is not installed. '
        'Run `pip install "neural-tangents[store]"` (or `pip install '
        '"zarr>=3"`), or pass store=None.') from None
  return zarr


# -----------------------------------------------------------------------------
# Fingerprints.


def _checksum(x: Any) -> str:
  x = np.asarray(x)
  return hashlib.sha256(np.ascontiguousarray(x).view(np.uint8)).hexdigest()


def _describe(value: Any, depth: int, seen: set[int]) -> Any:
  """A JSON-able description of a value a kernel function depends on."""
  if value is None or isinstance(value, (bool, int, float, str)):
    return repr(value)
  if isinstance(value, (np.generic,)):
    return repr(value.item())
  if is_array(value):
    return [str(np.shape(value)), str(value.dtype), _checksum(value)]
  if isinstance(value, (tuple, list)):
    return [_describe(v, depth, seen) for v in value]
  if isinstance(value, dict):
    return {str(k): _describe(v, depth, seen) for k, v in value.items()}
  if callable(value) and depth < _MAX_DEPTH and id(value) not in seen:
    seen.add(id(value))
    return _describe_function(value, depth + 1, seen)
  return type(value).__qualname__


# Functions of these packages are versioned code: the module-level values
# their code reads (tables, caches) are not part of what a user's kernel is.
_LIBRARY_PREFIXES = ('neural_tangents', 'jax', 'jaxlib', 'numpy', 'scipy',
                     'functools', 'builtins', 'zarr', 'absl')


def _names_read(code: types.CodeType) -> set[str]:
  """The global (and attribute) names `code` and the functions, lambdas and
  comprehensions defined in it name."""
  names = set(code.co_names)
  for const in code.co_consts:
    if isinstance(const, types.CodeType):
      names |= _names_read(const)
  return names


def _describe_globals(fn: Callable[..., Any], code: types.CodeType,
                      depth: int, seen: set[int]) -> Any:
  """The module-level values `fn`'s code reads: arrays (their bytes),
  numbers, strings, containers of them and functions (recursively), so that
  `W *= 3` on a global `W` between two calls changes the fingerprint.
  Modules and classes are left out, as are the globals of library code."""
  module = getattr(fn, '__module__', None) or ''
  if module.split('.')[0] in _LIBRARY_PREFIXES:
    return []
  namespace = getattr(fn, '__globals__', None) or {}
  out = []
  for name in sorted(_names_read(code)):
    if name not in namespace:
      continue
    value = namespace[name]
    if isinstance(value, (types.ModuleType, type)):
      continue
    out.append([name, _describe(value, depth, seen)])
  return out


def _describe_function(fn: Callable[..., Any], depth: int,
                       seen: set[int]) -> Any:
  out = [getattr(fn, '__module__', None) or '',
         getattr(fn, '__qualname__', type(fn).__qualname__)]
  code = getattr(fn, '__code__', None)
  if isinstance(code, types.CodeType):
    consts = [repr(c) for c in code.co_consts
              if isinstance(c, (bool, int, float, str, type(None)))]
    out.append(hashlib.sha256(code.co_code + repr(consts).encode()
                              ).hexdigest())
    out.append(_describe_globals(fn, code, depth, seen))
  for cell in getattr(fn, '__closure__', None) or ():
    try:
      out.append(_describe(cell.cell_contents, depth, seen))
    except ValueError:  # An empty cell.
      out.append('empty')
  wrapped = getattr(fn, '__wrapped__', None)
  if wrapped is not None:
    out.append(_describe(wrapped, depth, seen))
  partial_func = getattr(fn, 'func', None)
  if partial_func is not None and callable(partial_func):
    out.append(_describe((partial_func, getattr(fn, 'args', ()),
                          getattr(fn, 'keywords', {})), depth, seen))
  return out


def fingerprint_of(kernel_fn: Callable[..., Any], inputs: Any, args: tuple,
                   kwargs: dict[str, Any], batch_size: Optional[int]) -> str:
  """SHA-256 of what a batched call computes.

  Covers the inputs' shapes, dtypes and bytes, the other arguments (static
  values and the bytes of arrays), the batch size and the kernel function:
  its code and the constants and functions it closes over, recursively (so
  `Dense(8, W_std=1.)` and `Dense(8, W_std=2.)` differ), and the
  module-level arrays, numbers and functions the code of user functions
  reads (so a global `W` changed in place changes it too).

  Args:
    kernel_fn: the kernel function.
    inputs: `(x1, x2)` (pytrees of arrays, `x2` may be None).
    args: further positional arguments of the call.
    kwargs: keyword arguments of the call.
    batch_size: the block size (`None` for one block).

  Returns:
    A hex digest.
  """
  static, arrays = partition_static((args, kwargs))
  description = {
      'inputs': [[str(np.shape(x)), str(np.asarray(x).dtype), _checksum(x)]
                 for x in jax.tree_util.tree_leaves(inputs)],
      'inputs_tree': str(jax.tree_util.tree_structure(inputs)),
      'static': repr(static.values) + str(static.treedef),
      'arrays': [_describe(a, 0, set()) for a in arrays],
      'batch_size': batch_size,
      'kernel_fn': _describe_function(kernel_fn, 0, set()),
  }
  return hashlib.sha256(json.dumps(description, sort_keys=True).encode()
                        ).hexdigest()


# -----------------------------------------------------------------------------
# The store.


def _atomic_create(path: str, text: str) -> None:
  """Writes `path` durably: a temporary file, fsync, rename, fsync the dir."""
  tmp = f'{path}.tmp{os.getpid()}'
  with open(tmp, 'w') as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)
  _fsync_directory(os.path.dirname(path))


def _fsync_directory(path: str) -> None:
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def _fsync_file(path: str) -> None:
  if os.path.exists(path):
    fd = os.open(path, os.O_RDONLY)
    try:
      os.fsync(fd)
    finally:
      os.close(fd)


class Store:
  """A directory of zarr arrays written block by block, with records.

  Attributes:
    path: the store's directory.
    fingerprint: what it holds (`fingerprint_of`).
  """

  def __init__(self, path: str, fingerprint: str):
    self.path = os.path.abspath(os.fspath(path))
    self.fingerprint = fingerprint
    self.zarr = import_zarr()
    self.arrays = {}

  # --- creation and checks (creation by one process, checks by all) -------

  def create(self) -> None:
    """Creates the directory and fingerprint if absent; never overwrites."""
    os.makedirs(os.path.join(self.path, _COMPLETE), exist_ok=True)
    target = os.path.join(self.path, _FINGERPRINT)
    if not os.path.exists(target):
      _atomic_create(target, json.dumps({'fingerprint': self.fingerprint}))

  def check(self) -> None:
    """Raises a ValueError if the store holds another kernel."""
    target = os.path.join(self.path, _FINGERPRINT)
    try:
      with open(target) as f:
        found = json.load(f)['fingerprint']
    except (OSError, ValueError, KeyError):
      raise ValueError(
          f'`store={self.path!r}` is not a kernel store (no readable '
          f'{_FINGERPRINT}). Pass a new or empty directory.') from None
    if found != self.fingerprint:
      raise ValueError(
          f'`store={self.path!r}` holds a kernel of other inputs, arguments, '
          'batch_size or kernel_fn than this call (fingerprint '
          f'{found[:12]}... != {self.fingerprint[:12]}...): it is never '
          'reused silently. Pass another directory, or delete this one to '
          'recompute.')

  def completed(self) -> set[tuple[int, int]]:
    """The blocks `(i, j)` recorded as complete whose chunk files match the
    checksums of their record; the others are dropped (see `_damage`)."""
    out = set()
    for name in os.listdir(os.path.join(self.path, _COMPLETE)):
      parts = name.split('_')
      if len(parts) == 2 and all(p.isdigit() for p in parts):
        block = (int(parts[0]), int(parts[1]))
        if self._verified(block, os.path.join(self.path, _COMPLETE, name)):
          out.add(block)
    return out

  def _verified(self, block: tuple[int, int], record: str) -> bool:
    """Whether every chunk file of `block` has the checksum of its record;
    if not, warns and forgets the block (or raises if read-only)."""
    try:
      with open(record) as f:
        chunks = json.load(f)['chunks']
    except FileNotFoundError:  # Forgotten by another process meanwhile.
      return False
    except (OSError, ValueError, KeyError, TypeError):
      self._damage(block, record, 'its record has no readable checksums')
      return False
    for chunk, expected in sorted(chunks.items()):
      if chunk.endswith('/' + _METADATA):
        check_metadata(self.path, chunk.split('/')[0])  # Raises if edited.
        continue
      found = file_checksum(os.path.join(self.path, chunk))
      if found != expected:
        why = ('the chunk file is missing' if found is None else
               'the chunk file does not match its checksum')
        self._damage(block, record, f'{why} ({chunk})')
        return False
    return True

  def _damage(self, block: tuple[int, int], record: str, why: str) -> None:
    if not os.access(os.path.dirname(record), os.W_OK):
      raise ValueError(
          f'Block {block} of `store={self.path!r}` is damaged: {why}, and the '
          'store is read-only, so it cannot be recomputed. Make the store '
          'writable to recompute the block, or pass another directory.')
    warnings.warn(
        f'Block {block} of `store={self.path!r}` is damaged: {why}. It is '
        'computed again.', RuntimeWarning, stacklevel=2)
    try:
      os.remove(record)
    except FileNotFoundError:
      pass

  # --- arrays ---------------------------------------------------------------

  def array(self, name: str, shape: tuple[int, ...], dtype: Any,
            chunks: tuple[int, ...]) -> Any:
    """The zarr array of leaf `name`, created (filled with NaN) if absent."""
    name = _leaf_directory(name)
    fill = np.nan if np.issubdtype(dtype, np.inexact) else 0
    directory = os.path.join(self.path, name)
    if os.path.exists(os.path.join(directory, _METADATA)):
      check_metadata(self.path, name)
      arr = self.zarr.open_array(directory, mode='r+')
    else:
      arr = self.zarr.create_array(
          directory, shape=shape, dtype=np.dtype(dtype), chunks=chunks,
          fill_value=fill,
          # Kernels hardly compress; compressing would cost time per block.
          compressors=None)
    self.arrays[name] = arr
    return arr

  def mark_complete(self, task: Task,
                    chunks: Iterable[tuple[str, tuple[int, ...]]]) -> None:
    """Flushes `chunks` (`(leaf name, chunk coordinates)`), records `task`
    with their checksums (`None` for a chunk not written: all fill value)."""
    checksums = {}
    for name, coords in chunks:
      name = _leaf_directory(name)
      # The leaf's metadata (dtype, byte order, shape, chunks) is recorded
      # too: an edit of it would reinterpret intact chunk bytes.
      checksums[f'{name}/{_METADATA}'] = file_checksum(
          os.path.join(self.path, name, _METADATA))
      key = self.arrays[name].metadata.encode_chunk_key(tuple(coords))
      path = os.path.join(self.path, name, key)
      _fsync_file(path)
      checksums[os.path.relpath(path, self.path)] = file_checksum(path)
    _atomic_create(os.path.join(self.path, _COMPLETE, f'{task.i}_{task.j}'),
                   json.dumps({'chunks': checksums}))


def bytes_checksum(data: bytes) -> str:
  """SHA-256 of `data`: `file_checksum` of a file holding exactly `data`."""
  return hashlib.sha256(data).hexdigest()


def file_checksum(path: str) -> Optional[str]:
  """SHA-256 of the file at `path`, or None if there is none."""
  digest = hashlib.sha256()
  try:
    with open(path, 'rb') as f:
      for piece in iter(lambda: f.read(1 << 20), b''):
        digest.update(piece)
  except FileNotFoundError:
    return None
  return digest.hexdigest()


def store_root(array: Any) -> Optional[str]:
  """The directory of the store holding zarr `array` (a leaf of the store,
  as `nt.batch(..., store=...)` returns it), or None if `array` is not in a
  local directory with a store's fingerprint."""
  root = getattr(getattr(array, 'store', None), 'root', None)
  if root is None:
    return None
  leaf = os.path.join(os.fspath(root), getattr(array, 'path', '') or '')
  parent = os.path.dirname(os.path.normpath(leaf))
  if not os.path.exists(os.path.join(parent, _FINGERPRINT)):
    return None
  return parent


def recorded_chunks(root: str) -> dict[str, Optional[str]]:
  """`{chunk file relative to root: SHA-256 or None}` over the records of
  the finished blocks of the store at `root` (not verified: see
  `file_checksum`)."""
  out = {}
  directory = os.path.join(root, _COMPLETE)
  for name in (os.listdir(directory) if os.path.isdir(directory) else ()):
    try:
      with open(os.path.join(directory, name)) as f:
        out.update(json.load(f)['chunks'])
    except (OSError, ValueError, KeyError, TypeError):
      continue  # An unreadable record finishes nothing.
  return out


def check_metadata(root: str, leaf: str) -> None:
  """Raises a `ValueError` if the metadata file of the store's `leaf`
  (`<leaf>/zarr.json`: dtype, byte order, shape, chunks) differs from the
  checksum its block records hold (stores written before metadata was
  recorded hold none: nothing to check).

  Example:
    >>> check_metadata('/nonexistent', 'leaf')
  """
  key = f'{leaf}/{_METADATA}'
  expected = recorded_chunks(root).get(key)
  if expected is None:
    return
  found = file_checksum(os.path.join(root, leaf, _METADATA))
  if found != expected:
    why = 'is missing' if found is None else 'does not match its checksum'
    raise ValueError(
        f'The metadata of the kernel store {root!r} ({key}: dtype, byte '
        f'order, shape, chunks) {why}: it was edited after the blocks were '
        'written, so their bytes would be read as another array. Restore '
        'the file, or delete the store directory and run the batched '
        'function again to recompute it.')


def _leaf_directory(path: str) -> str:
  """A directory name for an output leaf path such as `.ntk` or `[0]`."""
  cleaned = ''.join(c if c.isalnum() or c in '_-' else '_' for c in path)
  return 'leaf' + cleaned if cleaned else 'leaf'
