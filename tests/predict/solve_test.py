"""Tests of `predict/solve.py`: the Cholesky, eigh and CG solves of the train
kernel, through the published predict functions, against the eigh path and
float64 direct solves; non-PD kernels; host, memory-mapped and row-block
kernels; memory."""
import collections
import os
import tempfile
import tracemalloc
from unittest import mock
import warnings

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents import predict
from neural_tangents._src.predict import kernel_rows
from neural_tangents._src.predict import solve
from tests import test_utils

Kernels = collections.namedtuple('Kernels', ['nngp', 'ntk'])


def _relu_nngp(x1, x2):
  """Arc-cosine kernel of degree 1 plus a bias: PD on distinct points."""
  n1 = np.linalg.norm(x1, axis=1)
  n2 = np.linalg.norm(x2, axis=1)
  c = np.clip(x1 @ x2.T / np.outer(n1, n2), -1., 1.)
  return 0.1 + np.outer(n1, n2) * (np.sqrt(1. - c**2) +
                                   (np.pi - np.arccos(c)) * c) / np.pi


def _problem(n=60, n_test=7, dim=5, out=3, seed=0, dtype=np.float64):
  r = np.random.RandomState(seed)
  x, x_test = r.randn(n, dim), r.randn(n_test, dim)
  y = r.randn(n, out)
  nngp = _relu_nngp(x, x)
  ntk = 2. * nngp + x @ x.T / dim
  nngp_t = _relu_nngp(x_test, x)
  ntk_t = 2. * nngp_t + x_test @ x.T / dim
  k_tt = _relu_nngp(x_test, x_test)
  cast = lambda a: a.astype(dtype)
  return (Kernels(cast(nngp), cast(ntk)), cast(y),
          Kernels(cast(nngp_t), cast(ntk_t)), cast(k_tt))


def _indefinite(n=20, dtype=np.float64):
  q, _ = np.linalg.qr(np.random.RandomState(3).randn(n, n))
  evals = np.linspace(1., 2., n)
  evals[0] = -0.05
  return ((q * evals) @ q.T).astype(dtype)


class SolversMatchEighTest(test_utils.NeuralTangentsTestCase):

  @parameterized.parameters('cholesky', 'cg')
  def test_gp_inference_matches_eigh(self, solver):
    k, y, k_t, k_tt = _problem()
    k = Kernels(jnp.asarray(k.nngp), jnp.asarray(k.ntk))
    kw = dict(diag_reg=1e-3, tol=1e-12)
    expected = predict.gp_inference(k, y, solver='eigh', **kw)(
        ('nngp', 'ntk', 'ntkgp'), k_t, Kernels(k_tt, k_tt))
    predict_fn = predict.gp_inference(k, y, solver=solver, **kw)
    got = predict_fn(('nngp', 'ntk', 'ntkgp'), k_t, Kernels(k_tt, k_tt))
    self.assertAllClose(got, expected, rtol=1e-8, atol=1e-8)
    info = predict_fn.solve_info['ntk']
    self.assertEqual(info.solver, solver)
    self.assertTrue(info.converged)
    self.assertLessEqual(info.residual, 1e-12)

  @parameterized.parameters('cholesky', 'cg')
  def test_gradient_descent_mse_matches_eigh(self, solver):
    k, y, k_t, _ = _problem()
    fx_train_0 = np.full_like(y, 0.3)
    expected = predict.gradient_descent_mse(k.ntk, y, diag_reg=1e-3,
                                            solver='eigh')(
                                                None, fx_train_0, 0.1, k_t.ntk)
    predict_fn = predict.gradient_descent_mse(k.ntk, y, diag_reg=1e-3,
                                              solver=solver, tol=1e-12)
    got = predict_fn(None, fx_train_0, 0.1, k_t.ntk)
    self.assertAllClose(got, expected, rtol=1e-8, atol=1e-8)
    self.assertEqual(predict_fn.solve_info.solver, solver)
    # Finite times still use the (cached) eigendecomposition.
    self.assertAllClose(predict_fn(1e9, fx_train_0, 0.1, k_t.ntk)[1],
                        expected[1], rtol=1e-6, atol=1e-6)

  def test_ensemble_infinite_time_matches_eigh(self):
    r = np.random.RandomState(1)
    x, x_test, y = r.randn(30, 4), r.randn(5, 4), r.randn(30, 2)

    def kernel_fn(x1, x2, get, **unused_kwargs):
      x2 = x1 if x2 is None else x2
      nngp = _relu_nngp(x1, x2)
      out = Kernels(jnp.asarray(nngp), jnp.asarray(2. * nngp + x1 @ x2.T))
      return out if isinstance(get, tuple) else getattr(out, get)

    kw = dict(diag_reg=1e-2)
    expected = predict.gradient_descent_mse_ensemble(
        kernel_fn, x, y, solver='eigh', **kw)(None, x_test, ('nngp', 'ntk'),
                                               compute_cov=True)
    got = predict.gradient_descent_mse_ensemble(kernel_fn, x, y, **kw)(
        None, x_test, ('nngp', 'ntk'), compute_cov=True)
    self.assertAllClose(got, expected, rtol=1e-9, atol=1e-9)


