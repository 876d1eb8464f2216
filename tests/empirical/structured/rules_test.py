"""Tests for `structured/rules/`: the table is the installed JAX's."""
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
from jax import lax
from jax.extend import core as jex_core
import jax.numpy as jnp
import numpy as np

import neural_tangents as nt
from neural_tangents import stax
from neural_tangents._src.empirical import einsum
from neural_tangents._src.empirical.structured import program
from neural_tangents._src.empirical.structured import rules
from neural_tangents._src.empirical.structured.rules import products
from tests import test_utils


def _traced_names(fn, *shapes) -> set[str]:
  avals = [[jax.ShapeDtypeStruct(s, jnp.float32)] for s in shapes]
  p = program.trace_program(lambda *a: [fn(*[x[0] for x in a])], *avals)
  return {e.name for e in p.eqns}


# Primitives that `jax.extend.core.primitives` does not list: each is named
# by what a public function traces to.
_PROBES = {
    'split': lambda: _traced_names(lambda x: jnp.split(x, 2)[0], (4,)),
    'stack': lambda: _traced_names(lambda x: jnp.stack([x, x]), (4,)),
    'optimization_barrier': lambda: _traced_names(
        lambda x: lax.optimization_barrier(x) + 1., (4,)),
}


def _installed_primitive_names() -> set[str]:
  module = jex_core.primitives
  names = {getattr(module, n).name for n in dir(module)
           if isinstance(getattr(module, n), jex_core.Primitive)}
  for probe in _PROBES.values():
    names |= probe()
  return names


class RulesTest(test_utils.NeuralTangentsTestCase):

  def test_every_record_names_an_installed_primitive(self):
    # A JAX release renaming a primitive fails here, not silently later (the
    # network would take the generic path, or fall back to Jacobians).
    installed = _installed_primitive_names()
    missing = sorted(set(rules.RULES) - installed)
    self.assertEqual(missing, [], f'{missing} are not primitives of JAX '
                     f'{jax.__version__}; rename their records in rules/ '
                     'and keep the old name in ALIASES.')

  def test_probes_trace_to_their_primitive(self):
    for name, probe in _PROBES.items():
      self.assertIn(name, probe())

  def test_aliases_are_old_names_of_records(self):
    installed = _installed_primitive_names()
    for old, new in rules.ALIASES.items():
      self.assertIn(new, rules.RULES)
      self.assertNotIn(old, rules.RULES)
      self.assertIs(rules.rule(old), rules.RULES[new])
      self.assertNotIn(old, installed)

  def test_calls_jax_makes(self):
    # `jit`, `checkpoint` and custom derivatives trace to recorded calls.
    x = jnp.ones(3)
    custom_jvp = jax.custom_jvp(jnp.sin)
    custom_jvp.defjvp(lambda primals, tangents: (jnp.sin(*primals),
                                                 tangents[0]))
    custom_vjp = jax.custom_vjp(jnp.sin)
    custom_vjp.defvjp(lambda x: (jnp.sin(x), None), lambda _, g: (g,))
    cases = {
        rules.INLINED: (jax.jit(jnp.sin), jax.checkpoint(jnp.sin)),
        rules.CUSTOM: (custom_jvp, custom_vjp),
    }
    for kind, fns in cases.items():
      for fn in fns:
        eqn, = jax.make_jaxpr(fn)(x).eqns
        self.assertTrue(rules.is_call(eqn.primitive.name, kind),
                        eqn.primitive.name)

  def test_custom_calls_tail_as_a_diagonal_when_their_body_is_elementwise(
      self):
    # The call records read the records of the body's primitives; the
    # diagonal is the call's own derivative rule (here `3 * tangent`).
    def custom(fn):
      wrapped = jax.custom_jvp(fn)
      wrapped.defjvp(lambda primals, tangents: (fn(*primals),
                                                3. * tangents[0]))
      return wrapped

    aval = [jax.ShapeDtypeStruct((3,), jnp.float32)]
    v = jnp.array([0.1, 0.5, 2.], jnp.float32)
    for fn, elementwise in ((lambda x: jnp.sin(2. * x) + x, True),
                            (lambda x: x[::-1], False)):
      p = program.trace_program(lambda a, fn=fn: [custom(fn)(a[0])], aval)
      eqn, = p.eqns
      self.assertTrue(rules.is_call(eqn.name, rules.CUSTOM), eqn.name)
      step = rules.rule(eqn.name).tail_step(eqn, 0, ['i'], einsum.Letters())
      if not elementwise:
        self.assertIsNone(step)
        continue
      letters, (factor,), scale, products = step
      self.assertEqual((letters, factor.letters, scale, products),
                       (['i'], ('i',), 1., 0))
      self.assertAllClose(factor.value(v), jnp.full_like(v, 3.))

  def test_sub_form_carries_its_sign(self):
    # `d(a - b)/db = -1` is the record's, not the planner's, knowledge.
    avals = [[jax.ShapeDtypeStruct((3,), jnp.float32)]] * 2
    p = program.trace_program(lambda a, b: [a[0] - b[0]], *avals)
    eqn, = p.eqns
    form = rules.rule('sub').jacobian_form
    self.assertEqual(form(eqn, 0, einsum.Letters())[3], 1.)
    self.assertEqual(form(eqn, 1, einsum.Letters())[3], -1.)

  def test_short_scans_expand_long_ones_stay_whole(self):
    def scanned(length):
      def fn(a):
        step = lambda c, w: (jnp.tanh(c * w), None)
        return [lax.scan(step, a[0], jnp.ones(length, jnp.float32))[0]]
      return {e.name for e in program.trace_program(
          fn, [jax.ShapeDtypeStruct((), jnp.float32)]).eqns}
    self.assertNotIn('scan', scanned(3))
    self.assertIn('tanh', scanned(3))
    self.assertIn('scan', scanned(rules.MAX_UNROLLED_SCAN + 1))

  def test_unit_reshape_letters_both_ways(self):
    self.assertEqual(rules.unit_reshape_letters((3, 1, 4), (3, 4),
                                                [0, None, 1]), [0, 1])
    self.assertEqual(rules.unit_reshape_letters((3, 4), (1, 3, 4, 1),
                                                [0, 1]), [None, 0, 1, None])
    self.assertIsNone(rules.unit_reshape_letters((3, 4), (12,), [0, 1]))

  def test_records_are_consistent(self):
    for name, r in rules.RULES.items():
      with self.subTest(name):
        self.assertEqual(r.name, name)
        # A letter map or region only exists along a chain.
        if r.leaf_letters is not None or r.leaf_region is not None:
          self.assertIsNotNone(r.linear_in)
        if r.call is not None:
          self.assertIn(r.call, (rules.INLINED, rules.CUSTOM))


