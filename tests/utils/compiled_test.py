"""Tests of `compile_per_signature` and of the compiled public `kernel_fn`."""
from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents import stax
from neural_tangents._src.utils import compiled
from tests import test_utils


def _counting(fn):
  """`fn` and a list that grows by one each time `fn` runs (is traced)."""
  calls = []

  def counted(*args, **kwargs):
    calls.append(1)
    return fn(*args, **kwargs)
  return counted, calls


class CompilePerSignatureTest(test_utils.NeuralTangentsTestCase):

  def test_traced_once_per_signature(self):
    f, calls = _counting(lambda x, y=None, scale=1.: jnp.sin(x) * scale)
    g = compiled.compile_per_signature(f)
    x = jnp.ones((3, 2))
    for _ in range(3):
      np.testing.assert_array_equal(g(x), jnp.sin(x))
    self.assertLen(calls, 1)
    g(jnp.zeros((3, 2)))  # Same signature, other values.
    self.assertLen(calls, 1)
    g(jnp.ones((4, 2)))  # New shape.
    g(x, scale=2.)  # New static value.
    g(x, scale=2)  # Another type of static value.
    self.assertLen(calls, 4)

  def test_nan_static_values_share_a_signature(self):
    f, calls = _counting(lambda x, c=None: jnp.where(jnp.isnan(c), x, -x))
    g = compiled.compile_per_signature(f)
    x = jnp.ones(2)
    for c in (float('nan'), float('nan'), np.float32('nan')):
      np.testing.assert_array_equal(g(x, c=c), x)
    self.assertLen(calls, 2)  # One per type.

  def test_large_programs_run_eagerly(self):
    f, calls = _counting(lambda x: jnp.cos(jnp.sin(x)))
    g = compiled.compile_per_signature(f)
    maximum, compiled.MAX_EQUATIONS = compiled.MAX_EQUATIONS, 1
    try:
      x = jnp.ones(2)
      for _ in range(3):
        np.testing.assert_allclose(g(x), jnp.cos(jnp.sin(x)), rtol=1e-6)
    finally:
      compiled.MAX_EQUATIONS = maximum
    self.assertLen(calls, 4)  # One trace, then eager calls.

  def test_identity_of_arguments_kept(self):
    seen = []

    def f(x1, x2=None):
      seen.append((x2 is None, x2 is x1))
      return x1 if x2 is None else x1 + x2
    g = compiled.compile_per_signature(f)
    x, y = jnp.ones(2), jnp.ones(2)
    g(x), g(x, x), g(x, y)
    self.assertEqual(seen, [(True, False), (False, True), (False, False)])

  def test_tracers_call_through(self):
    f, calls = _counting(lambda x: jnp.sum(jnp.sin(x)))
    g = compiled.compile_per_signature(f)
    x = jnp.arange(3.)
    np.testing.assert_allclose(jax.grad(g)(x), jnp.cos(x), rtol=1e-6)
    np.testing.assert_allclose(jax.jit(g)(x), f(x), rtol=1e-6)
    np.testing.assert_allclose(jax.vmap(g)(x[:, None]), jnp.sin(x),
                               rtol=1e-6)
    self.assertLen(calls, 4)  # Each transformation traced `f` itself.

  def test_concrete_values_fall_back_to_eager(self):
    f, calls = _counting(lambda x: x * 2 if float(x.sum()) > 0 else -x)
    g = compiled.compile_per_signature(f)
    x = jnp.ones(2)
    np.testing.assert_array_equal(g(x), 2 * x)
    np.testing.assert_array_equal(g(-x), x)
    # One failed trace, then eager calls only.
    self.assertLen(calls, 3)

  def test_errors_raised_unchanged(self):
    def f(x, get=None):
      if get not in (None, 'a'):
        raise ValueError(f'bad get {get!r}')
      return x
    g = compiled.compile_per_signature(f)
    with self.assertRaisesRegex(ValueError, "bad get 'b'"):
      g(jnp.ones(1), get='b')
    with self.assertRaisesRegex(ValueError, "bad get 'b'"):
      g(jnp.ones(1), get='b')

  def test_static_outputs_and_unhashable_arguments(self):
    g = compiled.compile_per_signature(
        lambda x, extra=None: (x.shape, None, x + 1, 'name'))
    shape, none, y, name = g(jnp.ones((2, 3)))
    self.assertEqual((shape, none, name), ((2, 3), None, 'name'))
    self.assertIsInstance(shape[0], int)
    np.testing.assert_array_equal(y, 2 * jnp.ones((2, 3)))
    # A set is not a pytree and not hashable: runs eagerly.
    self.assertEqual(g(jnp.ones(2), extra=[{1}])[0], (2,))

  def test_numpy_and_jax_inputs(self):
    f, calls = _counting(lambda x: x * 2)
    g = compiled.compile_per_signature(f)
    np.testing.assert_array_equal(g(np.ones(2, np.float32)), 2.)
    np.testing.assert_array_equal(g(jnp.ones(2, np.float32)), 2.)
    self.assertLen(calls, 2)


