"""Tests for `empirical/implementations.py`: one registry for api and AUTO."""
from absl.testing import absltest

from neural_tangents._src.empirical import auto
from neural_tangents._src.empirical import implementations
from neural_tangents._src.empirical import structured
from tests import test_utils

NtkImplementation = implementations.NtkImplementation


class RegistryTest(test_utils.NeuralTangentsTestCase):

  def test_every_member_but_auto_has_one_record(self):
    members = [r.member for r in implementations.REGISTRY]
    self.assertCountEqual(members, [m for m in NtkImplementation
                                    if m != NtkImplementation.AUTO])

  def test_auto_has_no_kernel_function_of_its_own(self):
    with self.assertRaisesRegex(ValueError, r'implementation=.*AUTO.*pass '
                                r'one of .*STRUCTURED_DERIVATIVES'):
      implementations.implementation(NtkImplementation.AUTO)

  def test_candidate_names_and_weights(self):
    # The published weighting: structured derivatives' estimated cost is
    # divided by STRUCTURED_SPEEDUP, per-example ones also by EXAMPLE_SPEEDUP.
    s = implementations.STRUCTURED_SPEEDUP
    self.assertEqual(implementations.CANDIDATE_SPEEDUPS, {
        'jacobian_contraction': 1., 'ntk_vector_products': 1.,
        'structured_whole': s, 'structured_separable': s,
        'structured_example': s * implementations.EXAMPLE_SPEEDUP})
    self.assertEqual(auto.SEPARABLE, 'structured_separable')
    self.assertEqual(auto.EXAMPLE, 'structured_example')

  def test_modes_are_structured_modes(self):
    for record in implementations.REGISTRY:
      self.assertEqual(record.planned is None, not record.modes)
      for mode in record.modes:
        self.assertIsInstance(mode, structured.Mode)


if __name__ == '__main__':
  absltest.main()