# `conv_windows` gathers windows of at most this many entries, else loops.
_WINDOWS_PATHS = {'gathered': 10**9, 'looped': 0}


class ConvWindowsTest(test_utils.NeuralTangentsTestCase):
  """`conv_windows` contracted with a filter is XLA's convolution, gathered
  (small windows) or copied by a loop (large ones) alike."""

  @test_utils.sample_product(
      layout={'nhwc': ('NHWC', 'HWIO', 'NHWC'),
              'nchw': ('NCHW', 'OIHW', 'NCHW'),
              'nwhc': ('NWHC', 'HWIO', 'NHWC')},  # Spatial axes reversed.
      strides=[(1, 1), (2, 1)], padding=[((1, 1), (0, 2)), ((0, 0), (1, 0))],
      lhs_dilation=[(1, 1), (1, 2)], rhs_dilation=[(1, 1), (2, 1)])
  def test_windows_contracted_with_a_filter_are_the_convolution(
      self, layout, strides, padding, lhs_dilation, rhs_dilation):
    lhs_spec, rhs_spec, _ = layout
    shape = {'N': 2, 'H': 7, 'W': 6, 'C': 3}
    x = jax.random.normal(jax.random.PRNGKey(0),
                          [shape[c] for c in lhs_spec], jnp.float32)
    filter_shape = (3, 2)
    w_shape = {'H': 3, 'W': 2, 'I': 3, 'O': 4}
    w = jax.random.normal(jax.random.PRNGKey(1),
                          [w_shape[c] for c in rhs_spec], jnp.float32)
    numbers = lax.conv_dimension_numbers(x.shape, w.shape, layout)
    out = lax.conv_general_dilated(
        x, w, strides, padding, lhs_dilation, rhs_dilation, numbers,
        precision=lax.Precision.HIGHEST)
    out_spatial = [out.shape[d] for d in numbers.out_spec[2:]]
    windows = {}
    for name, max_elements in _WINDOWS_PATHS.items():
      with mock.patch.object(products, 'GATHERED_WINDOWS_MAX_ELEMENTS',
                             max_elements):
        windows[name] = products.conv_windows(
            x, filter_shape, out_spatial, strides, padding, lhs_dilation,
            rhs_dilation, numbers.lhs_spec[2:], numbers.lhs_spec[1])
    # Both paths copy the same entries, so the contraction below checks both.
    np.testing.assert_array_equal(windows['gathered'], windows['looped'])
    windows = windows['looped']
    # windows: x's axes (spatial ones at output positions), with (kh, kw)
    # before the feature axis.
    x_letters = lhs_spec.lower().replace('c', 'kli')
    w_letters = rhs_spec.lower().replace('h', 'k').replace('w', 'l')
    expected = jnp.einsum(f'{x_letters},{w_letters}->nohw'.replace(
        'nohw', ''.join('o' if c == 'C' else c.lower() for c in layout[2])),
                          windows, w, precision=lax.Precision.HIGHEST)
    self.assertAllClose(expected, out, rtol=1e-5, atol=1e-5)

  @parameterized.parameters(*_WINDOWS_PATHS)
  def test_structured_ntk_differentiates_as_jacobian_contraction(self, path):
    # Gathered or copied in a loop, the windows keep the NTK differentiable
    # in both modes (reverse in the parameters, forward in the inputs), with
    # a strided and a padded convolution.
    init_fn, f, _ = stax.serial(
        stax.Conv(4, (3, 3), strides=(2, 1), padding='SAME'), stax.Relu(),
        stax.Conv(3, (2, 3), padding='VALID'), stax.Flatten(), stax.Dense(2))
    x1, x2 = test_utils.random_inputs((3, 7, 9, 2), (2, 7, 9, 2))
    _, params = init_fn(jax.random.PRNGKey(2), x1.shape)
    self.enter_context(mock.patch.object(
        products, 'GATHERED_WINDOWS_MAX_ELEMENTS', _WINDOWS_PATHS[path]))
    results = []
    for implementation in (nt.NtkImplementation.JACOBIAN_CONTRACTION,
                           nt.NtkImplementation.STRUCTURED_DERIVATIVES):
      ntk_fn = nt.empirical_ntk_fn(f, trace_axes=(), vmap_axes=0,
                                   implementation=implementation)
      grad = jax.jit(jax.grad(lambda p: jnp.sum(ntk_fn(x1, x2, p) ** 2)))(
          params)
      tangent = jax.jit(lambda x: jax.jvp(lambda y: ntk_fn(y, x2, params),
                                          (x,), (jnp.ones_like(x),))[1])(x1)
      results.append((grad, tangent))
    self.assertAllClose(results[0], results[1], rtol=1e-5, atol=1e-5)


if __name__ == '__main__':
  absltest.main()
