"""Tests of `empirical.api`: every implementation against the explicit
Jacobian contraction (`reference.explicit_ntk`), the other kernels, and
errors for bad arguments.
"""

import warnings

from absl.testing import absltest
from absl.testing import parameterized
import flax.linen as nn
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

import neural_tangents as nt
from neural_tangents import stax
from neural_tangents._src.empirical import structured_derivatives
from tests import test_utils
from tests.empirical.reference import AXES
from tests.empirical.reference import cnn
from tests.empirical.reference import cnn_batch_axis_1
from tests.empirical.reference import cnn_inputs
from tests.empirical.reference import cnn_params
from tests.empirical.reference import explicit_nngp
from tests.empirical.reference import explicit_ntk
from tests.empirical.reference import IMPL
from tests.empirical.reference import mlp
from tests.empirical.reference import mlp_params
from tests.empirical.reference import named
from tests.empirical.reference import normal
from tests.empirical.reference import TOL
from tests.empirical.reference import VMAP
from tests.empirical.reference import VMAP_NONE_ZERO


class EmpiricalNtkAllImplementationsTest(test_utils.NeuralTangentsTestCase):
  """Each implementation, vmap_axes and trace/diagonal option, on a CNN."""

  @named(implementation=IMPL, vmap={f'vmap_{v}': v for v in VMAP},
          axes={f'trace{"".join(map(str, t))}_diag{"".join(map(str, d))}':
                (t, d) for t, d in AXES})
  def test_cnn_equals_explicit_jacobian_contraction(self, implementation,
                                                    vmap, axes):
    trace_axes, diagonal_axes = axes
    params = cnn_params()
    x1, x2 = cnn_inputs()
    f, vmap_axes = cnn, {'none': None, 'zero': 0}.get(vmap)
    if vmap == 'pytree':
      f, vmap_axes = cnn_batch_axis_1, ({'img': 1}, 1, None)
      x1, x2 = {'img': jnp.moveaxis(x1, 0, 1)}, {'img': jnp.moveaxis(x2, 0, 1)}
    ntk_fn = nt.empirical_ntk_fn(f, trace_axes, diagonal_axes, vmap_axes,
                                 implementation)
    for second in (None, x2):
      expected = explicit_ntk(f, params, x1, second, trace_axes,
                              diagonal_axes, cache_key=f)
      self.assertAllClose(ntk_fn(x1, second, params), expected, rtol=TOL,
                          atol=TOL)


