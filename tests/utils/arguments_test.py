"""Tests of `utils.arguments`: the argument checks' accepted values and
messages (the layer-level errors are tested with the layers)."""
from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.utils import arguments


class PrngKeyTest(parameterized.TestCase):

  def test_accepts_raw_and_typed_keys(self):
    raw = jax.random.PRNGKey(0)
    typed = jax.random.key(0)
    self.assertIs(arguments.prng_key(raw), raw)
    self.assertIs(arguments.prng_key(typed), typed)

  @parameterized.parameters(None, 'key', 1.5)
  def test_rejects_non_arrays(self, value):
    with self.assertRaisesRegex(TypeError, r'`rng` must be a PRNG key.*'
                                r'PRNGKey\(0\).*jax\.random\.key\(0\)'):
      arguments.prng_key(value)


class InputShapeTest(parameterized.TestCase):

  @parameterized.parameters(
      {'shape': (-1, 3)}, {'shape': [2, 4, 4, 3]},
      {'shape': [(2, 3), (2, 5)]}, {'shape': (np.int64(2), 3)})
  def test_accepts_shapes(self, shape):
    self.assertEqual(arguments.input_shape(shape), shape)

  @parameterized.parameters(
      {'shape': (2, True)}, {'shape': (2, None)}, {'shape': [(2, 3), 'a']})
  def test_rejects_non_int_entries(self, shape):
    with self.assertRaisesRegex(TypeError, r'`input_shape`.*not'):
      arguments.input_shape(shape)


class RealNumberTest(parameterized.TestCase):

  def test_accepts_numbers(self):
    for value in (1, 2.5, np.float32(1.), np.array(0.5), jnp.array(0.5)):
      self.assertIs(arguments.real_number(value, 'W_std', ''), value)

  @parameterized.parameters(('1',), (None,), (True,), ([1.],))
  def test_rejects_others(self, value):
    with self.assertRaisesRegex(TypeError, r'`W_std` must be a real number.*'
                                r'Pass e\.g'):
      arguments.real_number(value, 'W_std', 'Pass e.g. W_std=1.')


if __name__ == '__main__':
  absltest.main()
