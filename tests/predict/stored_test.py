"""Predictions from a kernel store (`nt.predict.StoredKernel`, issue 31).

The three predict functions with `solver='cg'` take what `nt.batch(...,
store=...)` returns (zarr arrays, or the store's directory) and read it by
row blocks; their predictions equal a float64 direct solve of the same
kernels in memory. Incomplete, damaged and mis-shaped stores are refused.
Conjugate gradients multiply in the kernel's precision (float32) and still
certify the residual `tol` asks for, by exact residual replacement.
"""
import contextlib
import io
import os
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

import neural_tangents as nt
from neural_tangents import stax
from neural_tangents._src.predict import solve
from tests import test_utils

_N, _N_TEST, _BATCH = 40, 12, 16  # 3 x 3 train blocks, 1 x 3 test blocks.


def _kernel_fn():
  return stax.serial(stax.Dense(16, W_std=1.5, b_std=0.1), stax.Relu(),
                     stax.Dense(1, W_std=1.5, b_std=0.1))[2]


def _data():
  rng = np.random.RandomState(0)
  x = rng.randn(_N, 5).astype(np.float32)
  x_test = rng.randn(_N_TEST, 5).astype(np.float32)
  y = rng.randn(_N, 2)
  return x, x_test, y


def _direct(k, k_test, y, diag_reg):
  """`k_test (k + r I)^{-1} y` in float64, `r` relative to the mean
  diagonal."""
  k, k_test = np.asarray(k, np.float64), np.asarray(k_test, np.float64)
  reg = diag_reg * np.mean(np.diag(k))
  return k_test @ np.linalg.solve(k + reg * np.eye(len(k)), y)