class HostKernelsTest(test_utils.NeuralTangentsTestCase):

  def _expected(self, k, y, k_t):
    return predict.gp_inference(jnp.asarray(k), y, diag_reg=1e-3,
                                solver='eigh')('nngp', k_t)

  def test_numpy_memmap_and_row_blocks(self):
    k, y, k_t, _ = _problem(n=80)
    expected = self._expected(k.nngp, y, k_t.nngp)
    with tempfile.TemporaryDirectory() as tmp:
      mm = np.memmap(os.path.join(tmp, 'k.f64'), np.float64, 'w+',
                     shape=k.nngp.shape)
      mm[:] = k.nngp
      rows = solve.KernelRows(lambda a, b: k.nngp[a:b], 80, block_rows=16,
                              dtype=np.float64)
      for train in (k.nngp, mm, rows):
        for rank in (0, 10):
          predict_fn = predict.gp_inference(
              train, y, diag_reg=1e-3, solver='cg', tol=1e-11,
              preconditioner_rank=rank)
          self.assertAllClose(predict_fn('nngp', k_t.nngp), expected,
                              rtol=1e-8, atol=1e-8)
          self.assertLessEqual(predict_fn.solve_info['nngp'].residual, 1e-11)
      del mm
    # Cholesky of a host array, and gradient_descent_mse on one.
    self.assertAllClose(
        predict.gp_inference(k.nngp, y, diag_reg=1e-3)('nngp', k_t.nngp),
        expected, rtol=1e-9, atol=1e-9)
    _, fx = predict.gradient_descent_mse(k.nngp, y, diag_reg=1e-3,
                                         solver='cg', tol=1e-11)(
                                             None, 0., 0., k_t.nngp)
    self.assertAllClose(fx, expected, rtol=1e-8, atol=1e-8)

  def test_preconditioner_cuts_iterations(self):
    k, y, _, _ = _problem(n=150)
    its = []
    for rank in (0, 40):
      solver = solve.factorize(k.nngp, 1e-4, solver='cg', tol=1e-8,
                               preconditioner_rank=rank)
      solver.solve(y)
      self.assertTrue(solver.info.converged)
      its.append(solver.info.iterations)
    self.assertLess(its[1], its[0] / 2)

  def test_device_kernel_rows_compile_once(self):
    # A kernel on an accelerator: its preconditioner reads 30 single rows,
    # by one program (a slice per start compiled 30, minutes on a TPU).
    k, y, k_t, _ = _problem(n=80)
    expected = self._expected(k.nngp, y, k_t.nngp)
    traces = []
    slice_rows = jax.lax.dynamic_slice_in_dim

    def counted(*args, **kwargs):
      traces.append(1)
      return slice_rows(*args, **kwargs)

    with mock.patch.object(kernel_rows, 'on_host',
                           lambda k: isinstance(k, np.ndarray)), \
        mock.patch.object(jax.lax, 'dynamic_slice_in_dim', counted):
      kernel_rows._device_rows.clear_cache()
      predict_fn = predict.gp_inference(
          jnp.asarray(k.nngp), y, diag_reg=1e-3, solver='cg', tol=1e-11,
          preconditioner_rank=30)
      self.assertAllClose(predict_fn('nngp', k_t.nngp), expected, rtol=1e-8,
                          atol=1e-8)
    self.assertLen(traces, 1)
    np.testing.assert_array_equal(
        kernel_rows.rows_of(jnp.asarray(k.nngp), 5, 8), k.nngp[5:8])

  def test_float32_kernel_reaches_float64_residuals(self):
    k, y, _, _ = _problem(n=120)
    solver = solve.factorize(k.nngp.astype(np.float32), 1e-4, solver='cg',
                             tol=1e-9)
    x = np.asarray(solver.solve(y), np.float64)
    k32 = k.nngp.astype(np.float32).astype(np.float64)
    reg = 1e-4 * np.mean(np.diagonal(k32))
    exact = np.linalg.solve(k32 + reg * np.eye(120), y)
    self.assertLess(solver.info.residual, 1e-9)
    # Returned in float32: exact to float32 rounding of the solution.
    self.assertLess(np.abs(x - exact).max() / np.abs(exact).max(), 1e-6)

  def test_not_converged_warns_and_reports(self):
    k, y, _, _ = _problem(n=100)
    predict_fn = predict.gp_inference(k.nngp, y, diag_reg=1e-6, solver='cg',
                                      maxiter=2, preconditioner_rank=0)
    with self.assertWarnsRegex(RuntimeWarning, r'did not converge.*maxiter'):
      predict_fn('nngp', k.nngp[:3])
    info = predict_fn.solve_info['nngp']
    self.assertFalse(info.converged)
    self.assertEqual(info.iterations, 2)
    self.assertGreater(info.residual, 1e-5)

  def test_solve_memory(self):
    """No `n x n` copies beyond the factor (Cholesky) or at all (CG)."""
    k, y, _, _ = _problem(n=600, out=10)
    kernel_bytes = k.nngp.nbytes
    for solver, limit in (('cg', 0.25), ('cholesky', 1.25)):
      tracemalloc.start()
      factor = solve.factorize(k.nngp, 1e-3, solver=solver, tol=1e-6,
                               preconditioner_rank=50)
      factor.solve(y)
      _, peak = tracemalloc.get_traced_memory()
      tracemalloc.stop()
      del factor
      self.assertLess(peak / kernel_bytes, limit, solver)


