"""Runners: how the blocks of a batched call are computed.

A runner takes a list of blocks (`Task`s) and the `call.Call` they are
blocks of, and yields `(task, output)` for each, in order:

* `SerialRunner`: one block at a time, `jax.jit(kernel_fn)` on the default
  device (also inside a trace, where outputs stay traced values);
* `ShardedRunner`: `len(devices)` blocks at a time, stacked on a leading
  axis and sharded over a 1-D `Mesh` of the local devices with
  `jax.shard_map`, one block per device;
* `ProcessRunner`: blocks dealt over the processes of JAX's distributed
  runtime (`processes.ProcessGroup`); each process computes its share with
  a local runner, and either every process yields every block (`gathered`,
  shared with `process_allgather`) or only its own (`own`, for a store).

`local_runner` picks the serial or sharded runner. Outputs are numpy arrays
with `on_host`, device arrays (on the first device) otherwise. Runners count
the blocks they compute (`computed`) and advance a progress bar.

Example:
  >>> kernel_fn = lambda x1, x2=None, get=None: x1 @ (x1 if x2 is None
  ...                                                  else x2).T
  >>> call = Call(kernel_fn, jnp.ones((4, 2)), None, (), {}, 2)
  >>> runner = SerialRunner(BlockFunction(kernel_fn, jax.devices()[:1]),
  ...                       on_host=True)
  >>> diagonal = [Task(0, 0, True), Task(1, 1, True)]
  >>> [(t.i, out.shape) for t, out in runner.run(diagonal, call)]
  [(0, (2, 2)), (1, (2, 2))]
"""
import functools
from typing import Any, Callable, Iterator, Optional, Sequence

import jax
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec
import numpy as np

from neural_tangents._src.batching.call import Call
from neural_tangents._src.batching.processes import ProcessGroup
from neural_tangents._src.batching.splitting import merge_static
from neural_tangents._src.batching.splitting import stack
from neural_tangents._src.batching.splitting import Static
from neural_tangents._src.batching.splitting import Task

# Name of the mesh axis that blocks are spread over.
_DEVICES = 'devices'

# What a runner yields: each block and its output.
Blocks = Iterator[tuple[Task, Any]]


class BlockFunction:
  """`kernel_fn` on a block, jitted once per batched function.

  Calls are `(static, x1, x2, split_kwargs, shared_arrays)`, with
  `merge_static(static, shared_arrays) == (args, shared_kwargs)`.
  """

  def __init__(self, kernel_fn: Callable[..., Any], devices: Sequence[Any]):
    self.kernel_fn = kernel_fn
    self.devices = list(devices)
    self.single = jax.jit(self.call, static_argnums=0)
    if len(self.devices) > 1:
      self.mesh = Mesh(np.array(self.devices), (_DEVICES,))
      self.sharded = jax.jit(self._call_sharded, static_argnums=0)

  def call(self, static: Static, x1: Any, x2: Any, split_kwargs: Any,
           shared: Sequence[Any]) -> Any:
    """`kernel_fn` on one block (not jitted)."""
    args, kwargs = merge_static(static, shared)
    return self.kernel_fn(x1, x2, *args, **kwargs, **split_kwargs)

  def _call_sharded(self, static: Static, x1: Any, x2: Any,
                    split_kwargs: Any, shared: Sequence[Any]) -> Any:
    """Inputs stacked on a leading device axis: one block per device."""
    def local(x1, x2, split_kwargs, shared):
      first = lambda tree: jax.tree_util.tree_map(lambda x: x[0], tree)
      out = self.call(static, first(x1), first(x2), first(split_kwargs),
                      shared)
      return jax.tree_util.tree_map(lambda x: x[None], out)

    stacked = PartitionSpec(_DEVICES)
    return jax.shard_map(
        local, mesh=self.mesh,
        in_specs=(stacked, stacked, stacked, PartitionSpec()),
        out_specs=stacked, check_vma=False)(x1, x2, split_kwargs, shared)

  def shapes(self, call: Call, task: Task) -> Any:
    """The output of `task`'s block as `ShapeDtypeStruct`s, not computed."""
    return jax.eval_shape(
        functools.partial(self.call, call.static),
        *call.inputs(task), call.split_kwargs(task), call.shared)


class SerialRunner:
  """Computes blocks one at a time on the default device.

  Attributes:
    block_fn: the jitted kernel function.
    on_host: whether outputs are moved to host memory (numpy).
    computed: how many blocks this runner computed.
  """

  def __init__(self, block_fn: BlockFunction, on_host: bool):
    self.block_fn = block_fn
    self.on_host = on_host
    self.computed = 0

  def run(self, tasks: Sequence[Task], call: Call, bar: Any = None) -> Blocks:
    """Yields `(task, output)` of every task, in order.

    Args:
      tasks: the blocks to compute.
      call: the call they are blocks of.
      bar: a progress bar (`update(n)`) or None.
    """
    for task in tasks:
      self.computed += 1
      out = self._one(task, call)
      if bar is not None:
        # JAX dispatches asynchronously: the bar counts finished blocks.
        out = jax.block_until_ready(out)
        bar.update(1)
      yield task, out

  def _one(self, task: Task, call: Call) -> Any:
    out = self.block_fn.single(call.static, *call.inputs(task),
                               call.split_kwargs(task), call.shared)
    return jax.device_get(out) if self.on_host else out


