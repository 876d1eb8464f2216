"""Tests of the suite's own case sampling (`test_utils.sample_cases`)."""
import itertools

from absl.testing import absltest

from tests import test_utils


class SampleCasesTest(absltest.TestCase):

  def test_every_pair_of_values_is_covered(self):
    factors = dict(impl='abcd', vmap=(None, 0, 'tree'), axes=range(6),
                   dtype=('f32', 'f64'))
    cases = test_utils.sample_cases(**factors)
    for n1, n2 in itertools.combinations_with_replacement(factors, 2):
      seen = {(c[n1], c[n2]) for c in cases}
      wanted = {(a, b) for a in factors[n1] for b in factors[n2]
                if n1 != n2 or a == b}
      self.assertEqual(seen, wanted, (n1, n2))
    if not test_utils.FULL:  # A subset: 4 * 3 * 6 * 2 = 144 cases in all.
      self.assertLess(len(cases), 40)

  def test_the_subset_is_the_same_on_every_collection(self):
    # pytest-xdist requires every worker to collect the same tests.
    make = lambda: test_utils.sample_cases(a=range(5), b=range(4), c='xyz',
                                           seed_name='t')
    self.assertEqual(make(), make())
    names = [c['testcase_name'] for c in make()]
    self.assertLen(set(names), len(names))

  def test_coupled_parameters_stay_together(self):
    cases = test_utils.sample_cases(
        [dict(padding='SAME', size=3), dict(padding='VALID', size=1)],
        dtype=('f32', 'f64'))
    for case in cases:
      self.assertEqual(case['size'], {'SAME': 3, 'VALID': 1}[case['padding']])
    self.assertLen(cases, 4)

  def test_a_single_factor_runs_every_value(self):
    self.assertEqual([c['n'] for c in test_utils.sample_cases(n=(0, 1, 3))],
                     [0, 1, 3])


if __name__ == '__main__':
  absltest.main()
