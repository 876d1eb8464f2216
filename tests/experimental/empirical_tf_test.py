"""`nt.experimental.empirical_ntk_fn_tf` (the `tf` extra): the NTK of
TensorFlow models against an explicit TensorFlow Jacobian contraction and
against `nt.empirical_ntk_fn` of the same model written in JAX. Skipped
without `pip install "neural-tangents[tf]"`."""
import importlib.util
import inspect
import pydoc
import sys
import subprocess

from absl.testing import absltest
from absl.testing import parameterized
import jax.numpy as jnp
import numpy as np

import neural_tangents as nt
from tests import test_utils

HAVE_TF = all(importlib.util.find_spec(m) is not None
              for m in ('tensorflow', 'tf2jax'))
needs_tf = absltest.skipIf(not HAVE_TF,
                           'needs pip install "neural-tangents[tf]"')

if HAVE_TF:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top


def _tf_ntk(fn, variables, x1, x2):
  """`J(x1) J(x2)^T` traced over the last output axis, by `tf.GradientTape`."""
  def jacobian(x):
    with tf.GradientTape(persistent=True) as tape:
      out = fn(tf.constant(x))
    jac = tape.jacobian(out, variables)
    n, o = out.shape[0], out.shape[-1]
    return np.concatenate([np.reshape(j.numpy(), (n, o, -1)) for j in jac],
                          axis=-1).astype(np.float64)
  j1, j2 = jacobian(x1), jacobian(x2)
  return np.einsum('iop,jop->ij', j1, j2) / j1.shape[1]


def _keras_cnn():
  tf.keras.utils.set_random_seed(0)
  return tf.keras.Sequential([
      tf.keras.Input((5, 5, 2)),
      tf.keras.layers.Conv2D(3, 3, activation='tanh'),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(2)])


