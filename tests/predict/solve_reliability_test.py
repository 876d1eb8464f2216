"""Reliability tests of `predict/solve.py` (issue 29): conjugate gradients
refuse an indefinite train kernel with the error of the direct solvers."""
from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from neural_tangents import predict
from neural_tangents._src.predict import solve
from tests import test_utils


def _indefinite(n: int, seed: int = 1) -> np.ndarray:
  """A symmetric float32 `n x n` matrix with eigenvalues -0.3 and 0.5..3:
  its diagonal is positive, so only its curvature shows it is indefinite."""
  rs = np.random.RandomState(seed)
  q, _ = np.linalg.qr(rs.randn(n, n))
  evals = np.linspace(0.5, 3., n)
  evals[0] = -0.3
  k = ((q * evals) @ q.T).astype(np.float32)
  return (k + k.T) / 2


class CGIndefiniteKernelTest(test_utils.NeuralTangentsTestCase):
  """CG detects non-positive curvature and raises Cholesky's error."""

  def _errors(self, k, diag_reg=1e-3, **kwargs):
    y = np.random.RandomState(0).randn(k.shape[0], 1).astype(np.float32)
    messages = {}
    for solver in ('cholesky', 'eigh', 'cg'):
      with self.assertRaisesRegex(ValueError, 'not positive semi-definite'):
        predict.gp_inference(k, y, diag_reg=diag_reg, solver=solver,
                             **kwargs)('ntk', k[:3])
      try:
        predict.gp_inference(k, y, diag_reg=diag_reg, solver=solver,
                             **kwargs)('ntk', k[:3])
      except ValueError as e:
        messages[solver] = str(e)
    return messages

  def test_negative_diagonal_raises_the_cholesky_error(self):
    k = np.diag([1., -1., 2., 1., 1.]).astype(np.float32)
    messages = self._errors(k)
    self.assertIn('`diag_reg` >= 1.3', messages['cg'])
    self.assertEqual(messages['cg'], messages['cholesky'])

  @parameterized.parameters(5, 40, 150)
  def test_negative_curvature_raises_the_cholesky_error(self, n):
    k = _indefinite(n)
    self.assertGreater(np.diagonal(k).min(), 0.)
    messages = self._errors(k)
    self.assertEqual(messages['cg'], messages['cholesky'])
    self.assertEqual(messages['cg'], messages['eigh'])

  def test_absolute_diag_reg_words_the_same_suggestion(self):
    messages = self._errors(_indefinite(20), diag_reg=1e-2,
                            diag_reg_absolute_scale=True)
    self.assertEqual(messages['cg'], messages['cholesky'])

  def test_psd_kernel_still_solves(self):
    x = np.random.RandomState(0).randn(60, 3)
    k = np.exp(-((x[:, None] - x[None]) ** 2).sum(-1))
    y = np.ones((60, 1))
    solver = solve.factorize(k, 0., diag_reg_absolute_scale=True,
                             solver='cg', tol=1e-8, preconditioner_rank=5)
    a = solver.solve(y)
    self.assertTrue(solver.info.converged)
    self.assertAllClose(k @ a, y, atol=1e-5, rtol=1e-5)

  def test_lanczos_extremes_exact_on_small_matrices(self):
    k = _indefinite(10).astype(np.float64)
    lo, hi = solve.lanczos_extremes(lambda v: k @ v,
                                    np.ones(10), steps=64)
    evals = np.linalg.eigvalsh(k)
    self.assertAllClose(np.array([lo, hi]), evals[[0, -1]], rtol=1e-8,
                        atol=1e-8)


class SolverArgumentsTest(test_utils.NeuralTangentsTestCase):
  """Solver arguments: numpy scalars accepted, wrong types named (item 11)."""

  def _k_y(self):
    x = np.random.RandomState(0).randn(5, 3)
    k = (x @ x.T + np.eye(5)).astype(np.float32)
    return k, np.ones((5, 1), np.float32)

  def test_numpy_scalar_tol(self):
    k, y = self._k_y()
    for tol in (np.float32(1e-5), np.float64(1e-6)):
      mean = predict.gp_inference(k, y, solver='cg', tol=tol)('nngp', k[:2])
      self.assertAllClose(mean, y[:2], rtol=1e-3, atol=1e-3)

  def test_bool_preconditioner_rank(self):
    k, y = self._k_y()
    with self.assertRaisesRegex(ValueError, r'`preconditioner_rank` must be '
                                r'an int >= 0; got True'):
      predict.gp_inference(k, y, solver='cg', preconditioner_rank=True)(
          'nngp', k[:2])

  def test_string_diag_reg(self):
    k, y = self._k_y()
    with self.assertRaisesRegex(TypeError, r"`diag_reg` must be a number >= "
                                r"0; got '1e-3'\. Pass a float"):
      predict.gp_inference(k, y, diag_reg='1e-3')('nngp', k[:2])

  def test_max_learning_rate_of_no_points(self):
    with self.assertRaisesRegex(ValueError, r'`ntk_train_train` has no '
                                r'training points \(shape \(0, 0\)\)'):
      predict.max_learning_rate(np.zeros((0, 0), np.float32))


