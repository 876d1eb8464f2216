"""Tests of `utils.arguments`: canonical values and messages of argument
checks."""
from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents import stax
from neural_tangents._src.utils import arguments
from tests import test_utils


class ParseGetTest(test_utils.NeuralTangentsTestCase):

  def test_names_in_any_case_come_back_as_allowed(self):
    allowed = ('nngp', 'ntk')
    self.assertEqual(arguments.parse_get('NTK', allowed), (('ntk',), True))
    self.assertEqual(arguments.parse_get(('NTK', 'Nngp'), allowed),
                     (('ntk', 'nngp'), False))
    self.assertEqual(arguments.parse_get(['nngp'], allowed),
                     (('nngp',), False))
    self.assertEqual(arguments.parse_get(None, allowed), (None, False))

  def test_unknown_and_repeated_names(self):
    with self.assertRaisesRegex(ValueError, "asks for 'ntkk'.*Pass one of"):
      arguments.parse_get('ntkk', ('nngp', 'ntk'))
    # A close name is suggested, a far one is not.
    with self.assertRaisesRegex(ValueError, r"\(did you mean 'nngp'\?\)"):
      arguments.parse_get('ngp', ('nngp', 'ntk'))
    with self.assertRaisesRegex(ValueError, r"available here\. Pass"):
      arguments.parse_get('cov1', ('nngp', 'ntk'))
    # The same name twice in different cases is still twice.
    with self.assertRaisesRegex(ValueError, 'names a kernel twice'):
      arguments.parse_get(('ntk', 'NTK'), ('nngp', 'ntk'))


class RejectKernelTest(test_utils.NeuralTangentsTestCase):

  def test_kernel_anywhere_in_a_pytree_is_a_type_error(self):
    k = stax.Dense(1)[2](jnp.ones((2, 3)), None)
    arguments.reject_kernel((jnp.ones(2), {'a': jnp.ones(3)}), 'x', 'Fix.')
    for value in (k, (jnp.ones(2), k), {'a': [k]}):
      with self.assertRaisesRegex(TypeError, r'`x` is .*`nt.Kernel`.*Fix\.'):
        arguments.reject_kernel(value, 'x', 'Fix.')



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


class PositiveIntTest(test_utils.NeuralTangentsTestCase):
  """One check family: `TypeError` for non-ints, `ValueError` for values
  out of range, messages naming the argument, the value and the fix."""

  @parameterized.named_parameters(
      ('float', 2.5, TypeError, r'got 2\.5 \(float\)'),
      ('bool', True, TypeError, r'got True \(bool\)'),
      ('string', '3', TypeError, r"got '3' \(str\)"),
      ('zero', 0, ValueError, 'got 0'),
      ('negative', -2, ValueError, 'got -2'))
  def test_bad_int(self, value, error, got):
    with self.assertRaisesRegex(error, r'`num` of `FanOut` must be a positive '
                                f'int; {got}. Pass e.g. num=2.'):
      arguments.positive_int(value, 'num', 'Pass e.g. num=2.',
                             layer_name='FanOut')

  def test_int_accepts_numpy_ints_and_minimum(self):
    self.assertEqual(arguments.positive_int(np.int32(3), 'n', 'Fix.'), 3)
    self.assertEqual(arguments.positive_int(0, 'n', 'Fix.', minimum=0), 0)
    with self.assertRaisesRegex(ValueError, '`n` must be a non-negative int'):
      arguments.positive_int(-1, 'n', 'Fix.', minimum=0)

  @parameterized.named_parameters(
      ('not_a_tuple', 3, TypeError, r'got 3 \(int\)'),
      ('float_entry', (2, 1.5), TypeError, r'entry 1\.5 is a float'),
      ('bool_entry', (True, 2), TypeError, r'entry True is a bool'),
      ('empty', (), ValueError, r'got \(\)'),
      ('zero_entry', [2, 0], ValueError, r'got \[2, 0\]'),
      ('wrong_length', (2, 2, 2), ValueError,
       r'one entry per spatial dimension \(2\); got \(2, 2, 2\) of length 3'
       r'\. Pass 2 values'))
  def test_bad_tuple(self, value, error, got):
    with self.assertRaisesRegex(error, r'`strides` of `Conv` must be .* '
                                f'positive ints.*{got}.*Pass e.g. strides'):
      arguments.positive_int_tuple(value, 'strides', 'Pass e.g. strides=(1, '
                                   '1).', layer_name='Conv', length=2,
                                   length_of='spatial dimension')

  def test_tuple_and_wrappers_agree(self):
    self.assertEqual(arguments.positive_int_tuple([np.int64(2), 3], 's', 'F.'),
                     (2, 3))
    self.assertEqual(arguments.positive_int_tuple([1, 2], 's', 'F.', length=2),
                     (1, 2))
    self.assertEqual(arguments.positive_ints((3, 3), 'filter_shape', 'Conv'),
                     (3, 3))
    for check in (lambda v: arguments.positive_int_tuple(v, 's', 'F.',
                                                         length=2),
                  lambda v: arguments.positive_ints(v, 'strides', 'Conv', 2)):
      with self.assertRaises(TypeError):
        check((1, 1.5))
      with self.assertRaises(ValueError):
        check((1, 0))


if __name__ == '__main__':
  absltest.main()
