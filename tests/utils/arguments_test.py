"""Tests of `utils.arguments`: canonical values and messages of argument
checks."""
from absl.testing import absltest
import jax.numpy as jnp

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


if __name__ == '__main__':
  absltest.main()
