"""Dividing the blocks of a batched call over the processes of JAX's runtime.

With JAX's distributed runtime initialized (`jax.distributed.initialize`,
`jax.process_count() > 1`), every process runs the same batched call. Each
computes the blocks `k` with `k % process_count == process_index` of the
list of blocks to compute (the same list on every process; the diagonal
blocks of a symmetric call, then the others, continuing the deal), and the
outputs are shared with `jax.experimental.multihost_utils.process_allgather`,
one block per process at a time, so that every process assembles the same
result. With an on-disk store nothing is gathered: each process writes its
blocks and waits for the others (`sync_global_devices`).

Example:
  >>> group = ProcessGroup.current()
  >>> group.share(group.arrange(['a', 'b', 'c']))  # one process: all
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

  def arrange(self, tasks: Sequence[Any], offset: int = 0) -> list[Any]:
    """`tasks` after `offset % count` empty slots (`None`).

    Task `k` of the result goes to process `k % count`: with `offset` the
    number of tasks dealt before, consecutive lists continue the deal, so
    that the processes' shares differ by at most one task overall.
    """
    return [None] * (offset % self.count) + list(tasks)

  def share(self, arranged: Sequence[Any]) -> list[Any]:
    """The tasks of an `arrange`d list this process computes."""
    return [t for t in arranged[self.index::self.count] if t is not None]

  def rounds(self, arranged: Sequence[Any]) -> int:
    """How many gathers share an `arrange`d list (the longest share)."""
    return -(-len(arranged) // self.count)

  def owner_tasks(self, arranged: Sequence[Any], round_index: int
                  ) -> list[Any]:
    """`[task of process p in round round_index, or None]` for every `p`."""
    return [arranged[k] if k < len(arranged) else None
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
