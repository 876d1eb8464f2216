"""Masks through convolutions and pooling, as the published release (issue
28, item 1): a window's output position is masked iff the input position at
its centre is, global average pooling averages over unmasked positions, and
`apply_fn` keeps returning a `MaskedArray`. Checked against the published
numbers and a Monte Carlo estimate of `stax.unmask_fn(apply_fn)`."""
from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np

from neural_tangents import stax
from neural_tangents._src.stax import windows
from tests import test_utils

MASK = -99.


def _inputs():
  x = np.random.RandomState(0).randn(3, 6, 2).astype(np.float32)
  x[0, 4:] = MASK
  return x


def _conv(**kwargs):
  return stax.Conv(4, (3,), padding=kwargs.pop('padding', 'SAME'), **kwargs)


# Row 0 of the published NNGP (Neural Tangents 0.6.5) of each network, all
# read out by `Dense(1)`.
_PUBLISHED = {
    'same_global_avg': ([_conv(), stax.Relu(), stax.GlobalAvgPool()],
                        [0.492, 0.2235, 0.2836]),
    'valid_global_avg': ([_conv(padding='VALID'), stax.Relu(),
                          stax.GlobalAvgPool()], [0.5465, 0.2728, 0.3254]),
    'strided_global_avg': ([_conv(strides=(2,)), stax.Relu(),
                            stax.GlobalAvgPool()], [0.5932, 0.2174, 0.3473]),
    'avg_pool': ([_conv(), stax.Relu(), stax.AvgPool((2,), (2,)),
                  stax.GlobalAvgPool()], [0.492, 0.2235, 0.2836]),
    'global_sum': ([_conv(), stax.Relu(), stax.GlobalSumPool()],
                   [7.8722, 5.363, 6.8073]),
    'flatten': ([_conv(), stax.Relu(), stax.Flatten()],
                [0.5509, 0.2423, 0.2341]),
}


class PublishedMaskingTest(test_utils.NeuralTangentsTestCase):

  @parameterized.named_parameters(*((name,) + case
                                    for name, case in _PUBLISHED.items()))
  def test_published_numbers(self, layers, published):
    init_fn, apply_fn, kernel_fn = stax.serial(*layers, stax.Dense(1))
    x = _inputs()
    nngp = kernel_fn(x, None, 'nngp', mask_constant=MASK)
    self.assertAllClose(np.round(np.asarray(nngp[0]), 4),
                        np.array(published), rtol=0, atol=1.5e-4)
    _, params = init_fn(jax.random.PRNGKey(0), x.shape)
    out = apply_fn(params, x, mask_constant=MASK)
    self.assertIsInstance(out, stax.MaskedArray)
    self.assertFalse(bool(np.any(out.mask)))  # No example is all masked.

  def test_window_centres(self):
    # SAME, stride 1: the mask passes through; strides: the window centres;
    # VALID: shifted by half a window; padding and dilation zeros: none.
    same = windows.WindowDim(6, 3, 1, windows.same_pads(6, 3, 1))
    np.testing.assert_array_equal(windows.window_centres(same), np.arange(6))
    strided = windows.WindowDim(6, 3, 2, windows.same_pads(6, 3, 2))
    np.testing.assert_array_equal(windows.window_centres(strided), [1, 3, 5])
    np.testing.assert_array_equal(
        windows.window_centres(windows.WindowDim(6, 3)), [1, 2, 3, 4])
    np.testing.assert_array_equal(
        windows.window_centres(windows.WindowDim(3, 3, 1, (2, 2))),
        [-1, 0, 1, 2, -1])
    np.testing.assert_array_equal(
        windows.window_centres(windows.WindowDim(3, 2, 1, (0, 0),
                                                 dilation=2)),
        [0, -1, 1, -1])

  def test_kernel_matches_monte_carlo_of_unmasked_apply_fn(self):
    # The VALID network, where the centre rule and the earlier "any unmasked
    # position in the window" rule differ by a third.
    init_fn, apply_fn, kernel_fn = stax.serial(
        stax.Conv(512, (3,), padding='VALID'), stax.Relu(),
        stax.GlobalAvgPool(), stax.Dense(512))
    x = _inputs()
    unmasked_apply = stax.unmask_fn(apply_fn)
    nngp, _ = test_utils.monte_carlo_kernels(
        init_fn, lambda p, x: unmasked_apply(p, x, mask_constant=MASK), x, x,
        64, jax.random.PRNGKey(1), compute_ntk=False, batch_size=16)
    expected = kernel_fn(x, None, 'nngp', mask_constant=MASK)
    self.assertLess(test_utils.relative_error(nngp, expected),
                    test_utils.MC_TOL)


if __name__ == '__main__':
  absltest.main()
