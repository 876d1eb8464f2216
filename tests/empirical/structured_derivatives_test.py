"""Tests of `empirical.structured_derivatives`: the fallback to Jacobian
contraction warns once when STRUCTURED_DERIVATIVES was asked for, and never
when AUTO merely considered it.
"""
from unittest import mock
import warnings

from absl.testing import absltest
import jax.numpy as jnp

import neural_tangents as nt
from neural_tangents._src.empirical import structured_derivatives
from tests import test_utils
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


if __name__ == '__main__':
  absltest.main()
