"""Keyword arguments of `kernel_fn` that the published release accepts
(issue 28, item 5): `batch_axis` / `channel_axis` set the input layout, and a
published layer keyword (`pattern`) is ignored by a network none of whose
layers reads it; an unknown name still raises."""
from absl.testing import absltest
import numpy as np

from neural_tangents import stax
from tests import test_utils


def _inputs():
  r = np.random.RandomState(0)
  return r.randn(3, 5), r.randn(2, 5)


class PublishedKeywordsTest(test_utils.NeuralTangentsTestCase):

  def test_batch_and_channel_axis_set_the_input_layout(self):
    x1, x2 = _inputs()
    expected = stax.serial(stax.Dense(4), stax.Erf(), stax.Dense(2))[2](x1, x2)
    for layer_axes in ({}, dict(batch_axis=1, channel_axis=0)):
      _, _, kernel_fn = stax.serial(stax.Dense(4, **layer_axes), stax.Erf(),
                                    stax.Dense(2, **layer_axes))
      if not layer_axes:  # The layers read (batch, channels): no override.
        k = kernel_fn(x1, x2, batch_axis=0, channel_axis=-1)
      else:
        k = kernel_fn(x1.T, x2.T, batch_axis=1, channel_axis=0)
      self.assertAllClose(k.nngp, expected.nngp, rtol=1e-12, atol=1e-14)
      self.assertAllClose(k.ntk, expected.ntk, rtol=1e-12, atol=1e-14)

  def test_dot_general_with_its_axes_as_keywords(self):
    # The published pattern `DotGeneral(..., batch_axis=b)[2](x1, x2,
    # batch_axis=b, channel_axis=c)`.
    x1, x2 = _inputs()
    _, _, kernel_fn = stax.DotGeneral(rhs=2., batch_axis=1, channel_axis=0)
    k = kernel_fn(x1.T, x2.T, 'nngp', batch_axis=1, channel_axis=0)
    self.assertAllClose(k, 4. * x1 @ x2.T / 5., rtol=1e-12, atol=1e-14)

  def test_layer_keyword_that_no_layer_reads_is_ignored(self):
    x1, _ = _inputs()
    pattern = np.ones((3, 1, 1))
    for net in (stax.serial(stax.Dense(4), stax.Relu(), stax.Dense(1)),
                stax.repeat(stax.serial(stax.Dense(4), stax.Relu()), 0)):
      kernel_fn = net[2]
      self.assertAllClose(kernel_fn(x1, None, 'nngp',
                                    pattern=(pattern, pattern)),
                          kernel_fn(x1, None, 'nngp'))
    with self.assertRaisesRegex(TypeError, r"unexpected keyword.*'patern'"):
      net[2](x1, None, 'nngp', patern=pattern)


if __name__ == '__main__':
  absltest.main()