class ShardedRunner(SerialRunner):
  """Computes `len(block_fn.devices)` blocks at a time, one per device.

  Blocks are stacked, sharded over the devices' `Mesh` and computed by one
  `shard_map`; the last group is padded with copies of its last block (the
  same shapes on every device). A single block runs as in `SerialRunner`.
  """

  def run(self, tasks: Sequence[Task], call: Call, bar: Any = None) -> Blocks:
    if len(tasks) <= 1:
      yield from super().run(tasks, call, bar)
      return
    n = len(self.block_fn.devices)
    for start in range(0, len(tasks), n):
      chunk = list(tasks[start:start + n])
      self.computed += len(chunk)
      outs = self._sharded(chunk, n, call)
      if bar is not None:
        outs = jax.block_until_ready(outs)
        bar.update(len(chunk))
      yield from zip(chunk, outs)

  def _sharded(self, chunk: list[Task], n: int, call: Call) -> list[Any]:
    real = len(chunk)
    padded = chunk + [chunk[-1]] * (n - real)  # Uniform shapes per device.
    mesh = self.block_fn.mesh
    stacked = NamedSharding(mesh, PartitionSpec(_DEVICES))
    put = lambda tree: jax.device_put(tree, stacked)
    pairs = [call.inputs(t) for t in padded]
    x1 = put(stack([p[0] for p in pairs]))
    x2 = None if pairs[0][1] is None else put(stack([p[1] for p in pairs]))
    split_kwargs = put(stack([call.split_kwargs(t) for t in padded]))
    shared = jax.device_put(call.shared, NamedSharding(mesh, PartitionSpec()))
    out = self.block_fn.sharded(call.static, x1, x2, split_kwargs, shared)
    if self.on_host:
      out = jax.device_get(out)
      return [jax.tree_util.tree_map(lambda x, t=t: x[t], out)
              for t in range(real)]
    default = self.block_fn.devices[0]
    return [jax.tree_util.tree_map(
        lambda x, t=t: jax.device_put(_shard(x, t), default), out)
            for t in range(real)]


def local_runner(block_fn: BlockFunction, on_host: bool,
                 traced: bool) -> SerialRunner:
  """The runner of this process's devices: sharded over several, if any.

  Args:
    block_fn: the jitted kernel function (its `devices`).
    on_host: whether outputs are moved to host memory.
    traced: whether the call is traced (then blocks run one at a time).
  """
  if not traced and len(block_fn.devices) > 1:
    return ShardedRunner(block_fn, on_host)
  return SerialRunner(block_fn, on_host)


class ProcessRunner:
  """Blocks dealt over processes, computed by each with a local runner.

  The lists it runs are `arrange`d (`plan.DealtPhase.arranged`): task `k`
  belongs to process `k % group.count`, `None` is an empty slot.
  """

  def __init__(self, local: SerialRunner, group: ProcessGroup):
    self.local = local
    self.group = group

  @property
  def computed(self) -> int:
    return self.local.computed

  def own(self, arranged: Sequence[Optional[Task]], call: Call,
          bar: Any = None) -> Blocks:
    """Yields the blocks of this process's share only."""
    return self.local.run(self.group.share(arranged), call, bar)

  def gathered(self, arranged: Sequence[Optional[Task]], call: Call,
               template: Any, bar: Any = None) -> Blocks:
    """Yields every block of `arranged`, the same on every process.

    Args:
      arranged: the blocks, dealt over processes.
      call: the call they are blocks of.
      template: the `ShapeDtypeStruct`s of a block's output (what a process
        without a block in a round contributes, as zeros).
      bar: a progress bar or None (advanced by this process's blocks).
    """
    outputs = self.own(arranged, call, bar)
    zeros = jax.tree_util.tree_map(lambda s: np.zeros(s.shape, s.dtype),
                                   template)
    group = self.group
    for r in range(group.rounds(arranged)):
      owners = group.owner_tasks(arranged, r)
      mine = zeros if owners[group.index] is None else (
          jax.device_get(next(outputs)[1]))
      gathered = group.gather(mine)
      for p, task in enumerate(owners):
        if task is None:
          continue
        block = jax.tree_util.tree_map(lambda x, p=p: np.asarray(x[p]),
                                       gathered)
        if not self.local.on_host:
          block = jax.device_put(block, self.local.block_fn.devices[0])
        yield task, block


def _shard(x: jax.Array, t: int) -> jax.Array:
  """Block `t` of an array sharded one block per device, on its device."""
  for shard in x.addressable_shards:
    start = shard.index[0].start or 0
    if start == t:
      return shard.data[0]
  return x[t]
