"""Tests of `empirical.structured_derivatives`: the fallback to Jacobian
contraction warns once when STRUCTURED_DERIVATIVES was asked for, and never
when AUTO merely considered it.
"""
from unittest import mock
import warnings

from absl.testing import absltest
from absl.testing import parameterized
import jax.numpy as jnp

import neural_tangents as nt
from neural_tangents._src.empirical import structured_derivatives
from tests import test_utils
from tests.empirical.reference import cnn
from tests.empirical.reference import cnn_params
from tests.empirical.reference import explicit_ntk
from tests.empirical.reference import mlp
from tests.empirical.reference import mlp_params
from tests.empirical.reference import normal
from tests.empirical.reference import TOL


def _batch_size_branch(params, x):
  # A different program on 4 and on 3 examples: the engine cannot pair them.
  y = mlp(params, x)
  return y if x.shape[0] > 3 else jnp.tanh(y)


class FallbackWarningTest(test_utils.NeuralTangentsTestCase):

  def _kernels(self, implementation):
    params = mlp_params()
    x1, x2 = normal(1, (4, 3)), normal(2, (3, 3))
    ntk_fn = nt.empirical_ntk_fn(_batch_size_branch,
                                 implementation=implementation)
    with mock.patch.object(structured_derivatives, '_WARNED_REASONS', set()):
      with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        kernels = [ntk_fn(x1, x2, params) for _ in range(2)]
    for kernel in kernels:
      self.assertAllClose(kernel, explicit_ntk(_batch_size_branch, params,
                                               x1, x2), rtol=TOL, atol=TOL)
    return [w for w in caught
            if issubclass(w.category,
                          structured_derivatives.StructuredFallbackWarning)]

  def test_explicit_structured_derivatives_warns_once_saying_why(self):
    fallbacks = self._kernels(nt.NtkImplementation.STRUCTURED_DERIVATIVES)
    self.assertLen(fallbacks, 1)
    message = str(fallbacks[0].message)
    self.assertIn('different programs on x1 and x2', message)
    self.assertIn('JACOBIAN_CONTRACTION', message)

  def test_auto_does_not_warn(self):
    self.assertEmpty(self._kernels(nt.NtkImplementation.AUTO))

  def test_supported_function_does_not_warn(self):
    params, x1 = mlp_params(), normal(1, (4, 3))
    ntk_fn = nt.empirical_ntk_fn(
        mlp, implementation=nt.NtkImplementation.STRUCTURED_DERIVATIVES)
    with mock.patch.object(structured_derivatives, '_WARNED_REASONS', set()):
      with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        ntk_fn(x1, None, params)
    self.assertEmpty([w for w in caught if issubclass(
        w.category, structured_derivatives.StructuredFallbackWarning)])


class ScaledParametersTest(test_utils.NeuralTangentsTestCase):
  """Parameters scaled by constants before use (`w / c`, `c * w`, `w - c`):
  the structured rules' leaf scalings, against an explicit contraction."""

  def test_matches_explicit_jacobian_contraction(self):
    def f(params, x):
      w = params['w'] / 4.
      v = 3. * params['v'] - 0.5
      return jnp.tanh(x @ w) @ v / 2.

    params = {'w': normal(3, (3, 5)), 'v': normal(4, (5, 2))}
    x1, x2 = normal(1, (4, 3)), normal(2, (3, 3))
    expected = explicit_ntk(f, params, x1, x2)
    for vmap_axes in (None, 0):
      ntk_fn = nt.empirical_ntk_fn(
          f, vmap_axes=vmap_axes,
          implementation=nt.NtkImplementation.STRUCTURED_DERIVATIVES)
      with warnings.catch_warnings():
        warnings.simplefilter('error')  # No fallback: the rules ran.
        kernel = ntk_fn(x1, x2, params)
      self.assertAllClose(kernel, expected, rtol=TOL, atol=TOL)


class OneProgramTest(test_utils.NeuralTangentsTestCase):
  """x1 and x2 of one per-example program: both sides' values are traced
  once, and a side with a multiple of the other's examples is computed in
  blocks of the other's size; the kernel is the same as without blocks and
  as an explicit contraction, in every output axis layout."""

  @parameterized.parameters(
      # (x1 examples, x2 examples, blocks of x1 or x2, trace axes, diagonal,
      # examples per block at most)
      (6, 3, True, (-1,), (), 128), (3, 6, True, (), (), 128),
      (4, 2, True, (), (-1,), 128), (6, 4, False, (-1,), (), 128),
      (9, 3, False, (-1,), (), 128), (6, 3, False, (-1,), (), 2))
  def test_blocks_equal_one_pass_and_explicit(self, n1, n2, blocked,
                                              trace_axes, diagonal_axes,
                                              max_examples):
    # 6 and 4: not a multiple; 9 = 3 x 3: more blocks than EQUAL_BLOCKS_MAX;
    # blocks of 3 examples above EQUAL_BLOCKS_MAX_EXAMPLES = 2.
    self.enter_context(mock.patch.object(
        structured_derivatives, 'EQUAL_BLOCKS_MAX_EXAMPLES', max_examples))
    params = cnn_params()
    x1, x2 = normal(4, (n1, 4, 5, 2)), normal(5, (n2, 4, 5, 2))
    calls = {'blocks': [], 'traces': 0}
    equal_blocks = structured_derivatives._equal_blocks
    side_values = structured_derivatives._side_values

    def recording_blocks(*args):
      calls['blocks'].append(equal_blocks(*args))
      return calls['blocks'][-1]

    def counting_values(*args):
      calls['traces'] += 1
      return side_values(*args)

    ntk_fn = nt.empirical_ntk_fn(
        cnn, trace_axes, diagonal_axes, vmap_axes=0,
        implementation=nt.NtkImplementation.STRUCTURED_DERIVATIVES)
    with mock.patch.object(structured_derivatives, '_equal_blocks',
                           recording_blocks), mock.patch.object(
                               structured_derivatives, '_side_values',
                               counting_values):
      kernel = ntk_fn(x1, x2, params)
    self.assertEqual(calls['blocks'], [blocked])
    self.assertEqual(calls['traces'], 1)  # Both sides, every block.
    with mock.patch.object(structured_derivatives, 'EQUAL_BLOCKS_MAX', 1):
      one_pass = nt.empirical_ntk_fn(
          cnn, trace_axes, diagonal_axes, vmap_axes=0,
          implementation=nt.NtkImplementation.STRUCTURED_DERIVATIVES)(
              x1, x2, params)
    self.assertAllClose(kernel, one_pass, rtol=1e-12, atol=1e-12)
    self.assertAllClose(kernel, explicit_ntk(cnn, params, x1, x2, trace_axes,
                                             diagonal_axes),
                        rtol=TOL, atol=TOL)


if __name__ == '__main__':
  absltest.main()
