"""Tests of `Dropout`: Monte Carlo (one mask per sample), apply_fn, modes,
representations and errors."""
from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

import neural_tangents as nt
from neural_tangents import stax
from neural_tangents._src.utils import kernel as kernel_lib
from tests import test_utils



_inputs = test_utils.graded_inputs


class DropoutTest(test_utils.NeuralTangentsTestCase):

  # One estimate in the default tier (all with NT_TEST_FULL=1); the kernel
  # map is pinned exactly by `test_kernel_rescales_only_self_pairs` (also on
  # sequences).
  @parameterized.named_parameters(*test_utils.full_tier_cases(
      # The dropped-out variances feed a nonlinearity in the second layer.
      [('fc_two_layers', (3, 3), 0.6, 2)],
      [('sequence', (2, 3, 2), 0.5, 1)]))
  def test_kernel_matches_monte_carlo(self, shape, rate, depth):
    # x2 is x1 (one forward pass, one mask per sample), so the rescaled
    # diagonal shows.
    def network(mode):
      layers = [stax.Dense(1024, W_std=1.5, b_std=0.3), stax.Relu(),
                stax.Dropout(rate, mode=mode)]
      if depth == 2:
        layers += [stax.Dense(1024, W_std=1.2, b_std=0.2), stax.Erf()]
      return stax.serial(*layers, stax.Dense(512, b_std=0.1))

    init_fn, apply_fn, kernel_fn = network('train')
    with jax.enable_x64(False):
      x, _ = _inputs(shape, shape)
      k = kernel_fn(x, None, ('nngp', 'ntk'))
      nngp, ntk = test_utils.monte_carlo_kernels(
          init_fn, apply_fn, x, x, 48, jax.random.PRNGKey(1), batch_size=16,
          apply_kwargs=lambda key: {'rng': key})
      # The same network without dropout has a visibly different kernel.
      k_test = network('test')[2](x, None, ('nngp', 'ntk'))
    self.assertLess(test_utils.relative_error(nngp, k.nngp), test_utils.MC_TOL)
    self.assertLess(test_utils.relative_error(ntk, k.ntk), test_utils.MC_TOL)
    self.assertGreater(test_utils.relative_error(nngp, k_test.nngp),
                       2 * test_utils.MC_TOL)

  def test_kernel_rescales_only_self_pairs(self):
    def self_pairs(n, batch_pair):
      # True at (i, [j,] s, t) iff [i == j and] s == t, for 4 positions.
      eye = np.eye(4, dtype=bool)
      if not batch_pair:
        return eye
      return np.eye(n, dtype=bool)[:, :, None, None] & eye

    with jax.enable_x64(True):
      x1, x2 = _inputs((3, 4, 2), (2, 4, 2), np.float64)
      layers = [stax.Dense(3, b_std=0.3), stax.Relu()]
      _, _, before = stax.serial(*layers)
      _, _, after = stax.serial(*layers, stax.Dropout(0.8))
      scaled = lambda x, on: np.where(on, x / 0.8, x)
      for diagonal_batch in (True, False):
        kw = dict(diagonal_batch=diagonal_batch)
        k0, k = before(x1, None, **kw), after(x1, None, **kw)
        self.assertAllClose((k.nngp, k.ntk),
                            (scaled(k0.nngp, self_pairs(3, True)),
                             scaled(k0.ntk, self_pairs(3, True))),
                            rtol=1e-12, atol=0)
        self.assertAllClose(
            k.cov1, scaled(k0.cov1, self_pairs(3, not diagonal_batch)),
            rtol=1e-12, atol=0)
        # A different x2 is a separate forward pass: nngp and ntk unchanged.
        k0, k = before(x1, x2, **kw), after(x1, x2, **kw)
        self.assertAllClose((k.nngp, k.ntk), (k0.nngp, k0.ntk), rtol=1e-12,
                            atol=0)
        self.assertAllClose(
            k.cov2, scaled(k0.cov2, self_pairs(2, not diagonal_batch)),
            rtol=1e-12, atol=0)

  def test_x2_equal_to_x1_is_one_forward_pass(self):
    # Monte Carlo estimates (and the published release) take `x2` equal to
    # `x1` as one forward pass (`apply_fn(x2)` gets `apply_fn(x1)`'s key), so
    # the kernel does too: the self pairs are rescaled as with `x2=None`.
    init_fn, apply_fn, kernel_fn = stax.serial(
        stax.Dense(8, b_std=0.2), stax.Relu(), stax.Dropout(0.5),
        stax.Dense(1))
    with jax.enable_x64(True):
      x1, x2 = _inputs((5, 4), (5, 4), np.float64)
      one = kernel_fn(x1, None)
      for x1_again in (x1, np.array(x1), jnp.array(x1)):
        k = kernel_fn(x1, x1_again)
        self.assertAllClose((k.nngp, k.ntk, k.cov1, k.cov2),
                            (one.nngp, one.ntk, one.cov1, one.cov1),
                            rtol=1e-12, atol=0)
        self.assertFalse(k.x1_is_x2)
        self.assertAllClose(kernel_fn(x1, x1_again, 'cov2'), one.cov1,
                            rtol=1e-12, atol=0)
      # Under `jit` the equality is traced, and selects the same kernels.
      jitted = jax.jit(kernel_fn, static_argnames='get')
      self.assertAllClose(jitted(x1, jnp.array(x1), get=('nngp', 'ntk')),
                          (one.nngp, one.ntk), rtol=1e-12, atol=0)
      # A different x2 (same shape) is a separate pass: no self pairs.
      _, _, no_dropout = stax.serial(stax.Dense(8, b_std=0.2), stax.Relu(),
                                     stax.Dense(1))
      for fn in (kernel_fn, jitted):
        self.assertAllClose(fn(x1, x2, get='nngp'),
                            no_dropout(x1, x2, 'nngp'), rtol=1e-12, atol=0)
      # nt.batch's diagonal blocks pair x1 with itself too.
      batched = nt.batch(kernel_fn, batch_size=5)
      self.assertAllClose(batched(x1, jnp.array(x1), 'nngp'), one.nngp,
                          rtol=1e-12, atol=0)
      # The Monte Carlo convention this follows: x2 = x1 gives x2 = None.
      mc = nt.monte_carlo_kernel_fn(init_fn, apply_fn, jax.random.PRNGKey(0),
                                    n_samples=2)
      self.assertAllClose(mc(x1, np.array(x1), 'nngp'), mc(x1, None, 'nngp'),
                          rtol=1e-12, atol=0)

  @parameterized.named_parameters(('fc', (3, 4)), ('sequence', (3, 4, 2)),
                                  ('image', (2, 3, 3, 2)))
  def test_representations_agree(self, shape):
    x, _ = _inputs(shape, shape)
    _, _, kernel_fn = stax.serial(stax.Dense(3, b_std=0.3), stax.Dropout(0.7),
                                  stax.Dense(3), stax.Gelu(), stax.Dropout(0.9))
    full = kernel_fn(x, None, diagonal_batch=False)
    diag = kernel_fn(x, None, diagonal_spatial=True)
    spatial_diag = lambda a, n: (kernel_lib.spatial_diagonal(a, n)
                                 if len(shape) > 2 else a)
    self.assertAllClose(
        (diag.nngp, diag.ntk, diag.cov1),
        (spatial_diag(full.nngp, 2), spatial_diag(full.ntk, 2),
         kernel_lib.batch_diagonal(spatial_diag(full.cov1, 2))))
    self.assertAllClose(kernel_fn(x, None, 'cov1'),
                        kernel_lib.batch_diagonal(full.cov1))

  def test_apply_fn_keeps_rate_and_rescales(self):
    _, apply_fn, _ = stax.Dropout(0.3)
    x = jnp.asarray(np.random.RandomState(0).rand(200, 500) + 1, jnp.float32)
    out = np.asarray(apply_fn((), x, rng=jax.random.PRNGKey(0)))
    kept = out != 0
    self.assertAllClose(out[kept], np.asarray(x)[kept] / 0.3)
    self.assertAlmostEqual(kept.mean(), 0.3, delta=0.005)
    # The same key gives the same mask; another key another one.
    self.assertAllClose(apply_fn((), x, rng=jax.random.PRNGKey(0)), out)
    self.assertFalse(np.array_equal(
        np.asarray(apply_fn((), x, rng=jax.random.PRNGKey(1))) != 0, kept))

  def test_test_mode_is_the_identity(self):
    init_fn, apply_fn, kernel_fn = stax.Dropout(0.5, mode='test')
    x = jnp.arange(6.).reshape(2, 3)
    self.assertEqual(init_fn(None, (-1, 3))[0], (-1, 3))
    self.assertAllClose(apply_fn((), x), x)
    _, _, with_dropout = stax.serial(stax.Dense(2, b_std=0.1), stax.Relu(),
                                     stax.Dropout(0.5, mode='test'))
    _, _, without = stax.serial(stax.Dense(2, b_std=0.1), stax.Relu())
    self.assertAllClose(with_dropout(x, None), without(x, None))

  def test_rate_one_is_the_identity(self):
    _, apply_fn, _ = stax.Dropout(1.)
    x = jnp.arange(6.).reshape(2, 3)
    self.assertAllClose(apply_fn((), x, rng=jax.random.PRNGKey(0)), x)

  def test_init_and_apply_shapes_agree(self):
    init_fn, apply_fn, _ = stax.serial(stax.Dense(6), stax.Dropout(0.5),
                                       stax.Dense(3))
    out_shape, params = init_fn(jax.random.PRNGKey(0), (-1, 4, 2))
    out = apply_fn(params, jnp.ones((5, 4, 2)), rng=jax.random.PRNGKey(1))
    self.assertEqual(out_shape, (-1, 4, 3))
    self.assertEqual(out.shape, (5, 4, 3))

  @parameterized.named_parameters(
      ('zero', 0.), ('negative', -0.5), ('above_one', 1.5), ('string', '0.5'))
  def test_invalid_rate_raises(self, rate):
    with self.assertRaisesRegex(ValueError, 'rate.*keep'):
      stax.Dropout(rate)

  def test_invalid_mode_raises(self):
    with self.assertRaisesRegex(ValueError, "mode.*'eval'"):
      stax.Dropout(0.5, mode='eval')

  def test_train_mode_without_rng_raises(self):
    _, apply_fn, _ = stax.serial(stax.Dense(2), stax.Dropout(0.5))
    with self.assertRaisesRegex(ValueError, 'Dropout.*rng'):
      apply_fn([(jnp.ones((3, 2)), None), ()], jnp.ones((1, 3)))

  def test_nonlinearity_after_train_mode_dropout_raises(self):
    # Dropped-out activations are not Gaussian: a kernel for them would be
    # silently wrong.
    _, _, kernel_fn = stax.serial(stax.Dense(2), stax.Dropout(0.5),
                                  stax.Erf())
    with self.assertRaisesRegex(ValueError, 'Erf.*Gaussian'):
      kernel_fn(jnp.ones((2, 3)), None)


class DropoutKeyTest(absltest.TestCase):

  def test_int_rng_raises_naming_the_fix(self):
    _, apply_fn, _ = stax.Dropout(0.5, mode='train')
    with self.assertRaisesRegex(TypeError, r'`rng` must be a PRNG key; got 0'
                                r'.*PRNGKey\(0\).*jax\.random\.key'):
      apply_fn((), jnp.ones((2, 3)), rng=0)
    # A typed key works as a raw one.
    y = apply_fn((), jnp.ones((2, 3)), rng=jax.random.key(1))
    z = apply_fn((), jnp.ones((2, 3)), rng=jax.random.PRNGKey(1))
    np.testing.assert_array_equal(y, z)


if __name__ == '__main__':
  absltest.main()
