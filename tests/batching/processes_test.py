"""Tests of `nt.batch` across processes of JAX's distributed runtime.

Runs `examples/multihost_kernel.py` (the multi-host recipe of
`docs/scale.md`) as two local processes on 127.0.0.1, with two simulated CPU
devices each and JAX's CPU collectives (gloo): every process computes an
analytic CNN + fully connected kernel (into an on-disk store), an empirical
NTK and a Monte Carlo NTK, each equal to the single-process one,
with every block computed once across the processes; then predictions by
conjugate gradients from the store, each process reading only its row
blocks, equal to a one-process float64 direct solve.
"""
import ast
import functools
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tempfile

from absl.testing import absltest
import numpy as np

from tests import test_utils

_RECIPE = os.path.join(test_utils.REPO_ROOT, 'examples',
                       'multihost_kernel.py')
_TIMEOUT_S = 240
_N, _BATCH_SIZE = 8, 4  # 2 x 2 blocks: 2 diagonal ones and 1 above.


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


@functools.cache
def _recipe() -> object:
  spec = importlib.util.spec_from_file_location('multihost_kernel', _RECIPE)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def run_processes(n_processes: int, directory: str, *flags: str
                  ) -> list[dict[str, object]]:
  """Runs the recipe as `n_processes` local processes; their saved outputs."""
  port = _free_port()
  env = dict(os.environ, PYTHONPATH=test_utils.REPO_ROOT,
             JAX_PLATFORMS='cpu')
  output = os.path.join(directory, 'out')
  processes = []
  try:
    for i in range(n_processes):
      processes.append(subprocess.Popen(
          [sys.executable, _RECIPE, f'--coordinator_address=127.0.0.1:{port}',
           f'--num_processes={n_processes}', f'--process_id={i}',
           '--cpu_devices=2', '--x64', f'--n={_N}',
           f'--batch_size={_BATCH_SIZE}', f'--output={output}', *flags],
          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
          start_new_session=True))
    logs = [p.communicate(timeout=_TIMEOUT_S) for p in processes]
  finally:
    for p in processes:
      if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
  for p, (stdout, stderr) in zip(processes, logs):
    if p.returncode:
      raise AssertionError(f'process exited with {p.returncode}:\n{stdout}\n'
                           f'{stderr[-4000:]}')
  results = []
  for i in range(n_processes):
    with np.load(f'{output}.{i}.npz') as data:
      result = {k: data[k] for k in data.files if k != 'counts'}
      result['counts'] = ast.literal_eval(str(data['counts']))
    results.append(result)
  return results


@test_utils.needs_zarr
class TwoProcessesTest(test_utils.NeuralTangentsTestCase):

  def test_two_processes_compute_each_block_once_and_agree(self):
    with tempfile.TemporaryDirectory() as directory:
      results = run_processes(
          2, directory, f'--store={os.path.join(directory, "cnn")}',
          '--solve')
    # The single-process kernels, as one block each (one compilation).
    desired, _ = _recipe().kernels(_N, _N)
    names = ('cnn', 'empirical', 'monte_carlo')
    for name in names:
      with self.subTest(name):
        for result in results:
          self.assertEqual(result[name].dtype, np.float64)
          # Blocks may be computed on other devices than in one process.
          np.testing.assert_allclose(result[name], desired[name],
                                     rtol=1e-12, atol=1e-14)
        np.testing.assert_array_equal(results[0][name], results[1][name])
        counts = [r['counts'][name] for r in results]
        self.assertEqual([c['processes'] for c in counts], [2, 2])
        # Each process computes its share, together every block once: of
        # the 2 x 2 blocks, the 2 diagonal ones and the one above them.
        self.assertEqual([c['computed'] for c in counts], [2, 1])
        self.assertEqual([c['total'] for c in counts], [4, 4])
    self._check_predictions_from_store(results)

  def _check_predictions_from_store(self, results):
    # CG from the store across the 2 processes against a float64 direct
    # solve in one process, and each process read only its row blocks.
    recipe = _recipe()
    images, test, y = recipe.regression_data(_N, _N - 2)
    kernel_fn = recipe.cnn_kernel_fn()
    k = np.asarray(kernel_fn(images, None, 'ntk'), np.float64)
    k_test = np.asarray(kernel_fn(test, images, 'ntk'), np.float64)
    reg = 1e-2 * np.mean(np.diag(k))
    desired = k_test @ np.linalg.solve(k + reg * np.eye(_N), y)
    for result in results:
      np.testing.assert_allclose(result['predictions'], desired, rtol=1e-5,
                                 atol=1e-5 * np.abs(desired).max())
    np.testing.assert_array_equal(results[0]['predictions'],
                                  results[1]['predictions'])
    # 2 row blocks of 4 rows (train) and of 4 and 2 rows (test): block i is
    # process i's; the train blocks are read once per CG product.
    for index, result in enumerate(results):
      reads = result['counts']['reads']
      self.assertEqual(set(reads['train']), {index})
      self.assertEqual(set(reads['test']), {index})
      self.assertGreater(reads['train'][index], 1)


if __name__ == '__main__':
  absltest.main()
