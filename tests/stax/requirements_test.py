"""Tests of the layer machinery: `get`, inputs, representations, `Kernel`."""
from absl.testing import absltest
from absl.testing import parameterized
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

import neural_tangents as nt
from neural_tangents import stax
import test_utils


def _net():
  return stax.serial(stax.Dense(64, 1.5, 0.2), stax.Relu(),
                     stax.Dense(64, 1.2, 0.1), stax.Erf(), stax.Dense(1))


def _inputs(shape1=(3, 5), shape2=(4, 5)):
  return (jax.random.normal(jax.random.PRNGKey(1), shape1),
          jax.random.normal(jax.random.PRNGKey(2), shape2))


class GetTest(test_utils.NeuralTangentsTestCase):

  def test_get_variants(self):
    _, _, kernel_fn = _net()
    x1, x2 = _inputs()
    k = kernel_fn(x1, x2)
    self.assertIsInstance(k, nt.Kernel)
    self.assertAllClose(kernel_fn(x1, x2, 'ntk'), k.ntk)
    both = kernel_fn(x1, x2, ('nngp', 'ntk'))
    self.assertEqual(type(both).__name__, 'Kernel')
    self.assertEqual(both._fields, ('nngp', 'ntk'))
    self.assertAllClose(both.nngp, k.nngp)
    self.assertAllClose(kernel_fn(x1, x2, 'cov1'), k.cov1)
    self.assertAllClose(kernel_fn(x1, x2, 'cov2'), k.cov2)
    self.assertEqual(k.nngp.shape, (3, 4))
    self.assertEqual(k.cov1.shape, (3,))

  @parameterized.parameters(('ntkk',), (('nngp', 'foo'),), (3,), ((),))
  def test_unknown_get_raises(self, get):
    _, _, kernel_fn = _net()
    x1, _ = _inputs()
    with self.assertRaisesRegex(ValueError, r'`get` must be None, one of .*'
                                r'nngp.*got .*Pass e\.g\. get="ntk"'):
      kernel_fn(x1, None, get)

  def test_nngp_never_builds_ntk(self):
    seen = []

    @stax.layer
    def Spy():
      @stax.requires()
      def kernel_fn(k, **kwargs):
        seen.append(k.ntk is None)
        return k
      return (lambda rng, s: (s, ()), lambda p, x, **kw: x, kernel_fn)

    _, _, kernel_fn = stax.serial(stax.Dense(4), Spy(), stax.Relu(), Spy())
    x1, x2 = _inputs()
    kernel_fn(x1, x2, 'nngp')
    kernel_fn(x1, x2, ('nngp', 'cov1'))
    self.assertEqual(seen, [True] * 4)
    kernel_fn(x1, x2, 'ntk')
    self.assertEqual(seen[4:], [False] * 2)


class InputsTest(test_utils.NeuralTangentsTestCase):

  def test_mismatched_features_raise(self):
    _, _, kernel_fn = _net()
    x1, _ = _inputs()
    x2 = jnp.ones((4, 6))
    with self.assertRaisesRegex(
        ValueError, r'`x1` and `x2` must have the same shape except along the '
        r'batch axis.*x1.shape=\(3, 5\).*x2.shape=\(4, 6\).*Pass `x2`'):
      kernel_fn(x1, x2, 'nngp')

  def test_x2_none_equals_x1(self):
    _, _, kernel_fn = _net()
    x1, _ = _inputs()
    k_none = kernel_fn(x1, None)
    k_same = kernel_fn(x1, x1)
    self.assertTrue(k_none.x1_is_x2)
    self.assertIsNone(k_none.cov2)
    for name in ('nngp', 'ntk', 'cov1'):
      self.assertAllClose(getattr(k_none, name), getattr(k_same, name))
    self.assertAllClose(kernel_fn(x1, None, 'cov2'), k_same.cov2)

  def test_spatial_representations_agree(self):
    _, _, kernel_fn = stax.serial(stax.Dense(8, 1.3, 0.1), stax.Relu(),
                                  stax.Dense(8))
    x1, x2 = _inputs((2, 3, 4, 5), (3, 3, 4, 5))
    full = kernel_fn(x1, x2)
    diag = kernel_fn(x1, x2, diagonal_spatial=True)
    self.assertEqual(full.nngp.shape, (2, 3, 3, 3, 4, 4))
    self.assertEqual(full.cov1.shape, (2, 3, 3, 4, 4))
    self.assertEqual(diag.nngp.shape, (2, 3, 3, 4))
    self.assertEqual(diag.cov1.shape, (2, 3, 4))
    for name, n_batch in (('nngp', 2), ('ntk', 2), ('cov1', 1), ('cov2', 1)):
      f = getattr(full, name)
      for i in range(2):
        f = jnp.moveaxis(jnp.diagonal(f, axis1=n_batch + i,
                                      axis2=n_batch + i + 1), -1, n_batch + i)
      self.assertAllClose(f, getattr(diag, name))

  def test_full_batch_covariance(self):
    _, _, kernel_fn = _net()
    x1, x2 = _inputs()
    k = kernel_fn(x1, x2, diagonal_batch=False)
    self.assertEqual(k.cov1.shape, (3, 3))
    self.assertAllClose(k.cov1, kernel_fn(x1, x1, 'nngp'))
    self.assertAllClose(jnp.diagonal(k.cov1), kernel_fn(x1, x2, 'cov1'))

  def test_float32_matches_float64(self):
    _, _, kernel_fn = _net()
    x1, x2 = _inputs()
    with jax.enable_x64(True):
      k64 = kernel_fn(np.asarray(x1, np.float64), np.asarray(x2, np.float64),
                      'ntk')
      self.assertEqual(k64.dtype, jnp.float64)
    k32 = kernel_fn(x1.astype(jnp.float32), x2.astype(jnp.float32), 'ntk')
    self.assertEqual(k32.dtype, jnp.float32)
    self.assertAllClose(k32, np.asarray(k64, np.float32), rtol=1e-5)


class KernelPytreeTest(test_utils.NeuralTangentsTestCase):

  def test_jit_vmap_scan_replace(self):
    _, _, kernel_fn = _net()
    x1, x2 = _inputs()
    k = kernel_fn(x1, x2)
    k_jit = jax.jit(kernel_fn, static_argnames='get')(x1, x2)
    self.assertAllClose(k_jit.ntk, k.ntk)
    self.assertEqual(k_jit.shape1, k.shape1)
    # vmap over a leading axis of stacked inputs.
    ntk_v = jax.vmap(lambda a: kernel_fn(a, x2, 'ntk'))(jnp.stack([x1, x1]))
    self.assertAllClose(ntk_v[1], k.ntk)
    # A Kernel is a valid scan carry, static fields included.
    out, _ = lax.scan(lambda c, _: (c.replace(nngp=2 * c.nngp), None), k,
                      None, length=3)
    self.assertAllClose(out.nngp, 8 * k.nngp)
    self.assertEqual(out.is_gaussian, k.is_gaussian)
    leaves, treedef = jax.tree_util.tree_flatten(k)
    self.assertLen(leaves, 4)  # nngp, ntk, cov1, cov2 (masks are None).
    self.assertEqual(jax.tree_util.tree_unflatten(treedef, leaves).shape2,
                     (4, 1))

  def test_grad_wrt_inputs_is_finite(self):
    _, _, kernel_fn = _net()
    x1, x2 = _inputs()
    g = jax.grad(lambda a: kernel_fn(a, None, 'ntk').sum())(x1)
    self.assertFinite(g)
    self.assertGreater(float(jnp.abs(g).max()), 0)


if __name__ == '__main__':
  absltest.main()
