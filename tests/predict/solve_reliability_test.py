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


if __name__ == '__main__':
  absltest.main()
