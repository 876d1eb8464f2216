"""Tests of `batching/runners.py`: how the blocks of a call are computed.

Every runner yields, for each block, what `kernel_fn` returns on that
block's inputs called directly (a loop over `call.inputs(task)`); the
sharded runner is checked on two host devices in a subprocess, the process
runner with a stand-in for a second process.
"""
import dataclasses
import json
import os
import subprocess
import sys
import textwrap

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.batching.call import Call
from neural_tangents._src.batching.plan import Plan
from neural_tangents._src.batching.processes import ProcessGroup
from neural_tangents._src.batching.runners import BlockFunction
from neural_tangents._src.batching.runners import local_runner
from neural_tangents._src.batching.runners import ProcessRunner
from neural_tangents._src.batching.runners import SerialRunner
from neural_tangents._src.batching.runners import ShardedRunner
from tests import test_utils



def _KERNEL_FN(x1, x2=None, get=None):  # pylint: disable=invalid-name
  """A small kernel function (quick to compile): `tanh(x1 x2^T)`."""
  del get
  return jnp.tanh(x1 @ (x1 if x2 is None else x2).T)


def _call(n=5, batch_size=2):
  x = np.random.default_rng(0).standard_normal((n, 3))
  return Call(_KERNEL_FN, x, None, ('ntk',), {}, batch_size)


def _direct(call, tasks):
  """Each block computed by calling `kernel_fn` on its inputs."""
  return [np.asarray(_KERNEL_FN(*call.inputs(t), 'ntk')) for t in tasks]


class _Bar:

  def __init__(self):
    self.updates = []

  def update(self, n):
    self.updates.append(n)


class SerialRunnerTest(test_utils.NeuralTangentsTestCase):

  @parameterized.parameters(True, False)
  def test_blocks_equal_a_direct_loop(self, on_host):
    call = _call()
    tasks = [t for phase in Plan(call.grid).phases() for t in phase]
    runner = SerialRunner(BlockFunction(_KERNEL_FN, jax.devices()[:1]),
                          on_host)
    bar = _Bar()
    out = list(runner.run(tasks, call, bar))
    self.assertEqual([t for t, _ in out], tasks)
    self.assertTrue(all(isinstance(b, np.ndarray) == on_host
                        for _, b in out))
    self.assertAllClose([np.asarray(b) for _, b in out],
                        _direct(call, tasks))
    self.assertEqual(runner.computed, 6)
    self.assertEqual(bar.updates, [1] * 6)

  def test_local_runner_is_serial_on_one_device_or_in_a_trace(self):
    one = BlockFunction(_KERNEL_FN, jax.devices()[:1])
    self.assertIs(type(local_runner(one, True, traced=False)), SerialRunner)
    if len(jax.devices()) > 1:
      many = BlockFunction(_KERNEL_FN, jax.devices())
      self.assertIs(type(local_runner(many, True, traced=True)),
                    SerialRunner)
      self.assertIs(type(local_runner(many, True, traced=False)),
                    ShardedRunner)


@dataclasses.dataclass(frozen=True)
class _SecondOfTwo(ProcessGroup):
  """Process 1 of 2; process 0's blocks come from `others` (by task)."""
  others: dict = dataclasses.field(default_factory=dict, hash=False)
  rounds_seen: list = dataclasses.field(default_factory=list, hash=False)

  def gather(self, tree):
    round_index = len(self.rounds_seen)
    self.rounds_seen.append(tree)
    theirs = self.others.get(round_index, np.zeros_like(tree))
    return np.stack([theirs, np.asarray(tree)])


class ProcessRunnerTest(test_utils.NeuralTangentsTestCase):

  def test_each_process_computes_its_share_and_yields_every_block(self):
    call = _call(n=7)  # 4 diagonal blocks.
    phase = Plan(call.grid).deal((), ProcessGroup(1, 2))[0]
    tasks = list(phase.tasks)
    expected = _direct(call, tasks)
    # Process 0 owns tasks 0 and 2, contributed in rounds 0 and 1.
    group = _SecondOfTwo(1, 2, others={0: expected[0], 1: expected[2]})
    local = SerialRunner(BlockFunction(_KERNEL_FN, jax.devices()[:1]), True)
    runner = ProcessRunner(local, group)
    template = jax.ShapeDtypeStruct(expected[0].shape, expected[0].dtype)
    out = list(runner.gathered(phase.arranged, call, template))
    self.assertEqual([t for t, _ in out], tasks)
    self.assertAllClose([b for _, b in out], expected)
    self.assertEqual(runner.computed, 2)  # Tasks 1 and 3 only.
    self.assertLen(group.rounds_seen, 2)
    own = list(ProcessRunner(SerialRunner(local.block_fn, True),
                             group).own(phase.arranged, call))
    self.assertEqual([t for t, _ in own], [tasks[1], tasks[3]])


_SHARDED_SCRIPT = textwrap.dedent('''
    import json
    import jax
    import numpy as np
    import jax.numpy as jnp
    from neural_tangents._src.batching.call import Call
    from neural_tangents._src.batching.plan import Plan
    from neural_tangents._src.batching.runners import BlockFunction
    from neural_tangents._src.batching.runners import SerialRunner
    from neural_tangents._src.batching.runners import ShardedRunner

    kernel_fn = lambda x1, x2=None, get=None: jnp.tanh(
        x1 @ (x1 if x2 is None else x2).T)
    x = np.random.default_rng(0).standard_normal((7, 3))
    call = Call(kernel_fn, x, None, ('ntk',), {}, 2)
    tasks = Plan(call.grid).others()  # 6 blocks: 3 rounds of 2 devices.
    block_fn = BlockFunction(kernel_fn, jax.devices())
    serial = [b for _, b in SerialRunner(block_fn, True).run(tasks, call)]
    out = {'devices': len(jax.devices())}
    for on_host in (True, False):
      runner = ShardedRunner(block_fn, on_host)
      got = list(runner.run(tasks[:5], call))  # Last round padded.
      out[str(on_host)] = {
          'tasks': [t == u for (t, _), u in zip(got, tasks)],
          'computed': runner.computed,
          'error': max(float(np.max(np.abs(np.asarray(b) - s)))
                       for (_, b), s in zip(got, serial)),
          'numpy': all(isinstance(b, np.ndarray) for _, b in got),
      }
    print(json.dumps(out))
''')


class ShardedRunnerTest(absltest.TestCase):

  def test_blocks_on_two_devices_equal_serial_ones(self):
    env = dict(os.environ, JAX_PLATFORMS='cpu',
               XLA_FLAGS='--xla_force_host_platform_device_count=2')
    result = subprocess.run([sys.executable, '-c', _SHARDED_SCRIPT],
                            env=env, capture_output=True, text=True,
                            timeout=300, check=False)
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    out = json.loads(result.stdout.strip().splitlines()[-1])
    self.assertEqual(out['devices'], 2)
    for on_host in ('True', 'False'):
      self.assertEqual(out[on_host]['tasks'], [True] * 5)
      self.assertEqual(out[on_host]['computed'], 5)
      self.assertLess(out[on_host]['error'], 1e-5)
      self.assertEqual(out[on_host]['numpy'], on_host == 'True')


if __name__ == '__main__':
  absltest.main()
