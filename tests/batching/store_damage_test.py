"""Reliability tests of `nt.batch(..., store=path)` (issue 29 item 1): a
damaged or missing block of a store is never served as the kernel.

Each complete block's record holds the SHA-256 of its chunk files; a chunk
overwritten with zeros or random bytes, truncated or deleted is detected when
the store is opened, and its block is recomputed with a warning naming it
(or refused, naming it, when the store is read-only); a deleted record makes
the block computed again.
"""
import json
import os
import tempfile
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

import neural_tangents as nt
from neural_tangents import stax
from neural_tangents._src.batching import store as store_lib
from tests import test_utils


def _kernel_fn():
  return stax.serial(stax.Dense(16, W_std=1.5, b_std=0.1), stax.Relu(),
                     stax.Dense(1, W_std=1.5, b_std=0.1))[2]


def _damage(path: str, how: str) -> None:
  size = os.path.getsize(path)
  if how == 'zeroed':
    data = bytes(size)
  elif how == 'random':
    data = np.random.default_rng(0).bytes(size)
  elif how == 'truncated':
    with open(path, 'rb') as f:
      data = f.read(size // 2)
  elif how == 'deleted':
    os.remove(path)
    return
  else:
    raise ValueError(how)
  with open(path, 'wb') as f:
    f.write(data)


@test_utils.needs_zarr
class StoreDamageTest(test_utils.NeuralTangentsTestCase):

  def setUp(self):
    super().setUp()
    temporary = tempfile.TemporaryDirectory()
    self.addCleanup(temporary.cleanup)
    self.path = os.path.join(temporary.name, 'k.zarr')
    self.x = np.random.default_rng(0).standard_normal((6, 4)).astype(
        np.float32)
    self.kernel_fn = _kernel_fn()
    self.desired = np.asarray(self.kernel_fn(self.x, None, 'ntk'))
    first = nt.batch(self.kernel_fn, 2, store_on_device=False,
                     store=self.path)(self.x, None, 'ntk')
    self.assertAllClose(np.asarray(first), self.desired, rtol=1e-6)

  def _chunk(self, i, j):
    leaves = [d for d in os.listdir(self.path) if d.startswith('leaf')]
    self.assertLen(leaves, 1)
    return os.path.join(self.path, leaves[0], 'c', str(i), str(j))

  def _reread(self):
    batched = nt.batch(self.kernel_fn, 2, store_on_device=False,
                       store=self.path)
    return np.asarray(batched(self.x, None, 'ntk')), batched.block_counts

  @parameterized.product(how=('zeroed', 'random', 'truncated', 'deleted'),
                         chunk=((0, 1), (1, 0), (2, 2)))
  def test_damaged_chunk_is_recomputed_with_a_warning(self, how, chunk):
    _damage(self._chunk(*chunk), how)
    block = tuple(sorted(chunk))  # The upper block whose record holds it.
    with self.assertWarnsRegex(RuntimeWarning,
                               rf'Block \({block[0]}, {block[1]}\) of '
                               r'`store=.*` is damaged'):
      kernel, counts = self._reread()
    self.assertAllClose(kernel, self.desired, rtol=1e-6)
    self.assertEqual(counts['computed'], 1)
    self.assertEqual(counts['from_store'], counts['total'] - 3 - 1)
    # Recomputed and recorded again: the next read is clean.
    kernel, counts = self._reread()
    self.assertEqual(counts['computed'], 0)
    self.assertAllClose(kernel, self.desired, rtol=1e-6)

  def test_deleted_record_is_recomputed(self):
    os.remove(os.path.join(self.path, 'complete', '0_2'))
    kernel, counts = self._reread()
    self.assertAllClose(kernel, self.desired, rtol=1e-6)
    self.assertEqual(counts['computed'], 1)

  def test_record_without_checksums_is_recomputed(self):
    with open(os.path.join(self.path, 'complete', '1_1'), 'w') as f:
      f.write('')
    with self.assertWarnsRegex(RuntimeWarning, r'Block \(1, 1\) .*no readable '
                               'checksums'):
      kernel, counts = self._reread()
    self.assertAllClose(kernel, self.desired, rtol=1e-6)
    self.assertEqual(counts['computed'], 1)

  @parameterized.parameters('zeroed', 'deleted')
  def test_damaged_chunk_of_a_read_only_store_is_refused(self, how):
    _damage(self._chunk(0, 1), how)
    with mock.patch.object(store_lib.os, 'access', return_value=False):
      with self.assertRaisesRegex(ValueError, r'Block \(0, 1\) of `store=.*` '
                                  r'is damaged: .*read-only.*Make the store '
                                  'writable'):
        self._reread()

  @parameterized.parameters('data_type', 'endian')
  def test_edited_metadata_is_refused_naming_it(self, field):
    # The chunks are intact, so their checksums passed, but they were read
    # as another dtype (zarr's 'Invalid type: NaN') or byte order (garbage
    # from the batched call, a NaN blamed on the kernel by the predictions).
    leaf = [d for d in os.listdir(self.path) if d.startswith('leaf')][0]
    metadata = os.path.join(self.path, leaf, 'zarr.json')
    with open(metadata) as f:
      edited = json.load(f)
    if field == 'data_type':
      edited['data_type'] = 'int32'
    else:
      edited['codecs'][0]['configuration']['endian'] = 'big'
    with open(metadata, 'w') as f:
      json.dump(edited, f)
    message = (rf'The metadata of the kernel store .* \({leaf}/zarr\.json: '
               r'dtype, byte order, shape, chunks\) does not match its '
               r'checksum: it was edited.*delete the store directory')
    with self.assertRaisesRegex(ValueError, message):
      self._reread()
    k_trains = [self.path]  # The directory, and the array zarr can parse.
    if field == 'endian':
      import zarr  # pylint: disable=g-import-not-at-top  (needs_zarr)
      k_trains.append(zarr.open_array(os.path.join(self.path, leaf)))
    for k_train in k_trains:
      with self.assertRaisesRegex(ValueError, message):
        nt.predict.gp_inference(k_train, np.ones((6, 1)), diag_reg=1e-2,
                                solver='cg')('ntk', self.desired[:2])


# Module-level values read by `_global_kernel_fn` (issue 29 item 2).
W = np.eye(4, dtype=np.float32)
SCALE = 1.


def _project(x):
  return None if x is None else x @ W


def _global_kernel_fn(x1, x2, get):
  return _kernel_fn()(_project(x1), _project(x2), get) * SCALE


@test_utils.needs_zarr
class StoreGlobalsTest(test_utils.NeuralTangentsTestCase):
  """A kernel function reading changed globals is never served stale."""

  def setUp(self):
    super().setUp()
    temporary = tempfile.TemporaryDirectory()
    self.addCleanup(temporary.cleanup)
    self.path = os.path.join(temporary.name, 'k.zarr')
    self.x = np.random.default_rng(0).standard_normal((6, 4)).astype(
        np.float32)
    self.addCleanup(self._restore, W.copy(), SCALE)

  def _restore(self, w, scale):
    global SCALE
    W[...] = w
    SCALE = scale

  def _batched(self):
    return nt.batch(_global_kernel_fn, 2, store_on_device=False,
                    store=self.path)

  def test_unchanged_globals_are_read_back(self):
    self._batched()(self.x, None, 'ntk')
    batched = self._batched()
    batched(self.x, None, 'ntk')
    self.assertEqual(batched.block_counts['computed'], 0)

  def test_array_changed_in_place_is_refused(self):
    self._batched()(self.x, None, 'ntk')
    W[...] *= 3  # Read by `_project`, a global function `kernel_fn` reads.
    with self.assertRaisesRegex(ValueError, 'holds a kernel of other'):
      self._batched()(self.x, None, 'ntk')

  def test_rebound_scalar_is_refused(self):
    global SCALE
    self._batched()(self.x, None, 'ntk')
    SCALE = 2.
    with self.assertRaisesRegex(ValueError, 'holds a kernel of other'):
      self._batched()(self.x, None, 'ntk')


if __name__ == '__main__':
  absltest.main()