class EmpiricalNtkNetworksTest(test_utils.NeuralTangentsTestCase):
  """Each implementation on networks of various kinds."""

  def _check(self, f, params, x1, x2, implementation, vmap_axes,
             trace_axes=(-1,), diagonal_axes=(), jit=False, both=True,
             **kwargs):
    """Compares with the reference, for `x2=None` (if `both`) and `x2`."""
    ntk_fn = nt.empirical_ntk_fn(f, trace_axes, diagonal_axes, vmap_axes,
                                 implementation)
    if jit:
      ntk_fn = jax.jit(ntk_fn)
    for second in (None, x2) if both else (x2,):
      expected = explicit_ntk(f, params, x1, second, trace_axes,
                              diagonal_axes, kwargs)
      actual = ntk_fn(x1, second, params, **kwargs)
      self.assertAllClose(actual, expected, rtol=TOL, atol=TOL)

  @named(implementation=IMPL, vmap_axes=VMAP_NONE_ZERO)
  def test_mlp(self, implementation, vmap_axes):
    for trace_axes in ((), (-1,)):
      self._check(mlp, mlp_params(), normal(1, (4, 3)), normal(2, (3, 3)),
                  implementation, vmap_axes, trace_axes)

  @named(implementation=IMPL)
  def test_mlp_under_jit(self, implementation):
    self._check(mlp, mlp_params(), normal(1, (4, 3)), normal(2, (3, 3)),
                implementation, 0, jit=True)

  @named(implementation=IMPL, vmap_axes=VMAP_NONE_ZERO)
  def test_dict_params(self, implementation, vmap_axes):
    def f(params, x):
      h = jnp.sin(x @ params['dense']['w'].T) * jnp.expand_dims(
          params['scale'], 0)
      return h @ params['out']

    params = {'dense': {'w': normal(1, (5, 3))}, 'scale': normal(2, (5,)),
              'out': normal(3, (5, 2))}
    self._check(f, params, normal(4, (3, 3)), normal(5, (2, 3)),
                implementation, vmap_axes)

  @named(implementation=IMPL, vmap_axes=VMAP_NONE_ZERO)
  def test_flax_module(self, implementation, vmap_axes):

    class Net(nn.Module):

      @nn.compact
      def __call__(self, x):
        x = nn.Conv(3, (2, 2), param_dtype=jnp.float64)(x)
        x = nn.gelu(x).reshape((x.shape[0], -1))
        return nn.Dense(2, param_dtype=jnp.float64)(x)

    x1, x2 = normal(1, (3, 3, 3, 2)), normal(2, (2, 3, 3, 2))
    model = Net()
    variables = model.init(jax.random.PRNGKey(0), x1)
    # Under jit: a deep network compiles faster whole than op by op. (`x2`
    # given only: `x2=None` is checked on every other network.)
    self._check(model.apply, variables, x1, x2, implementation, vmap_axes,
                jit=True)

  @named(implementation=IMPL, vmap_axes=VMAP_NONE_ZERO)
  def test_stax_network(self, implementation, vmap_axes):
    init_fn, apply_fn, _ = stax.serial(
        stax.Conv(3, (2, 2), padding='SAME', b_std=0.1), stax.Relu(),
        stax.Flatten(), stax.Dense(4, b_std=0.1), stax.Erf(), stax.Dense(2))
    x1, x2 = normal(1, (3, 3, 3, 2)), normal(2, (2, 3, 3, 2))
    _, params = init_fn(jax.random.PRNGKey(0), x1.shape)
    self._check(apply_fn, params, x1, x2, implementation, vmap_axes,
                jit=True)

  @named(implementation=IMPL, vmap_axes=VMAP_NONE_ZERO)
  def test_stax_residual_and_repeat(self, implementation, vmap_axes):
    block = stax.serial(stax.Dense(4, b_std=0.1), stax.Relu())
    init_fn, apply_fn, _ = stax.serial(
        stax.Dense(4), stax.FanOut(2), stax.parallel(block, stax.Identity()),
        stax.FanInSum(), stax.repeat(block, 2), stax.Dense(2))
    x1, x2 = normal(1, (3, 3)), normal(2, (2, 3))
    _, params = init_fn(jax.random.PRNGKey(0), x1.shape)
    self._check(apply_fn, params, x1, x2, implementation, vmap_axes,
                jit=True)

  @named(implementation=IMPL, vmap_axes=VMAP_NONE_ZERO)
  def test_rng_keyword(self, implementation, vmap_axes):
    def f(params, x, rng):
      # Dropout-like: one mask over features, shared by the batch.
      h = jnp.tanh(x @ params[0])
      mask = jax.random.bernoulli(rng, 0.6, (1,) + h.shape[-1:])
      return (h * mask) @ params[1]

    params = (normal(1, (3, 5)), normal(2, (5, 2)))
    x1, x2 = normal(3, (3, 3)), normal(4, (2, 3))
    rng = jax.random.PRNGKey(7)
    ntk_fn = nt.empirical_ntk_fn(f, vmap_axes=vmap_axes,
                                 implementation=implementation)
    # x2 is None: both calls get `rng`; else x2's gets `fold_in(rng, 1)`.
    for second, rng2 in ((None, rng), (x2, jax.random.fold_in(rng, 1))):
      expected = explicit_ntk(f, params, x1, second, kwargs1={'rng': rng},
                              kwargs2={'rng': rng2})
      self.assertAllClose(ntk_fn(x1, second, params, rng=rng), expected,
                          rtol=TOL, atol=TOL)
    # A pair of keys: one for x1's call, one for x2's.
    k1, k2 = jax.random.PRNGKey(1), jax.random.PRNGKey(2)
    expected = explicit_ntk(f, params, x1, x2, kwargs1={'rng': k1},
                            kwargs2={'rng': k2})
    self.assertAllClose(ntk_fn(x1, x2, params, rng=(k1, k2)), expected,
                        rtol=TOL, atol=TOL)

  @named(implementation=IMPL,
          vmap_axes={'vmap_none': None, 'vmap_0': 0, 'vmap_pytree': (
              {'a': 0, 'b': 0}, (0, {'c': 0}), {})})
  def test_pytree_inputs_and_outputs(self, implementation, vmap_axes):
    def f(params, x):
      h = jnp.tanh(x['a'] @ params['w'] + x['b'] @ params['v'])
      return (h @ params['o1'],
              {'c': jnp.einsum('nh,hkc->nkc', h, params['o2'])})

    params = {'w': normal(1, (3, 4)), 'v': normal(2, (2, 4)),
              'o1': normal(3, (4, 2)), 'o2': normal(4, (4, 3, 2))}
    x1 = {'a': normal(5, (3, 3)), 'b': normal(6, (3, 2))}
    x2 = {'a': normal(7, (2, 3)), 'b': normal(8, (2, 2))}
    self._check(f, params, x1, x2, implementation, vmap_axes,
                trace_axes=(-1,))

  @named(implementation=IMPL)
  def test_batch_items_interact(self, implementation):
    def f(params, x):
      # Batch-norm-like: statistics over the batch couple the examples.
      h = x @ params[0]
      h = ((h - h.mean(0, keepdims=True)) /
           jnp.sqrt(h.var(0, keepdims=True) + 1.))
      return jnp.tanh(h) @ params[1]

    params = (normal(1, (3, 4)), normal(2, (4, 2)))
    self._check(f, params, normal(3, (4, 3)), normal(4, (3, 3)),
                implementation, None, trace_axes=())

  @named(implementation=IMPL)
  def test_batched_keyword_argument(self, implementation):
    def f(params, x, mask):
      return (jnp.tanh(x @ params[0]) * mask) @ params[1]

    params = (normal(1, (3, 4)), normal(2, (4, 2)))
    x1, x2 = normal(3, (3, 3)), normal(4, (2, 3))
    m1, m2 = normal(5, (3, 4)), normal(6, (2, 4))
    expected = explicit_ntk(f, params, x1, x2, kwargs1={'mask': m1},
                            kwargs2={'mask': m2})
    # Explicitly batched keyword; then an int `vmap_axes`, which batches
    # keywords that have the batch size along it.
    for vmap_axes in ((0, 0, {'mask': 0}), 0):
      ntk_fn = nt.empirical_ntk_fn(f, vmap_axes=vmap_axes,
                                   implementation=implementation)
      self.assertAllClose(ntk_fn(x1, x2, params, mask=(m1, m2)), expected,
                          rtol=TOL, atol=TOL)




