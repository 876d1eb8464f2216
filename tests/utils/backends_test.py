"""float64 where a backend emulates it (TPUs), checked on any backend.

On a TPU, float64 is pairs of float32: float32's exponent range, no IEEE
float64 bits, no float64 factorizations (compiling one aborts the process).
These tests mark the current platform as emulating float64
(`backends.FLOAT64_EMULATED_PLATFORMS`) and check that the library then
(1) builds and reads powers of 2 through float32, exactly, and gives the same
kernels as the IEEE path; (2) never hands a float64 Cholesky, triangular
solve or `eigh` to XLA, factoring on the host instead with the same answers,
under `jax.jit` too; (3) refuses to differentiate such a host factorization
with a `ValueError` naming the fix.
"""
from unittest import mock

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

import neural_tangents as nt
from neural_tangents import stax
from neural_tangents._src.utils import arctan
from neural_tangents._src.utils import backends
from neural_tangents._src.utils import linalg
from neural_tangents._src.utils import scaling
from tests import test_utils


def _emulating_float64():
  """A context in which the current platform emulates float64."""
  return mock.patch.object(backends, 'FLOAT64_EMULATED_PLATFORMS',
                           {backends.compute_platform()})


def _refusing_float64(fn):
  """`fn`, raising AssertionError if called with a float64 argument."""
  def checked(*args, **kwargs):
    for leaf in jax.tree_util.tree_leaves((args, kwargs)):
      if getattr(leaf, 'dtype', None) in (np.float64, np.complex128):
        raise AssertionError(f'float64 {fn.__name__} reached XLA')
    return fn(*args, **kwargs)
  return checked


def _no_float64_factorizations_in_xla():
  """Patches JAX's factorizations to fail on float64 (as a TPU aborts)."""
  patches = [mock.patch.object(jnp.linalg, name,
                               _refusing_float64(getattr(jnp.linalg, name)))
             for name in ('cholesky', 'eigh', 'eigvalsh')]
  patches += [mock.patch.object(
      jax.scipy.linalg, name,
      _refusing_float64(getattr(jax.scipy.linalg, name)))
              for name in ('cho_solve', 'solve_triangular')]
  return patches


class EmulatedScalingTest(test_utils.NeuralTangentsTestCase):

  def test_powers_of_two_through_float32(self):
    exponents = jnp.arange(-125, 128)
    expected = scaling.power_of_two(exponents, jnp.float64)
    with _emulating_float64():
      self.assertTrue(backends.float64_emulated(np.float64))
      powers = scaling.power_of_two(exponents, jnp.float64)
      read = scaling.power_of_two_exponent(powers)
    self.assertEqual(powers.dtype, jnp.float64)
    np.testing.assert_array_equal(powers, expected)
    np.testing.assert_array_equal(read, exponents)

  def test_exponent_of_is_exact_where_float32_rounds_up(self):
    # 2^k (1 - 2^-40) rounds to 2^k in float32: its exponent is still k.
    # (From k = -80 up: a TPU's float32 pair flushes the low word of smaller
    # values, 2^(k - 40), which is below float32's normal range.)
    k = np.arange(-80, 101, 7)
    x = np.ldexp(1. - 2.**-40, k) * np.where(k % 2, -1., 1.)
    x = np.concatenate([x, [0., -0., 3., 0.25, 1e30, -1e-30]])
    expected = np.frexp(x)[1]
    with _emulating_float64():
      np.testing.assert_array_equal(scaling.exponent_of(jnp.asarray(x)),
                                    expected)
      np.testing.assert_array_equal(
          jax.jit(scaling.exponent_of)(jnp.asarray(x)), expected)

  def test_arctan2_signs(self):
    values = np.array([0., -0., 1e-30, -1e-30, 2., -2., 1e30, -1e30])
    y, x = np.meshgrid(values, values)
    with _emulating_float64():
      angles = arctan.arctan2(jnp.asarray(y), jnp.asarray(x))
    np.testing.assert_allclose(angles, np.arctan2(y, x), rtol=1e-15, atol=0)
    np.testing.assert_array_equal(np.signbit(angles), np.signbit(
        np.arctan2(y, x)))

  @test_utils.sample_product(nonlinearity=('Relu', 'Erf', 'Gelu', 'Sin'),
                             scale=(1e-20, 1., 1e20))
  def test_kernels_as_ieee(self, nonlinearity, scale):
    def net():
      return stax.serial(stax.Dense(8, 1.5, 0.1),
                         getattr(stax, nonlinearity)(),
                         stax.Dense(1, 1.3, 0.2))
    x1 = scale * np.random.RandomState(0).randn(4, 3)
    x2 = scale * np.random.RandomState(1).randn(3, 3)
    expected = net()[2](x1, x2, ('nngp', 'ntk'))
    with _emulating_float64():
      kernels = net()[2](x1, x2, ('nngp', 'ntk'))
    self.assertAllClose(kernels, expected, rtol=1e-12, atol=0.)


