"""float32 answers at default settings against a float64 CPU reference.

On TPUs (bfloat16 passes) and recent GPUs (TF32) JAX's default float32 matrix
products carry 3-4 significant digits; the library runs its own contractions
at 'highest' unless the user chose a precision (`utils/precision.py`). These
tests compute empirical NTKs (implementations 1-3) and ensemble predictions
(finite and infinite time) of small FCN and CNN workloads in float32 on the
default backend, at default settings, and compare them with the same
computation in float64 on the CPU: within 1e-4 relative on every backend.
They also check that a user's own precision still wins.
"""
from unittest import mock

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

import neural_tangents as nt
from neural_tangents import stax
from neural_tangents._src.utils import backends
from neural_tangents._src.utils import precision
from tests import test_utils

# Relative error of the float32 answers against the float64 reference.
FLOAT32_ACCURATE = 1e-4
_CPU = jax.devices('cpu')[0]


def _fcn():
  return stax.serial(stax.Dense(256, W_std=1.5, b_std=0.05), stax.Relu(),
                     stax.Dense(256, W_std=1.5, b_std=0.05), stax.Erf(),
                     stax.Dense(3, W_std=1.5, b_std=0.05))


def _cnn():
  return stax.serial(stax.Conv(32, (3, 3), padding='SAME'), stax.Relu(),
                     stax.Conv(32, (3, 3), padding='SAME'), stax.Relu(),
                     stax.GlobalAvgPool(), stax.Dense(3))


_NETS = {'fcn': (_fcn, (8, 64), (6, 64)), 'cnn': (_cnn, (4, 8, 8, 3),
                                                  (3, 8, 8, 3))}


def _relative(actual, reference) -> float:
  actual = np.asarray(actual, np.float64)
  reference = np.asarray(reference, np.float64)
  return float(np.max(np.abs(actual - reference)) /
               np.max(np.abs(reference)))


def _on_cpu_float64(tree):
  return jax.device_put(
      jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), tree), _CPU)


def _inputs(shape, seed):
  return np.random.RandomState(seed).randn(*shape).astype(np.float32)


class DefaultPrecisionTest(test_utils.NeuralTangentsTestCase):

  @test_utils.sample_product(net=tuple(_NETS), implementation=(1, 2, 3))
  def test_empirical_ntk_matches_float64_cpu(self, net, implementation):
    make, shape1, shape2 = _NETS[net]
    init_fn, apply_fn, _ = make()
    x1, x2 = _inputs(shape1, 1), _inputs(shape2, 2)
    _, params = init_fn(jax.random.PRNGKey(0), shape1)
    params = jax.tree_util.tree_map(lambda p: p.astype(jnp.float32), params)
    ntk_fn = nt.empirical_ntk_fn(apply_fn, implementation=implementation)
    ntk = ntk_fn(x1, x2, params)
    self.assertEqual(ntk.dtype, jnp.float32)
    with jax.default_device(_CPU):
      reference = ntk_fn(*_on_cpu_float64((x1, x2, params)))
    self.assertLess(_relative(ntk, reference), FLOAT32_ACCURATE)

  @test_utils.sample_product(net=tuple(_NETS), t=(10., None))
  def test_ensemble_matches_float64_cpu(self, net, t):
    make, shape1, shape2 = _NETS[net]
    _, _, kernel_fn = make()
    n_train = 16
    x_train = _inputs((n_train,) + shape1[1:], 3)
    x_test = _inputs(shape2, 4)
    y_train = _inputs((n_train, 3), 5)

    def predict(x_train, x_test, y_train):
      predict_fn = nt.predict.gradient_descent_mse_ensemble(
          kernel_fn, x_train, y_train, diag_reg=1e-3)
      return predict_fn(t=t, x_test=x_test, get='ntk', compute_cov=True)

    out = predict(x_train, x_test, y_train)
    self.assertEqual(out.mean.dtype, jnp.float32)
    with jax.default_device(_CPU):
      reference = predict(*_on_cpu_float64((x_train, x_test, y_train)))
    self.assertLess(_relative(out.mean, reference.mean), FLOAT32_ACCURATE)
    self.assertLess(_relative(out.covariance, reference.covariance),
                    FLOAT32_ACCURATE)