class StructuredDerivativesRulesTest(test_utils.NeuralTangentsTestCase):
  """Structured derivatives (and AUTO) where parameters enter unusually."""

  _FUNCTIONS = {
      # A parameter used twice (weight sharing), and transposed.
      'shared_weight': lambda p, x: jnp.tanh(x @ p['w']) @ p['w'].T @ p['o'],
      # Through a non-letter-preserving linear chain (sum, broadcast, pad).
      'linear_chain': lambda p, x: jnp.tanh(
          x @ (p['w'] + p['w'].sum(0, keepdims=True))) @ jnp.pad(
              p['o'], ((0, 1), (0, 0)))[:-1],
      # A primitive without a structure rule (generic rule), and `where`.
      'generic': lambda p, x: jnp.where(
          x[:, :1] > 0, jnp.exp(jnp.expand_dims(p['w'][0], 0)),
          x @ p['w']) @ p['o'],
      # Custom derivatives, and a jitted layer used twice.
      'custom': lambda p, x: _jitted_layer(
          jax.nn.softplus(_jitted_layer(x, p['w'])), p['o'][:, :1] *
          jnp.ones((1, 3))) @ p['o'][:3],
      # A parameter on the left of a matmul, a division, concatenation.
      'lhs_div_concat': lambda p, x: jnp.concatenate(
          [(p['w'].T @ x.T).T / (1. + jnp.expand_dims(p['w'][0], 0) ** 2),
           jnp.expand_dims(p['o'].sum(1), 0) + x],
          axis=-1),
      # A grouped convolution (generic rule) and a bias via `select_n`.
      'grouped_conv': lambda p, x: lax.conv_general_dilated(
          x[..., None].repeat(2, -1).reshape(x.shape[0], 3, 1, 2),
          p['k'], (1, 1), 'SAME', feature_group_count=2,
          dimension_numbers=('NHWC', 'HWIO', 'NHWC')).reshape(
              x.shape[0], -1) + jnp.where(x[:, :1] > 0, p['b'][None],
                                          -p['b'][None]),
  }

  @staticmethod
  def _scan(p, x):
    # Steps read slices of a stacked parameter, and share another one.
    step = lambda c, s: (jnp.tanh(c @ s + c @ p['w']), c.sum(-1))
    c, ys = lax.scan(step, x, p['s'], reverse=True)
    return c @ p['o'] + ys.T @ jnp.ones((2, 2))

  _FUNCTIONS['scan'] = _scan

  @named(name={n: n for n in _FUNCTIONS},
          implementation={'auto': 0, 'structured_derivatives': 3},
          vmap_axes=VMAP_NONE_ZERO)
  def test_equals_explicit(self, name, implementation, vmap_axes):
    params = {'w': normal(1, (3, 3)), 'o': normal(2, (3, 2)),
              'k': normal(3, (2, 1, 1, 6)), 'b': normal(4, (18,)),
              's': normal(7, (2, 3, 3))}
    x1, x2 = normal(5, (4, 3)), normal(6, (3, 3))
    f = self._FUNCTIONS[name]
    # Untraced per example, traced on the whole batch: both kinds of letters.
    trace_axes = () if vmap_axes == 0 else (-1,)
    ntk_fn = nt.empirical_ntk_fn(f, trace_axes, (), vmap_axes, implementation)
    for second in (None, x2):
      expected = explicit_ntk(f, params, x1, second, trace_axes,
                              cache_key=name)
      self.assertAllClose(ntk_fn(x1, second, params), expected, rtol=TOL,
                          atol=TOL)


