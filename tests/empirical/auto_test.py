"""Tests of `empirical.auto`: AUTO weighs per-example and whole-batch
formulations when they agree, and skips tracing only candidates that could
not have won.
"""
import collections
import functools
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp

import neural_tangents as nt
from neural_tangents._src.empirical import auto
from neural_tangents._src.empirical import implementations
from neural_tangents._src.empirical import problem as problem_lib
from tests import test_utils
from tests.empirical.reference import batch_position_iota
from tests.empirical.reference import batch_position_scaled
from tests.empirical.reference import batch_size_scaled
from tests.empirical.reference import cnn
from tests.empirical.reference import cnn_inputs
from tests.empirical.reference import cnn_params
from tests.empirical.reference import explicit_ntk
from tests.empirical.reference import mlp
from tests.empirical.reference import mlp_params
from tests.empirical.reference import normal
from tests.empirical.reference import TOL


class AutoTest(test_utils.NeuralTangentsTestCase):
  """AUTO weighs per-example and whole-batch formulations when they agree."""

  def _formulation(self, f, vmap_axes, x2=None):
    # As `AUTO` calls it: separability comes from planning the candidates.
    params = mlp_params()
    x1 = normal(1, (4, 3))
    setup = functools.partial(problem_lib.setup, f, x1, x2, params, {},
                              (-1,), ())
    problem, param_leaves, data1, data2 = setup(vmap_axes)
    separable = auto.SEPARABLE in auto.candidates(problem, param_leaves,
                                                  data1, data2)
    return auto.other_formulation(setup, vmap_axes, param_leaves, data1,
                                  data2, separable=separable)

  def test_per_example_formulation_without_vmap_axes(self):
    other = self._formulation(mlp, None, normal(2, (3, 3)))
    self.assertIsNotNone(other)
    self.assertTrue(other.per_example)
    # And the whole-batch one with vmap_axes=0.
    self.assertFalse(self._formulation(mlp, 0).per_example)

  @parameterized.named_parameters(
      ('batch_size_literal', batch_size_scaled),
      ('batch_position_constant', batch_position_scaled),
      ('batch_position_iota', batch_position_iota))
  def test_no_per_example_formulation_when_batch_of_one_differs(self, f):
    self.assertIsNone(self._formulation(f, None))

  def test_no_per_example_formulation_when_examples_interact(self):
    f = lambda p, x: mlp(p, x - jnp.mean(x, axis=0, keepdims=True))
    self.assertIsNone(self._formulation(f, None))

  def test_choice_is_per_static_keyword_value(self):
    # Examples interact only with `train=True`: the choice made for
    # `train=False` (per-example derivatives) must not be reused for it.
    def f(params, x, train=False):
      y = mlp(params, x)
      return y - jnp.mean(y, axis=0, keepdims=True) if train else y
    params = mlp_params()
    x1, x2 = normal(1, (4, 3)), normal(2, (3, 3))
    ntk_fn = nt.empirical_ntk_fn(f, (), (), None, nt.NtkImplementation.AUTO)
    for train in (False, True, False):
      self.assertAllClose(
          ntk_fn(x1, x2, params, train=train),
          explicit_ntk(functools.partial(f, train=train), params, x1, x2, ()),
          rtol=TOL, atol=TOL)

  @parameterized.named_parameters(
      ('mlp', mlp), ('batch_size_literal', batch_size_scaled),
      ('batch_position_constant', batch_position_scaled),
      ('batch_position_iota', batch_position_iota))
  def test_auto_without_vmap_axes_equals_explicit(self, f):
    params = mlp_params()
    x1, x2 = normal(1, (4, 3)), normal(2, (3, 3))
    ntk_fn = nt.empirical_ntk_fn(f, (), (), None, nt.NtkImplementation.AUTO)
    for second in (None, x2):
      self.assertAllClose(ntk_fn(x1, second, params),
                          explicit_ntk(f, params, x1, second, ()),
                          rtol=TOL, atol=TOL)


class ParameterProductFlopsTest(test_utils.NeuralTangentsTestCase):
  """The FLOPs behind the bounds: products with a parameter factor only."""

  def _flops(self, f, params, vmap_axes, side=0):
    x1, x2 = normal(1, (4, 3)), normal(2, (3, 3))
    problem, leaves, data1, data2 = problem_lib.setup(
        f, x1, x2, params, {}, (-1,), (), vmap_axes)
    return auto.parameter_product_flops(problem, side, leaves,
                                        (data1, data2)[side])

  @parameterized.parameters(None, 0)
  def test_mlp_counts_every_weight_product(self, vmap_axes):
    # Widths 3 -> 5 -> 4 -> 2: 2 (3 5 + 5 4 + 4 2) = 86 FLOPs per example.
    self.assertEqual(self._flops(mlp, mlp_params(), vmap_axes), 86. * 4)
    self.assertEqual(self._flops(mlp, mlp_params(), vmap_axes, side=1),
                     86. * 3)

  def test_products_without_a_derivative_are_not_counted(self):
    c, c2 = normal(3, (3, 5)), normal(4, (5, 2))

    @jax.custom_jvp
    def custom(y, w):  # Its own derivative rule: not looked into.
      return y @ w
    custom.defjvp(lambda primals, tangents: (custom(*primals),
                                             custom(*tangents)))

    def f(p, x):
      constant = (x @ c) @ p['v']  # Only the second product: 2 5 2 = 20.
      floored = jnp.floor(x @ p['w']) @ c2  # 2 3 5 = 30; floor's is zero.
      stopped = x @ jax.lax.stop_gradient(p['w'])  # Not counted.
      called = jax.jit(lambda y, w: y @ w)(x, p['w'])  # 30, inside a call.
      saved = jax.checkpoint(lambda y, w: y @ w)(x, p['w'])  # 30, as well.
      ruled = custom(x, p['w']) @ c2  # Neither product.
      return (constant + floored + ruled +
              (stopped + called + saved) @ c2)  # And 20.

    params = {'v': normal(5, (5, 2)), 'w': normal(6, (3, 5))}
    self.assertEqual(self._flops(f, params, 0),
                     (20. + 30. + 30. + 30. + 20.) * 4)

  def test_convolutions(self):
    x1, x2 = cnn_inputs()
    problem, leaves, data1, _ = problem_lib.setup(cnn, x1, x2, cnn_params(),
                                                  {}, (-1,), (), 0)
    # Per example of 4 x 5 x 2: SAME 3 x 3 x 2 -> 3 makes 4 5 3 outputs of
    # 18 products; then 2 x 2 x 3 -> 2 with strides (2, 1), padding
    # ((1, 0), (0, 1)) and rhs dilation (1, 2) makes 2 4 2 outputs of 12.
    self.assertEqual(
        auto.parameter_product_flops(problem, 0, leaves, data1),
        2. * (4 * 5 * 3 * 18 + 2 * 4 * 2 * 12) * 3)


