"""Tests of `nt.batch(..., store=path)`: the resumable on-disk kernel.

A stored kernel equals the unbatched one; a second call reads every block
from the store and computes none; a store missing some blocks (records
removed, or a process killed with SIGKILL in the middle of a run) gets only
those recomputed; a store written for other inputs, arguments, batch size or
kernel function is refused with a `ValueError` naming the fix.
"""
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

from absl.testing import absltest
import jax
import numpy as np

import neural_tangents as nt
from neural_tangents import stax
from tests import test_utils



def _network(w_std=1.5):
  return stax.serial(stax.Dense(16, W_std=w_std, b_std=0.1), stax.Relu(),
                     stax.Dense(1, W_std=w_std, b_std=0.1))


def _inputs(n=7, seed=0):
  return np.random.default_rng(seed).standard_normal((n, 3))


@test_utils.needs_zarr
class StoreTest(test_utils.NeuralTangentsTestCase):

  def setUp(self):
    super().setUp()
    temporary = tempfile.TemporaryDirectory()
    self.addCleanup(temporary.cleanup)
    self.dir = temporary.name
    self.path = os.path.join(self.dir, 'kernel')

  def test_stored_kernel_equals_unbatched_and_is_read_back(self):
    _, _, kernel_fn = _network()
    x = _inputs()
    desired = kernel_fn(x, None, ('nngp', 'ntk'))
    batched = nt.batch(kernel_fn, 3, store_on_device=False, store=self.path)
    first = batched(x, None, ('nngp', 'ntk'))
    # 3 x 3 blocks: 3 diagonal and 3 above it computed, 3 transposed.
    self.assertEqual(batched.block_counts,
                     {'total': 9, 'computed': 6, 'from_store': 0,
                      'processes': 1})
    self.assertEqual(type(first.ntk).__module__.split('.')[0], 'zarr')
    self.assertAllClose(np.asarray(first.ntk), desired.ntk, rtol=1e-12)
    self.assertAllClose(np.asarray(first.nngp), desired.nngp, rtol=1e-12)
    second = nt.batch(kernel_fn, 3, store=self.path)(x, None, ('nngp', 'ntk'))
    self.assertIsInstance(second.ntk, jax.Array)
    np.testing.assert_array_equal(np.asarray(second.ntk),
                                  np.asarray(first.ntk))

  def test_only_missing_blocks_are_recomputed(self):
    _, _, kernel_fn = _network()
    x1, x2 = _inputs(5), _inputs(4, seed=1)
    batched = nt.batch(kernel_fn, 2, store_on_device=False, store=self.path)
    desired = np.asarray(batched(x1, x2, 'ntk'))
    self.assertEqual(batched.block_counts['computed'], 6)
    # A block whose record is lost, and whose chunk holds garbage, is redone.
    os.remove(os.path.join(self.path, 'complete', '1_0'))
    os.remove(os.path.join(self.path, 'complete', '2_1'))
    garbage = np.asarray(batched(x1, x2, 'ntk'))  # Reads all but 2 blocks.
    self.assertEqual(batched.block_counts['computed'], 2)
    self.assertEqual(batched.block_counts['from_store'], 4)
    np.testing.assert_array_equal(garbage, desired)

  def test_other_inputs_arguments_or_kernel_fn_are_refused(self):
    _, _, kernel_fn = _network()
    x = _inputs()
    nt.batch(kernel_fn, 3, store=self.path)(x, None, 'ntk')
    _, _, other_fn = _network(w_std=2.)
    for name, call in (
        ('inputs', lambda: nt.batch(kernel_fn, 3, store=self.path)(
            x + 1., None, 'ntk')),
        ('get', lambda: nt.batch(kernel_fn, 3, store=self.path)(
            x, None, 'nngp')),
        ('batch_size', lambda: nt.batch(kernel_fn, 2, store=self.path)(
            x, None, 'ntk')),
        ('kernel_fn', lambda: nt.batch(other_fn, 3, store=self.path)(
            x, None, 'ntk')),
    ):
      with self.subTest(name):
        with self.assertRaisesRegex(
            ValueError, r'store=.*holds a kernel of other inputs, arguments, '
            r'batch_size or kernel_fn.*Pass another directory'):
          call()

  def test_state_the_kernel_fn_keeps_is_not_its_fingerprint(self):
    # The programs a stax `kernel_fn` compiled per signature, and the choices
    # an empirical kernel remembers per shapes, changed the fingerprint: a
    # store refused its own call after a direct call of `kernel_fn` (or,
    # for an empirical kernel, after its first batched call).
    init_fn, apply_fn, kernel_fn = _network()
    _, params = init_fn(jax.random.PRNGKey(0), (-1, 3))
    x = _inputs()
    for name, fn, args in (
        ('stax', kernel_fn, ()),
        ('empirical', nt.empirical_kernel_fn(apply_fn), (params,))):
      with self.subTest(name):
        path = os.path.join(self.dir, name)
        batched = nt.batch(fn, 3, store_on_device=False, store=path)
        first = np.asarray(batched(x, None, 'ntk', *args))
        fn(_inputs(4, seed=1), None, 'ntk', *args)  # Another signature.
        again = np.asarray(batched(x, None, 'ntk', *args))
        self.assertEqual(batched.block_counts['computed'], 0)
        np.testing.assert_array_equal(again, first)

  def test_bad_store_arguments(self):
    _, _, kernel_fn = _network()
    with self.assertRaisesRegex(TypeError, r'`store` must be a directory path'
                                r'.*got 3.*store="kernel.zarr"'):
      nt.batch(kernel_fn, 3, store=3)
    batched = nt.batch(kernel_fn, 3, store=self.path)
    with self.assertRaisesRegex(ValueError, r'store=.*inside a trace.*'
                                r'store=None'):
      jax.jit(lambda x: batched(x, None, 'ntk'))(_inputs())
    os.makedirs(os.path.join(self.dir, 'other'))
    with self.assertRaisesRegex(ValueError, r'not a kernel store.*fingerprint'
                                r'.*Pass a new or empty directory'):
      with open(os.path.join(self.dir, 'other', 'fingerprint.json'),
                'w') as f:
        f.write('not json')
      nt.batch(kernel_fn, 3, store=os.path.join(self.dir, 'other'))(
          _inputs(), None, 'ntk')
    with self.assertRaisesRegex(ValueError, r'cov1.*store does not hold.*'
                                r'diagonal_batch=True'):
      nt.batch(kernel_fn, 3, store=os.path.join(self.dir, 'third'))(
          _inputs(), None, ('ntk', 'cov1'), diagonal_batch=False)