@jax.jit
def _jitted_layer(x, w):
  return x @ w


class OtherKernelsTest(test_utils.NeuralTangentsTestCase):

  @parameterized.parameters(((-1,), ()), ((), ()), ((), (-1,)))
  def test_nngp_equals_explicit(self, trace_axes, diagonal_axes):
    params = mlp_params()
    x1, x2 = normal(1, (4, 3)), normal(2, (3, 3))
    nngp_fn = nt.empirical_nngp_fn(mlp, trace_axes, diagonal_axes)
    for second in (None, x2):
      self.assertAllClose(
          nngp_fn(x1, second, params),
          explicit_nngp(mlp, params, x1, second, trace_axes, diagonal_axes),
          rtol=TOL, atol=TOL)

  def test_kernel_fn_get(self):
    params = mlp_params()
    x1, x2 = normal(1, (4, 3)), normal(2, (3, 3))
    kernel_fn = nt.empirical_kernel_fn(mlp, vmap_axes=0, implementation=3)
    ntk = explicit_ntk(mlp, params, x1, x2)
    nngp = explicit_nngp(mlp, params, x1, x2)
    self.assertAllClose(kernel_fn(x1, x2, 'ntk', params), ntk, rtol=TOL)
    self.assertAllClose(kernel_fn(x1, x2, 'nngp', params), nngp, rtol=TOL)
    both = kernel_fn(x1, x2, None, params)
    self.assertEqual(type(both).__name__, 'Kernel')
    self.assertEqual(both._fields, ('nngp', 'ntk'))
    self.assertAllClose(both.ntk, ntk, rtol=TOL)
    self.assertAllClose(both.nngp, nngp, rtol=TOL)
    only = kernel_fn(x1, x2, ('ntk',), params)
    self.assertEqual(only._fields, ('ntk',))
    self.assertAllClose(only.ntk, ntk, rtol=TOL)
    # One result type per `get`, shared with stax: results are the same
    # pytree structure and can be combined, e.g. averaged over ensembles.
    again = kernel_fn(x2, x2, None, params)
    self.assertIs(type(again), type(both))
    _, _, stax_kernel_fn = stax.serial(stax.Dense(1))
    self.assertIs(type(stax_kernel_fn(x1, x2, ('nngp', 'ntk'))), type(both))
    total = jax.tree_util.tree_map(jnp.add, again,
                                   kernel_fn(x2, x2, None, params))
    self.assertAllClose(total.ntk, 2 * again.ntk, rtol=TOL)

  def test_ntk_vp_equals_full_ntk_times_vector(self):
    params = mlp_params()
    x1, x2 = normal(1, (4, 3)), normal(2, (3, 3))
    v = normal(3, (3, 2))
    full = explicit_ntk(mlp, params, x1, x2, trace_axes=())  # (4, 3, 2, 2)
    expected = jnp.einsum('ijab,jb->ia', full, v)
    vp = nt.empirical_ntk_vp_fn(mlp, x1, x2, params)
    self.assertAllClose(vp(v), expected, rtol=TOL)

  def test_linearize_is_first_order_taylor(self):
    params = mlp_params()
    x = normal(1, (4, 3))
    dp = jax.tree_util.tree_map(lambda p: 1e-3 * jnp.ones_like(p), params)
    shifted = jax.tree_util.tree_map(jnp.add, params, dp)
    f_lin = nt.linearize(mlp, params)
    _, df = jax.jvp(lambda p: mlp(p, x), (params,), (dp,))
    self.assertAllClose(f_lin(shifted, x), mlp(params, x) + df, rtol=TOL)
    self.assertAllClose(f_lin(params, x), mlp(params, x), rtol=TOL)

  def test_taylor_expand_matches_polynomial(self):
    f = lambda p, x: p['a'] ** 3 * x + jnp.sin(p['b']) * x
    params = {'a': 2., 'b': 0.5}
    new = {'a': 2.5, 'b': 0.7}
    x = 3.
    da, db = 0.5, 0.2
    # Exact derivatives of a^3 and sin(b) at the expansion point.
    sin, cos = np.sin(0.5), np.cos(0.5)
    terms = [8. + sin, 12. * da + cos * db, (12. * da ** 2 - sin * db ** 2) / 2,
             (6. * da ** 3 - cos * db ** 3) / 6]
    for degree in range(4):
      expected = x * sum(terms[:degree + 1])
      actual = nt.taylor_expand(f, params, degree)(new, x)
      self.assertAllClose(actual, expected, rtol=1e-12)
    self.assertAllClose(nt.taylor_expand(f, params, 1)(new, x),
                        nt.linearize(f, params)(new, x), rtol=1e-12)



