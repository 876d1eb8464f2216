"""Reliability tests of `stax/elementwise.py` (issue 29): hyperparameters
that make a kernel not PSD are refused, and closed forms stay accurate at
small input scales."""
from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents import stax
from neural_tangents._src.stax import kernel_maps
from tests import test_utils


class ExpNormalizedGammaTest(test_utils.NeuralTangentsTestCase):
  """`ExpNormalized(gamma < 0)` raises, as `Rbf(gamma <= 0)` does."""

  @parameterized.parameters(-1., -1e-3, -5, np.float32(-1.))
  def test_negative_gamma_raises(self, gamma):
    with self.assertRaisesRegex(ValueError, r'`gamma` of `ExpNormalized` '
                                r'must be >= 0; got .*gamma=1\.'):
      stax.ExpNormalized(gamma=gamma)

  def test_nan_gamma_raises(self):
    with self.assertRaisesRegex(ValueError, '`gamma`'):
      stax.ExpNormalized(gamma=float('nan'))

  def test_string_gamma_raises_type_error(self):
    with self.assertRaisesRegex(TypeError, '`gamma` of `ExpNormalized`'):
      stax.ExpNormalized(gamma='1')

  @parameterized.parameters(0., 0.5, 1, 3.)
  def test_nonnegative_gamma_gives_a_psd_kernel(self, gamma):
    x = np.random.RandomState(0).randn(12, 4).astype(np.float32)
    _, _, kernel_fn = stax.serial(stax.Dense(8), stax.ExpNormalized(gamma))
    k = np.asarray(kernel_fn(x, None, 'nngp'), np.float64)
    evals = np.linalg.eigvalsh((k + k.T) / 2)
    self.assertGreater(evals[0], -1e-5 * evals[-1])


class CompiledLargeInputsTest(test_utils.NeuralTangentsTestCase):
  """Jitted float32 bounded kernels at huge inputs: XLA's fused multiply-add
  left a rounding error in `q1 q2 - c^2` that swamped the Gaussian
  determinant (NTK off by 1e15 relative, or inf, at inputs x 1e15)."""

  @parameterized.parameters('Erf', 'Gelu', 'Sigmoid_like')
  def test_jitted_matches_float64(self, name):
    kernel_fn = stax.serial(stax.Dense(8), getattr(stax, name)(),
                            stax.Dense(1))[2]
    jitted = jax.jit(kernel_fn, static_argnames='get')
    x = np.random.RandomState(0).randn(3, 4).astype(np.float32) * 1e15
    got = jitted(x, None, get=('nngp', 'ntk'))
    want = kernel_fn(x.astype(np.float64), None, ('nngp', 'ntk'))
    for g, w in zip(got, want):
      self.assertEqual(g.dtype, np.float32)
      np.testing.assert_allclose(np.asarray(g, np.float64), w, rtol=1e-5,
                                 atol=1e-5 * np.max(np.abs(w)))

  def test_cauchy_schwarz_gap_is_exact_on_the_diagonal(self):
    q = np.float32([3.526483, 1e30, 7e-30, 1.])
    for fn in (kernel_maps.cauchy_schwarz_gap,
               jax.jit(kernel_maps.cauchy_schwarz_gap)):
      self.assertTrue(np.all(fn(q, q, q) == 0))
      self.assertTrue(np.all(fn(q, q, -q) == 0))
    q1, q2, c = 2., 3., np.sqrt(5.)
    self.assertAllClose(kernel_maps.cauchy_schwarz_gap(q1, q2, c),
                        q1 * q2 - c**2)


_F32_MAX = float(np.finfo(np.float32).max)


def _assert_float32_matches_float64(test, got, want, err_msg=''):
  """`got` (float32) equals `want` (float64) to 1e-5 wherever `want` is
  representable in float32, and is `inf` of its sign wherever it is not."""
  for g, w in zip(got, want):
    test.assertEqual(g.dtype, np.float32)
    g, w = np.asarray(g, np.float64), np.asarray(w)
    representable = np.abs(w) < _F32_MAX / 2
    np.testing.assert_allclose(
        g[representable], w[representable], rtol=1e-5,
        atol=1e-5 * np.max(np.abs(w[representable])), err_msg=err_msg)
    over = np.abs(w) > 2 * _F32_MAX
    np.testing.assert_array_equal(g[over], np.sign(w[over]) * np.inf,
                                  err_msg=err_msg)


