"""Reliability tests of layer and kernel arguments (issue 29): inputs the
published release accepted are accepted, and wrong ones get a message that
names the argument, the value and the fix."""
from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

import neural_tangents as nt
from neural_tangents import stax
from neural_tangents._src.stax.masking import MaskedArray
from tests import test_utils


def _network():
  return stax.serial(stax.Dense(8, 1.5, 0.1), stax.Relu(),
                     stax.Dense(1, 1.5, 0.1))


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
                                  r"nothing\. Pass one of \('nngp', 'ntk', "):
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


class ArgumentMessagesTest(test_utils.NeuralTangentsTestCase):
  """Wrong arguments get a message naming them (issue 29 item 11)."""

  def test_string_mask_constant(self):
    init_fn, apply_fn, kernel_fn = _network()
    x = np.ones((3, 4), np.float32)
    _, params = init_fn(jax.random.PRNGKey(0), x.shape)
    with self.assertRaisesRegex(TypeError, r"`mask_constant` must be a "
                                r"number \(or None\); got 'x'.*mask_constant=0"):
      apply_fn(params, x, mask_constant='x')
    with self.assertRaisesRegex(TypeError, "`mask_constant` .*got 'x'"):
      kernel_fn(x, None, 'nngp', mask_constant='x')

  def test_array_hyperparameter(self):
    with self.assertRaisesRegex(TypeError, r'`W_std` of `Dense` must be a '
                                r'scalar; got an array of shape \(2,\)'):
      stax.Dense(8, W_std=np.array([1., 2.]))
    with self.assertRaisesRegex(TypeError, '`b_std` of `Conv` must be a '
                                'scalar'):
      stax.Conv(3, (2,), b_std=[0.1, 0.2])

  def test_diagonal_shift_by_a_non_diagonal(self):
    with self.assertRaisesRegex(TypeError, r'`other` is 1 \(int\)\. Pass a '
                                '`Diagonal`'):
      stax.Diagonal() >> 1  # pylint: disable=expression-not-assigned
    with self.assertRaisesRegex(TypeError, '`other` is 1'):
      stax.Diagonal() << 1  # pylint: disable=expression-not-assigned

  def test_negative_input_size(self):
    init_fn, _, _ = _network()
    with self.assertRaisesRegex(ValueError, r'`input_shape` must be a tuple of '
                                r'sizes >= 0.*got \(5, -4\), with the entry -4'):
      init_fn(jax.random.PRNGKey(0), (5, -4))
    init_fn(jax.random.PRNGKey(0), (-1, 4))  # -1: an unknown batch size.

  def test_monte_carlo_batch_of_keys_and_missing_apply_fn(self):
    init_fn, apply_fn, _ = _network()
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    with self.assertRaisesRegex(ValueError, r'`key` must be one PRNG key; got '
                                '3 keys'):
      nt.monte_carlo_kernel_fn(init_fn, apply_fn, keys, 2)
    with self.assertRaisesRegex(TypeError, '`apply_fn` must be callable; got '
                                'None'):
      nt.monte_carlo_kernel_fn(init_fn, None, jax.random.PRNGKey(0), 2)
    with self.assertRaisesRegex(TypeError, '`init_fn` must be callable'):
      nt.monte_carlo_kernel_fn(None, apply_fn, jax.random.PRNGKey(0), 2)


class NumericScalarTest(test_utils.NeuralTangentsTestCase):
  """NumPy and JAX scalars are numbers wherever a float is (issue 52 item
  11): `LayerNorm(eps=np.float32(1e-6))`, `Dropout(jnp.array(0.5))` were
  refused with messages contradicting the input, `Rbf(gamma=np.float32(-1))`
  accepted."""

  _LAYERS = (('LayerNorm', 'eps', 1e-6, -1.), ('Dropout', 'rate', 0.5, 1.5),
             ('Rbf', 'gamma', 0.5, -1.), ('ExpNormalized', 'gamma', 0.5, -1.))
  _SCALARS = (np.float32, np.float64, jnp.float32, jnp.array,
              lambda v: np.array(v, np.float32))

  def test_numpy_and_jax_scalars_are_numbers(self):
    x = np.random.RandomState(0).randn(3, 4)
    for name, arg, good, bad in self._LAYERS:
      network = lambda value: stax.serial(  # pylint: disable=cell-var-from-loop
          stax.Dense(4), getattr(stax, name)(**{arg: value}), stax.Dense(1))
      want = network(good)[2](x, None, 'nngp')
      for scalar in self._SCALARS:
        self.assertAllClose(network(scalar(good))[2](x, None, 'nngp'), want,
                            rtol=1e-6, atol=0)
        with self.assertRaisesRegex(ValueError, f'`{arg}`.*got .*' +
                                    f'{bad:g}'.replace('.', r'\.')):
          getattr(stax, name)(**{arg: scalar(bad)})
    with self.assertRaisesRegex(ValueError, r'`eps` must be a non-negative '
                                r"number .*got 'small'"):
      stax.LayerNorm(eps='small')


