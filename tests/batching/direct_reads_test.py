"""Tests of `direct_reads.FileReader`: whole files, byte for byte, through
`O_DIRECT` and through the page cache, into at most `buffers` buffers."""
import concurrent.futures
import errno
import os
import tempfile
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from neural_tangents._src.batching import direct_reads


def _write(directory: str, name: str, size: int) -> tuple[str, bytes]:
  data = np.random.default_rng(size).bytes(size)
  path = os.path.join(directory, name)
  with open(path, 'wb') as f:
    f.write(data)
  return path, data


class FileReaderTest(parameterized.TestCase):

  @parameterized.named_parameters(('direct', True), ('page_cache', False))
  def test_reads_whole_files_byte_for_byte(self, direct):
    # Sizes around the 4096-byte alignment of O_DIRECT transfers.
    sizes = (0, 1, 4095, 4096, 4097, 3 * 4096 + 7, 50_000)
    with tempfile.TemporaryDirectory() as directory:
      reader = direct_reads.FileReader(max(sizes), direct=direct)
      for size in sizes:
        path, data = _write(directory, f'f{size}', size)
        with reader.read(path, drop_pages=True) as read:
          self.assertEqual(bytes(read), data, msg=f'size {size}')
      self.assertEqual(reader.buffers_made, 1)  # Reused, not reallocated.
      if not direct:
        self.assertFalse(reader.direct)

  def test_missing_and_oversized_files(self):
    with tempfile.TemporaryDirectory() as directory:
      path, _ = _write(directory, 'big', 10_000)
      for direct in (True, False):
        reader = direct_reads.FileReader(9_999, direct=direct)
        with reader.read(os.path.join(directory, 'none')) as read:
          self.assertIsNone(read)
        with reader.read(path) as read:
          self.assertEqual(len(read), 0)

  def test_concurrent_reads_share_at_most_the_given_buffers(self):
    with tempfile.TemporaryDirectory() as directory:
      files = [_write(directory, f'f{i}', 20_000 + i) for i in range(12)]
      reader = direct_reads.FileReader(20_100, buffers=2)

      def read(item):
        path, data = item
        with reader.read(path) as view:
          return bytes(view) == data

      with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        self.assertTrue(all(pool.map(read, files)))
      self.assertLessEqual(reader.buffers_made, 2)

  def test_a_file_system_refusing_o_direct_is_read_through_the_page_cache(
      self):
    refused = OSError(errno.EINVAL, 'Invalid argument')
    with tempfile.TemporaryDirectory() as directory:
      path, data = _write(directory, 'f', 12_345)
      reader = direct_reads.FileReader(12_345)
      with mock.patch.object(direct_reads, '_read_direct',
                             side_effect=refused) as direct:
        for _ in range(2):
          with reader.read(path) as read:
            self.assertEqual(bytes(read), data)
      self.assertFalse(reader.direct)
      self.assertEqual(direct.call_count, 1)  # Not tried again.


if __name__ == '__main__':
  absltest.main()
