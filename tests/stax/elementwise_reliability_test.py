"""Reliability tests of `stax/elementwise.py` (issue 29): hyperparameters
that make a kernel not PSD are refused, and closed forms stay accurate at
small input scales."""
from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from neural_tangents import stax
from tests import test_utils


class ExpNormalizedGammaTest(test_utils.NeuralTangentsTestCase):
  """`ExpNormalized(gamma < 0)` raises, as `Rbf(gamma <= 0)` does."""

  @parameterized.parameters(-1., -1e-3, -5, np.float32(-1.))
  def test_negative_gamma_raises(self, gamma):
    with self.assertRaisesRegex(ValueError, r'`gamma` of `ExpNormalized` '
                                r'must be >= 0; got .*gamma=1\.'):
      stax.ExpNormalized(gamma=gamma)

  def test_nan_gamma_raises(self):
    with self.assertRaisesRegex(ValueError, '`gamma`'):
      stax.ExpNormalized(gamma=float('nan'))

  def test_string_gamma_raises_type_error(self):
    with self.assertRaisesRegex(TypeError, '`gamma` of `ExpNormalized`'):
      stax.ExpNormalized(gamma='1')

  @parameterized.parameters(0., 0.5, 1, 3.)
  def test_nonnegative_gamma_gives_a_psd_kernel(self, gamma):
    x = np.random.RandomState(0).randn(12, 4).astype(np.float32)
    _, _, kernel_fn = stax.serial(stax.Dense(8), stax.ExpNormalized(gamma))
    k = np.asarray(kernel_fn(x, None, 'nngp'), np.float64)
    evals = np.linalg.eigvalsh((k + k.T) / 2)
    self.assertGreater(evals[0], -1e-5 * evals[-1])


if __name__ == '__main__':
  absltest.main()