class KernelRowsTest(test_utils.NeuralTangentsTestCase):
  """`KernelRows` in `gradient_descent_mse` and its validation (item 10)."""

  def _problem(self):
    x = np.random.RandomState(0).randn(6, 3)
    k = x @ x.T + np.eye(6)
    y = np.random.RandomState(1).randn(6, 1)
    k_test = np.random.RandomState(2).randn(2, 3) @ x.T
    return k, y, k_test

  def test_gradient_descent_mse_infinite_time_by_cg(self):
    k, y, k_test = self._problem()
    rows = predict.KernelRows(lambda a, b: k[a:b], 6, block_rows=4)
    predict_fn = predict.gradient_descent_mse(rows, y, solver='cg',
                                              diag_reg=0., tol=1e-8)
    fx_train, fx_test = predict_fn(None, 0., 0., k_test)
    self.assertAllClose(fx_train, y, rtol=1e-5, atol=1e-5)
    self.assertAllClose(fx_test, k_test @ np.linalg.solve(k, y), rtol=1e-4,
                        atol=1e-4)

  def test_finite_time_says_the_kernel_must_be_in_memory(self):
    k, y, k_test = self._problem()
    rows = predict.KernelRows(lambda a, b: k[a:b], 6)
    predict_fn = predict.gradient_descent_mse(rows, y, solver='cg')
    with self.assertRaisesRegex(ValueError, r'finite `t` \(got t=1\.0\) need '
                                r'the eigendecomposition .*in memory'):
      predict_fn(1., 0., 0., k_test)

  def test_other_solvers_refused(self):
    k, y, _ = self._problem()
    rows = predict.KernelRows(lambda a, b: k[a:b], 6)
    with self.assertRaisesRegex(ValueError, r'only `solver="cg"` can use; got '
                                "solver='cholesky'"):
      predict.gradient_descent_mse(rows, y)

  def test_diagonal_length(self):
    k, _, _ = self._problem()
    with self.assertRaisesRegex(ValueError, r'`diagonal` must have shape '
                                r'\(6,\).*got shape \(5,\)'):
      predict.KernelRows(lambda a, b: k[a:b], 6, diagonal=np.ones(5))

  def test_block_rows(self):
    k, _, _ = self._problem()
    for block_rows in (0, -2, 1.5, True):
      with self.assertRaisesRegex(ValueError, '`block_rows` must be an int '
                                  '>= 1'):
        predict.KernelRows(lambda a, b: k[a:b], 6, block_rows=block_rows)

  def test_rows_of_the_wrong_shape(self):
    k, y, k_test = self._problem()
    # `n` smaller than the kernel: rows are wider than `n`.
    rows = predict.KernelRows(lambda a, b: k[a:b], 5)
    with self.assertRaisesRegex(ValueError, r'`rows_fn\(0, 5\)` of a '
                                r'`KernelRows` with n=5 .*shape \(5, 5\); got '
                                r'shape \(5, 6\)'):
      predict.gp_inference(rows, y[:5], solver='cg')('nngp', k_test[:, :5])
    # `n` larger than the kernel: fewer rows than asked for.
    rows = predict.KernelRows(lambda a, b: k[a:b], 7)
    with self.assertRaisesRegex(ValueError, r'must return rows'):
      rows.rows(0, 7)


if __name__ == '__main__':
  absltest.main()


class GpInferenceEdgeInputsTest(test_utils.NeuralTangentsTestCase):
  """Inputs the published release accepted (issue 29 item 9)."""

  def _kernels(self):
    k = 3 * np.eye(5, dtype=np.int64) + 1
    y = np.random.RandomState(1).randn(5, 1).astype(np.float32)
    return k, y

  @parameterized.parameters('cholesky', 'eigh', 'cg')
  def test_integer_kernels_give_the_float_answer(self, solver):
    k, y = self._kernels()
    k_test = np.arange(10, dtype=np.int64).reshape(2, 5) % 3
    mean = predict.gp_inference(k, y, diag_reg=1e-3, solver=solver)(
        'nngp', k_test)
    expected = predict.gp_inference(k.astype(np.float32), y, diag_reg=1e-3,
                                    solver=solver)(
                                        'nngp', k_test.astype(np.float32))
    self.assertTrue(np.issubdtype(np.asarray(mean).dtype, np.floating))
    self.assertAllClose(mean, expected, rtol=1e-5, atol=1e-6)

  @parameterized.parameters('cholesky', 'cg')
  def test_empty_test_set_gives_an_empty_mean(self, solver):
    k, y = self._kernels()
    k = k.astype(np.float32)
    for dtype in (np.float32, np.float64):
      mean = predict.gp_inference(k, y, solver=solver)(
          'ntk', np.zeros((0, 5), dtype))
      self.assertEqual(np.shape(mean), (0, 1))

  def test_empty_test_set_kernel_matmul(self):
    out = solve.kernel_matmul(np.zeros((0, 5), np.float32), np.ones((5, 2)))
    self.assertEqual(out.shape, (0, 2))
