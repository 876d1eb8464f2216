"""Tests of `empirical.problem` and `empirical.rng`, through the public
functions: `rng`, `vmap_axes`, batch-axis layouts and nested inputs, as
published.
"""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

import neural_tangents as nt
from neural_tangents import stax
from tests import test_utils
from tests.empirical.reference import batch_axis_1
from tests.empirical.reference import batch_axis_1_params
from tests.empirical.reference import explicit_nngp
from tests.empirical.reference import explicit_ntk
from tests.empirical.reference import IMPL
from tests.empirical.reference import mlp
from tests.empirical.reference import mlp_params
from tests.empirical.reference import named
from tests.empirical.reference import normal
from tests.empirical.reference import TOL
from tests.empirical.reference import VMAP_NONE_ZERO


class PublishedConventionsTest(test_utils.NeuralTangentsTestCase):
  """`rng`, `vmap_axes`, batch-axis layouts and nested inputs, as published.

  The reference is the explicit Jacobian contraction (`explicit_ntk`).
  """

  @named(implementation=IMPL)
  def test_dropout_rng_keys(self, implementation):
    # f(x1) gets rng, f(x2) fold_in(rng, 1), unless x2 is None or equal to
    # x1; a pair of keys is used as given.
    init_fn, apply_fn, _ = stax.serial(stax.Dense(16), stax.Dropout(0.5),
                                       stax.Relu(), stax.Dense(2))
    x1, x2 = normal(1, (3, 4)), normal(2, (2, 4))
    _, params = init_fn(jax.random.PRNGKey(0), x1.shape)
    rng, other = jax.random.PRNGKey(7), jax.random.PRNGKey(8)
    kernel_fn = nt.empirical_kernel_fn(apply_fn, implementation=implementation)
    folded = jax.random.fold_in(rng, 1)
    cases = ((x2, rng, (rng, folded)), (None, rng, (rng, rng)),
             (jnp.array(x1), rng, (rng, rng)),
             (x2, (rng, other), (rng, other)))
    for second, given, (rng1, rng2) in cases:
      k = kernel_fn(x1, second, ('nngp', 'ntk'), params, rng=given)
      x = x1 if second is None else second
      expected = explicit_ntk(apply_fn, params, x1, x, kwargs1={'rng': rng1},
                              kwargs2={'rng': rng2})
      self.assertAllClose(k.ntk, expected, rtol=TOL, atol=TOL)
      f1 = apply_fn(params, x1, rng=rng1)
      f2 = apply_fn(params, x, rng=rng2)
      self.assertAllClose(k.nngp, f1 @ f2.T / 2, rtol=TOL, atol=TOL)
    # Different masks for x1 and x2 change the kernel (the test has power).
    same_keys = explicit_ntk(apply_fn, params, x1, x2, kwargs1={'rng': rng})
    self.assertGreater(
        np.abs(kernel_fn(x1, x2, 'ntk', params, rng=rng) - same_keys).max(),
        1e-3)
    # Under jit the comparison of x1 and x2 is traced.
    jitted = jax.jit(kernel_fn, static_argnames='get')
    self.assertAllClose(jitted(x1, x1, 'ntk', params, rng=rng),
                        kernel_fn(x1, None, 'ntk', params, rng=rng),
                        rtol=TOL, atol=TOL)
    self.assertAllClose(jitted(x1, x2, 'ntk', params, rng=rng),
                        kernel_fn(x1, x2, 'ntk', params, rng=rng),
                        rtol=TOL, atol=TOL)

  @named(implementation=IMPL,
          vmap_axes={'pair': (0, 1), 'triple': (0, 1, None)})
  def test_output_batch_axis_keeps_the_layout(self, implementation,
                                              vmap_axes):
    # Outputs (7, 3, 2) with batch axis 1: the kernel is (7, 7, 3, 3, 2, 2),
    # as without vmap_axes.
    params = batch_axis_1_params()
    x1, x2 = normal(2, (3, 4)), normal(3, (2, 4))
    ntk_fn = nt.empirical_ntk_fn(batch_axis_1, (), (), vmap_axes,
                                 implementation)
    for second, n2 in ((None, 3), (x2, 2)):
      actual = ntk_fn(x1, second, params)
      self.assertEqual(actual.shape, (7, 7, 3, n2, 2, 2))
      self.assertAllClose(actual, explicit_ntk(batch_axis_1, params, x1,
                                               second, ()),
                          rtol=TOL, atol=TOL)

  @named(implementation=IMPL)
  def test_pytree_vmap_axes(self, implementation):
    def f(params, x):
      h = jnp.tanh(x['a'] @ params['w'] + x['b'].T @ params['v'])
      return jnp.moveaxis(h.reshape(x['a'].shape[0], 7, 2), 0, 1), jnp.sin(h)

    params = {'w': normal(1, (4, 14), 0.5), 'v': normal(2, (2, 14), 0.5)}
    x1 = {'a': normal(3, (3, 4)), 'b': normal(4, (2, 3))}
    x2 = {'a': normal(5, (2, 4)), 'b': normal(6, (2, 2))}
    # A pair `(in_axes, out_axes)` of pytrees; the triple with kwargs axes.
    for vmap_axes in (({'a': 0, 'b': 1}, (1, 0)),
                      ({'a': 0, 'b': 1}, (1, 0), {})):
      ntk_fn = nt.empirical_ntk_fn(f, (), (), vmap_axes, implementation)
      for second in (None, x2):
        self.assertAllClose(ntk_fn(x1, second, params),
                            explicit_ntk(f, params, x1, second, ()),
                            rtol=TOL, atol=TOL)

  def test_pytree_vmap_axes_of_inputs_and_outputs(self):
    # A pytree prefix of both x and f(x) is the batch axes of both.
    def f(params, x):
      a, b = x
      return jnp.tanh(a @ params), jnp.tanh(b.T @ params).T

    params = normal(1, (3, 2))
    x1 = (normal(2, (4, 3)), normal(3, (3, 4)))
    ntk_fn = nt.empirical_ntk_fn(f, (), (), (0, 1))
    self.assertAllClose(ntk_fn(x1, None, params),
                        explicit_ntk(f, params, x1, None, ()),
                        rtol=TOL, atol=TOL)

  @named(implementation=IMPL,
          vmap_axes={'vmap_none': None, 'vmap_0': 0, 'vmap_out_1': (0, 1)},
          axes={'trace_batch': ((0,), ()), 'diag_batch': ((), (0,)),
                'trace_batch_and_last': ((0, -1), ()),
                'diag_batch_trace_last': ((-1,), (0,)),
                'trace_batch_diag_last': ((0,), (-1,))})
  def test_traced_or_diagonal_batch_axis(self, implementation, vmap_axes,
                                         axes):
    trace_axes, diagonal_axes = axes
    f, params = mlp, mlp_params()
    if vmap_axes == (0, 1):  # The batch axis is output axis 1.
      f, params = batch_axis_1, batch_axis_1_params()
      swap = lambda axes: tuple({0: 1, 1: 0}.get(a, a) for a in axes)
      trace_axes, diagonal_axes = swap(trace_axes), swap(diagonal_axes)
    x1, x2 = normal(2, (3, 4 if f is batch_axis_1 else 3)), None
    x2 = normal(3, x1.shape)  # Diagonal batch axes need equal batch sizes.
    ntk_fn = nt.empirical_ntk_fn(f, trace_axes, diagonal_axes, vmap_axes,
                                 implementation)
    for second in (None, x2):
      self.assertAllClose(
          ntk_fn(x1, second, params),
          explicit_ntk(f, params, x1, second, trace_axes, diagonal_axes),
          rtol=TOL, atol=TOL)

  @parameterized.parameters(None, 0)
  def test_diagonal_batch_axis_needs_equal_batch_sizes(self, vmap_axes):
    ntk_fn = nt.empirical_ntk_fn(mlp, (), (0,), vmap_axes)
    with self.assertRaisesRegex(ValueError, 'diagonal_axes'):
      ntk_fn(normal(1, (4, 3)), normal(2, (3, 3)), mlp_params())

  def test_nngp_batch_axis_traced_or_diagonal(self):
    params, x1, x2 = mlp_params(), normal(1, (3, 3)), normal(2, (3, 3))
    for trace_axes, diagonal_axes in (((0,), ()), ((), (0,)), ((-1,), (0,))):
      nngp_fn = nt.empirical_nngp_fn(mlp, trace_axes, diagonal_axes)
      self.assertAllClose(
          nngp_fn(x1, x2, params),
          explicit_nngp(mlp, params, x1, x2, trace_axes, diagonal_axes),
          rtol=TOL, atol=TOL)

  @named(implementation=IMPL, vmap_axes=VMAP_NONE_ZERO)
  def test_nested_tuple_inputs(self, implementation, vmap_axes):
    init_fn, apply_fn, _ = stax.parallel(
        stax.parallel(stax.Dense(3), stax.Dense(4)), stax.Dense(2))
    x1 = ((normal(1, (3, 5)), normal(2, (3, 6))), normal(3, (3, 2)))
    x2 = ((normal(4, (2, 5)), normal(5, (2, 6))), normal(6, (2, 2)))
    _, params = init_fn(jax.random.PRNGKey(0),
                        jax.tree_util.tree_map(jnp.shape, x1))
    kernel_fn = nt.empirical_kernel_fn(apply_fn, vmap_axes=vmap_axes,
                                       implementation=implementation)
    for second in (None, x2):
      k = kernel_fn(x1, second, ('nngp', 'ntk'), params)
      self.assertAllClose(k.ntk, explicit_ntk(apply_fn, params, x1, second),
                          rtol=TOL, atol=TOL)
      self.assertAllClose(k.nngp,
                          explicit_nngp(apply_fn, params, x1, second),
                          rtol=TOL, atol=TOL)


if __name__ == '__main__':
  absltest.main()
