"""Tests of `windows`: window geometry against `jax.lax`'s output shapes."""
from absl.testing import absltest
from absl.testing import parameterized
from jax import lax
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.stax import windows
from tests import test_utils


class WindowGeometryTest(test_utils.NeuralTangentsTestCase):

  @parameterized.product(in_size=[3, 5], size=[1, 3], stride=[1, 2, 3],
                         padding=['VALID', 'SAME'])
  def test_conv_window_out_size_is_that_of_lax_conv(self, in_size, size,
                                                    stride, padding):
    out = lax.conv_general_dilated(jnp.ones((1, 1, in_size)),
                                   jnp.ones((1, 1, size)), (stride,), padding)
    dim = windows.conv_window(in_size, size, stride, windows.Padding(padding))
    self.assertEqual(dim.out_size, out.shape[-1])
    if padding == 'SAME':
      expected_pads = lax.padtype_to_pads((in_size,), (size,), (stride,),
                                          padding)[0]
      self.assertEqual(dim.pads, tuple(expected_pads))

  @parameterized.product(in_size=[1, 5], size=[2, 3], stride=[1, 2, 3],
                         padding=['VALID', 'SAME'])
  def test_conv_transpose_window_out_size_is_that_of_lax(self, in_size, size,
                                                         stride, padding):
    out = lax.conv_transpose(jnp.ones((1, in_size, 1)), jnp.ones((size, 1, 1)),
                             (stride,), padding,
                             dimension_numbers=('NHC', 'HIO', 'NHC'))
    dim = windows.conv_transpose_window(in_size, size, stride,
                                        windows.Padding(padding))
    self.assertEqual(dim.out_size, out.shape[1])

  def test_padding_of_accepts_any_case_and_names_the_fix(self):
    self.assertIs(windows.padding_of('circular'), windows.Padding.CIRCULAR)
    self.assertIs(windows.padding_of(windows.Padding.SAME),
                  windows.Padding.SAME)
    with self.assertRaisesRegex(ValueError, r'`padding`.*\'FULL\'.*SAME'):
      windows.padding_of('FULL')

  def test_too_many_spatial_dimensions_names_the_fix(self):
    with self.assertRaisesRegex(ValueError, r'`filter_shape` has 30 entries.*'
                                r'Pass `dimension_numbers`'):
      windows.conv_layout(None, 30, 'Conv')

  def test_separable_window_sum_pairs_every_tap(self):
    x = jnp.arange(36.).reshape(1, 6, 6)
    dims = [windows.conv_window(6, 3, 2, windows.Padding.SAME)] * 2
    padded = np.pad(np.asarray(x[0]), dims[0].pads)
    expected = np.array([[padded[2 * a:2 * a + 3, 2 * b:2 * b + 3].sum()
                          for b in range(3)] for a in range(3)])
    self.assertAllClose(windows.separable_window_sum(x, [1, 2], dims)[0],
                        expected)

  def test_letter_windows_follow_the_dimension_numbers(self):
    layout = windows.conv_layout(('NCHW', 'OIHW', 'NCHW'), 2, 'Conv')
    dims = windows.letter_windows((2, 3, 8, 5), layout, (3, 1), (2, 1),
                                  windows.Padding.VALID, 'Conv')
    self.assertEqual({c: d.out_size for c, d in dims.items()},
                     {'H': 3, 'W': 5})
    self.assertEqual(
        windows.window_output_shape((2, 3, 8, 5), layout, dims, 4),
        (2, 4, 3, 5))


if __name__ == '__main__':
  absltest.main()
