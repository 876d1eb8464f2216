"""Tests of `empirical.program_cost`: FLOPs and bytes counted on a jaxpr
agree with XLA's cost analysis of its lowering."""
import functools

from absl.testing import absltest
from absl.testing import parameterized
import jax
from jax import lax
import jax.numpy as jnp

from neural_tangents._src.empirical import auto
from neural_tangents._src.empirical import problem as problem_lib
from neural_tangents._src.empirical import program_cost
from tests import test_utils
from tests.empirical.reference import cnn
from tests.empirical.reference import cnn_inputs
from tests.empirical.reference import cnn_params
from tests.empirical.reference import mlp
from tests.empirical.reference import mlp_params
from tests.empirical.reference import normal


def _xla_cost(fn, *args) -> tuple[float, float]:
  cost = jax.jit(fn).trace(*args).lower().cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0]
  return float(cost.get('flops', 0.)), float(cost.get('bytes accessed', 0.))


def _counted(fn, *args) -> tuple[float, float]:
  return program_cost.program_cost(jax.make_jaxpr(fn)(*args).jaxpr)


def _conv(strides, padding, lhs_dilation, rhs_dilation):
  return lambda x, w: lax.conv_general_dilated(
      x, w, strides, padding, lhs_dilation, rhs_dilation,
      ('NHWC', 'HWIO', 'NHWC'))


_X = normal(1, (3, 8, 16))
_V = normal(2, (1, 8, 16))
_M = normal(3, (16, 5))
_IMAGES = normal(4, (2, 7, 6, 3))
_FILTER = normal(5, (3, 2, 3, 4))
_WIDE = normal(6, (4, 32, 64))

# Programs whose every equation follows a rule of `program_cost` exactly.
PROGRAMS = {
    'dot': (lambda x, m: x @ m, _X, _M),
    'conv_same': (_conv((1, 1), 'SAME', (1, 1), (1, 1)), _IMAGES, _FILTER),
    'conv_strided_padded': (_conv((2, 1), ((2, 1), (0, 3)), (1, 1), (1, 2)),
                            _IMAGES, _FILTER),
    'conv_lhs_dilated': (_conv((1, 1), ((1, 1), (2, 0)), (2, 3), (1, 1)),
                         _IMAGES, _FILTER),
    'elementwise_and_scalars': (lambda x: jnp.maximum(2. * x - 1., 0.), _X),
    'size_one_broadcast': (lambda x, v: lax.add(x, v), _X, _V),
    'transcendental': (lambda x: jnp.tanh(jnp.exp(x)) * x, _X),
    'square_and_power': (lambda x: lax.square(x) + lax.integer_pow(x, 3) +
                         lax.integer_pow(x, 4) + lax.integer_pow(x, -2), _X),
    'reductions': (lambda x: x.sum(0) + x.max(0), _X),
    'select': (lambda x: jnp.where(x > 0, x, -x), _X),
    'moves': (lambda x: jnp.concatenate([
        jnp.pad(x, ((1, 0), (0, 0), (0, 0))),
        x.transpose(0, 2, 1).reshape(3, 8, 16)[:2]]), _X),
    'reshape_round_trip': (lambda x: x.reshape(24, 16).reshape(3, 8, 16) * x,
                           _X),
    'identities': (lambda x: (x * 1. + 0.) * x, _X),
    'dead_and_repeated': (lambda x: (jnp.sin(x) * 2., jnp.exp(x) * x)[1] +
                          jnp.exp(x) * x, _X),
    'slices_in_place': (lambda x: lax.dynamic_update_slice(
        x, lax.dynamic_slice(x, (1, 0, 0), (1, 8, 16)) * 2., (0, 0, 0)), _X),
    'gather_scatter': (lambda x, i: x.at[i].add(x[i[::-1]] * 2.), _X,
                       jnp.array([2, 0])),
    'batched_slices': (jax.vmap(lambda x, u: lax.dynamic_update_slice(
        x, u, (0, 3))), _WIDE, _WIDE[:, :, :16]),
    'loop': (lambda x: lax.fori_loop(0, 5, lambda i, y: y * y, x), _X),
    'nested_jit': (lambda x: jax.jit(lambda y: y * y)(x) + x, _X),
    'custom_jvp': (jax.nn.relu, _X),
}


class ProgramCostTest(test_utils.NeuralTangentsTestCase):
  """Counts on the jaxpr against XLA's analysis of the lowered program."""

  def setUp(self):
    super().setUp()
    if jax.default_backend() != 'cpu':
      # The rules are those of the CPU backend's analysis; AUTO uses the
      # same counts on every backend.
      self.skipTest('compared with the CPU backend\'s cost analysis only')

  @parameterized.named_parameters((name, name) for name in PROGRAMS)
  def test_equals_xla_cost_analysis(self, name):
    fn, *args = PROGRAMS[name]
    flops, nbytes = _counted(fn, *args)
    xla_flops, xla_bytes = _xla_cost(fn, *args)
    self.assertAllClose(flops, xla_flops, rtol=1e-6, atol=8.)  # Loop index.
    self.assertAllClose(nbytes, xla_bytes, rtol=0.02, atol=16.)

  def test_docstring_example(self):
    self.assertEqual(_counted(lambda a, b: a @ b,
                              jnp.ones((2, 3), jnp.float32),
                              jnp.ones((3, 4), jnp.float32)), (48., 104.))

  def test_unused_outputs_not_counted(self):
    closed = jax.make_jaxpr(lambda x, m: (x @ m, jnp.exp(x)))(_X, _M)
    only_product = program_cost.program_cost(closed.jaxpr, [True, False])
    self.assertEqual(only_product, _counted(lambda x, m: x @ m, _X, _M))

  @parameterized.product(net=['mlp', 'cnn'], vmap_axes=[None, 0])
  def test_candidates_close_to_xla(self, net, vmap_axes):
    # Whole programs: FLOPs within 5% of XLA's; bytes above XLA's by at most
    # a third (measured 6-19% on `benchmarks/first_call.py`'s FCN and CNN).
    if net == 'mlp':
      f, params, (x1, x2) = mlp, mlp_params(), (normal(1, (4, 3)),
                                                normal(2, (3, 3)))
    else:
      f, params, (x1, x2) = cnn, cnn_params(), cnn_inputs()
    setup = functools.partial(problem_lib.setup, f, x1, x2, params, {},
                              (-1,), ())
    problem, leaves, data1, data2 = setup(vmap_axes)
    for name, fn in auto.candidates(problem, leaves, data1, data2).items():
      jitted = jax.jit(lambda p, d1, d2, fn=fn: fn(problem, p, d1, d2))
      traced = jitted.trace(leaves, data1, data2)
      flops, nbytes = program_cost.program_cost(traced.jaxpr.jaxpr)
      xla_flops, xla_bytes = _xla_cost(jitted, leaves, data1, data2)
      self.assertAllClose(flops, xla_flops, rtol=0.05, atol=0.)
      self.assertBetween(nbytes / xla_bytes, 0.9, 1.35)


if __name__ == '__main__':
  absltest.main()
