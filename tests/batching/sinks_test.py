"""Tests of `batching/sinks.py`: blocks assembled in memory or in a store.

A sink fed the blocks of a plan returns the kernel that `np.block` builds
from every block, the blocks below a symmetric diagonal transposed from
those above (batch axes and spatial pairs swapped).
"""
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np

from neural_tangents._src.batching.assembling import LeafSpec
from neural_tangents._src.batching.assembling import Role
from neural_tangents._src.batching.plan import Plan
from neural_tangents._src.batching.processes import ProcessGroup
from neural_tangents._src.batching.sinks import check_storable
from neural_tangents._src.batching.sinks import MemorySink
from neural_tangents._src.batching.sinks import StoreSink
from neural_tangents._src.batching.splitting import Grid
from tests import test_utils


def _kernel(n, spatial=0, seed=0):
  """A symmetric kernel `(n, n, S, S, ...)`: `K[j, i, t, s] = K[i, j, s, t]`."""
  f = np.random.default_rng(seed).standard_normal((n,) + (3,) * spatial +
                                                  (4,))
  if not spatial:
    return f @ f.T
  return np.einsum('isd,jtd->ijst', f, f)


def _block(k, grid, task):
  """Block `task` of `k`, padded as the runners pad it."""
  rows = grid.indices(task.i, 1)
  cols = grid.indices(task.j, 2)
  return k[rows][:, cols]


def _np_block(k, grid):
  """`k` rebuilt by `np.block` from its unpadded blocks."""
  return np.block([[k[slice(*grid.rows(i, 1)), slice(*grid.rows(j, 2))]
                    for j in range(grid.nb2)] for i in range(grid.nb1)])


class MemorySinkTest(parameterized.TestCase):

  @parameterized.parameters(True, False)
  def test_symmetric_blocks_assemble_as_np_block(self, on_host):
    grid = Grid(n1=5, n2=5, b1=2, b2=2, symmetric=True)
    k = _kernel(5)
    sink = MemorySink([LeafSpec('', Role.PAIR)], grid, on_host)
    for phase in Plan(grid).phases():
      for task in phase:
        sink.add(task, _block(k, grid, task))
    out, = sink.finish()
    self.assertEqual(isinstance(out, np.ndarray), on_host)
    np.testing.assert_array_equal(np.asarray(out), _np_block(k, grid))
    np.testing.assert_array_equal(np.asarray(out), k)

  @parameterized.parameters(True, False)
  def test_spatial_pairs_are_swapped_in_transposed_blocks(self, on_host):
    grid = Grid(n1=4, n2=4, b1=3, b2=3, symmetric=True)
    k = _kernel(4, spatial=1)
    self.assertFalse(np.allclose(k, k.transpose(1, 0, 2, 3)))
    sink = MemorySink([LeafSpec('', Role.PAIR)], grid, on_host)
    for phase in Plan(grid).phases():
      for task in phase:
        sink.add(task, _block(k, grid, task))
    np.testing.assert_allclose(np.asarray(sink.finish()[0]), k)

  @parameterized.parameters(True, False)
  def test_every_block_of_a_rectangular_grid(self, on_host):
    grid = Grid(n1=5, n2=3, b1=2, b2=2, symmetric=False)
    k = np.random.default_rng(1).standard_normal((5, 3))
    sink = MemorySink([LeafSpec('', Role.PAIR)], grid, on_host)
    for task in Plan(grid).others():
      sink.add(task, _block(k, grid, task))
    np.testing.assert_array_equal(np.asarray(sink.finish()[0]),
                                  _np_block(k, grid))

  def test_without_transposes_lower_blocks_are_taken_as_given(self):
    grid = Grid(n1=5, n2=5, b1=2, b2=2, symmetric=True)
    k = np.random.default_rng(2).standard_normal((5, 5))  # Not symmetric.
    sink = MemorySink([LeafSpec('', Role.PAIR)], grid, True, transpose=False)
    for phase in Plan(grid, need_lower=True).phases():
      for task in phase:
        sink.add(task, _block(k, grid, task))
    np.testing.assert_array_equal(sink.finish()[0], k)

  def test_covariances_are_concatenated_from_the_diagonal(self):
    grid = Grid(n1=5, n2=5, b1=2, b2=2, symmetric=True)
    k = _kernel(5)
    specs = [LeafSpec('[0]', Role.PAIR), LeafSpec('[1]', Role.SELF1)]
    sink = MemorySink(specs, grid, True)
    for phase in Plan(grid).phases():
      for task in phase:
        block = _block(k, grid, task)
        sink.add(task, [block, np.diagonal(block).copy()])
    kernel, cov1 = sink.finish()
    np.testing.assert_array_equal(kernel, k)
    np.testing.assert_array_equal(cov1, np.diagonal(k))


@test_utils.needs_zarr
class StoreSinkTest(absltest.TestCase):

  def _sink(self, path, fingerprint='f', store_on_device=False):
    return StoreSink(path, fingerprint, [LeafSpec('', Role.PAIR)],
                     [jax.ShapeDtypeStruct((2, 2), np.float64)], self.grid,
                     ProcessGroup(0, 1), store_on_device)

  def setUp(self):
    super().setUp()
    self.grid = Grid(n1=5, n2=5, b1=2, b2=2, symmetric=True)
    self.k = _kernel(5)
    self.path = self.enter_context(tempfile.TemporaryDirectory())

  def test_a_reopened_store_holds_the_blocks_added_before(self):
    first = self._sink(self.path)
    self.assertEqual(set(first.done), set())
    diagonal, others = Plan(self.grid).phases()
    for task in others:
      first.add(task, _block(self.k, self.grid, task))
    second = self._sink(self.path)
    self.assertEqual(set(second.done), {(0, 1), (0, 2), (1, 2)})
    for phase in Plan(self.grid).deal(second.done):
      self.assertEqual(list(phase.missing), diagonal if phase.missing else [])
      for task in phase.missing:
        second.add(task, _block(self.k, self.grid, task))
    out, = second.finish()
    self.assertNotIsInstance(out, np.ndarray)  # A zarr array, read lazily.
    np.testing.assert_array_equal(np.asarray(out), _np_block(self.k,
                                                             self.grid))
    out, = self._sink(self.path, store_on_device=True).finish()
    self.assertIsInstance(out, jax.Array)
    np.testing.assert_array_equal(np.asarray(out), self.k)

  def test_a_store_of_another_kernel_is_refused(self):
    self._sink(self.path, 'first')
    with self.assertRaisesRegex(ValueError, 'holds a kernel of other inputs'):
      self._sink(self.path, 'second')

  def test_masks_are_not_storable(self):
    with self.assertRaisesRegex(ValueError, r'mask1 leaf, which a store does '
                                r'not hold.*store=None'):
      check_storable([LeafSpec('.mask1', Role.MASK1)], [np.ones((2, 3))])


if __name__ == '__main__':
  absltest.main()