class NotPositiveDefiniteTest(test_utils.NeuralTangentsTestCase):

  @parameterized.product(dtype=(np.float32, np.float64),
                         solver=('cholesky', 'eigh'))
  def test_indefinite_kernel_raises_with_working_diag_reg(self, dtype,
                                                          solver):
    k = _indefinite(dtype=dtype)
    y = np.ones((20, 1), dtype)
    with self.assertRaisesRegex(ValueError, r'not positive semi-definite.*'
                                r'smallest eigenvalue is -0\.05.*`diag_reg` '
                                r'>= [0-9.e-]+') as cm:
      predict.gp_inference(k, y, solver=solver)('nngp', k[:3])
    suggested = float(str(cm.exception).split('>= ')[1].split(' ')[0])
    # The suggested value works (relative to the mean diagonal, ~1.5).
    self.assertBetween(suggested, 0.05 / 1.5, 0.2)
    with warnings.catch_warnings():
      warnings.simplefilter('error')
      out = predict.gp_inference(k, y, diag_reg=suggested, solver=solver)(
          'nngp', k[:3], k[:3, :3])
    self.assertFinite(out)
    with self.assertRaisesRegex(ValueError, 'not positive semi-definite'):
      predict.gradient_descent_mse(k, y)(1., 0., None, k[:3])

  @parameterized.parameters(np.float32, np.float64)
  def test_duplicated_points(self, dtype):
    k, y, k_t, _ = _problem(n=40, dtype=np.float64)
    idx = np.concatenate([np.arange(40), np.arange(10)])
    k_dup = k.nngp[idx][:, idx].astype(dtype)
    y_dup = y[idx].astype(dtype)
    with self.assertWarnsRegex(RuntimeWarning,
                               r'singular to working precision.*'
                               r'`diag_reg` >='):
      _, fx = predict.gradient_descent_mse(k_dup, y_dup)(
          None, 0., 0., k_t.nngp[:, idx].astype(dtype))
    self.assertFinite(fx)
    _, expected = predict.gradient_descent_mse(k.nngp, y)(None, 0., 0.,
                                                          k_t.nngp)
    tol = 1e-6 if dtype == np.float64 else 5e-2
    self.assertAllClose(fx, expected.astype(dtype), rtol=tol, atol=tol)
    # With a ridge: Cholesky, no warning, finite.
    with warnings.catch_warnings():
      warnings.simplefilter('error')
      out = predict.gp_inference(k_dup, y_dup, diag_reg=1e-3)(
          'nngp', k_t.nngp[:, idx].astype(dtype))
    self.assertFinite(out)

  @parameterized.parameters(np.float32, np.float64)
  def test_rank_deficient_kernel_is_pseudo_inverse(self, dtype):
    features = np.random.RandomState(4).randn(30, 6)
    k = (features @ features.T).astype(dtype)
    y = np.random.RandomState(5).randn(24, 2).astype(dtype)
    with self.assertWarnsRegex(RuntimeWarning, 'pseudo-inverse'):
      out = predict.gp_inference(k[:24, :24], y)('nngp', k[24:, :24],
                                                 k[24:, 24:])
    self.assertFinite(out)
    pinv = np.linalg.pinv(k[:24, :24].astype(np.float64), hermitian=True,
                          rcond=1e-6)
    tol = 1e-7 if dtype == np.float64 else 2e-2
    self.assertAllClose(out.mean, (k[24:, :24] @ pinv @ y).astype(dtype),
                        rtol=tol, atol=tol)

  def test_negative_diag_reg_raises(self):
    k, y, _, _ = _problem(n=10)
    kernel_fn = lambda x1, x2, get, **kw: k.nngp
    for make in (lambda: predict.gp_inference(k.nngp, y, diag_reg=-1e-3),
                 lambda: predict.gradient_descent_mse(k.nngp, y,
                                                      diag_reg=-1e-3),
                 lambda: predict.gradient_descent_mse_ensemble(
                     kernel_fn, np.zeros((10, 1)), y, diag_reg=-1e-3)):
      with self.assertRaisesRegex(ValueError,
                                  r'`diag_reg` must be >= 0.*-0\.001.*Pass'):
        make()

  def test_asymmetric_kernel_raises(self):
    k, y, _, _ = _problem(n=10)
    bad = k.nngp.copy()
    bad[0, 9] += 0.1
    with self.assertRaisesRegex(ValueError, r'`k_train_train` is not '
                                r'symmetric: entry \(0, 9\).*kernel_fn\('
                                r'x_train, None\)'):
      predict.gradient_descent_mse(bad, y)
    with self.assertRaisesRegex(ValueError, 'not symmetric'):
      predict.gp_inference(bad, y)('nngp', bad[:2])

  def test_bad_solver_arguments_raise(self):
    k, y, _, _ = _problem(n=10)
    with self.assertRaisesRegex(ValueError, r'`solver` must be one of.*lu'):
      predict.gp_inference(k.nngp, y, solver='lu')
    with self.assertRaisesRegex(ValueError, r'`tol`.*got 0'):
      predict.gradient_descent_mse(k.nngp, y, solver='cg', tol=0)
    rows = solve.KernelRows(lambda a, b: k.nngp[a:b], 10)
    with self.assertRaisesRegex(ValueError, r'only `solver="cg"`'):
      predict.gp_inference(rows, y)('nngp', k.nngp[:2])

  def test_bad_solver_argument_messages_give_the_fix(self):
    k, y, _, _ = _problem(n=10)
    with self.assertRaisesRegex(ValueError,
                                r'`tol`.*got 2\.0\. Pass e\.g\. tol=1e-5'):
      predict.gp_inference(k.nngp, y, solver='cg', tol=2.)
    with self.assertRaisesRegex(ValueError,
                                r'`maxiter`.*got 0\. Pass e\.g\. maxiter='):
      predict.gp_inference(k.nngp, y, solver='cg', maxiter=0)
    with self.assertRaisesRegex(ValueError, r'`preconditioner_rank`.*got -1\. '
                                r'Pass e\.g\. 100, or 0 for no'):
      predict.gp_inference(k.nngp, y, solver='cg', preconditioner_rank=-1)
    with self.assertRaisesRegex(TypeError, r"`diag_reg`.*got 'a'\. Pass a "
                                r'float'):
      predict.gp_inference(k.nngp, y, diag_reg='a')
    rows = solve.KernelRows(lambda a, b: k.nngp[a:b], 10)
    with self.assertRaisesRegex(ValueError, r"got solver='eigh'\. Pass "
                                r'solver="cg"'):
      predict.gp_inference(rows, y, solver='eigh')('nngp', k.nngp[:2])
    with self.assertRaisesRegex(ValueError, r'`n` must be a positive int; '
                                r'got 0\. Pass the number of rows'):
      solve.KernelRows(lambda a, b: k.nngp[a:b], 0)
    with self.assertRaisesRegex(TypeError, r'`rows_fn` must be callable.*got a '
                                r'ndarray\. Pass a function returning rows'):
      solve.KernelRows(k.nngp, 10)