class HostFactorizationTest(test_utils.NeuralTangentsTestCase):

  def _kernels(self):
    _, _, kernel_fn = stax.serial(stax.Dense(8, 1.5, 0.1), stax.Relu(),
                                  stax.Dense(1))
    rng = np.random.RandomState(2)
    x_train, x_test = rng.randn(12, 4), rng.randn(5, 4)
    y_train = rng.randn(12, 2)
    return (kernel_fn(x_train, None, ('nngp', 'ntk')),
            kernel_fn(x_test, x_train, ('nngp', 'ntk')),
            kernel_fn(x_test, None, ('nngp', 'ntk')), y_train, kernel_fn,
            x_train, x_test)

  def _predictions(self, solver):
    k_train, k_test_train, k_test, y_train, kernel_fn, x_train, x_test = (
        self._kernels())
    gp = nt.predict.gp_inference(k_train, y_train, diag_reg=1e-3,
                                 solver=solver)
    mse = nt.predict.gradient_descent_mse(k_train.ntk, y_train, diag_reg=1e-3)
    ensemble = nt.predict.gradient_descent_mse_ensemble(
        kernel_fn, x_train, y_train, diag_reg=1e-3)
    jitted_gp = jax.jit(
        lambda k_train, k_test_train, k_test: nt.predict.gp_inference(
            k_train, y_train, diag_reg=1e-3)('nngp', k_test_train, k_test))
    return {
        'gp': gp('ntk', k_test_train, k_test),
        'mse_t': mse(3., 0., 0., k_test_train.ntk),
        'mse_inf': mse(None, 0., 0., k_test_train.ntk),
        'ensemble': ensemble(None, x_test, 'nngp', compute_cov=True),
        'ensemble_t': ensemble(2., x_test, 'ntk', compute_cov=True),
        'jitted_gp': jitted_gp(k_train.nngp, k_test_train.nngp, k_test.nngp),
        'max_lr': nt.predict.max_learning_rate(k_train.ntk),
    }

  @test_utils.sample_product(solver=('cholesky', 'eigh'))
  def test_predictions_factor_on_host(self, solver):
    expected = self._predictions(solver)
    patches = _no_float64_factorizations_in_xla()
    with _emulating_float64():
      for patch in patches:
        patch.start()
      try:
        # The patches do bite where float64 is not emulated.
        with mock.patch.object(backends, 'FLOAT64_EMULATED_PLATFORMS', set()):
          with self.assertRaisesRegex(AssertionError, 'reached XLA'):
            linalg.eigh(jnp.eye(2, dtype=jnp.float64))
        actual = self._predictions(solver)
      finally:
        for patch in patches:
          patch.stop()
    self.assertAllClose(actual, expected, rtol=1e-10, atol=1e-12)

  def test_float32_stays_on_device(self):
    k = jnp.eye(3, dtype=jnp.float32) * 2.
    with _emulating_float64():
      self.assertFalse(linalg.factored_on_host(k))
      np.testing.assert_allclose(linalg.cholesky(k), np.sqrt(2.) * np.eye(3),
                                 rtol=1e-6)

  def test_host_factorization_refuses_derivatives(self):
    k = jnp.array([[2., 1.], [1., 3.]], jnp.float64)
    with _emulating_float64():
      values = jax.jit(linalg.eigvalsh)(k)
      np.testing.assert_allclose(values, np.linalg.eigvalsh(np.asarray(k)),
                                 rtol=1e-14)
      with self.assertRaisesRegex(ValueError, 'float32'):
        jax.grad(lambda k: linalg.eigvalsh(k).sum())(k)


if __name__ == '__main__':
  absltest.main()
