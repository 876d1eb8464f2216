"""Reliability tests of layer construction (issue 29): a NaN or infinite
hyperparameter raises a `ValueError` naming it (the `@layer` decorator checks
every float argument of every layer)."""
from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents import stax
from tests import test_utils

_NAN, _INF = float('nan'), float('inf')


class NonFiniteHyperparameterTest(test_utils.NeuralTangentsTestCase):
  """NaN and inf hyperparameters are refused when the layer is built."""

  @parameterized.named_parameters(
      ('dense_w_std_nan', lambda: stax.Dense(8, W_std=_NAN), 'W_std', 'Dense'),
      ('dense_b_std_inf', lambda: stax.Dense(8, 1., _INF), 'b_std', 'Dense'),
      ('dense_numpy_nan', lambda: stax.Dense(8, W_std=np.float32(_NAN)),
       'W_std', 'Dense'),
      ('dense_jax_nan', lambda: stax.Dense(8, W_std=jnp.nan), 'W_std',
       'Dense'),
      ('conv_w_std_minus_inf', lambda: stax.Conv(3, (2,), W_std=-_INF),
       'W_std', 'Conv'),
      ('erf_a_nan', lambda: stax.Erf(a=_NAN), 'a', 'Erf'),
      ('leaky_relu_alpha_inf', lambda: stax.LeakyRelu(_INF), 'alpha',
       'LeakyRelu'),
      ('polynomial_coef_nan', lambda: stax.Polynomial([1., _NAN]), 'coef',
       'Polynomial'),
      ('layer_norm_eps_inf', lambda: stax.LayerNorm(eps=_INF), 'eps',
       'LayerNorm'),
      ('dropout_rate_nan', lambda: stax.Dropout(_NAN), 'rate', 'Dropout'),
      ('gaussian_b_nan', lambda: stax.Gaussian(b=_NAN), 'b', 'Gaussian'),
  )
  def test_non_finite_raises_naming_it(self, make, name, layer_name):
    with self.assertRaisesRegex(
        ValueError, f'`{name}` of `{layer_name}` must be finite; got'):
      make()

  def test_default_named_as_the_fix(self):
    with self.assertRaisesRegex(ValueError, r'e\.g\. the default W_std=1\.0'):
      stax.Dense(8, W_std=_NAN)

  def test_reproducer_never_gives_a_finite_kernel(self):
    # Before: a finite all-zero NNGP (and a NaN NTK).
    with self.assertRaisesRegex(ValueError, '`W_std` of `Dense`'):
      stax.serial(stax.Dense(8, W_std=_NAN), stax.Relu(), stax.Dense(1))

  def test_finite_and_traced_hyperparameters_pass(self):
    stax.Dense(8, W_std=np.float32(1.5), b_std=jnp.asarray(0.1))
    stax.Polynomial([1., 0.5])

    @jax.jit
    def nngp(w_std):
      _, _, kernel_fn = stax.Dense(1, W_std=w_std)
      return kernel_fn(jnp.ones((2, 3)), None, 'nngp')

    self.assertAllClose(nngp(2.), 4. * np.ones((2, 2)))


if __name__ == '__main__':
  absltest.main()
