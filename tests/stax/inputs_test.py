"""Tests of `stax.inputs`: the input kernel and the layout of input arrays."""
from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents import stax
from neural_tangents._src.stax import inputs
from neural_tangents._src.stax import protocol
from tests import test_utils


def _direct_nngp(x1, x2, batch_axis, channel_axis):
  """float64 `(1/C) sum_c x1[i, s, c] x2[j, s', c]`, `(N1, N2, S, S', ...)`."""
  def standard(x):
    x = np.moveaxis(np.asarray(x, np.float64), (batch_axis, channel_axis),
                    (0, -1))
    return x
  return np.asarray(test_utils.pair_covariance(standard(x1), standard(x2)))


class InputsToKernelTest(test_utils.NeuralTangentsTestCase):

  @parameterized.named_parameters(
      ('flat', (3, 4), (2, 4), 0, -1),
      ('images_nhwc', (2, 3, 2, 5), (3, 3, 2, 5), 0, -1),
      ('batch_last_channel_first', (5, 3, 2), (5, 3, 4), 2, 0))
  def test_covariances_match_float64_direct_sum(self, shape1, shape2,
                                                batch_axis, channel_axis):
    rng = np.random.RandomState(0)
    # Examples of very different sizes: each keeps its own scale.
    x1 = rng.randn(*shape1) * np.logspace(-3, 3, shape1[batch_axis]).reshape(
        [-1 if a == batch_axis else 1 for a in range(len(shape1))])
    x2 = rng.randn(*shape2)
    for diagonal_spatial, diagonal_batch in ((False, False), (True, False),
                                             (False, True), (True, True)):
      k = inputs.inputs_to_kernel(
          jnp.asarray(x1), jnp.asarray(x2), diagonal_batch=diagonal_batch,
          diagonal_spatial=diagonal_spatial, compute_ntk=True,
          batch_axis=batch_axis, channel_axis=channel_axis)
      nngp = _direct_nngp(x1, x2, batch_axis, channel_axis)
      cov1 = _direct_nngp(x1, x1, batch_axis, channel_axis)
      cov2 = _direct_nngp(x2, x2, batch_axis, channel_axis)
      if diagonal_spatial:
        for _ in range(nngp.ndim // 2 - 1):
          nngp = np.moveaxis(np.diagonal(nngp, axis1=2, axis2=3), -1, -1)
          cov1 = np.moveaxis(np.diagonal(cov1, axis1=2, axis2=3), -1, -1)
          cov2 = np.moveaxis(np.diagonal(cov2, axis1=2, axis2=3), -1, -1)
      if diagonal_batch:
        cov1, cov2 = (np.moveaxis(np.diagonal(c, axis1=0, axis2=1), -1, 0)
                      for c in (cov1, cov2))
      self.assertAllClose(k.nngp, nngp)
      self.assertAllClose(k.cov1, cov1)
      self.assertAllClose(k.cov2, cov2)
      self.assertAllClose(k.ntk, np.zeros_like(nngp))
      self.assertEqual((k.batch_axis, k.channel_axis),
                       (batch_axis, channel_axis))

  def test_equal_batch_and_channel_axes_raise(self):
    with self.assertRaisesRegex(ValueError, r'`batch_axis` and `channel_axis`'
                                r'.*must differ.*Pass distinct axes'):
      inputs.inputs_to_kernel(jnp.ones((2, 3)), None, diagonal_batch=True,
                              diagonal_spatial=False, compute_ntk=False,
                              batch_axis=0, channel_axis=-2)


class EmptyInputsTest(test_utils.NeuralTangentsTestCase):
  """0 channels or positions reached JAX's 'zero-size array to reduction'
  (and `Dense`'s apply_fn a ZeroDivisionError); an empty batch is fine."""

  def test_no_channels_or_positions_are_refused(self):
    init_fn, _, kernel_fn = stax.serial(stax.Dense(4), stax.Relu(),
                                        stax.Dense(1))
    for x1, x2, name, what in (
        (np.ones((3, 0)), None, 'x1', 'channel axis 1'),
        (np.ones((3, 2)), np.ones((3, 0)), 'x2', 'channel axis 1'),
        (np.ones((3, 0, 2)), None, 'x1', 'spatial axis 1')):
      with self.assertRaisesRegex(
          ValueError, f'`{name}` has shape .*, with no entries on its {what}: '
          'the kernel averages'):
        kernel_fn(x1, x2, 'nngp')
    with self.assertRaisesRegex(ValueError, r'`Dense` needs at least one '
                                r'input channel; got input_shape=\(3, 0\)'):
      init_fn(jax.random.PRNGKey(0), (3, 0))
    self.assertEqual(kernel_fn(np.ones((0, 3)), np.ones((2, 3)), 'nngp').shape,
                     (0, 2))


class InputLayoutTest(test_utils.NeuralTangentsTestCase):

  def test_pair_inputs_keeps_the_structure_of_x1(self):
    self.assertEqual(inputs.pair_inputs(('a', ['b', 'c']), None),
                     (None, [None, None]))
    with self.assertRaisesRegex(ValueError, r'`x2` must have the same '
                                r'structure as `x1` \(2 inputs\).*Pass one'):
      inputs.pair_inputs(('a', 'b'), ('c',))

  def test_input_axes_of_parallel_follow_each_branch(self):
    kernel_fn = stax.parallel(stax.Dense(1, batch_axis=1, channel_axis=0),
                              stax.Dense(1))[2]
    x = (jnp.ones((3, 2)), jnp.ones((2, 3)))
    self.assertEqual(inputs.input_axes(kernel_fn, x),
                     (protocol.InputAxes(1, 0), protocol.InputAxes(0, -1)))
    self.assertEqual(inputs.input_batch_axes(kernel_fn, x), (1, 0))
    # One array for the whole network: the first declared layout.
    self.assertEqual(inputs.input_batch_axes(kernel_fn, x[0]), 1)

  def test_input_axes_legacy_encoding_converts(self):
    self.assertEqual(protocol.KernelSpec(input_axes=(1, 0)).input_axes,
                     protocol.InputAxes(1, 0))
    self.assertEqual(protocol.InputAxes.of([(1, 0), [None]]),
                     protocol.InputAxes(per_input=(
                         protocol.InputAxes(1, 0),
                         protocol.InputAxes(
                             per_input=(protocol.InputAxes(),)))))
    with self.assertRaisesRegex(TypeError, r'`input_axes` must be None, a '
                                r"`\(batch_axis, channel_axis\)`.*got 'NHWC'.*"
                                r'Pass e.g.'):
      protocol.InputAxes.of('NHWC')


if __name__ == '__main__':
  absltest.main()