def _two_input_net():
  """`parallel(Dense, Dense)` on inputs `(a, b)`: two outputs."""
  init_fn, apply_fn, _ = stax.parallel(stax.Dense(2), stax.Dense(3))
  x = (normal(1, (4, 3)), normal(2, (4, 5)))
  _, params = init_fn(jax.random.PRNGKey(0), (x[0].shape, x[1].shape))
  return apply_fn, x, params


class PublishedConventionsTest(test_utils.NeuralTangentsTestCase):
  """Calls that the published release accepts, with its results."""

  def test_x2_of_only_nones_is_none(self):
    # Read before the implementation runs: one implementation suffices.
    apply_fn, x, params = _two_input_net()
    implementation = nt.NtkImplementation.STRUCTURED_DERIVATIVES
    kernel_fn = nt.empirical_kernel_fn(apply_fn,
                                       implementation=implementation)
    expected = kernel_fn(x, None, ('nngp', 'ntk'), params)
    self.assertAllClose(kernel_fn(x, (None, None), ('nngp', 'ntk'), params),
                        expected)
    ntk_fn = nt.empirical_ntk_fn(apply_fn, implementation=implementation)
    self.assertAllClose(ntk_fn(x, (None, None), params), expected.ntk)
    nngp_fn = nt.empirical_nngp_fn(apply_fn)
    self.assertAllClose(nngp_fn(x, (None, None), params), expected.nngp)
    cotangents = (jnp.ones((4, 2)), jnp.ones((4, 3)))
    self.assertAllClose(
        nt.empirical_ntk_vp_fn(apply_fn, x, (None, None), params)(cotangents),
        nt.empirical_ntk_vp_fn(apply_fn, x, None, params)(cotangents))

  @named(implementation=IMPL)
  def test_vmap_axes_none_for_absent_inputs_line_up(self, implementation):
    # x = (a, None, b): the axes (0, None, 1) are a's and b's, leaf by leaf.
    def f(params, x):
      a, _, b = x
      return jnp.tanh(a @ params['w'] + b.T @ params['v'])
    params = {'w': normal(1, (3, 2)), 'v': normal(2, (5, 2))}
    x1 = (normal(3, (4, 3)), None, normal(4, (5, 4)))
    x2 = (normal(5, (2, 3)), None, normal(6, (5, 2)))
    expected = nt.empirical_ntk_fn(f, implementation=1)(x1, x2, params)
    for vmap_axes in (((0, None, 1), 0), ((0, None, 1), 0, None)):
      ntk_fn = nt.empirical_ntk_fn(f, vmap_axes=vmap_axes,
                                   implementation=implementation)
      self.assertAllClose(ntk_fn(x1, x2, params), expected, rtol=TOL,
                          atol=TOL)

  def test_pair_kwarg_with_none_for_absent_x2(self):
    # Read before the implementation runs: one implementation suffices.
    def f(params, x, scale=1.):
      return mlp(params, x) * scale
    x, params = normal(1, (4, 3)), mlp_params()
    ntk_fn = nt.empirical_ntk_fn(f)
    self.assertAllClose(ntk_fn(x, None, params, scale=(2., None)),
                        ntk_fn(x, None, params, scale=2.))
    self.assertAllClose(ntk_fn(x, None, params, scale=(2., None)),
                        4. * ntk_fn(x, None, params), rtol=TOL, atol=TOL)
    kernel_fn = nt.empirical_kernel_fn(f)
    self.assertAllClose(kernel_fn(x, None, 'nngp', params, scale=(2., None)),
                        kernel_fn(x, None, 'nngp', params, scale=2.))

  @named(implementation=IMPL, vmap=VMAP_NONE_ZERO)
  def test_nan_example_stays_in_its_row_and_column(self, implementation,
                                                   vmap):
    # AUTO compiles every candidate implementation; the others check it.
    x1 = normal(1, (4, 3)).at[1, 0].set(jnp.nan)
    x2 = normal(2, (3, 3))
    params = mlp_params()
    ntk_fn = nt.empirical_ntk_fn(mlp, vmap_axes=vmap,
                                 implementation=implementation)
    finite = nt.empirical_ntk_fn(mlp, implementation=1)
    rows = np.array([0, 2, 3])
    k = ntk_fn(x1, None, params)
    expected = np.zeros((4, 4), bool)
    expected[1] = expected[:, 1] = True
    np.testing.assert_array_equal(np.isnan(k), expected)
    self.assertAllClose(k[np.ix_(rows, rows)], finite(x1[rows], None, params),
                        rtol=TOL, atol=TOL)
    k = ntk_fn(x1, x2, params)
    np.testing.assert_array_equal(np.isnan(k), np.arange(4)[:, None] == 1 +
                                  np.zeros((1, 3), bool))
    self.assertAllClose(k[rows], finite(x1[rows], x2, params), rtol=TOL,
                        atol=TOL)

  def test_nan_spreads_where_examples_interact(self):
    # Centering over the batch mixes examples: every entry depends on the
    # NaN example, and the kernel is NaN everywhere, as it should be.
    f = lambda p, x: jnp.tanh((x - x.mean(0, keepdims=True)) @ p)
    x = normal(1, (4, 3)).at[1, 0].set(jnp.nan)
    for implementation in nt.NtkImplementation:
      ntk = nt.empirical_ntk_fn(f, implementation=implementation)(
          x, None, normal(2, (3, 2)))
      self.assertTrue(np.isnan(ntk).all())

  def test_get_names_in_any_case(self):
    x, params = normal(1, (4, 3)), mlp_params()
    kernel_fn = nt.empirical_kernel_fn(mlp)
    upper = kernel_fn(x, None, ('NTK', 'NNGP'), params)
    self.assertEqual(upper._fields, ('ntk', 'nngp'))
    self.assertAllClose(upper.ntk, kernel_fn(x, None, 'ntk', params))
    self.assertAllClose(kernel_fn(x, None, 'Nngp', params), upper.nngp)


