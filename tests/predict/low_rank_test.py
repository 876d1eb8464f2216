"""Tests of `predict/low_rank.py`: predictions from a low-rank train kernel
`K = F F^T` solved in feature space equal the exact-kernel path on the same
`K`, with the factor held whole or streamed by row blocks."""
import warnings

from absl.testing import absltest
from absl.testing import parameterized
from jax import random
import numpy as np

from neural_tangents import predict
from neural_tangents.experimental import features as ft
from tests import test_utils

# (n, D): more points than features (singular K) and fewer.
SIZES = ((14, 5), (4, 9))


def _factors(n, d, n_test=3, seed=0):
  r = np.random.RandomState(seed)
  f, f_test, f_tt = r.randn(n, d), r.randn(n_test, d), r.randn(n_test, d)
  y = r.randn(n, 2)
  return f, f_test, f_tt, y


def _low_rank(f, streamed, block_rows=3):
  if streamed:
    return predict.LowRankKernel(lambda a, b: f[a:b], n=len(f),
                                 block_rows=block_rows)
  return predict.LowRankKernel(f, block_rows=block_rows)


def _exact(fn, *args, **kwargs):
  """The exact path; singular kernels warn (pseudo-inverse): expected."""
  with warnings.catch_warnings():
    warnings.simplefilter('ignore')
    return fn(*args, **kwargs)


class LowRankGpInferenceTest(parameterized.TestCase):

  @test_utils.sample_product(size=SIZES, streamed=(False, True),
                             diag_reg=(0., 0.3), get=('nngp', 'ntkgp'),
                             absolute=(False, True))
  def test_matches_exact_kernel(self, size, streamed, diag_reg, get,
                                absolute):
    f, f_test, _, y = _factors(*size)
    exact = _exact(predict.gp_inference, f @ f.T, y, diag_reg, absolute,
                   solver='eigh')
    low = predict.gp_inference(_low_rank(f, streamed), y, diag_reg, absolute)
    mean, cov = _exact(exact, get, f_test @ f.T, f_test @ f_test.T)
    low_mean, low_cov = low(get, _low_rank(f_test, streamed),
                            _low_rank(f_test, streamed))
    np.testing.assert_allclose(low_mean, mean, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(low_cov, cov, rtol=1e-8, atol=1e-8)
    # An array test-test kernel gives the same covariance.
    np.testing.assert_allclose(
        low(get, _low_rank(f_test, streamed), f_test @ f_test.T).covariance,
        cov, rtol=1e-8, atol=1e-8)
    # Means with a ridge need only a Cholesky factorization of F^T F + r I.
    self.assertEqual(low.solve_info[get if get == 'nngp' else 'ntk'].solver,
                     'cholesky' if diag_reg else 'eigh')

  def test_on_training_points_interpolates(self):
    f, _, _, y = _factors(6, 3)
    low = predict.gp_inference(predict.LowRankKernel(f), y, 0.1)
    mean, cov = low('nngp', None, True)
    np.testing.assert_array_equal(mean, y)
    np.testing.assert_array_equal(cov, np.zeros((6, 6)))


class LowRankGradientDescentMseTest(parameterized.TestCase):

  @test_utils.sample_product(
      size=SIZES, streamed=(False, True), diag_reg=(0., 0.2),
      t=(None, 3., ((0.5, 20.), (200., 1e4))), fx_train_0=('zero', 'rows'),
      learning_rate=(1., 0.3))
  def test_matches_exact_kernel(self, size, streamed, diag_reg, t,
                                fx_train_0, learning_rate):
    n, d = size
    f, f_test, _, y = _factors(n, d, seed=1)
    r = np.random.RandomState(2)
    f0 = 0. if fx_train_0 == 'zero' else r.randn(n, 2)
    f0_test = r.randn(len(f_test), 2)
    t = None if t is None else np.array(t)
    exact = _exact(predict.gradient_descent_mse, f @ f.T, y, learning_rate,
                   diag_reg, solver='eigh')
    low = predict.gradient_descent_mse(_low_rank(f, streamed), y,
                                       learning_rate, diag_reg)
    train, test = _exact(exact, t, f0, f0_test, f_test @ f.T)
    low_train, low_test = low(t, f0, f0_test, _low_rank(f_test, streamed))
    np.testing.assert_allclose(low_train, train, rtol=1e-7, atol=1e-8)
    np.testing.assert_allclose(low_test, test, rtol=1e-7, atol=1e-8)
    # Test outputs alone (`fx_train_0=None`: train outputs start at 0).
    test_only = _exact(exact, t, None, f0_test, f_test @ f.T)
    np.testing.assert_allclose(
        low(t, None, f0_test, _low_rank(f_test, streamed)), test_only,
        rtol=1e-7, atol=1e-8)

  def test_cholesky_default_matches_at_infinite_time(self):
    f, f_test, _, y = _factors(5, 8)  # K = F F^T is positive definite.
    exact = predict.gradient_descent_mse(f @ f.T, y)
    low = predict.gradient_descent_mse(predict.LowRankKernel(f), y)
    for got, want in zip(low(None, 0., 0., predict.LowRankKernel(f_test)),
                         exact(None, 0., 0., f_test @ f.T)):
      np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-10)


  def test_targets_without_output_axes(self):
    # `y_train` of shape (n,) with `trace_axes=()`: an (n, n) kernel.
    f, f_test, _, y = _factors(7, 4)
    exact = predict.gradient_descent_mse(f @ f.T, y[:, 0], diag_reg=0.1,
                                         trace_axes=())
    low = predict.gradient_descent_mse(predict.LowRankKernel(f), y[:, 0],
                                       diag_reg=0.1, trace_axes=())
    for got, want in zip(low(2., 0., 0., predict.LowRankKernel(f_test)),
                         exact(2., 0., 0., f_test @ f.T)):
      self.assertEqual(got.shape, want.shape)
      np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-10)


  @parameterized.named_parameters(('float32', np.float32),
                                  ('float64', np.float64))
  def test_infinite_time_is_finite_without_regularizer(self, dtype):
    # `r = 0`, `t = inf`: `-expm1(-r tau)` was `-expm1(nan)` (0 * inf), all
    # train outputs NaN; the exact path and `t=None` are finite.
    f, f_test, _, y = _factors(8, 5, seed=4)
    f, f_test, y = f.astype(dtype), f_test.astype(dtype), y.astype(dtype)
    f64, f_test64 = f.astype(np.float64), f_test.astype(np.float64)
    exact = _exact(predict.gradient_descent_mse, f64 @ f64.T,
                   y.astype(np.float64), solver='eigh')
    low = predict.gradient_descent_mse(predict.LowRankKernel(f), y)
    want = _exact(exact, np.inf, 0., 0., f_test64 @ f64.T)
    for t in (np.inf, np.array([0., np.inf])):
      got = low(t, 0., 0., predict.LowRankKernel(f_test))
      for g, w, w0 in zip(got, want, (np.zeros_like(y), np.zeros((3, 2)))):
        self.assertTrue(np.all(np.isfinite(g)))
        g = np.asarray(g).reshape((-1,) + w.shape)
        np.testing.assert_allclose(g[-1], w, rtol=1e-5, atol=1e-5)
        if g.shape[0] == 2:
          np.testing.assert_allclose(g[0], w0, atol=0)