class HugeInputsTest(test_utils.NeuralTangentsTestCase):
  """Issue 29 item 6: bounded layers past the float32 overflow of the input
  covariance (inputs above ~1e19) match float64 of the same inputs, instead
  of +-1 (`Erf`) or NaN (`Sin`, `Rbf`): the input kernel is stored scaled
  (`Kernel.scale_exponents`) through `Dense` and `Conv` to these layers."""

  @test_utils.sample_product(
      layer=['Erf', 'Sin', 'Rbf', 'Cos', 'Sigmoid_like'], scale=[1e20, 1e30])
  def test_bounded_layer_matches_float64(self, layer, scale):
    kernel_fn = jax.jit(stax.serial(stax.Dense(8, 1.5, 0.1),
                                    getattr(stax, layer)(),
                                    stax.Dense(1, 1.2, 0.1))[2],
                        static_argnames='get')
    x = np.random.RandomState(0).randn(4, 5) * scale
    got = kernel_fn(x.astype(np.float32), None, get=('nngp', 'ntk'))
    want = kernel_fn(x, None, get=('nngp', 'ntk'))
    _assert_float32_matches_float64(self, got, want, f'{layer} x{scale}')

  def test_erf_of_huge_inputs_is_the_arcsine_kernel(self):
    # The reproducer: `Erf` on x1e20 gave +-1 (sign-kernel limit).
    x = np.random.RandomState(0).randn(4, 5)
    kernel_fn = stax.serial(stax.Dense(8), stax.Erf())[2]
    got = kernel_fn(x.astype(np.float32) * np.float32(1e20), None, 'nngp')
    q = x @ x.T / 5 * 1e40
    d = np.sqrt(np.outer(1 + 2 * np.diag(q), 1 + 2 * np.diag(q)))
    self.assertAllClose(np.asarray(got, np.float64),
                        2 / np.pi * np.arcsin(2 * q / d), rtol=1e-5,
                        atol=1e-6)

  @parameterized.parameters('Erf', 'Sin')
  def test_mixed_magnitudes_in_one_batch(self, layer):
    # Examples from 1e-3 to 1e33 side by side: each keeps its own scale
    # (a small one next to a huge one is not rounded to zero).
    rng = np.random.RandomState(1)
    x1, x2 = rng.randn(4, 5), rng.randn(3, 5)
    x1 *= np.array([[1e25], [1e-3], [1.], [1e12]])
    x2 *= np.array([[1e12], [1.], [1e33]])
    kernel_fn = jax.jit(stax.serial(
        stax.Dense(8, 1.5, 0.1), stax.Relu(), stax.Dense(8, 1.3, 0.2),
        getattr(stax, layer)(), stax.Dense(1, 1., 0.1))[2],
                        static_argnames=('get', 'diagonal_batch'))
    for diagonal_batch in (True, False):
      got = kernel_fn(x1.astype(np.float32), x2.astype(np.float32),
                      get=('nngp', 'ntk', 'cov1', 'cov2'),
                      diagonal_batch=diagonal_batch)
      want = kernel_fn(x1, x2, get=('nngp', 'ntk', 'cov1', 'cov2'),
                       diagonal_batch=diagonal_batch)
      _assert_float32_matches_float64(self, got, want,
                                      f'diagonal_batch={diagonal_batch}')

  def test_repeat_carries_the_scale(self):
    x = np.random.RandomState(2).randn(3, 4) * 1e25
    block = stax.serial(stax.Dense(8, 1.4, 0.1), stax.Relu())
    head = [stax.Dense(8), stax.Erf(), stax.Dense(1)]
    repeated = stax.serial(stax.Dense(8), stax.repeat(block, 3), *head)[2]
    unrolled = stax.serial(stax.Dense(8), *[block] * 3, *head)[2]
    want = unrolled(x, None, ('nngp', 'ntk'))
    for kernel_fn in (repeated, unrolled):
      got = kernel_fn(x.astype(np.float32), None, ('nngp', 'ntk'))
      _assert_float32_matches_float64(self, got, want)

  def test_gradients_stay_finite_at_ordinary_inputs(self):
    # The scaled forms are selected by `jnp.where`; the unselected branch
    # must not put NaN into gradients (zero inputs included).
    x = np.random.RandomState(3).randn(3, 4).astype(np.float32)
    x[1] = 0.
    for layer in (stax.Erf(), stax.Sin(), stax.LayerNorm()):
      kernel_fn = stax.serial(stax.Dense(8, 1.5, 0.1), layer, stax.Dense(1))[2]
      grad = jax.grad(lambda x: jnp.sum(kernel_fn(x, None, 'ntk')))(x)
      self.assertTrue(np.all(np.isfinite(grad)), grad)

  def test_traced_hyperparameters_of_huge_inputs(self):
    # `W_std`/`b_std` traced by `jax.vmap` and `jax.grad` (as in a phase
    # diagram) go through the scaled bias terms: the same kernel as the
    # Python floats, and finite gradients.
    x = np.random.RandomState(4).randn(3, 4) * 1e25

    def nngp(w_std, b_std, x):
      kernel_fn = stax.serial(stax.Dense(8, w_std, b_std), stax.Relu(),
                              stax.Dense(8, w_std, b_std), stax.Erf(),
                              stax.Dense(1))[2]
      return kernel_fn(x, None, 'nngp')

    b_stds = np.array([0.05, 0.1, 0.5])
    got = jax.vmap(lambda b: nngp(1.5, b, x.astype(np.float32)))(
        b_stds.astype(np.float32))
    for b_std, g in zip(b_stds, got):
      _assert_float32_matches_float64(self, [g], [nngp(1.5, b_std, x)],
                                      f'b_std={b_std}')
    grad = jax.grad(lambda w, b: jnp.sum(nngp(w, b, x.astype(np.float32))),
                    argnums=(0, 1))(1.5, 0.1)
    self.assertTrue(np.all(np.isfinite(grad)), grad)

  def test_cauchy_schwarz_gap_of_unequal_variances(self):
    # `(q1 - |c|) q2 + |c| (q2 - |c|)` cancels terms of size |c| q2 >> q1 q2
    # here (a small input against a huge one): it was 4% off in float64.
    q1, q2, c = 0.04000307068130797, 7.682598786723794e65, 4.463085920104e29
    self.assertAllClose(kernel_maps.cauchy_schwarz_gap(q1, q2, c),
                        q1 * q2 - c**2, rtol=1e-12)


