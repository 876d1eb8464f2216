"""The ensemble's joint kernel call (`_joint_kernel_matrices`): one
`kernel_fn` call on the concatenated inputs gives the predictions of the three
separate calls, and is used only where it applies."""
import os
import tempfile
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np

import neural_tangents as nt
from neural_tangents import predict
from neural_tangents._src.predict import ensemble
from neural_tangents import stax
from neural_tangents._src.stax.requirements import is_pairwise_kernel_fn
from tests import test_utils


def _network():
  return stax.serial(stax.Dense(512, W_std=1.5, b_std=0.05), stax.Relu(),
                     stax.Dense(512, W_std=1.5, b_std=0.05), stax.Erf(),
                     stax.Dense(1, W_std=1.5, b_std=0.05))


class JointKernelTest(test_utils.NeuralTangentsTestCase):

  @parameterized.parameters(
      dict(t=None, get='ntk', compute_cov=True),
      dict(t=np.array([0.5, 10.]), get=('nngp', 'ntkgp'), compute_cov=True),
      dict(t=3., get='nngp', compute_cov=False),
  )
  def test_joint_equals_separate_calls(self, t, get, compute_cov):
    _, _, kernel_fn = _network()
    rng = np.random.RandomState(0)
    x_train, x_test = rng.randn(6, 3), rng.randn(4, 3)
    y_train = rng.randn(6, 2)
    calls = []

    def separate(x1, x2, get, **kwargs):
      # Not a stax `kernel_fn`: the ensemble calls it once per block.
      calls.append((np.shape(x1)[0], None if x2 is None else np.shape(x2)[0]))
      return kernel_fn(x1, x2, get, **kwargs)

    self.assertTrue(is_pairwise_kernel_fn(kernel_fn))
    self.assertFalse(is_pairwise_kernel_fn(separate))
    args = dict(t=t, x_test=x_test, get=get, compute_cov=compute_cov)
    with mock.patch.object(ensemble, '_kernel_fn_matrices',
                           wraps=ensemble._kernel_fn_matrices) as matrices:
      joint = predict.gradient_descent_mse_ensemble(
          kernel_fn, x_train, y_train, diag_reg=1e-3)(**args)
    # One call, on the 10 points together.
    self.assertEqual([(np.shape(c.args[1])[0], c.args[2])
                      for c in matrices.call_args_list], [(10, None)])
    want = predict.gradient_descent_mse_ensemble(
        separate, x_train, y_train, diag_reg=1e-3)(**args)
    self.assertIn((4, 6), calls)  # The test-train block, separately.
    for a, b in zip(jax.tree_util.tree_leaves(joint),
                    jax.tree_util.tree_leaves(want)):
      self.assertAllClose(a, b, rtol=1e-10, atol=1e-12)

  def test_not_joint_for_mismatched_or_large_inputs(self):
    _, _, kernel_fn = _network()
    x = np.ones((3, 2))
    self.assertIsNone(ensemble._joint_kernel_matrices(
        kernel_fn, x, np.ones((2, 3)), ('nngp',), {}))
    self.assertIsNone(ensemble._joint_kernel_matrices(
        kernel_fn, x, np.ones((2, 2), np.float32), ('nngp',), {}))
    self.assertIsNone(ensemble._joint_kernel_matrices(
        kernel_fn, x, x, ('nngp',), {'diagonal_spatial': False}))
    self.assertIsNone(ensemble._joint_kernel_matrices(
        kernel_fn, x, np.ma.masked_array(x), ('nngp',), {}))
    big = np.ones((ensemble.JOINT_KERNEL_MAX_POINTS, 2))
    self.assertIsNone(ensemble._joint_kernel_matrices(
        kernel_fn, big, x, ('nngp',), {}))
    blocks = ensemble._joint_kernel_matrices(kernel_fn, x, 2 * x[:2],
                                             ('nngp',), {})
    self.assertEqual([b['nngp'].shape for b in blocks],
                     [(3, 3), (2, 3), (2, 2)])



@test_utils.needs_zarr
class StoredEnsembleTest(test_utils.NeuralTangentsTestCase):
  """`gradient_descent_mse_ensemble` over `nt.batch(..., store=d)` (issue 52
  item 12): its second call was refused ("pass another directory"), which
  the user cannot do through the ensemble."""

  def test_each_call_gets_its_own_store_under_the_directory(self):
    directory = self.enter_context(tempfile.TemporaryDirectory())
    _, _, kernel_fn = stax.serial(stax.Dense(16, W_std=1.5, b_std=0.1),
                                  stax.Relu(), stax.Dense(1))
    r = np.random.RandomState(0)
    x = r.randn(20, 5).astype(np.float32)
    y = r.randn(20, 1).astype(np.float32)
    x_tests = r.randn(6, 5).astype(np.float32), r.randn(3, 5).astype(
        np.float32)
    root = os.path.join(directory, 'kernels')
    stored = predict.gradient_descent_mse_ensemble(
        nt.batch(kernel_fn, 8, store_on_device=False, store=root), x, y,
        diag_reg=1e-3)
    memory = predict.gradient_descent_mse_ensemble(kernel_fn, x, y,
                                                   diag_reg=1e-3)
    # The first test set again (and at another time): from its stores.
    for x_test, t in zip(x_tests + x_tests[:1], (None, None, 10.)):
      want = memory(t, x_test, 'ntk', compute_cov=True)
      got = stored(t, x_test, 'ntk', compute_cov=True)
      self.assertAllClose(got, want, rtol=1e-4, atol=1e-5)
    # train_train, and test_train / test_test per test set.
    names = sorted(os.listdir(root))
    self.assertLen(names, 5)
    self.assertEqual(sorted({n.rsplit('_', 1)[0] for n in names}),
                     ['test_test', 'test_train', 'train_train'])


if __name__ == '__main__':
  absltest.main()