class HalfPrecisionTest(test_utils.NeuralTangentsTestCase):

  def test_float16_solved_in_float32_returned_in_float16(self):
    k, y, k_t, _ = _problem(n=20, out=1)
    k16, y16, kt16 = (a.astype(np.float16) for a in (k.nngp, y, k_t.nngp))
    predict_fn = predict.gradient_descent_mse(k16, y16, diag_reg=1e-2)
    ref_fn = predict.gradient_descent_mse(k16.astype(np.float32),
                                          y16.astype(np.float32),
                                          diag_reg=1e-2)
    for t in (None, 5.):
      got = predict_fn(t, 0., 0., kt16)
      expected = ref_fn(t, 0., 0., kt16.astype(np.float32))
      for a, b in zip(got, expected):
        self.assertEqual(a.dtype, jnp.float16)
        self.assertAllClose(a.astype(np.float32), b, rtol=1e-2, atol=1e-2)


class JitTest(test_utils.NeuralTangentsTestCase):

  def test_traced_kernel_under_jit_matches_eager(self):
    k, y, k_t, _ = _problem(n=20)
    f = lambda kk: predict.gp_inference(kk, y, diag_reg=1e-3)('nngp',
                                                              k_t.nngp)
    self.assertAllClose(jax.jit(f)(k.nngp), f(k.nngp), rtol=1e-9, atol=1e-9)


if __name__ == '__main__':
  absltest.main()