class NumpyMaskedArrayTest(test_utils.NeuralTangentsTestCase):
  """A `numpy.ma.MaskedArray` input is the documented masked input."""

  def test_kernel_and_apply_match_the_package_masked_array(self):
    x = np.random.RandomState(0).randn(5, 3, 4).astype(np.float32)
    mask = np.zeros_like(x, bool)
    mask[1, 2] = True
    mask[3, 0] = True
    init_fn, apply_fn, kernel_fn = stax.serial(
        stax.Dense(8), stax.Relu(), stax.GlobalAvgPool(), stax.Dense(1))
    _, params = init_fn(jax.random.PRNGKey(0), x.shape)
    numpy_masked = np.ma.masked_array(x, mask=mask)
    ours = MaskedArray(x, mask)
    self.assertAllClose(kernel_fn(numpy_masked, None, 'nngp'),
                        kernel_fn(ours, None, 'nngp'))
    self.assertAllClose(apply_fn(params, numpy_masked),
                        apply_fn(params, ours))
    # The mask matters: the plain data give another kernel.
    self.assertGreater(float(np.max(np.abs(
        kernel_fn(numpy_masked, None, 'nngp') - kernel_fn(x, None, 'nngp')))),
                       1e-3)


class StructureChecksTest(test_utils.NeuralTangentsTestCase):
  """Structure that used to be accepted silently (issue 29 item 8)."""

  def test_parallel_kernel_fn_refuses_extra_inputs(self):
    x = np.ones((3, 4), np.float32)
    _, _, kernel_fn = stax.parallel(stax.Dense(2), stax.Dense(3))
    with self.assertRaisesRegex(ValueError, r'takes 2 inputs .*`x1` is a list '
                                'of 3 arrays'):
      kernel_fn([x, x, x], None, 'ntk')
    self.assertLen(kernel_fn([x, x], None, 'ntk'), 2)

  def test_params_of_another_network_are_refused(self):
    x = np.ones((6, 4), np.float32)
    _, apply_fn, _ = stax.serial(stax.Dense(8), stax.Relu(), stax.Dense(1))
    init3, _, _ = stax.serial(stax.Dense(3), stax.Relu(), stax.Dense(2))
    _, params3 = init3(jax.random.PRNGKey(0), x.shape)
    with self.assertRaisesRegex(ValueError, r'params of `Dense\(8\)` must be '
                                r'.*got `W` of shape \(4, 3\)'):
      apply_fn(params3, x)

  def test_sparse_aggregate_edges_beyond_the_nodes(self):
    x = np.ones((3, 2, 4), np.float32)
    _, _, kernel_fn = stax.Aggregate(implementation='SPARSE')
    edges = np.full((3, 2, 2), 9, np.int32)
    with self.assertRaisesRegex(ValueError, r'`pattern\[0\]` has an edge '
                                r'\[9, 9\] .*beyond the \(2,\) nodes'):
      kernel_fn(x, None, 'nngp', pattern=(edges, None))
    padded = np.array([[[0, 1], [-1, -1]]] * 3, np.int32)
    kernel_fn(x, None, 'nngp', pattern=(padded, None))  # -1 pads.

  def test_repeat_params_to_serial_negative_depth(self):
    with self.assertRaisesRegex(ValueError, r'`n` must be an int >= 0 .*got '
                                '-1'):
      stax.repeat_params_to_serial([], -1)


if __name__ == '__main__':
  absltest.main()