# Computes a stored kernel with blocks that each take >= 0.3 s when
# NT_TEST_BLOCK_SECONDS says so (read at run time, so it is not part of the
# store's fingerprint), and prints the block counts.
_SLOW_STORE_SCRIPT = textwrap.dedent('''
    import os, sys, time
    import jax
    import numpy as np
    import neural_tangents as nt
    from neural_tangents import stax

    def pause():
      time.sleep(float(os.environ.get('NT_TEST_BLOCK_SECONDS', '0')))

    _, _, kernel_fn = stax.serial(stax.Dense(16, W_std=1.5), stax.Relu(),
                                  stax.Dense(1, W_std=1.5))

    def slow_kernel_fn(x1, x2, get):
      jax.debug.callback(pause)
      return kernel_fn(x1, x2, get)

    x = np.random.default_rng(0).standard_normal((8, 3)).astype(np.float32)
    batched = nt.batch(slow_kernel_fn, 2, device_count=1,
                       store_on_device=False, store=sys.argv[1])
    k = np.asarray(batched(x, None, 'ntk'))
    np.save(sys.argv[2], k)
    print('counts', batched.block_counts['computed'],
          batched.block_counts['from_store'], flush=True)
''')


@test_utils.needs_zarr
class KilledRunTest(test_utils.NeuralTangentsTestCase):

  def test_sigkill_then_restart_recomputes_only_missing_blocks(self):
    temporary = tempfile.TemporaryDirectory()
    self.addCleanup(temporary.cleanup)
    directory = temporary.name
    store = os.path.join(directory, 'kernel')
    out = os.path.join(directory, 'k.npy')
    env = dict(os.environ, PYTHONPATH=test_utils.REPO_ROOT,
               JAX_PLATFORMS='cpu', NT_TEST_BLOCK_SECONDS='0.3')
    command = [sys.executable, '-c', _SLOW_STORE_SCRIPT, store, out]
    process = subprocess.Popen(command, env=env, start_new_session=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    records = os.path.join(store, 'complete')
    try:
      deadline = time.monotonic() + 120
      # 4 x 4 blocks of which 10 are computed; kill after 3 are complete.
      while time.monotonic() < deadline and process.poll() is None:
        if os.path.isdir(records) and len(os.listdir(records)) >= 3:
          os.killpg(process.pid, signal.SIGKILL)
          break
        time.sleep(0.05)
      process.wait(timeout=30)
    finally:
      if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
      process.stdout.close()
      process.stderr.close()
    self.assertEqual(process.returncode, -signal.SIGKILL)
    done = len([n for n in os.listdir(records) if '_' in n])
    self.assertBetween(done, 3, 9)

    env['NT_TEST_BLOCK_SECONDS'] = '0'
    result = subprocess.run(command, env=env, capture_output=True, text=True,
                            timeout=180, check=False, start_new_session=True)
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    counts = result.stdout.split('counts')[-1].split()
    self.assertEqual((int(counts[0]), int(counts[1])), (10 - done, done))

    _, _, kernel_fn = stax.serial(stax.Dense(16, W_std=1.5), stax.Relu(),
                                  stax.Dense(1, W_std=1.5))
    x = np.random.default_rng(0).standard_normal((8, 3)).astype(np.float32)
    self.assertAllClose(np.load(out), kernel_fn(x, None, 'ntk'),
                        rtol=test_utils.tolerance(np.float32, cpu=2e-5))


if __name__ == '__main__':
  absltest.main()
