"""The plan of a batched call: which blocks it computes, in which order.

A call of a batched kernel function on `N1 x N2` examples is a grid of
`B1 x B2` blocks (`Grid`). Its plan lists the blocks to compute as phases:

* `x2` given: one phase, every block `(i, j)`, row by row;
* `x2=None` (symmetric): the diagonal blocks `(i, i)` (computed with
  `x2=None`), then the blocks above the diagonal, `i < j`; the blocks below
  are the transposes of those above, unless an output is not known to
  transpose (`need_lower`), in which case they are computed too.

So a symmetric `3 x 3` grid computes `3 + 3 = 6` blocks, not 9. The first
block of the first phase is the *reference* block, whose output tells how
every output leaf is assembled (`assembling.leaf_specs`).

With a store or several processes, `deal` drops the blocks already complete
in the store and deals the others over the processes, continuing the deal
from one phase to the next (`ProcessGroup.arrange`).

Example:
  >>> plan = Plan(Grid(n1=6, n2=6, b1=2, b2=2, symmetric=True))
  >>> [(t.i, t.j) for phase in plan.phases() for t in phase]
  [(0, 0), (1, 1), (2, 2), (0, 1), (0, 2), (1, 2)]
  >>> [len(p.missing) for p in plan.deal({(0, 0), (0, 1)})]
  [2, 2]
"""
import dataclasses
from typing import Collection, Optional

from neural_tangents._src.batching.processes import ProcessGroup
from neural_tangents._src.batching.splitting import Grid
from neural_tangents._src.batching.splitting import Task


@dataclasses.dataclass(frozen=True)
class Plan:
  """The blocks of a call's grid to compute.

  Attributes:
    grid: the block grid.
    need_lower: (symmetric grids) whether the blocks below the diagonal are
      computed rather than transposed from those above.
  """
  grid: Grid
  need_lower: bool = False

  def diagonal(self) -> list[Task]:
    """The diagonal blocks of a symmetric grid (`x2=None`), else none."""
    if not self.grid.symmetric:
      return []
    return [Task(i, i, True) for i in range(self.grid.nb1)]

  def others(self) -> list[Task]:
    """Every other block to compute, row by row."""
    g = self.grid
    if not g.symmetric:
      return [Task(i, j, False) for i in range(g.nb1) for j in range(g.nb2)]
    return [Task(i, j, False) for i in range(g.nb1) for j in range(g.nb1)
            if j > i or (self.need_lower and j < i)]

  def phases(self) -> list[list[Task]]:
    """The non-empty lists of blocks, in order: diagonal, then others."""
    phases = [self.diagonal(), self.others()] if self.grid.symmetric else [
        self.others()]
    return [p for p in phases if p]

  def count(self) -> int:
    """How many blocks the plan computes."""
    return sum(map(len, self.phases()))

  def reference(self) -> Task:
    """The first block: its output says how outputs are assembled."""
    return self.phases()[0][0]

  def deal(self, done: Collection[tuple[int, int]] = (),
           group: Optional[ProcessGroup] = None) -> list['DealtPhase']:
    """Every phase without the blocks in `done`, dealt over `group`.

    Args:
      done: blocks `(i, j)` already complete (in a store).
      group: the processes sharing the blocks (default: this process only).

    Returns:
      One `DealtPhase` per phase.
    """
    group = group or ProcessGroup(0, 1)
    out = []
    dealt = 0
    for phase in self.phases():
      missing = [t for t in phase if (t.i, t.j) not in done]
      arranged = group.arrange(missing, dealt) if missing else []
      dealt += len(missing)
      out.append(DealtPhase(tuple(phase), tuple(missing), tuple(arranged)))
    return out


@dataclasses.dataclass(frozen=True)
class DealtPhase:
  """One phase of a plan, dealt over processes.

  Attributes:
    tasks: every block of the phase.
    missing: the blocks not complete in the store (all of them without one).
    arranged: `missing` after empty slots (`None`), task `k` going to process
      `k % count` (`ProcessGroup.arrange`); empty if nothing is missing.
  """
  tasks: tuple[Task, ...]
  missing: tuple[Task, ...]
  arranged: tuple[Optional[Task], ...]

  @property
  def from_store(self) -> int:
    """How many blocks of the phase are complete in the store."""
    return len(self.tasks) - len(self.missing)

  def owned_by(self, group: ProcessGroup) -> list[Task]:
    """The blocks of this phase that process `group.index` computes."""
    return group.share(self.arranged)
