"""Tests of `map_rows_in_place`: blocked maps equal unblocked ones bitwise."""
from unittest import mock

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.stax import kernel_maps
from neural_tangents._src.utils import row_blocks
from tests import test_utils


def _has_loop(fn, *args) -> bool:
  jaxpr = str(jax.make_jaxpr(fn)(*args))
  return 'scan' in jaxpr or 'while' in jaxpr


def _relu_and_ntk(c, ntk, q1, q2):
  nngp, dot = kernel_maps.relu_kernel_map(q1, q2, c, True)
  return nngp, dot * ntk


class MapRowsInPlaceTest(test_utils.NeuralTangentsTestCase):

  def _covariances(self):
    rng = np.random.RandomState(0)
    x = rng.randn(12, 5).astype(np.float32)
    c = x @ x.T / 5
    q = np.diag(c)
    return (jnp.asarray(c), jnp.asarray(2 * c), jnp.asarray(q[:, None]),
            jnp.asarray(q[None, :]))

  def test_blocks_equal_the_whole_map_bitwise(self):
    c, ntk, q1, q2 = self._covariances()
    # Both compiled: XLA's fusion of the whole map, or of a block, computes
    # each entry the same way (op-by-op dispatch may round differently).
    expected = jax.jit(_relu_and_ntk)(c, ntk, q1, q2)
    # 12 rows of 48 bytes: blocks of 4 rows (3 blocks), and of 1 row.
    for block_bytes in (200, 1):
      blocked = jax.jit(lambda c, ntk, q1, q2, b=block_bytes:
                        row_blocks.map_rows_in_place(
                            _relu_and_ntk, [c, ntk], [q1, q2],
                            blocked_above_bytes=0, block_bytes=b))
      self.assertTrue(_has_loop(blocked, c, ntk, q1, q2))
      for actual, desired in zip(blocked(c, ntk, q1, q2), expected):
        np.testing.assert_array_equal(actual, desired)

  def test_none_passes_through(self):
    c, _, q1, q2 = self._covariances()
    relu = lambda c, ntk, q1, q2: (kernel_maps.relu_kernel_map(
        q1, q2, c, False)[0], None)
    nngp, ntk = jax.jit(lambda c: row_blocks.map_rows_in_place(
        relu, [c, None], [q1, q2], blocked_above_bytes=0,
        block_bytes=100))(c)
    self.assertIsNone(ntk)
    # The same operations compiled inside a loop and whole: XLA may order or
    # contract them differently (measured: 3.3e-7, under 3 ulp of float32,
    # with the suite's unoptimized compilation).
    np.testing.assert_allclose(nngp, jax.jit(relu)(c, None, q1, q2)[0],
                               rtol=1e-6, atol=0)

  def test_small_or_shape_changing_maps_are_not_blocked(self):
    c, ntk, q1, q2 = self._covariances()
    whole = lambda c: row_blocks.map_rows_in_place(
        _relu_and_ntk, [c, ntk], [q1, q2])
    self.assertFalse(_has_loop(whole, c))  # below `BLOCKED_ABOVE_BYTES`
    halve = lambda c: row_blocks.map_rows_in_place(
        lambda c: (c[:, ::2],), [c], blocked_above_bytes=0, block_bytes=1)
    self.assertFalse(_has_loop(halve, c))
    np.testing.assert_array_equal(halve(c)[0], c[:, ::2])

  def test_block_rows_divide_the_axis(self):
    x = jnp.zeros((12, 10), jnp.float32)  # 40 bytes a row
    self.assertEqual(row_blocks.block_rows(x, 40 * 5), 4)
    self.assertEqual(row_blocks.block_rows(x, 39), 1)
    self.assertEqual(row_blocks.block_rows(x, 10**6), 12)

  def test_module_thresholds_are_read_at_call_time(self):
    c, ntk, q1, q2 = self._covariances()
    with mock.patch.object(row_blocks, 'BLOCKED_ABOVE_BYTES', 0), \
         mock.patch.object(row_blocks, 'BLOCK_BYTES', 100):
      blocked = lambda c: row_blocks.map_rows_in_place(
          _relu_and_ntk, [c, ntk], [q1, q2])
      self.assertTrue(_has_loop(blocked, c))


if __name__ == '__main__':
  absltest.main()
