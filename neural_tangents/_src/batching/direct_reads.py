"""Whole files read into reused buffers, past the OS page cache where it can.

Reading a store's chunk files through the page cache costs memory twice:
the kernel's page cache fills with the file's pages and the reader copies
them out. For a kernel read once into a cache of its own, or streamed from a
disk larger than memory, the page cache only churns: every page is new
memory, which virtual machines hand out slowly the first time it is touched
(on the 2-core benchmark machine, a 500 MB row block read with `O_DIRECT`
took half the time of the same read through the page cache). `FileReader`
opens files with `O_DIRECT` where the OS and file system allow it (Linux;
not e.g. tmpfs) and reads each whole file into one of a few page-aligned
buffers that it reuses, so repeated reads touch no new memory. Elsewhere it
reads through the page cache into the same buffers.

Example:
  >>> import os, tempfile
  >>> path = os.path.join(tempfile.mkdtemp(), 'chunk')
  >>> with open(path, 'wb') as f:
  ...   _ = f.write(b'abc' * 1000)
  >>> reader = FileReader(3000)
  >>> with reader.read(path) as data:
  ...   bytes(data[:6]), len(data)
  (b'abcabc', 3000)
"""
import contextlib
import mmap
import os
import queue
import threading
from typing import Iterator, Optional

# O_DIRECT transfers must be aligned to the device's logical block size (512
# or 4096 bytes); buffers from `mmap` start at a page (4096 bytes).
_ALIGNMENT = 4096


class FileReader:
  """Reads whole files of at most `max_bytes` bytes into reused buffers.

  Args:
    max_bytes: the largest file it reads (e.g. a chunk file's size).
    buffers: how many files may be held at once (one per reading thread).
    direct: whether to try `O_DIRECT` (it is still turned off for good
      where the OS refuses it).

  Attributes:
    direct: whether reads go past the page cache.
    buffers_made: the buffers allocated so far (at most `buffers`).
  """

  def __init__(self, max_bytes: int, buffers: int = 2, direct: bool = True):
    self._size = max(_ALIGNMENT, -(-int(max_bytes) // _ALIGNMENT) * _ALIGNMENT)
    self._max_bytes = int(max_bytes)
    self._free = queue.SimpleQueue()
    self.buffers_made = 0
    self._buffers = buffers
    self._lock = threading.Lock()
    self.direct = direct and hasattr(os, 'O_DIRECT')

  def _take(self) -> mmap.mmap:
    with self._lock:
      if self._free.empty() and self.buffers_made < self._buffers:
        self.buffers_made += 1
        return mmap.mmap(-1, self._size)
    return self._free.get()

  @contextlib.contextmanager
  def read(self, path: str, drop_pages: bool = False
           ) -> Iterator[Optional[memoryview]]:
    """Yields the whole file's bytes (valid inside the `with` only).

    Yields None if there is no file at `path`, and an empty view if the
    file is larger than `max_bytes`.

    Args:
      path: the file.
      drop_pages: for reads through the page cache, whether to ask the OS
        to drop the file's pages afterwards (the caller keeps a copy).
    """
    buffer = self._take()
    try:
      size = self._read_into(path, buffer, drop_pages)
      yield None if size is None else memoryview(buffer)[:size]
    finally:
      self._free.put(buffer)

  def _read_into(self, path: str, buffer: mmap.mmap,
                 drop_pages: bool) -> Optional[int]:
    if self.direct:
      try:
        return _read_direct(path, buffer, self._max_bytes)
      except FileNotFoundError:
        return None
      except OSError:
        self.direct = False  # e.g. EINVAL: this file system refuses O_DIRECT.
    try:
      with open(path, 'rb', buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        if size > self._max_bytes:
          return 0
        view, read = memoryview(buffer), 0
        while read < size:
          n = f.readinto(view[read:size])
          if not n:
            break
          read += n
        if drop_pages and hasattr(os, 'posix_fadvise'):
          os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        return read
    except FileNotFoundError:
      return None


def _read_direct(path: str, buffer: mmap.mmap, max_bytes: int) -> int:
  """Reads `path` with O_DIRECT into `buffer`; its size in bytes (0 if
  larger than `max_bytes`). Raises OSError where O_DIRECT is refused."""
  fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
  try:
    size = os.fstat(fd).st_size
    if size > max_bytes:
      return 0
    view, read = memoryview(buffer), 0
    end = -(-size // _ALIGNMENT) * _ALIGNMENT
    while read < size:
      n = os.readv(fd, [view[read:end]])
      if not n:
        break
      read += n
      if read < size and read % _ALIGNMENT:
        # A short read that leaves the next one unaligned: not expected of
        # a local file system; read the file through the page cache.
        raise OSError(f'unaligned short read of {path}')
    return min(read, size)
  finally:
    os.close(fd)
