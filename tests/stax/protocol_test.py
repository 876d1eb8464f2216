"""Tests of the layer protocol: `KernelSpec` and its combinators'
helpers, and the `LayerSpec` record of a layer's constructor call."""
from absl.testing import absltest

from neural_tangents import stax
from neural_tangents._src.stax import protocol
from tests import test_utils

_BOOLS = (stax.Bool.NO, stax.Bool.MAYBE, stax.Bool.YES)
_DIAGONALS = [stax.Diagonal(i, o) for i in _BOOLS for o in _BOOLS]


class LayerSpecTest(test_utils.NeuralTangentsTestCase):

  def test_kernel_fn_records_the_constructor_call(self):
    conv = stax.Conv(3, (2, 2), padding='SAME', b_std=0.1)
    relu = stax.Relu()
    spec = protocol.layer_spec(stax.serial(conv, relu)[2])
    self.assertEqual(spec.name, 'serial')
    self.assertEqual(spec.arguments['layers'], (conv, relu))
    conv_spec = protocol.layer_spec(conv[2])
    self.assertEqual(conv_spec.name, 'Conv')
    self.assertEqual(dict(conv_spec.arguments), dict(
        out_chan=3, filter_shape=(2, 2), strides=None, padding='SAME',
        W_std=1., b_std=0.1, dimension_numbers=None, parameterization='ntk',
        s=(1, 1)))
    with self.assertRaises(TypeError):  # Read-only.
      conv_spec.arguments['W_std'] = 2.

  def test_hand_written_kernel_fn_has_no_spec(self):
    self.assertIsNone(protocol.layer_spec(lambda k: k))


def _residual_block():
  return stax.serial(stax.FanOut(2),
                     stax.parallel(stax.Dense(4), stax.Identity()),
                     stax.FanInSum())


class KernelSpecTest(test_utils.NeuralTangentsTestCase):
  """The layer protocol: one `KernelSpec`, built by the combinators' helpers."""

  def _spec(self, layer):
    return protocol.kernel_spec(layer[2])

  def test_serial_spec_is_compose_of_parts(self):
    for layers in ([stax.Dense(2), stax.Relu(), stax.Flatten(), stax.Dense(1)],
                   [stax.Dense(4), _residual_block(), stax.Relu()]):
      self.assertEqual(self._spec(stax.serial(*layers)),
                       protocol.compose([self._spec(l) for l in layers]))
    chain = self._spec(stax.serial(stax.Dense(2), stax.Flatten()))
    self.assertIsNone(chain.combination)
    self.assertEqual(self._spec(_residual_block()).combination,
                     protocol.Combination.SERIAL)

  def test_parallel_spec_is_in_parallel_of_parts(self):
    layers = [stax.Dense(2), stax.GlobalAvgPool(), test_utils.hand_written_layer([])]
    spec = self._spec(stax.parallel(*layers))
    self.assertEqual(spec,
                     protocol.in_parallel([self._spec(l) for l in layers]))
    self.assertEqual(spec.input_axes, protocol.InputAxes(per_input=(
        protocol.InputAxes(0, -1), protocol.InputAxes(0, -1),
        protocol.InputAxes())))
    # The legacy list-of-pairs encoding converts to the same `InputAxes`.
    self.assertEqual(protocol.InputAxes.of([(0, -1), (0, -1), None]),
                     spec.input_axes)

  def test_repeat_spec_is_repeated(self):
    block = _residual_block()
    spec = self._spec(stax.repeat(block, 3))
    self.assertEqual(spec, protocol.repeated(self._spec(block), 3))
    self.assertFalse(spec.supports_masking)

  def test_hand_written_layer_gets_the_default_spec(self):
    spec = self._spec(test_utils.hand_written_layer([]))
    self.assertEqual(spec, protocol.KernelSpec(protocol.UNDECLARED))
    self.assertEqual(spec.name, 'kernel_fn')
    self.assertFalse(spec.input_axes.declared)
    self.assertEqual(spec.input_axes, protocol.InputAxes.of(None))
    self.assertFalse(spec.supports_masking)
    self.assertEqual(spec.allowed_inputs(protocol.Allowed(True, False)),
                     protocol.Allowed(True, False))
    self.assertFalse(protocol.is_layer_kernel_fn(test_utils.hand_written_layer([])[2]))
    self.assertTrue(protocol.is_layer_kernel_fn(stax.Relu()[2]))

  def test_helpers_allow_what_their_parts_allow(self):
    states = [protocol.Allowed(b, s) for b in _BOOLS for s in _BOOLS]
    leaves = [protocol.KernelSpec(protocol.Requirements(a, b))
              for a, b in zip(_DIAGONALS, _DIAGONALS[::-1])]
    parts = leaves + [protocol.in_parallel(leaves[:2]),
                      protocol.compose([leaves[0], protocol.in_parallel(
                          leaves[1:3])])]
    for a in parts:
      for b in parts:
        for out in states:
          self.assertEqual(
              protocol.compose([a, b]).allowed_states(out),
              a.allowed_states(b.allowed_states(out)), (a, b, out))
      for n in (0, 1, 4):
        for out in states:
          expected = out
          for _ in range(n):
            expected = a.allowed_states(expected)
          self.assertEqual(protocol.repeated(a, n).allowed_states(out),
                           expected)


if __name__ == '__main__':
  absltest.main()