def _sin_reference(a, b, sin2, cos2, q1, q2, c):
  """float64 `E[phi(u) phi(v)]`, `E[phi'(u) phi'(v)]` of `a sin(b x + s)`,
  `sin2 = sin(s)^2`, `cos2 = cos(s)^2`, through `log sinh` (finite at every
  scale): `exp(-b^2 (q1 + q2) / 2) sinh(b^2 c)` plus the phase term."""
  q1, q2, c = (np.asarray(v, np.float64) for v in (q1, q2, c))
  x = b**2 * np.abs(c)
  with np.errstate(divide='ignore', over='ignore'):
    log_sinh = np.where(x > 20., x - np.log(2.) + np.log1p(-np.exp(-2 * x)),
                        np.log(np.sinh(np.minimum(x, 20.))))
  s = np.sign(c) * np.exp(-b**2 * (q1 + q2) / 2 + log_sinh)
  opposite = np.exp(-b**2 * (q1 + q2 + 2 * c) / 2)
  return a**2 * (s + sin2 * opposite), a**2 * b**2 * (s + cos2 * opposite)


# (q1, q2, c) in units of the squared input scale: equal points, correlated,
# anti-correlated, nearly orthogonal, orthogonal.
_TRIPLES = np.array([[1., 1., 1.], [1., 2., 0.7], [1., 2., -0.7],
                     [2., 0.5, 0.01], [1.5, 1., 0.]])