class CompiledKernelFnTest(test_utils.NeuralTangentsTestCase):

  def _network(self):
    return stax.serial(stax.Dense(512, W_std=1.5, b_std=0.05), stax.Relu(),
                       stax.Dense(512, W_std=1.5, b_std=0.05), stax.Erf(),
                       stax.Dense(1, W_std=1.5, b_std=0.05))

  def test_same_as_jitted_and_eager(self):
    _, _, kernel_fn = self._network()
    x1 = jax.random.normal(jax.random.PRNGKey(1), (6, 4))
    x2 = jax.random.normal(jax.random.PRNGKey(2), (3, 4))
    for x2_ in (None, x2):
      out = kernel_fn(x1, x2_, ('nngp', 'ntk'))
      jitted = jax.jit(kernel_fn, static_argnames='get')(x1, x2_,
                                                         get=('nngp', 'ntk'))
      # Concrete inputs inside the user's `jit`: staged into it.
      closed = jax.jit(lambda: kernel_fn(x1, x2_, ('nngp', 'ntk')))()
      for a, b, c in zip(out, jitted, closed):
        np.testing.assert_allclose(a, b, rtol=1e-12)
        np.testing.assert_allclose(a, c, rtol=1e-12)

  def test_whole_kernel_and_static_fields(self):
    _, _, kernel_fn = self._network()
    x = jnp.ones((2, 3))
    k = kernel_fn(x)
    self.assertEqual(k.shape1, (2, 1))
    self.assertTrue(k.x1_is_x2)
    self.assertEqual(kernel_fn(x, None, 'shape1'), (2, 1))
    _, _, relu_kernel_fn = stax.Relu()
    np.testing.assert_allclose(
        relu_kernel_fn(k, None, 'nngp'),
        jax.jit(relu_kernel_fn, static_argnums=2)(k, None, 'nngp'),
        rtol=1e-12)

  def test_bad_arguments_raise_as_before(self):
    _, _, kernel_fn = self._network()
    x = jnp.ones((2, 3))
    with self.assertRaisesRegex(ValueError, "get='nnpg'.*did you mean 'nngp'"):
      kernel_fn(x, None, 'nnpg')
    with self.assertRaisesRegex(TypeError, 'unexpected keyword'):
      kernel_fn(x, None, 'nngp', diagonal_spatail=True)
    with self.assertRaisesRegex(ValueError, 'same shape except'):
      kernel_fn(x, jnp.ones((2, 4)), 'nngp')

  def test_gradient_through_hyperparameters(self):
    x = jax.random.normal(jax.random.PRNGKey(1), (3, 4))

    def nngp_sum(w_std):
      _, _, kernel_fn = stax.serial(stax.Dense(1, W_std=w_std), stax.Relu(),
                                    stax.Dense(1, W_std=w_std))
      return jnp.sum(kernel_fn(x, None, 'nngp'))
    # The layers close over a tracer; the inputs are concrete.
    grad = jax.grad(nngp_sum)(1.5)
    eps = 1e-4
    fd = (nngp_sum(1.5 + eps) - nngp_sum(1.5 - eps)) / (2 * eps)
    np.testing.assert_allclose(grad, fd, rtol=1e-5)


if __name__ == '__main__':
  absltest.main()
