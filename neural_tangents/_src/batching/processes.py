"""Dividing the blocks of a batched call over the processes of JAX's runtime.

With JAX's distributed runtime initialized (`jax.distributed.initialize`,
`jax.process_count() > 1`), every process runs the same batched call. Each
computes the blocks `k` with `k % process_count == process_index` of the
list of blocks to compute (the same list on every process), and the
outputs are shared with `jax.experimental.multihost_utils.process_allgather`,
one block per process at a time, so that every process assembles the same
result. With an on-disk store nothing is gathered: each process writes its
blocks and waits for the others (`sync_global_devices`).

Example:
  >>> group = ProcessGroup.current()
  >>> group.share(['a', 'b', 'c'])  # one process: every block
  ['a', 'b', 'c']
"""
import dataclasses
from typing import Any, Sequence

import jax
from jax.experimental import multihost_utils
import numpy as np


@dataclasses.dataclass(frozen=True)
class ProcessGroup:
  """This process's place among the processes computing a batched call."""
  index: int
  count: int

  @classmethod
  def current(cls) -> 'ProcessGroup':
    return cls(jax.process_index(), jax.process_count())

  @property
  def distributed(self) -> bool:
    return self.count > 1

  def share(self, tasks: Sequence[Any]) -> list[Any]:
    """The tasks of `tasks` this process computes."""
    return list(tasks[self.index::self.count])

  def rounds(self, tasks: Sequence[Any]) -> int:
    """How many gathers share `tasks` (the longest share)."""
    return -(-len(tasks) // self.count)

  def owner_tasks(self, tasks: Sequence[Any], round_index: int
                  ) -> list[Any]:
    """`[task of process p in round round_index or None for p]`."""
    return [tasks[k] if k < len(tasks) else None
            for k in range(round_index * self.count,
                           (round_index + 1) * self.count)]

  def gather(self, tree: Any) -> Any:
    """Every process's `tree` (same structure and shapes), stacked on axis 0."""
    if not self.distributed:
      return jax.tree_util.tree_map(lambda x: np.asarray(x)[None], tree)
    return multihost_utils.process_allgather(tree, tiled=False)

  def barrier(self, name: str) -> None:
    """Waits until every process reaches the barrier `name`."""
    if self.distributed:
      multihost_utils.sync_global_devices(name)
