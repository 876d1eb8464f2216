"""Tests of `layout`: moves between layouts are inverse to each other, and
`check_layout` names the mismatch."""
from absl.testing import absltest
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.stax import layout
from neural_tangents._src.stax import inputs
from neural_tangents._src.utils import kernel as kernel_lib
from tests import test_utils


class LayoutTest(test_utils.NeuralTangentsTestCase):

  def test_standard_layout_round_trip(self):
    x = jnp.asarray(np.random.RandomState(0).randn(3, 2, 4, 5))
    for flatten in (False, True):
      z = layout.to_standard(x, 1, 0, flatten)
      self.assertEqual(z.shape, (2, 20, 3) if flatten else (2, 4, 5, 3))
      self.assertAllClose(layout.from_standard(z, x.shape, 1, 0), x)

  def test_flatten_pairs_round_trip_and_entries(self):
    x = jnp.asarray(np.random.RandomState(1).randn(2, 3, 3, 4, 4))
    flat = layout.flatten_pairs(x, 1, 2)
    # Position (h, w) is flattened to h * 4 + w.
    self.assertAllClose(flat[1, 2 * 4 + 1, 0 * 4 + 3], x[1, 2, 0, 1, 3])
    self.assertAllClose(layout.unflatten_pairs(flat, 1, (3, 4)), x)

  def test_embed_spatial_diagonal_inverts_spatial_diagonal(self):
    d = jnp.asarray(np.random.RandomState(2).randn(2, 2, 3, 4))
    full = layout.embed_spatial_diagonal(d, 2)
    self.assertEqual(full.shape, (2, 2, 3, 3, 4, 4))
    self.assertAllClose(kernel_lib.spatial_diagonal(full, 2), d)
    self.assertAllClose(full[0, 1, 0, 1, 2, 2], 0.)

  def test_check_layout_names_the_layer_and_axes(self):
    k = inputs.inputs_to_kernel(
        jnp.ones((2, 3, 4)), None, diagonal_batch=True,
        diagonal_spatial=False, compute_ntk=True)
    layout.check_layout(k, 0, -1, 'Dense')
    with self.assertRaisesRegex(ValueError,
                                r'`LayerNorm\(batch_axis=0, channel_axis=1\)`'
                                r'.*channel_axis=-1'):
      layout.check_layout(k, 0, 1, 'LayerNorm')

  def test_spatial_axes_rejects_equal_axes(self):
    self.assertEqual(layout.spatial_axes(4, 1, 0, 'AvgPool'), [2, 3])
    with self.assertRaisesRegex(ValueError, 'must differ'):
      layout.spatial_axes(3, 1, -2, 'AvgPool')


if __name__ == '__main__':
  absltest.main()