def _on_an_accelerator():
  """A context in which computations run on a TPU as far as the library can
  tell (the jaxprs it traces are the same as on one)."""
  return mock.patch.object(backends, 'compute_platform', lambda: 'tpu')


class UserPrecisionTest(test_utils.NeuralTangentsTestCase):

  def _traced_precisions(self, fn, *args):
    """The `precision` of every `dot_general` in the jaxpr of `fn(*args)`."""
    jaxpr = jax.make_jaxpr(fn)(*args)
    found = []

    def visit(jaxpr):
      for eqn in jaxpr.eqns:
        if eqn.primitive.name == 'dot_general':
          found.append(eqn.params['precision'])
        for value in eqn.params.values():
          for sub in value if isinstance(value, (list, tuple)) else [value]:
            sub = getattr(sub, 'jaxpr', sub)  # A ClosedJaxpr's jaxpr.
            if hasattr(sub, 'eqns'):
              visit(sub)

    visit(jaxpr.jaxpr)
    return found

  def test_library_runs_highest_and_user_choice_wins(self):
    apply_fn = lambda p, x: jnp.tanh(x @ p['w']) @ p['v']
    params = {'w': jnp.ones((4, 8), jnp.float32),
              'v': jnp.ones((8, 2), jnp.float32)}
    x = jnp.ones((3, 4), jnp.float32)
    ntk_fn = nt.empirical_ntk_fn(apply_fn, implementation=1)
    highest = (jax.lax.Precision.HIGHEST,) * 2
    with _on_an_accelerator():
      found = self._traced_precisions(lambda x: ntk_fn(x, None, params), x)
      self.assertNotEmpty(found)
      self.assertTrue(all(p == highest for p in found), found)
      with jax.default_matmul_precision('bfloat16'):
        self.assertEqual(precision.user_precision(), 'bfloat16')
        found = self._traced_precisions(lambda x: ntk_fn(x, None, params), x)
      self.assertNotEmpty(found)
      self.assertFalse(any(p == highest for p in found), found)

  def test_cpu_programs_are_left_alone(self):
    # XLA:CPU's default float32 products are exact: nothing is changed.
    apply_fn = lambda p, x: x @ p
    ntk_fn = nt.empirical_ntk_fn(apply_fn, implementation=1)
    with mock.patch.object(backends, 'compute_platform', lambda: 'cpu'):
      found = self._traced_precisions(
          lambda x: ntk_fn(x, None, jnp.ones((4, 2), jnp.float32)),
          jnp.ones((3, 4), jnp.float32))
    self.assertNotEmpty(found)
    self.assertTrue(all(p is None for p in found), found)

  def test_feature_maps_run_highest(self):
    from neural_tangents.experimental import features  # pylint: disable=g-import-not-at-top
    init_fn, feature_fn = features.serial(features.DenseFeatures(8),
                                          features.ReluFeatures(),
                                          features.DenseFeatures(1))
    x = jnp.ones((3, 4), jnp.float32)
    _, params = init_fn(jax.random.PRNGKey(0), x.shape)
    with _on_an_accelerator():
      found = self._traced_precisions(
          lambda x: feature_fn(x, params).nngp_feat, x)
    self.assertNotEmpty(found)
    highest = (jax.lax.Precision.HIGHEST,) * 2
    self.assertTrue(all(p == highest for p in found), found)

  def test_explicit_precision_of_f_is_kept(self):
    apply_fn = lambda p, x: jnp.dot(x, p, precision=jax.lax.Precision.DEFAULT)
    ntk_fn = nt.empirical_ntk_fn(apply_fn, implementation=1)
    found = self._traced_precisions(
        lambda x: ntk_fn(x, None, jnp.ones((4, 2), jnp.float32)),
        jnp.ones((3, 4), jnp.float32))
    default = (jax.lax.Precision.DEFAULT,) * 2
    self.assertIn(default, found)


if __name__ == '__main__':
  absltest.main()
