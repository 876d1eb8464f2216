"""Tests of `predict/options.py`: `solve_options` checks every solver keyword
once and returns a frozen `SolveOptions`; the entry points check them once per
call, not once per factorization."""
import dataclasses
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from neural_tangents import predict
from neural_tangents._src.predict import options
from tests import test_utils


def _kernel(n=8, seed=0):
  x = np.random.RandomState(seed).randn(n, 3)
  return x @ x.T + np.eye(n), np.random.RandomState(seed + 1).randn(n, 2)


class SolveOptionsTest(test_utils.NeuralTangentsTestCase):

  def test_record_is_frozen_and_replace_keeps_other_fields(self):
    record = options.solve_options('cg', 1e-3, True, 1e-7, 50, 5)
    with self.assertRaises(dataclasses.FrozenInstanceError):
      record.solver = 'eigh'
    eigh = record.replace(solver='eigh')
    self.assertEqual(eigh, options.SolveOptions('eigh', 1e-3, True, 1e-7, 50,
                                                5))
    self.assertEqual(record.solver, 'cg')

  @parameterized.named_parameters(
      ('solver', dict(solver='lu'), ValueError, r'`solver` must be one of'),
      ('tol', dict(tol=1.5), ValueError, r'`tol` must be a float in \(0, 1\)'),
      ('maxiter', dict(maxiter=0), ValueError,
       r'`maxiter` must be a positive int or None'),
      ('rank', dict(preconditioner_rank=-1), ValueError,
       r'`preconditioner_rank` must be an int >= 0'),
      ('diag_reg_negative', dict(diag_reg=-1.), ValueError,
       r'`diag_reg` must be >= 0 and finite'),
      ('diag_reg_string', dict(diag_reg='1e-3'), TypeError,
       r'`diag_reg` must be a number >= 0'),
  )
  def test_bad_keyword_raises_the_entry_points_message(self, kwargs, error,
                                                       message):
    with self.assertRaisesRegex(error, message):
      options.solve_options(**kwargs)
    k, y = _kernel()
    # The entry points raise the same error, from the same check.
    with self.assertRaisesRegex(error, message):
      predict.gp_inference(k, y, **kwargs)

  def test_entry_points_check_options_once_per_call(self):
    k, y = _kernel()
    k_test = k[:3]
    with mock.patch.object(options, 'check_solver_args',
                           wraps=options.check_solver_args) as check:
      fn = predict.gradient_descent_mse(k, y, diag_reg=1e-3)
      fn(None, 0., 0., k_test)
      fn(2., 0., 0., k_test)
      self.assertEqual(check.call_count, 1)
      fn = predict.gp_inference(k, y, diag_reg=1e-3, solver='cg')
      fn('nngp', k_test, k[:3, :3])
      self.assertEqual(check.call_count, 2)


if __name__ == '__main__':
  absltest.main()