_SCALES = (1e-12, 1e-9, 1e-6, 1e-4, 1e-3, 1e-2, 1., 10., 1e3)


class SinSmallInputsTest(test_utils.NeuralTangentsTestCase):
  """`Sin`/`Cos` kernels keep float32 relative accuracy at every scale."""

  def test_reference_matches_quadrature(self):
    # The float64 reference against 2-d Gauss-Hermite quadrature of
    # E[a sin(b u + s) a sin(b v + s)] (and of the derivatives).
    nodes, weights = np.polynomial.hermite_e.hermegauss(80)
    weights = weights / weights.sum()
    a, b, shift = 1.3, 0.8, 0.4
    for q1, q2, c in _TRIPLES:
      cov = np.array([[q1, c], [c, q2]])
      low = np.linalg.cholesky(cov + 1e-300 * np.eye(2)) if c**2 < q1 * q2 \
          else np.array([[np.sqrt(q1), 0.], [c / np.sqrt(q1), 0.]])
      z1, z2 = np.meshgrid(nodes, nodes, indexing='ij')
      u = low[0, 0] * z1
      v = low[1, 0] * z1 + low[1, 1] * z2
      w = np.outer(weights, weights)
      nngp = np.sum(w * a**2 * np.sin(b * u + shift) * np.sin(b * v + shift))
      dot = np.sum(w * a**2 * b**2 * np.cos(b * u + shift) *
                   np.cos(b * v + shift))
      ref = _sin_reference(a, b, np.sin(shift)**2, np.cos(shift)**2, q1, q2, c)
      self.assertAllClose(np.array(ref), np.array([nngp, dot]), rtol=1e-10,
                          atol=1e-12)

  @parameterized.product(
      scale=_SCALES,
      layer=(('sin', (1., 1., 0.), 0., 1.), ('sin_phase', (1.5, 2., 0.3),
                                              np.sin(0.3)**2, np.cos(0.3)**2),
             ('cos', (1., 1., 0.), 1., 0.)),
  )
  def test_kernel_map_float32_relative_accuracy(self, scale, layer):
    name, (a, b, shift), sin2, cos2 = layer
    if name == 'cos':
      kernel_map = kernel_maps.sin_kernel_map(a, b, shift + np.pi / 2)
    else:
      kernel_map = kernel_maps.sin_kernel_map(a, b, shift)
    q1, q2, c = (jnp.asarray(v, jnp.float32) for v in (_TRIPLES * scale**2).T)
    nngp, dot = kernel_map(q1, q2, c, True)
    # The reference from the same float32 covariances.
    ref_nngp, ref_dot = _sin_reference(a, b, sin2, cos2, np.asarray(q1),
                                       np.asarray(q2), np.asarray(c))
    self.assertAllClose(np.asarray(nngp, np.float64), ref_nngp, rtol=1e-5,
                        atol=2e-38)
    self.assertAllClose(np.asarray(dot, np.float64), ref_dot, rtol=1e-5,
                        atol=2e-38)

  @parameterized.parameters(1e-12, 1e-6, 1e-4, 1e-3, 1., 1e3)
  def test_network_matches_float64_closed_form(self, scale):
    # The reproducer of issue 29: 2.7% off at 1e-3, all zeros from 1e-4.
    x = np.random.RandomState(0).randn(4, 4).astype(np.float32) * scale
    _, _, kernel_fn = stax.serial(stax.Dense(8), stax.Sin(), stax.Dense(1))
    nngp = np.asarray(kernel_fn(x, None, 'nngp'), np.float64)
    x64 = x.astype(np.float64)
    q = x64 @ x64.T / 4
    d = np.diag(q)
    ref, _ = _sin_reference(1., 1., 0., 1., d[:, None], d[None], q)
    self.assertLess(np.max(np.abs(nngp - ref)) / np.max(np.abs(ref)), 1e-5)


if __name__ == '__main__':
  absltest.main()
