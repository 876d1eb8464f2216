"""Tests of `batching/plan.py`: which blocks a batched call computes."""
from absl.testing import absltest

from neural_tangents._src.batching.plan import Plan
from neural_tangents._src.batching.processes import ProcessGroup
from neural_tangents._src.batching.splitting import Grid
from neural_tangents._src.batching.splitting import Task


def _ij(tasks):
  return [(t.i, t.j) for t in tasks]


_SYMMETRIC_3X3 = Grid(n1=5, n2=5, b1=2, b2=2, symmetric=True)


class PlanTest(absltest.TestCase):

  def test_symmetric_grid_computes_the_upper_triangle(self):
    plan = Plan(_SYMMETRIC_3X3)
    self.assertEqual([_ij(p) for p in plan.phases()],
                     [[(0, 0), (1, 1), (2, 2)], [(0, 1), (0, 2), (1, 2)]])
    self.assertEqual(plan.count(), 6)
    self.assertTrue(all(t.diagonal for t in plan.diagonal()))
    self.assertFalse(any(t.diagonal for t in plan.others()))
    self.assertEqual(plan.reference(), Task(0, 0, True))

  def test_need_lower_computes_every_block(self):
    plan = Plan(_SYMMETRIC_3X3, need_lower=True)
    self.assertEqual(plan.count(), 9)
    self.assertEqual(_ij(plan.others()),
                     [(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)])

  def test_given_x2_computes_every_block_row_by_row(self):
    plan = Plan(Grid(n1=3, n2=5, b1=2, b2=2, symmetric=False),
                need_lower=True)  # Ignored without symmetry.
    self.assertEqual([_ij(p) for p in plan.phases()],
                     [[(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]])
    self.assertEqual(plan.diagonal(), [])
    self.assertEqual(plan.reference(), Task(0, 0, False))

  def test_one_block_has_no_second_phase(self):
    plan = Plan(Grid(n1=2, n2=2, b1=2, b2=2, symmetric=True))
    self.assertEqual([_ij(p) for p in plan.phases()], [[(0, 0)]])

  def test_deal_skips_blocks_in_the_store(self):
    dealt = Plan(_SYMMETRIC_3X3).deal({(1, 1), (0, 1), (0, 2), (1, 2)})
    self.assertEqual([_ij(p.missing) for p in dealt], [[(0, 0), (2, 2)], []])
    self.assertEqual([p.from_store for p in dealt], [1, 3])
    self.assertEqual([_ij(p.arranged) for p in dealt], [[(0, 0), (2, 2)], []])
    self.assertEqual(_ij(dealt[0].owned_by(ProcessGroup(0, 1))),
                     [(0, 0), (2, 2)])

  def test_deal_over_processes_continues_across_phases(self):
    # 3 diagonal blocks dealt to processes 0, 1, 0; the next phase starts
    # with process 1, so that shares differ by at most one block.
    dealt = Plan(_SYMMETRIC_3X3).deal((), ProcessGroup(1, 2))
    self.assertEqual([p.arranged[0] for p in dealt],
                     [Task(0, 0, True), None])
    shares = [[_ij(p.owned_by(ProcessGroup(k, 2))) for p in dealt]
              for k in range(2)]
    self.assertEqual(shares, [[[(0, 0), (2, 2)], [(0, 2)]],
                              [[(1, 1)], [(0, 1), (1, 2)]]])


if __name__ == '__main__':
  absltest.main()
