"""Sinks: where the finished blocks of a batched call go.

A sink receives every computed block (`add(task, output)`), then returns
the assembled output leaves (`finish()`), in `tree_leaves` order of a
block's output. `done` is the set of blocks `(i, j)` the sink already holds
(which the plan skips).

* `MemorySink`: the blocks assembled in memory by an `Assembler`, into
  preallocated numpy arrays on host (`on_host`) or concatenated on the
  device at the end;
* `StoreSink`: the blocks written into a resumable on-disk `Store` (one zarr
  array per leaf, a record per complete block); `done` are the blocks
  complete there, and `finish` reads the result back.

Example:
  >>> grid = Grid(n1=3, n2=3, b1=2, b2=2, symmetric=True)
  >>> sink = MemorySink([LeafSpec('', Role.PAIR)], grid, on_host=True)
  >>> sink.add(Task(0, 0, True), np.ones((2, 2)))
  >>> sink.add(Task(1, 1, True), 3 * np.ones((2, 2)))
  >>> sink.add(Task(0, 1, False), 2 * np.ones((2, 2)))
  >>> sink.finish()[0]
  array([[1., 1., 2.],
         [1., 1., 2.],
         [2., 2., 3.]])
"""
from typing import Any, Collection

import jax

from neural_tangents._src.batching.assembling import Assembler
from neural_tangents._src.batching.assembling import LeafSpec
from neural_tangents._src.batching.assembling import Role
from neural_tangents._src.batching.processes import ProcessGroup
from neural_tangents._src.batching.splitting import Grid
from neural_tangents._src.batching.splitting import Task
from neural_tangents._src.batching.store import Store


class MemorySink:
  """Blocks assembled in memory, on host (numpy) or on the device.

  Attributes:
    assembler: the `Assembler` collecting the blocks.
    done: blocks already held (none).
  """

  def __init__(self, specs: list[LeafSpec], grid: Grid, on_host: bool,
               transpose: bool = True):
    """Assembles the leaves `specs` of `grid`'s blocks.

    Args:
      specs: the specs of the output leaves (`leaf_specs`).
      grid: the block grid.
      on_host: whether blocks are written into host (numpy) arrays.
      transpose: whether the blocks below the diagonal of a symmetric grid
        are the transposes of those above (else they are added too).
    """
    self.assembler = Assembler(specs, grid, on_host)
    self.assembler.transpose = transpose
    self.done: Collection[tuple[int, int]] = frozenset()

  def add(self, task: Task, out: Any) -> None:
    """Adds the output of block `task`."""
    self.assembler.add(task, out)

  def finish(self) -> list[Any]:
    """The assembled leaves (`None` for full covariances, filled later)."""
    return self.assembler.finish()


def check_storable(specs: list[LeafSpec], block_leaves: list[Any]) -> None:
  """Raises a ValueError for output leaves a store does not hold.

  Args:
    specs: the specs of the output leaves.
    block_leaves: the leaves of a block's output (`.shape`).
  """
  for spec, leaf in zip(specs, block_leaves):
    if spec.role in (Role.MASK1, Role.MASK2) or (
        spec.role in (Role.SELF1, Role.SELF2) and not spec.diagonal_batch):
      raise ValueError(
          f'`store=` holds kernels between examples; output '
          f'{spec.path or "array"} of shape {leaf.shape} is a '
          f'{spec.role.name.lower()} leaf, which a store does not hold. '
          "Ask for `get='nngp'`/`'ntk'` (with diagonal_batch=True), or "
          'pass store=None.')


class StoreSink:
  """Blocks written into a resumable on-disk store, shared by processes.

  Opening the sink checks that the store holds this call's kernel (its
  fingerprint), creates its arrays (process 0, then every process opens
  them) and reads the record of complete blocks (`done`), the same on every
  process.

  Attributes:
    store: the `Store`.
    assembler: the `Assembler` writing blocks into the store's arrays.
    done: the blocks complete in the store when it was opened.
  """

  def __init__(self, path: str, fingerprint: str, specs: list[LeafSpec],
               block_leaves: list[Any], grid: Grid, group: ProcessGroup,
               store_on_device: bool, transpose: bool = True):
    """Opens (or creates) the store at `path`.

    Args:
      path: the store's directory.
      fingerprint: what the call computes (`store.fingerprint_of`).
      specs: the specs of the output leaves.
      block_leaves: the leaves of a block's output (`.shape`, `.dtype`).
      grid: the block grid (the arrays' chunks are its blocks).
      group: the processes writing into the store.
      store_on_device: whether `finish` loads the result onto the device
        (else it returns the zarr arrays).
      transpose: as for `MemorySink`.

    Raises:
      ValueError: if an output leaf cannot be stored, or the store holds
        another kernel.
    """
    check_storable(specs, block_leaves)
    self.group = group
    self.store_on_device = store_on_device
    self.store = Store(path, fingerprint)
    if group.index == 0:
      self.store.create()
    group.barrier('nt.batch: store created')
    self.store.check()
    self.assembler = Assembler(
        specs, grid, True, lambda spec, *a: self.store.array(spec.path, *a))
    self.assembler.transpose = transpose
    # One process creates the arrays, then every process opens them, and
    # all read the same record of complete blocks before any writes.
    if group.index == 0:
      self.assembler.allocate_all(block_leaves)
    group.barrier('nt.batch: store arrays created')
    if group.index != 0:
      self.assembler.allocate_all(block_leaves)
    self.done = self.store.completed()
    group.barrier('nt.batch: store record read')

  def add(self, task: Task, out: Any) -> None:
    """Writes the output of block `task` and records it as complete."""
    self.assembler.add(task, out)
    self.store.mark_complete(task, self.assembler.take_written())

  def finish(self) -> list[Any]:
    """Waits for every process; the leaves read from the store."""
    self.group.barrier('nt.batch: store complete')
    leaves = self.assembler.host
    if self.store_on_device:
      leaves = [jax.numpy.asarray(leaf[...]) for leaf in leaves]
    return leaves