class LowRankKernelTest(parameterized.TestCase):

  def test_float32_factor_accumulates_to_float32_round_off(self):
    # Many rows of float32 features: the feature-space solve keeps the
    # error at float32 round-off of the factor, far below sketch errors.
    r = np.random.RandomState(0)
    n, d = 60_000, 8
    f = (r.randn(n, d) + 3.).astype(np.float32)  # Large mean: cancellation.
    y = r.randn(n, 1)
    f_test = r.randn(4, d).astype(np.float32)
    low = predict.gp_inference(predict.LowRankKernel(f, block_rows=8192), y,
                               1e-3)('nngp', predict.LowRankKernel(f_test))
    f64 = f.astype(np.float64)
    reg = 1e-3 * np.sum(f64**2) / n
    want = f_test.astype(np.float64) @ np.linalg.solve(
        f64.T @ f64 + reg * np.eye(d), f64.T @ y)
    self.assertEqual(low.dtype, np.float64)  # float32 factor, float64 y.
    np.testing.assert_allclose(low, want, rtol=1e-5, atol=1e-6)

  def test_from_features_equals_whole_batch(self):
    init_fn, feature_fn = ft.serial(
        ft.DenseFeatures(1), ft.ReluFeatures('RANDFEAT', feature_dim0=16,
                                             feature_dim1=16, sketch_dim=16),
        ft.DenseFeatures(1))
    x = np.asarray(random.normal(random.PRNGKey(1), (11, 3)))
    _, params = init_fn(random.PRNGKey(0), x.shape)
    whole = feature_fn(x, params)
    for kernel in ('ntk', 'nngp'):
      feat = np.asarray(getattr(whole, f'{kernel}_feat'), np.float64)
      for source, n in ((x, None), (lambda a, b: x[a:b], 11)):
        k = predict.LowRankKernel.from_features(
            feature_fn, params, source, n, batch_size=4, kernel=kernel,
            dtype=np.float64)
        self.assertTrue(k.is_streamed)
        np.testing.assert_allclose(k.dense(), feat @ feat.T, rtol=1e-10)

  def test_from_features_refuses_batch_dependent_features(self):
    # 'EXACT' features factor each batch's kernel in its own basis: rows of
    # different batches made a factor whose means were 2.8x off.
    x = np.asarray(random.normal(random.PRNGKey(1), (8, 5)))
    for method in ('EXACT', 'RANDFEAT'):
      init_fn, feature_fn = ft.serial(
          ft.DenseFeatures(16), ft.ReluFeatures(method=method),
          ft.DenseFeatures(1))
      _, params = init_fn(random.PRNGKey(0), x.shape)
      make = lambda: predict.LowRankKernel.from_features(  # pylint: disable=cell-var-from-loop
          feature_fn, params, x, batch_size=4)
      if method == 'RANDFEAT':
        self.assertEqual(make().dense().shape, (8, 8))
        continue
      with self.assertRaisesRegex(
          ValueError, r'`feature_fn` gives ntk_feat of dimension 4 for 2 '
          r'inputs and 6 for 3: its features depend on the whole batch.*'
          r'RANDFEAT'):
        make()

  def test_complex_factor_refused(self):
    # Its imaginary part was dropped with NumPy's ComplexWarning only.
    f, _, _, _ = _factors(6, 3)
    fix = r'must be real; got dtype complex128.*z.real, z.imag'
    with self.assertRaisesRegex(TypeError, '`factor` of a LowRankKernel ' + fix):
      predict.LowRankKernel(f + 1j * f)
    streamed = predict.LowRankKernel(lambda a, b: (f + 1j * f)[a:b], n=6)
    with self.assertRaisesRegex(TypeError, fix):
      streamed.dense()

  def test_bad_targets_and_overflowing_factor_name_the_cause(self):
    f, f_test, _, y = _factors(8, 5, seed=4)
    y_nan = y.copy()
    y_nan[2, 1] = np.nan
    for make in (predict.gp_inference, predict.gradient_descent_mse):
      # Was blamed on the factor `F`.
      with self.assertRaisesRegex(
          ValueError, r'`y_train` has 1 NaN or inf entries \(in rows \[2\]\)'):
        make(predict.LowRankKernel(f), y_nan)
    # float16 rows whose F^T F overflows float16 (65504) but not float32:
    # accumulated in float32, the means of the float64 solve.
    f16 = (200 * f).astype(np.float16)
    low = predict.gp_inference(predict.LowRankKernel(f16), y, 1e-3)(
        'nngp', predict.LowRankKernel(f_test.astype(np.float16)))
    f64 = f16.astype(np.float64)
    reg = 1e-3 * np.sum(f64**2) / len(f64)
    want = f_test.astype(np.float16).astype(np.float64) @ np.linalg.solve(
        f64.T @ f64 + reg * np.eye(5), f64.T @ y)
    np.testing.assert_allclose(low, want, rtol=1e-5, atol=1e-6)

  def test_bad_inputs_name_the_argument(self):
    f, f_test, _, y = _factors(6, 3)
    low = predict.LowRankKernel(f)
    gp = predict.gp_inference(low, y)
    mse = predict.gradient_descent_mse(low, y)
    cases = [
        (lambda: gp('nngp', f_test @ f.T), 'k_test_train'),
        (lambda: mse(None, 0., 0., f_test @ f.T), 'k_test_train'),
        (lambda: gp('nngp', predict.LowRankKernel(np.ones((2, 4)))),
         'k_test_train'),
        (lambda: gp('ntk', predict.LowRankKernel(f_test), True), 'ntkgp'),
        (lambda: gp('nngp', predict.LowRankKernel(f_test), np.eye(2)),
         'k_test_test'),
        (lambda: predict.gp_inference(low, y[:5]), 'y_train'),
        (lambda: predict.gradient_descent_mse(low, y, trace_axes=()),
         'trace_axes'),
        (lambda: predict.LowRankKernel(lambda a, b: f[a:b]), '`n`'),
        (lambda: predict.LowRankKernel(np.ones((2, 3, 4))), 'Flatten'),
        (lambda: predict.gp_inference(predict.LowRankKernel(
            lambda a, b: f[a:b + 1], n=6, block_rows=2), y)(
                'nngp', predict.LowRankKernel(f_test)), 'rows'),
        (lambda: predict.gp_inference(predict.LowRankKernel(
            f * np.nan), y)('nngp', predict.LowRankKernel(f_test)), 'NaN'),
    ]
    for fn, word in cases:
      with self.assertRaisesRegex(ValueError, word):
        fn()
    # A low-rank test kernel with an exact train kernel.
    exact = predict.gp_inference(f @ f.T + np.eye(6), y)
    with self.assertRaisesRegex(TypeError, 'LowRankKernel'):
      exact('nngp', predict.LowRankKernel(f_test))


if __name__ == '__main__':
  absltest.main()
