"""Tests of `empirical.batch_size_independence`: the structural comparison
of jaxprs traced at different batch sizes.
"""
import functools

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp

from neural_tangents import stax
from neural_tangents._src.empirical import batch_size_independence
from neural_tangents._src.empirical import problem as problem_lib
from tests import test_utils
from tests.empirical.reference import batch_position_scaled
from tests.empirical.reference import batch_size_scaled
from tests.empirical.reference import mlp
from tests.empirical.reference import mlp_params
from tests.empirical.reference import normal


def _stax_mlp():
  init_fn, apply_fn, _ = stax.serial(stax.Dense(5), stax.Relu(),
                                     stax.Dense(2))
  _, params = init_fn(jax.random.PRNGKey(0), (-1, 3))
  return apply_fn, params


def _batch_size_branch(params, x):
  y = mlp(params, x)
  return y if x.shape[0] > 4 else jnp.tanh(y)


def _reshape_by_min_batch(params, x):
  # The batch size enters a param, but not as the batch size.
  y = mlp(params, x)
  return jnp.pad(y, ((0, 0), (0, min(x.shape[0], 3))))[:, :2]


class BatchOfOneAgreesTest(test_utils.NeuralTangentsTestCase):

  def _agrees(self, f, params, batch=4):
    x = normal(1, (batch, 3))
    problem, param_leaves, data, _ = problem_lib.setup(
        f, x, None, params, {}, (-1,), (), 0)
    return batch_size_independence.batch_of_one_agrees(
        problem.sides[0], param_leaves, data)

  def test_accepts_mlp(self):
    self.assertTrue(self._agrees(mlp, mlp_params()))

  def test_accepts_stax_mlp_with_custom_derivatives(self):
    apply_fn, params = _stax_mlp()  # Relu is a custom_jvp.
    self.assertTrue(self._agrees(apply_fn, params))

  def test_accepts_jitted_and_scanned_functions(self):
    def f(params, x):
      step = lambda carry, _: (jnp.tanh(carry), None)
      return jax.lax.scan(step, jax.jit(mlp)(params, x), None, length=2)[0]
    self.assertTrue(self._agrees(f, mlp_params()))

  @parameterized.named_parameters(
      ('batch_size_literal', batch_size_scaled),
      ('batch_position_constant', batch_position_scaled),
      ('batch_size_branch', _batch_size_branch),
      ('batch_size_in_a_shape', _reshape_by_min_batch))
  def test_rejects_batch_size_dependent_structure(self, f):
    self.assertFalse(self._agrees(f, mlp_params()))

  def test_rejects_a_batch_of_one(self):
    self.assertFalse(self._agrees(mlp, mlp_params(), batch=1))


class SameProgramTest(test_utils.NeuralTangentsTestCase):

  def _jaxprs(self, f, sizes=(4, 7, 1)):
    return [jax.make_jaxpr(f)(jnp.ones((n, 3))) for n in sizes]

  def test_same_structure_up_to_batch_size(self):
    f = lambda x: jnp.tanh(x @ jnp.ones((3, 2))).sum(-1)
    self.assertTrue(batch_size_independence.same_program(
        self._jaxprs(f), (4, 7, 1)))

  def test_different_literal(self):
    f = lambda x: x / x.shape[0]
    self.assertFalse(batch_size_independence.same_program(
        self._jaxprs(f), (4, 7, 1)))

  def test_different_data_flow(self):
    jaxprs = [jax.make_jaxpr(lambda x: x * 2. + x)(jnp.ones((n, 3)))
              for n in (4, 7)]
    jaxprs.append(jax.make_jaxpr(lambda x: x * 2. + x * 2.)(jnp.ones((1, 3))))
    self.assertFalse(batch_size_independence.same_program(jaxprs, (4, 7, 1)))

  def test_non_batch_dimension_must_be_equal(self):
    jaxprs = [jax.make_jaxpr(functools.partial(jnp.sum, axis=0))(
        jnp.ones((n, m))) for n, m in ((4, 3), (7, 3), (1, 2))]
    self.assertFalse(batch_size_independence.same_program(jaxprs, (4, 7, 1)))


if __name__ == '__main__':
  absltest.main()