def _jax_cnn(params, x):
  """The Keras CNN in JAX (HWIO filters, NHWC inputs)."""
  w1, b1, w2, b2 = params
  y = jax.lax.conv_general_dilated(x, w1, (1, 1), 'VALID',
                                   dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
  y = jnp.tanh(y + b1.reshape(1, 1, 1, -1)).reshape(x.shape[0], -1)
  return y @ w2 + b2[None]


class _Module(tf.Module if HAVE_TF else object):

  def __init__(self):
    super().__init__()
    rng = np.random.RandomState(1)
    self.w = tf.Variable(rng.randn(3, 4).astype(np.float32), name='w')
    # Same name: `tf2jax` calls it `w_1`.
    self.v = tf.Variable(rng.randn(4, 2).astype(np.float32), name='w')
    self.scale = tf.Variable(2., trainable=False)

  @tf.function if HAVE_TF else (lambda f: f)
  def __call__(self, x):
    return self.scale * tf.sin(x @ self.w) @ self.v


import jax  # pylint: disable=g-import-not-at-top,wrong-import-position


@needs_tf
class EmpiricalNtkTfTest(test_utils.NeuralTangentsTestCase):

  @test_utils.sample_product(implementation=[1, 2, 3, 0],
                             vmap_axes=[None, 0])
  def test_keras_cnn(self, implementation, vmap_axes):
    model = _keras_cnn()
    rng = np.random.RandomState(0)
    x1 = rng.randn(3, 5, 5, 2).astype(np.float32)
    x2 = rng.randn(2, 5, 5, 2).astype(np.float32)
    ntk_fn = nt.experimental.empirical_ntk_fn_tf(
        model, vmap_axes=vmap_axes, implementation=implementation)
    k = ntk_fn(x1, x2, model.trainable_variables)
    self.assertIsInstance(k, tf.Tensor)
    expected = _tf_ntk(model, model.trainable_variables, x1, x2)
    self.assertAllClose(np.asarray(k, np.float64), expected, rtol=1e-4,
                        atol=1e-4)
    params = [v.numpy() for v in model.trainable_variables]
    in_jax = nt.empirical_ntk_fn(_jax_cnn, vmap_axes=vmap_axes,
                                 implementation=implementation)(x1, x2, params)
    self.assertAllClose(np.asarray(k, np.float64),
                        np.asarray(in_jax, np.float64), rtol=1e-4, atol=1e-4)
    # x2=None is x1.
    k11 = ntk_fn(x1, None, model.trainable_variables)
    self.assertAllClose(np.asarray(k11, np.float64),
                        _tf_ntk(model, model.trainable_variables, x1, x1),
                        rtol=1e-4, atol=1e-4)

  def test_module_and_function(self):
    module = _Module()
    rng = np.random.RandomState(2)
    x1 = rng.randn(4, 3).astype(np.float32)
    x2 = rng.randn(3, 3).astype(np.float32)
    k = nt.experimental.empirical_ntk_fn_tf(module, vmap_axes=0)(
        x1, x2, module.trainable_variables)
    expected = _tf_ntk(module, module.trainable_variables, x1, x2)
    self.assertAllClose(np.asarray(k, np.float64), expected, rtol=1e-4,
                        atol=1e-4)

    @tf.function
    def f(params, x):
      return 2. * tf.sin(x @ params['w']) @ params['v']
    params = {'w': module.w.numpy(), 'v': module.v.numpy()}
    k_fn = nt.experimental.empirical_ntk_fn_tf(f, implementation=2)(
        x1, x2, params)
    self.assertAllClose(np.asarray(k_fn, np.float64), expected, rtol=1e-4,
                        atol=1e-4)
    apply_fn, none = nt.experimental.get_apply_fn_and_params(f)
    self.assertIsNone(none)
    self.assertAllClose(np.asarray(apply_fn(params, x1)),
                        f(params, x1).numpy(), rtol=1e-5, atol=1e-6)

  def test_module_wrapping_a_keras_3_model(self):
    # Issue 51, item 4: Keras 3 variables are not `tf.Variable`s, so the
    # module's `trainable_variables` misses them; its parameters are found
    # in the Keras models it holds (after its own variables).
    model = _keras_cnn()

    class Wrapper(tf.Module):

      def __init__(self, scale):
        super().__init__()
        self.layers = {'model': model}
        self.scale = scale

      def __call__(self, x):
        return self.scale * self.layers['model'](x)

    rng = np.random.RandomState(5)
    x1 = rng.randn(3, 5, 5, 2).astype(np.float32)
    x2 = rng.randn(2, 5, 5, 2).astype(np.float32)
    keras_variables = [v.value for v in model.trainable_variables]
    wrapper = Wrapper(2.)
    self.assertEmpty(wrapper.trainable_variables)
    _, params = nt.experimental.get_apply_fn_and_params(wrapper)
    self.assertLen(params, len(keras_variables))
    expected = _tf_ntk(wrapper, keras_variables, x1, x2)
    ntk_fn = nt.experimental.empirical_ntk_fn_tf(wrapper)
    for passed in (wrapper.trainable_variables, params):
      self.assertAllClose(np.asarray(ntk_fn(x1, x2, passed), np.float64),
                          expected, rtol=1e-4, atol=1e-4)
    # With a variable of its own too: it comes first.
    mixed = Wrapper(tf.Variable(2.))
    _, params = nt.experimental.get_apply_fn_and_params(mixed)
    self.assertLen(params, len(keras_variables) + 1)
    k = nt.experimental.empirical_ntk_fn_tf(mixed)(x1, x2, params)
    self.assertAllClose(
        np.asarray(k, np.float64),
        _tf_ntk(mixed, [mixed.scale] + keras_variables, x1, x2), rtol=1e-4,
        atol=1e-4)
    with self.assertRaisesRegex(ValueError, r'get_apply_fn_and_params\(f\)'):
      nt.experimental.empirical_ntk_fn_tf(mixed)(
          x1, x2, mixed.trainable_variables)

  def test_input_signature_fixing_the_batch_size(self):
    # Issue 51, item 5: the published release returns the (3, 3) kernel.
    f = tf.function(lambda p, x: tf.matmul(x, p), input_signature=[
        tf.TensorSpec((5, 2)), tf.TensorSpec((3, 5))])
    rng = np.random.RandomState(6)
    x = rng.randn(3, 5).astype(np.float32)
    k = nt.experimental.empirical_ntk_fn_tf(f)(x, None, np.ones((5, 2), 'f'))
    # d (x p)_j / d p = x in channel j: the NTK (mean over channels) is x x^T.
    self.assertAllClose(np.asarray(k, np.float64),
                        x.astype(np.float64) @ x.T.astype(np.float64),
                        rtol=1e-5, atol=1e-5)
    with self.assertRaisesRegex(ValueError, 'input_signature'):
      nt.experimental.empirical_ntk_fn_tf(f)(np.ones((4, 5), 'f'), None,
                                             np.ones((5, 2), 'f'))

  def test_function_closing_over_variables_needs_params_and_x(self):
    model = _keras_cnn()
    for f in (tf.function(lambda x: model(x)), lambda x: model(x)):
      with self.assertRaisesRegex(TypeError, r'`f\(params, x\)`'):
        nt.experimental.empirical_ntk_fn_tf(f)
      with self.assertRaisesRegex(TypeError, r'takes 1 positional'):
        nt.experimental.get_apply_fn_and_params(f)

  def test_feature_detection_with_the_extra(self):
    self.assertTrue(hasattr(nt.experimental, 'empirical_ntk_fn_tf'))
    self.assertIn('get_apply_fn_and_params', dir(nt.experimental))

  def test_wrong_params(self):
    module = _Module()
    ntk_fn = nt.experimental.empirical_ntk_fn_tf(module)
    with self.assertRaisesRegex(ValueError, 'trainable variables'):
      ntk_fn(np.ones((2, 3), np.float32), None,
             module.trainable_variables[:1])
    with self.assertRaisesRegex(TypeError, '`f` must be'):
      nt.experimental.get_apply_fn_and_params(3)


class WithoutExtraTest(test_utils.NeuralTangentsTestCase):

  def test_import_does_not_import_tensorflow(self):
    # `dir()` lists the TensorFlow names iff they are available, as
    # `hasattr` says.
    code = ('import sys, neural_tangents as nt; '
            'listed = "empirical_ntk_fn_tf" in dir(nt.experimental); '
            'assert "tensorflow" not in sys.modules; '
            f'assert listed == {HAVE_TF}, listed')
    subprocess.run([sys.executable, '-c', code], check=True, timeout=120,
                   env={'PYTHONPATH': test_utils.REPO_ROOT,
                        'JAX_PLATFORMS': 'cpu'})

  @absltest.skipIf(HAVE_TF, 'the tf extra is installed')
  def test_missing_extra_names_it(self):
    extra = r'neural-tangents\[tf\]'
    with self.assertRaisesRegex(ImportError, extra):
      nt.experimental.empirical_ntk_fn_tf  # pylint: disable=pointless-statement
    with self.assertRaisesRegex(ImportError, extra):
      nt.experimental.get_apply_fn_and_params(lambda params, x: x)
    with self.assertRaisesRegex(ImportError, extra):
      from neural_tangents.experimental import empirical_ntk_fn_tf  # pylint: disable=g-import-not-at-top,unused-import

  @absltest.skipIf(HAVE_TF, 'the tf extra is installed')
  def test_missing_extra_is_absent_to_feature_detection(self):
    # Issue 51, item 3: feature detection sees no attribute, and no error.
    for name in ('empirical_ntk_fn_tf', 'get_apply_fn_and_params'):
      self.assertFalse(hasattr(nt.experimental, name))
      self.assertIsNone(getattr(nt.experimental, name, None))
      self.assertNotIn(name, dir(nt.experimental))
      with self.assertRaisesRegex(AttributeError, r'neural-tangents\[tf\]'):
        getattr(nt.experimental, name)
    members = dict(inspect.getmembers(nt.experimental))
    self.assertNotIn('empirical_ntk_fn_tf', members)
    self.assertIn('features', members)
    self.assertIn('features', pydoc.render_doc(nt.experimental))


if __name__ == '__main__':
  absltest.main()
