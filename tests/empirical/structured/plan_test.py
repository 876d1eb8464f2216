"""Tests for `structured/plan.py`: common networks plan without fallback.

A network whose primitives all have structure rules plans in every mode
(`make_plan` raises no `Unsupported`, so `empirical_ntk_fn` does not fall
back to Jacobian contraction), contracts every parameter leaf lazily (no
materialized Jacobian), and gives the JACOBIAN_CONTRACTION kernel.
"""
from absl.testing import absltest
from absl.testing import parameterized
import flax.linen as nn
import jax
import jax.numpy as jnp

import neural_tangents as nt
from neural_tangents import stax
from neural_tangents._src.empirical import structured
from tests import test_utils

_TOL = 1e-10


def _stax(layers, shape):
  init_fn, apply_fn, _ = stax.serial(*layers)
  _, params = init_fn(jax.random.PRNGKey(1), (-1,) + shape[1:])
  return apply_fn, params


class _FlaxMlp(nn.Module):

  @nn.compact
  def __call__(self, x):
    return nn.Dense(2)(nn.tanh(nn.Dense(6)(x)))


class _FlaxCnn(nn.Module):

  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Conv(3, (2, 2))(x))
    return nn.Dense(2)(x.mean((-3, -2)))


def _flax(module, shape):
  params = module.init(jax.random.PRNGKey(1), jnp.ones(shape))
  # In the inputs' dtype, so that both implementations compute in it.
  return module.apply, jax.tree_util.tree_map(
      lambda p: p.astype(jnp.float64), params)


_DENSE = ((4, 5), lambda s: _stax(
    [stax.Dense(6), stax.Relu(), stax.Dense(2)], s))
_CONV = ((3, 4, 4, 2), lambda s: _stax(
    [stax.Conv(3, (2, 2), padding='SAME'), stax.Relu(), stax.Flatten(),
     stax.Dense(2)], s))
_RESIDUAL = ((4, 5), lambda s: _stax(
    [stax.Dense(6), stax.FanOut(2),
     stax.parallel(stax.serial(stax.Erf(), stax.Dense(6)), stax.Identity()),
     stax.FanInSum(), stax.Dense(2)], s))
_REPEAT = ((4, 5), lambda s: _stax(
    [stax.Dense(6), stax.repeat(stax.serial(stax.Relu(), stax.Dense(6)), 3),
     stax.Dense(2)], s))
_FLAX_MLP = ((4, 5), lambda s: _flax(_FlaxMlp(), s))
_FLAX_CNN = ((3, 4, 4, 2), lambda s: _flax(_FlaxCnn(), s))

_NETWORKS = {'dense': _DENSE, 'conv': _CONV, 'residual': _RESIDUAL,
             'repeat': _REPEAT, 'flax_mlp': _FLAX_MLP, 'flax_cnn': _FLAX_CNN}


def _plan(apply_fn, params, x, mode: structured.Mode) -> structured.Plan:
  """Plans `apply_fn(params, x)` as `empirical_ntk_fn` does, on both sides."""
  leaves, tree = jax.tree_util.tree_flatten(params)
  aval = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype)
  per_example = mode == structured.Mode.EXAMPLE
  x_aval = aval(x[0] if per_example else x)

  def call(p, data):
    # One example is run as a batch of one, as `vmap_axes=0` does.
    x = data[0][None] if per_example else data[0]
    out = apply_fn(jax.tree_util.tree_unflatten(tree, p), x)
    return [out[0] if per_example else out]

  program = structured.trace_program(call, [aval(l) for l in leaves],
                                     [x_aval])
  batch_axes = (None, None)
  if mode == structured.Mode.SEPARABLE:
    axes = structured.batch_axes(program, [None] * len(leaves) + [0])
    assert structured.outputs_batched_at(program, axes, 0)
    batch_axes = (axes, axes)
  return structured.make_plan((program, program), len(leaves), mode,
                              batch_axes)


class NoFallbackTest(test_utils.NeuralTangentsTestCase):

  @parameterized.product(name=sorted(_NETWORKS),
                         mode=[m.value for m in structured.Mode])
  def test_plans_every_leaf_lazily(self, name, mode):
    shape, build = _NETWORKS[name]
    apply_fn, params = build(shape)
    x, _ = test_utils.random_inputs(shape, shape, seed=2)
    plan = _plan(apply_fn, params, x, structured.Mode(mode))
    self.assertEqual(plan.materialized, ())
    lazy_leaves = {s.leaf for s in plan.lazy} | {
        m.leaf for g in plan.groups for m in g.members}
    self.assertEqual(lazy_leaves,
                     set(range(len(jax.tree_util.tree_leaves(params)))))

  @parameterized.parameters(*sorted(_NETWORKS))
  def test_equals_jacobian_contraction(self, name):
    # Whole-batch programs (per-example ones are compared in
    # tests/empirical_test.py).
    shape, build = _NETWORKS[name]
    apply_fn, params = build(shape)
    x1, x2 = test_utils.random_inputs(shape, (2,) + shape[1:], seed=2)
    kernels = [
        nt.empirical_ntk_fn(apply_fn, implementation=implementation)(
            x1, x2, params)
        for implementation in (nt.NtkImplementation.JACOBIAN_CONTRACTION,
                               nt.NtkImplementation.STRUCTURED_DERIVATIVES)]
    self.assertAllClose(kernels[1], kernels[0], rtol=_TOL, atol=_TOL)


if __name__ == '__main__':
  absltest.main()