class BadInputTest(test_utils.NeuralTangentsTestCase):

  def _ntk(self, **kwargs):
    return nt.empirical_ntk_fn(mlp, **kwargs)(normal(1, (4, 3)), None,
                                              mlp_params())

  @parameterized.parameters(7, -1, 'jacobian', 1.5, None, True)
  def test_invalid_implementation(self, implementation):
    with self.assertRaisesRegex(ValueError, r'implementation.*STRUCTURED'):
      nt.empirical_ntk_fn(mlp, implementation=implementation)

  def test_implementation_as_int(self):
    for i in range(4):
      self.assertEqual(self._ntk(implementation=i).shape, (4, 4))

  def test_implementation_as_name(self):
    expected = self._ntk(implementation=1)
    for name in ('structured_derivatives', 'NTK_VECTOR_PRODUCTS'):
      self.assertAllClose(self._ntk(implementation=name), expected,
                          rtol=TOL, atol=TOL)

  @parameterized.parameters((5,), (-3,))
  def test_trace_axes_out_of_range(self, axis):
    with self.assertRaisesRegex(ValueError, 'trace_axes'):
      self._ntk(trace_axes=(axis,))

  def test_diagonal_axes_out_of_range(self):
    with self.assertRaisesRegex(ValueError, 'diagonal_axes'):
      self._ntk(diagonal_axes=(2,))

  @parameterized.named_parameters(
      ('_out_of_range', 3), ('_pair_out_of_range', (0, 2)),
      ('_pair_wrong_tree', ({'a': 0}, 0)), ('_wrong_tree', ({'a': 0}, 0, None)),
      ('_kwarg_out_of_range', (0, 0, {'z': 5})), ('_output_axis', (0, 1, None)),
      ('_string', 'zero'))
  def test_vmap_axes_not_matching(self, vmap_axes):
    with self.assertRaisesRegex(ValueError, 'vmap_axes'):
      nt.empirical_ntk_fn(mlp, vmap_axes=vmap_axes)(
          normal(1, (4, 3)), None, mlp_params(), **(
              {'z': jnp.ones(3)} if isinstance(vmap_axes, tuple) and
              len(vmap_axes) == 3 and vmap_axes[2] else {}))

  def test_kernel_for_an_array_is_a_type_error(self):
    x, params = normal(1, (4, 3)), mlp_params()
    k = stax.Dense(1)[2](x, None)
    fix = r'.*`nt.Kernel`.*Pass the inputs themselves'
    with self.assertRaisesRegex(TypeError, '`x1` is ' + fix):
      nt.empirical_ntk_fn(mlp)(k, None, params)
    with self.assertRaisesRegex(TypeError, '`x2` is ' + fix):
      nt.empirical_kernel_fn(mlp)(x, k, 'nngp', params)
    with self.assertRaisesRegex(TypeError, '`x1` is ' + fix):
      nt.empirical_ntk_vp_fn(mlp, k, None, params)
    with self.assertRaisesRegex(TypeError, r'`x` is .*Call `f_lin\(params'):
      nt.linearize(mlp, params)(params, k)
    with self.assertRaisesRegex(TypeError, '`params` is .*init_fn'):
      nt.empirical_ntk_fn(mlp)(x, None, k)

  @parameterized.named_parameters(
      ('none', lambda p: None, r'\(got None\)'),
      ('int', lambda p: jax.tree_util.tree_map(lambda a: a.astype(int), p),
       r"\(got \[\('int"))
  def test_params_without_floats(self, make_params, got):
    x = normal(1, (4, 3))
    for implementation in nt.NtkImplementation:
      with self.assertRaisesRegex(
          ValueError, '`params` has no floating-point leaves ' + got +
          r'.*Pass the params returned by `init_fn`'):
        nt.empirical_ntk_fn(mlp, implementation=implementation)(
            x, None, make_params(mlp_params()))
    with self.assertRaisesRegex(ValueError, '`params` has no floating'):
      nt.empirical_ntk_vp_fn(mlp, x, None, None)

  def test_keyword_batch_of_another_size_is_refused_before_f_runs(self):
    # A batched keyword argument of 5 rows for 4 inputs reached `f`'s own
    # broadcasting error; docs/empirical.md promises this ValueError.
    f = lambda p, x, mask: (x * mask) @ p
    x, params = normal(1, (4, 3)), normal(2, (3, 2))
    for implementation in nt.NtkImplementation:
      for vmap_axes in ((0, 0, {'mask': 0}), (0, 0, 0)):
        with self.assertRaisesRegex(
            ValueError, r'`vmap_axes=.*`: the batch axes of the inputs \(and '
            r'batched keyword arguments\) have different sizes \[4, 5\]'):
          nt.empirical_ntk_fn(f, vmap_axes=vmap_axes,
                              implementation=implementation)(
                                  x, None, params, mask=np.ones((5, 3)))

  def test_complex_params_refused_and_the_fix_agrees(self):
    # Each implementation took a different Jacobian of a complex parameter
    # (purely imaginary kernels, zeros, or jacrev's refusal): all refuse it
    # now, naming the leaf and the fix, two real parameters.
    x = normal(1, (4, 3))
    w = normal(2, (3, 2)) + 1j * normal(3, (3, 2))
    f = lambda p, x: jnp.sin(x @ p['w']).real
    for implementation in nt.NtkImplementation:
      with self.assertRaisesRegex(
          TypeError, r"`params` must be real for the NTK; got a complex128 "
          r"leaf at params\['w'\]\. Pass its real and imaginary parts"):
        nt.empirical_ntk_fn(f, implementation=implementation)(
            x, None, {'w': w})
    with self.assertRaisesRegex(TypeError, '`params` must be real'):
      nt.empirical_kernel_fn(f)(x, None, 'ntk', {'w': w})
    with self.assertRaisesRegex(TypeError, '`params` must be real'):
      nt.empirical_ntk_vp_fn(f, x, None, {'w': w})
    # The fix: every implementation gives the explicit Jacobian contraction
    # over both real parts (STRUCTURED_DERIVATIVES and AUTO gave a complex
    # kernel of complex intermediates; they contract Jacobians instead).
    g = lambda p, x: f({'w': p['re'] + 1j * p['im']}, x)
    params = {'re': w.real, 'im': w.imag}
    expected = explicit_ntk(g, params, x, None)
    for implementation in nt.NtkImplementation:
      with warnings.catch_warnings():
        warnings.simplefilter('ignore', structured_derivatives.StructuredFallbackWarning)
        k = nt.empirical_ntk_fn(g, implementation=implementation)(
            x, None, params)
      self.assertEqual(k.dtype, np.float64)
      self.assertAllClose(k, expected, rtol=1e-10, atol=1e-12)
    # Complex outputs: `J J^T` or `J J^H` differed between implementations.
    for implementation in nt.NtkImplementation:
      with self.assertRaisesRegex(
          TypeError, r'`f` returned a complex output \(dtype complex128\).*'
          r'Return the real and imaginary parts as two real outputs'):
        nt.empirical_ntk_fn(lambda p, x: jnp.exp(1j * x @ p['re']),
                            implementation=implementation)(x, None, params)

  def test_linearize_of_wrong_params(self):
    x, params = normal(1, (4, 3)), mlp_params()
    f_lin = nt.linearize(mlp, params)
    with self.assertRaisesRegex(ValueError, r'`p` must have the structure and '
                                r'shapes of the `params` given to `linearize`'
                                r'.*Pass `p` shaped like'):
      f_lin(params[:2], x)
    transposed = [(w.T, b) for w, b in params]
    with self.assertRaisesRegex(ValueError, r'`p` must have the structure'):
      f_lin(transposed, x)

  def test_ntk_vp_of_wrong_batch_size(self):
    x1, x2, params = normal(1, (4, 3)), normal(2, (2, 3)), mlp_params()
    vp = nt.empirical_ntk_vp_fn(mlp, x1, x2, params)
    self.assertEqual(vp(jnp.ones((2, 2))).shape, (4, 2))
    with self.assertRaisesRegex(ValueError, r'`cotangents` must have the '
                                r'structure and shapes of f\(params, x2\), '
                                r'\(2, 2\); got \(4, 2\)'):
      vp(jnp.ones((4, 2)))

  def test_transposed_dense_weights(self):
    init_fn, apply_fn, _ = stax.serial(stax.Dense(8), stax.Relu(),
                                       stax.Dense(1))
    x = normal(1, (4, 3))
    _, params = init_fn(jax.random.PRNGKey(0), x.shape)
    (w, b), *rest = params
    with self.assertRaisesRegex(ValueError, r'`Dense` expects 8 channels .*'
                                r'`W`, of shape \(8, 3\).*not transposed'):
      nt.empirical_ntk_fn(apply_fn)(x, None, [(w.T, b)] + rest)

  def test_invalid_get(self):
    kernel_fn = nt.empirical_kernel_fn(mlp)
    with self.assertRaisesRegex(ValueError, 'get'):
      kernel_fn(normal(1, (4, 3)), None, 'ntkk', mlp_params())

  @parameterized.parameters(-1, 1.5)
  def test_taylor_expand_of_a_bad_degree(self, degree):
    with self.assertRaisesRegex(ValueError, f'`degree={degree}` is not a '
                                'non-negative int; pass .*`degree=2`'):
      nt.taylor_expand(mlp, mlp_params(), degree)

  @parameterized.named_parameters(
      ('int_output', lambda p, x: mlp(p, x).astype(jnp.int32),
       r'dtype int32.*floating-point outputs: cast the output in `f`'),
      ('scalar_output', lambda p, x: mlp(p, x).sum(),
       r'scalar output \(shape \(\)\).*return one value per example'),
      ('structures', lambda p, x: ({'a': mlp(p, x)} if x.shape[0] == 4 else
                                   [mlp(p, x)]),
       r'different structures, .*and .*make `f` return the same pytree'))
  def test_outputs_without_a_kernel(self, f, message):
    with self.assertRaisesRegex(ValueError, message):
      nt.empirical_ntk_fn(f)(normal(1, (4, 3)), normal(2, (2, 3)),
                             mlp_params())

  def test_vmap_axes_of_kwargs_and_outputs(self):
    x = normal(1, (4, 3))
    f = lambda p, x, z: mlp(p, x) * z
    with self.assertRaisesRegex(ValueError, r'`kwargs_axes` is \[0\], not None'
                                r'.*pass e\.g\. `vmap_axes=\(0, 0, '):
      nt.empirical_ntk_fn(f, vmap_axes=(0, 0, [0]))(x, None, mlp_params(),
                                                    z=1.)
    with self.assertRaisesRegex(ValueError, r'`out_axes` contains None; '
                                r'give each output leaf its batch axis'):
      nt.empirical_ntk_fn(mlp, vmap_axes=(0, None))(x, None, mlp_params())


class ApplyFnArgumentTest(absltest.TestCase):

  def test_f_none_raises(self):
    with self.assertRaisesRegex(TypeError, r'`f` must be callable; got None.*'
                                r'apply_fn'):
      nt.empirical_ntk_fn(None)


if __name__ == '__main__':
  absltest.main()