@test_utils.needs_zarr
class PredictFromStoreTest(test_utils.NeuralTangentsTestCase):

  def setUp(self):
    super().setUp()
    self.directory = self.enter_context(tempfile.TemporaryDirectory())
    self.x, self.x_test, self.y = _data()

  def _store(self, name, x1, x2, get=('nngp', 'ntk')):
    path = os.path.join(self.directory, name)
    return nt.batch(_kernel_fn(), _BATCH, store_on_device=False,
                    store=path)(x1, x2, get), path

  @parameterized.parameters('gp_inference', 'gradient_descent_mse',
                            'gradient_descent_mse_ensemble')
  def test_equals_direct_solve_in_memory(self, fn):
    k, path = self._store('train', self.x, None)
    k_test, test_path = self._store('test', self.x_test, self.x)
    options = dict(diag_reg=1e-3, solver='cg', tol=1e-10,
                   preconditioner_rank=4)  # n > 2 rank: pivots from a pool.
    desired = _direct(k.ntk[...], k_test.ntk[...], self.y, 1e-3)
    if fn == 'gp_inference':
      predict_fn = nt.predict.gp_inference(path, self.y, **options)
      got = predict_fn('ntk', test_path)  # The stores' directories.
      self.assertLessEqual(predict_fn.solve_info['ntk'].residual, 1e-10)
    elif fn == 'gradient_descent_mse':
      got = nt.predict.gradient_descent_mse(k.ntk, self.y, **options)(
          None, None, 0., k_test.ntk)
    else:
      stores = iter(('train2', 'test2'))

      def kernel_fn(x1, x2, get):  # Writes each kernel into a store.
        return self._store(next(stores), x1, x2, get)[0]

      got = nt.predict.gradient_descent_mse_ensemble(
          kernel_fn, self.x, self.y, **options)(None, self.x_test, 'ntk')
    np.testing.assert_allclose(np.asarray(got, np.float64), desired,
                               rtol=1e-6, atol=1e-6 * np.abs(desired).max())

  def test_reads_each_row_block_per_product_and_the_diagonal_blocks(self):
    k, _ = self._store('train', self.x, None, 'ntk')
    stored = nt.predict.StoredKernel(k)
    self.assertEqual((stored.shape, stored.block_rows), ((_N, _N), _BATCH))
    np.testing.assert_array_equal(stored.diagonal(), np.diag(k[...]))
    v = np.random.RandomState(1).randn(_N, 3)
    np.testing.assert_allclose(solve.kernel_matmul(stored, v),
                               np.asarray(k[...], np.float64) @ v,
                               rtol=1e-12)
    # One read of each row block (the diagonal reads only diagonal chunks).
    self.assertEqual(stored.reads, {0: 1, 1: 1, 2: 1})

  def test_cache_reads_each_cached_block_once_per_solve(self):
    k, _ = self._store('train', self.x, None, 'ntk')
    k_test, _ = self._store('test', self.x_test, self.x, 'ntk')
    block_bytes = _BATCH * _N * k.dtype.itemsize
    options = dict(diag_reg=1e-3, solver='cg', tol=1e-10)
    # Room for two of the three row blocks: the third is read every pass.
    cached = nt.predict.StoredKernel(k, cache_bytes=2 * block_bytes)
    predict_fn = nt.predict.gp_inference(cached, self.y, **options)
    got = predict_fn('ntk', k_test)
    desired = _direct(k[...], k_test[...], self.y, 1e-3)
    np.testing.assert_allclose(np.asarray(got, np.float64), desired,
                               rtol=1e-6, atol=1e-6 * np.abs(desired).max())
    self.assertEqual(cached.cached_blocks, [0, 1])
    self.assertEqual((cached.reads[0], cached.reads[1]), (1, 1))
    self.assertGreater(cached.reads[2], 2)  # Every pass over the kernel.
    uncached = nt.predict.StoredKernel(k)
    nt.predict.gp_inference(uncached, self.y, **options)('ntk', k_test)
    self.assertEqual(uncached.cached_blocks, [])
    self.assertEqual(uncached.reads[0], cached.reads[2])

  @parameterized.parameters(-1, 1.5, True, '1GB')
  def test_bad_cache_bytes_is_refused(self, cache_bytes):
    k, _ = self._store('train', self.x, None, 'ntk')
    with self.assertRaisesRegex(ValueError, 'cache_bytes=.*non-negative'):
      nt.predict.StoredKernel(k, cache_bytes=cache_bytes)

  def test_incomplete_store_is_refused_naming_the_blocks(self):
    k, path = self._store('train', self.x, None, 'ntk')
    os.remove(os.path.join(path, 'complete', '0_2'))
    with self.assertRaisesRegex(
        ValueError, r'incomplete: 2 of its 3 x 3 blocks were never finished: '
        r'\(0, 2\), \(2, 0\)\. Run the batched function'):
      nt.predict.gp_inference(k, self.y, solver='cg')('ntk', k[...][:3])

  def test_damaged_block_is_refused(self):
    k, path = self._store('train', self.x, None, 'ntk')
    chunk = os.path.join(path, 'leaf', 'c', '1', '0')
    with open(chunk, 'r+b') as f:
      f.write(bytes(8))
    stored = nt.predict.StoredKernel(k)
    stored.rows(0, _BATCH)  # Another row block: fine.
    with self.assertRaisesRegex(ValueError,
                                r'Block \(1, 0\) .* is damaged.*again'):
      stored.rows(_BATCH, 2 * _BATCH)
    # Passes over the row blocks decode the bytes they checked (one read).
    stored = nt.predict.StoredKernel(k)
    blocks = stored.row_blocks()
    start, _, rows = next(blocks)
    np.testing.assert_array_equal(rows, k[start:start + _BATCH])
    with self.assertRaisesRegex(ValueError,
                                r'Block \(1, 0\) .* is damaged.*again'):
      next(blocks)

  @parameterized.named_parameters(
      ('truncated', 'truncated', 'the chunk file does not match its checksum'),
      ('oversized', 'oversized', 'the chunk file does not match its checksum'),
      ('deleted', 'deleted', 'the chunk file is missing'))
  def test_chunk_file_of_another_size_is_refused_by_row_passes(self, damage,
                                                                why):
    # Not a whole raw chunk: the pass hands the block to the zarr path,
    # which checks the whole file against its record.
    k, path = self._store('train', self.x, None, 'ntk')
    chunk = os.path.join(path, 'leaf', 'c', '1', '0')
    if damage == 'deleted':
      os.remove(chunk)
    else:
      with open(chunk, 'r+b') as f:
        data = f.read()
        f.seek(0)
        f.truncate()
        f.write(data[:len(data) // 2] if damage == 'truncated' else
                data + data)
    blocks = nt.predict.StoredKernel(k).row_blocks()
    next(blocks)
    with self.assertRaisesRegex(
        ValueError, rf'Block \(1, 0\) .* is damaged: {why}.*again'):
      next(blocks)

  def test_store_of_other_points_is_refused(self):
    k, _ = self._store('train', self.x[:30], None, 'ntk')
    with self.assertRaisesRegex(ValueError, 'y_train` has 40 rows'):
      nt.predict.gradient_descent_mse(k, self.y, solver='cg')

  def test_non_finite_kernel_is_refused_naming_the_entry(self):
    # A NaN input: the in-memory path names the NaN kernel; conjugate
    # gradients on the store met NumPy's 'Probabilities contain NaN'.
    x = self.x.copy()
    x[3, 1] = np.nan
    k, _ = self._store('nan', x, None, 'ntk')
    for make in (nt.predict.gp_inference, nt.predict.gradient_descent_mse):
      with self.assertRaisesRegex(
          ValueError, r'`k_train_train` contains NaN or inf values \(first '
          r'at row 3, column 3: nan, in block \(0, 0\) of the store\)'):
        predict = make(k, self.y, diag_reg=1e-2, solver='cg')
        if make is nt.predict.gp_inference:
          predict('ntk', k[...][:3])
        else:
          predict(None, None, 0., k[...][:3])
    # Off the diagonal (a zarr array outside a store, no checksums): found by
    # the first pass over the row blocks.
    import zarr  # pylint: disable=g-import-not-at-top  (needs_zarr)
    kernel = np.asarray(self._store('train', self.x, None, 'ntk')[0][...])
    kernel[20, 2] = kernel[2, 20] = np.inf
    array = zarr.open_array(os.path.join(self.directory, 'plain'), mode='w',
                            shape=kernel.shape, chunks=(16, 16),
                            dtype=kernel.dtype)
    array[...] = kernel
    with self.assertRaisesRegex(ValueError, r'first at row 2, column 20: '
                                r'inf, in block \(0, 1\)'):
      nt.predict.gp_inference(array, self.y, diag_reg=1e-2, solver='cg')(
          'ntk', kernel[:3])

  def test_stored_kernel_of_a_numpy_array_is_refused(self):
    with self.assertRaisesRegex(
        TypeError, r'`StoredKernel` reads a zarr array .*got a ndarray\. '
        r'Pass an in-memory kernel directly as `k_train_train`'):
      nt.predict.StoredKernel(np.eye(3))

  @parameterized.parameters('cholesky', 'eigh')
  def test_other_solvers_read_the_store_whole(self, solver):
    k, _ = self._store('train', self.x, None, 'ntk')
    k_test, _ = self._store('test', self.x_test, self.x, 'ntk')
    got = nt.predict.gradient_descent_mse(k, self.y, diag_reg=1e-3,
                                          solver=solver)(None, None, 0.,
                                                         k_test)
    desired = _direct(k[...], k_test[...], self.y, 1e-3)
    np.testing.assert_allclose(np.asarray(got, np.float64), desired,
                               rtol=1e-5, atol=1e-5 * np.abs(desired).max())


class ProgressTest(test_utils.NeuralTangentsTestCase):

  def test_progress_bar_of_cg_iterations(self):
    k = np.random.RandomState(0).rand(30, 30)
    k = k @ k.T
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
      predict_fn = nt.predict.gradient_descent_mse(
          k, np.ones((30, 1)), diag_reg=1e-2, solver='cg', progress=True)
      predict_fn(None, None, 0., k[:3])
    self.assertRegex(stderr.getvalue(), r'conjugate gradients.*residual=')
    with self.assertRaisesRegex(TypeError, '`progress` must be True or False'):
      nt.predict.gp_inference(k, np.ones((30, 1)), progress='yes')


class FastProductsTest(test_utils.NeuralTangentsTestCase):
  """CG multiplies a float32 kernel in float32 and replaces its residual by
  the exact (float64) one before it stops."""

  def test_float32_products(self):
    k = np.random.RandomState(0).rand(50, 50).astype(np.float32)
    v = np.random.RandomState(1).randn(50, 3)
    fast = solve.kernel_matmul(k, v, exact=False)
    np.testing.assert_allclose(fast, k @ v.astype(np.float32), rtol=1e-5)
    exact = solve.kernel_matmul(k, v)
    np.testing.assert_allclose(exact, k.astype(np.float64) @ v, rtol=1e-13)

  def test_ill_conditioned_float32_kernel_reaches_tol(self):
    # Condition number 1e4: float32 products alone leave an exact residual
    # near eps32 * cond ~ 1e-3, far above `tol`.
    rng = np.random.RandomState(2)
    q, _ = np.linalg.qr(rng.randn(300, 300))
    k = ((q * np.logspace(0, -4, 300)) @ q.T).astype(np.float32)
    k = (k + k.T) / 2
    y = rng.randn(300, 2)
    factor = solve.factorize(k, 1e-7, diag_reg_absolute_scale=True,
                             solver='cg', tol=1e-9, maxiter=3000,
                             preconditioner_rank=50)
    x = factor.solve(y)
    self.assertTrue(factor.info.converged)
    self.assertLessEqual(factor.info.residual, 1e-9)
    k64 = k.astype(np.float64) + 1e-7 * np.eye(300)
    residual = np.linalg.norm(y - k64 @ x, axis=0) / np.linalg.norm(y, axis=0)
    self.assertLessEqual(residual.max(), 1.01e-9)


if __name__ == '__main__':
  absltest.main()