class BranchAndBoundTest(test_utils.NeuralTangentsTestCase):
  """Tracing fewer candidates changes neither the choice nor the kernel."""

  @test_utils.sample_product(
      net=['mlp', 'cnn'], vmap_axes=[None, 0],
      axes={'traced': ((-1,), ()), 'untraced': ((), ()),
            'batch_diagonal': ((-1,), (0,))})
  def test_bounds_hold_and_choice_equals_exhaustive(self, net, vmap_axes,
                                                    axes):
    trace_axes, diagonal_axes = axes
    if net == 'mlp':
      f, params = mlp, mlp_params()
      x1, x2 = normal(1, (4, 3)), normal(2, (4, 3))
    else:
      f, params = cnn, cnn_params()
      x1, x2 = cnn_inputs()
      x2 = x2[:1].repeat(3, 0) + x1  # Equal batch sizes (diagonal axes).
    setup = functools.partial(problem_lib.setup, f, x1, x2, params, {},
                              trace_axes, diagonal_axes)
    problem, leaves, data1, data2 = setup(vmap_axes)
    other = functools.partial(auto.other_formulation, setup, vmap_axes,
                              leaves, data1, data2)
    formulations = [problem]
    own = auto.candidates(problem, leaves, data1, data2)
    alternative = other(verify=True, separable=auto.SEPARABLE in own)
    if alternative is not None:
      formulations.append(alternative)
    for formulation in formulations:
      for name, fn in auto.candidates(formulation, leaves, data1,
                                      data2).items():
        cost = auto.estimated_cost(fn, formulation, leaves, data1, data2)
        weighted = cost / implementations.CANDIDATE_SPEEDUPS[name]
        bound = auto.cost_lower_bound(name, formulation, leaves, data1,
                                       data2)
        self.assertLessEqual(bound, weighted, msg=name)
        if name in (auto.JACOBIAN, auto.VECTOR_PRODUCTS):
          self.assertGreater(bound, 0., msg=name)  # A bound with teeth.
    pruned, exhaustive = {}, {}
    auto.choose(problem, other, leaves, data1, data2, (), pruned)
    auto.choose(problem, other, leaves, data1, data2, (), exhaustive,
                exhaustive=True)
    (chosen,), (best,) = pruned.values(), exhaustive.values()
    self.assertEqual(chosen[1], best[1])  # The candidate's name.
    ntk_fn = nt.empirical_ntk_fn(f, trace_axes, diagonal_axes, vmap_axes,
                                 nt.NtkImplementation.AUTO)
    self.assertAllClose(ntk_fn(x1, x2, params),
                        explicit_ntk(f, params, x1, x2, trace_axes,
                                     diagonal_axes), rtol=TOL, atol=TOL)


class TraceReuseTest(test_utils.NeuralTangentsTestCase):
  """The first call runs the winner as traced for its cost: one trace."""

  @parameterized.parameters(None, 0)
  def test_winner_traced_once(self, vmap_axes):
    traces = collections.Counter()
    real_candidates = auto.candidates

    def counting_candidates(*args):
      def counted(name, fn):
        def traced(*fn_args):
          traces[name] += 1  # Runs only when JAX traces the candidate.
          return fn(*fn_args)
        return traced
      return {name: counted(name, fn)
              for name, fn in real_candidates(*args).items()}

    params, x1, x2 = mlp_params(), normal(1, (4, 3)), normal(2, (3, 3))
    ntk_fn = nt.empirical_ntk_fn(mlp, vmap_axes=vmap_axes,
                                 implementation=nt.NtkImplementation.AUTO)
    with mock.patch.object(auto, 'candidates', counting_candidates):
      kernel = ntk_fn(x1, x2, params)
    self.assertNotEmpty(traces)
    self.assertEqual(max(traces.values()), 1, msg=dict(traces))
    self.assertAllClose(kernel, explicit_ntk(mlp, params, x1, x2, (-1,), ()),
                        rtol=TOL, atol=TOL)


if __name__ == '__main__':
  absltest.main()
