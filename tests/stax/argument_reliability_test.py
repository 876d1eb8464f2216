"""Reliability tests of layer and kernel arguments (issue 29): inputs the
published release accepted are accepted, and wrong ones get a message that
names the argument, the value and the fix."""
from absl.testing import absltest
import numpy as np

from neural_tangents import stax
from tests import test_utils


class GetArgumentTest(test_utils.NeuralTangentsTestCase):
  """`get` errors say what is wrong with it (issue 29 item 9)."""

  def _kernel_fn(self):
    return stax.serial(stax.Dense(8, 1.5, 0.1), stax.Relu(),
                       stax.Dense(1, 1.5, 0.1))[2]

  def test_duplicate_get_says_duplicate(self):
    x = np.ones((3, 4), np.float32)
    with self.assertRaisesRegex(
        ValueError, r"`get=\('ntk', 'ntk'\)` has a duplicate: .*'ntk'.*"
        r"Pass each name once, e\.g\. get=\('ntk',\)"):
      self._kernel_fn()(x, None, ('ntk', 'ntk'))

  def test_empty_get_says_empty(self):
    x = np.ones((3, 4), np.float32)
    for get in ((), []):
      with self.assertRaisesRegex(ValueError,
                                  r'`get=(\(\)|\[\])` is empty: it asks for '
                                  r'nothing\..*Pass e\.g\. get="ntk"'):
        self._kernel_fn()(x, None, get)


class AggregatePatternTest(test_utils.NeuralTangentsTestCase):
  """`pattern=(p, p.copy())` with `x2=None` is `pattern=(p, None)`."""

  def test_equal_copies_are_accepted(self):
    x = np.random.RandomState(0).randn(2, 3, 4).astype(np.float32)
    p = (np.random.RandomState(1).rand(2, 3, 3) > 0.5).astype(np.float32)
    _, _, kernel_fn = stax.serial(stax.Aggregate(), stax.Dense(3),
                                  stax.Relu(), stax.Aggregate(), stax.Dense(1))
    expected = kernel_fn(x, None, 'ntk', pattern=(p, None))
    self.assertAllClose(kernel_fn(x, None, 'ntk', pattern=(p, p.copy())),
                        expected)
    self.assertAllClose(kernel_fn(x, None, 'ntk', pattern=(p, list(p))),
                        expected)

  def test_different_patterns_are_refused(self):
    x = np.ones((2, 3, 4), np.float32)
    p = np.ones((2, 3, 3), np.float32)
    _, _, kernel_fn = stax.serial(stax.Aggregate(), stax.Dense(1))
    with self.assertRaisesRegex(ValueError, r'`pattern\[1\]` must be None '
                                r'\(or equal to `pattern\[0\]`\).*differ'):
      kernel_fn(x, None, 'nngp', pattern=(p, 2 * p))


if __name__ == '__main__':
  absltest.main()
