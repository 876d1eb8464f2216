"""Tests of `neural_tangents._src.empirical`: empirical NTK, NNGP and friends.

Every implementation is compared with an explicit reference written here
from the definition: the Jacobian of the whole batch with `jax.jacobian`,
contracted with an explicit einsum, in float64.
"""
import functools
import itertools
import string

from absl.testing import absltest
from absl.testing import parameterized
import flax.linen as nn
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

import neural_tangents as nt
from neural_tangents import stax
from neural_tangents._src import empirical
from neural_tangents._src.empirical import api as empirical_api
from tests import test_utils


_IMPLEMENTATIONS = tuple(nt.NtkImplementation)
_TOL = 1e-10


# ---------------------------------------------------------------------------
# The reference: whole-batch Jacobians and one explicit einsum per output.
# ---------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnums=0)
def _full_kernels(f, params, x1, x2, kwargs1, kwargs2):
  """`sum_p J1[out1..., p] J2[out2..., p]` per output leaf (all axes kept)."""
  j1 = jax.jacobian(lambda p: f(p, x1, **kwargs1))(params)
  j2 = jax.jacobian(lambda p: f(p, x2, **kwargs2))(params)
  out_leaves, treedef = jax.tree_util.tree_flatten(f(params, x1, **kwargs1))
  kernels = []
  for o, a, b in zip(out_leaves, treedef.flatten_up_to(j1),
                     treedef.flatten_up_to(j2)):
    kernel = 0.
    for u, v in zip(jax.tree_util.tree_leaves(a),
                    jax.tree_util.tree_leaves(b)):
      p = list(range(o.ndim, u.ndim))
      kernel = kernel + jnp.tensordot(u, v, (p, p))
    kernels.append(kernel)
  return kernels


def _layout(full, out_ndim, trace_axes, diagonal_axes):
  """Traces, keeps diagonals of, or pairs the axes of a full kernel.

  The published layout: every output axis, the batch axis included, in
  order; a paired axis as two adjacent axes.
  """
  trace = {a % out_ndim for a in trace_axes}
  diagonal = {a % out_ndim for a in diagonal_axes} - trace
  letters = iter(string.ascii_letters)
  s1 = [next(letters) for _ in range(out_ndim)]
  s2 = [next(letters) for _ in range(out_ndim)]
  result = []
  divisor = 1
  for axis in range(out_ndim):
    if axis in trace:
      s2[axis] = s1[axis]
      divisor *= full.shape[axis]
    elif axis in diagonal:
      s2[axis] = s1[axis]
      result.append(s1[axis])
    else:
      result += [s1[axis], s2[axis]]
  spec = ''.join(s1) + ''.join(s2) + '->' + ''.join(result)
  return jnp.einsum(spec, full) / divisor


_FULL_KERNELS = {}


def explicit_ntk(f, params, x1, x2, trace_axes=(-1,), diagonal_axes=(),
                 kwargs1=None, kwargs2=None, cache_key=None):
  """The NTK from `jax.jacobian` of the whole batch (a pytree per output).

  With `cache_key`, the full kernel of `(f, params, x1, x2, kwargs)` is
  computed once per key and only the layout is applied per call.
  """
  kwargs1 = kwargs1 or {}
  kwargs2 = kwargs1 if kwargs2 is None else kwargs2
  x2 = x1 if x2 is None else x2
  key = None if cache_key is None else (cache_key, x2 is x1)
  if key not in _FULL_KERNELS or key is None:
    treedef = jax.tree_util.tree_structure(jax.eval_shape(
        lambda: f(params, x1, **kwargs1)))
    _FULL_KERNELS[key] = (
        _full_kernels(f, params, x1, x2, kwargs1, kwargs2), treedef)
  kernels, treedef = _FULL_KERNELS[key]
  return jax.tree_util.tree_unflatten(treedef, [
      _layout(k, k.ndim // 2, trace_axes, diagonal_axes) for k in kernels])


def explicit_nngp(f, params, x1, x2, trace_axes=(-1,), diagonal_axes=()):
  x2 = x1 if x2 is None else x2
  out1, out2 = f(params, x1), f(params, x2)
  return jax.tree_util.tree_map(
      lambda a, b: _layout(jnp.tensordot(a, b, 0), a.ndim, trace_axes,
                           diagonal_axes), out1, out2)


# ---------------------------------------------------------------------------
# Networks.
# ---------------------------------------------------------------------------


def _normal(seed, shape, scale=1.):
  return scale * jax.random.normal(jax.random.PRNGKey(seed), shape)


def mlp(params, x):
  for w, b in params[:-1]:
    x = jnp.tanh(x @ w + jnp.expand_dims(b, 0))
  w, b = params[-1]
  return x @ w + jnp.expand_dims(b, 0)


def mlp_params():
  sizes = [3, 5, 4, 2]
  return [(_normal(i, (a, b), a ** -0.5), _normal(10 + i, (b,), 0.1))
          for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:]))]


def cnn(params, x):
  """A CNN with `lax.conv_general_dilated`, output `(N, H, W, C)`."""
  w1, b1, w2 = params
  x = lax.conv_general_dilated(x, w1, (1, 1), 'SAME',
                               dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
  x = jax.nn.relu(x + b1.reshape(1, 1, 1, -1))
  return lax.conv_general_dilated(x, w2, (2, 1), ((1, 0), (0, 1)),
                                  rhs_dilation=(1, 2),
                                  dimension_numbers=('NHWC', 'HWIO', 'NHWC'))


def cnn_params():
  return (_normal(1, (3, 3, 2, 3), 0.3), _normal(2, (3,), 0.1),
          _normal(3, (2, 2, 3, 2), 0.3))


def cnn_batch_axis_1(params, x):
  """`cnn` on a dict input with batch axis 1; output batch axis 1."""
  out = cnn(params, jnp.moveaxis(x['img'], 1, 0))
  return jnp.moveaxis(out, 0, 1)


def _cnn_inputs():
  return _normal(4, (3, 4, 5, 2)), _normal(5, (2, 4, 5, 2))


# `(trace_axes, diagonal_axes)`: none, one, several traced; one diagonal;
# one diagonal also traced; one traced and another diagonal.
_AXES = (((), ()), ((-1,), ()), ((-1, -2), ()), ((), (-2,)), ((-1,), (-1,)),
         ((-1,), (-2,)))

# vmap_axes: none, 0, and a pytree with non-zero axes (on `cnn_batch_axis_1`).
_VMAP = ('none', 'zero', 'pytree')


def _named(**factors):
  """`named_parameters` for the product of `factors` (name: {label: value})."""
  names = list(factors)
  cases = []
  for combo in itertools.product(*(factors[n].items() for n in names)):
    case = {'testcase_name': '_' + '_'.join(label for label, _ in combo)}
    case.update({n: value for n, (_, value) in zip(names, combo)})
    cases.append(case)
  return parameterized.named_parameters(*cases)


_IMPL = {i.name.lower(): i for i in _IMPLEMENTATIONS}
_VMAP_NONE_ZERO = {'vmap_none': None, 'vmap_0': 0}


class EmpiricalNtkAllImplementationsTest(test_utils.NeuralTangentsTestCase):
  """Each implementation, vmap_axes and trace/diagonal option, on a CNN."""

  @_named(implementation=_IMPL, vmap={f'vmap_{v}': v for v in _VMAP},
          axes={f'trace{"".join(map(str, t))}_diag{"".join(map(str, d))}':
                (t, d) for t, d in _AXES})
  def test_cnn_equals_explicit_jacobian_contraction(self, implementation,
                                                    vmap, axes):
    trace_axes, diagonal_axes = axes
    params = cnn_params()
    x1, x2 = _cnn_inputs()
    f, vmap_axes = cnn, {'none': None, 'zero': 0}.get(vmap)
    if vmap == 'pytree':
      f, vmap_axes = cnn_batch_axis_1, ({'img': 1}, 1, None)
      x1, x2 = {'img': jnp.moveaxis(x1, 0, 1)}, {'img': jnp.moveaxis(x2, 0, 1)}
    ntk_fn = nt.empirical_ntk_fn(f, trace_axes, diagonal_axes, vmap_axes,
                                 implementation)
    for second in (None, x2):
      expected = explicit_ntk(f, params, x1, second, trace_axes,
                              diagonal_axes, cache_key=f)
      self.assertAllClose(ntk_fn(x1, second, params), expected, rtol=_TOL,
                          atol=_TOL)


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
      self.assertAllClose(actual, expected, rtol=_TOL, atol=_TOL)

  @_named(implementation=_IMPL, vmap_axes=_VMAP_NONE_ZERO)
  def test_mlp(self, implementation, vmap_axes):
    for trace_axes in ((), (-1,)):
      self._check(mlp, mlp_params(), _normal(1, (4, 3)), _normal(2, (3, 3)),
                  implementation, vmap_axes, trace_axes)

  @_named(implementation=_IMPL)
  def test_mlp_under_jit(self, implementation):
    self._check(mlp, mlp_params(), _normal(1, (4, 3)), _normal(2, (3, 3)),
                implementation, 0, jit=True)

  @_named(implementation=_IMPL, vmap_axes=_VMAP_NONE_ZERO)
  def test_dict_params(self, implementation, vmap_axes):
    def f(params, x):
      h = jnp.sin(x @ params['dense']['w'].T) * jnp.expand_dims(
          params['scale'], 0)
      return h @ params['out']

    params = {'dense': {'w': _normal(1, (5, 3))}, 'scale': _normal(2, (5,)),
              'out': _normal(3, (5, 2))}
    self._check(f, params, _normal(4, (3, 3)), _normal(5, (2, 3)),
                implementation, vmap_axes)

  @_named(implementation=_IMPL, vmap_axes=_VMAP_NONE_ZERO)
  def test_flax_module(self, implementation, vmap_axes):

    class Net(nn.Module):

      @nn.compact
      def __call__(self, x):
        x = nn.Conv(3, (2, 2), param_dtype=jnp.float64)(x)
        x = nn.gelu(x).reshape((x.shape[0], -1))
        return nn.Dense(2, param_dtype=jnp.float64)(x)

    x1, x2 = _normal(1, (3, 3, 3, 2)), _normal(2, (2, 3, 3, 2))
    model = Net()
    variables = model.init(jax.random.PRNGKey(0), x1)
    # Under jit: a deep network compiles faster whole than op by op. (`x2`
    # given only: `x2=None` is checked on every other network.)
    self._check(model.apply, variables, x1, x2, implementation, vmap_axes,
                jit=True)

  @_named(implementation=_IMPL, vmap_axes=_VMAP_NONE_ZERO)
  def test_stax_network(self, implementation, vmap_axes):
    init_fn, apply_fn, _ = stax.serial(
        stax.Conv(3, (2, 2), padding='SAME', b_std=0.1), stax.Relu(),
        stax.Flatten(), stax.Dense(4, b_std=0.1), stax.Erf(), stax.Dense(2))
    x1, x2 = _normal(1, (3, 3, 3, 2)), _normal(2, (2, 3, 3, 2))
    _, params = init_fn(jax.random.PRNGKey(0), x1.shape)
    self._check(apply_fn, params, x1, x2, implementation, vmap_axes,
                jit=True)

  @_named(implementation=_IMPL, vmap_axes=_VMAP_NONE_ZERO)
  def test_stax_residual_and_repeat(self, implementation, vmap_axes):
    block = stax.serial(stax.Dense(4, b_std=0.1), stax.Relu())
    init_fn, apply_fn, _ = stax.serial(
        stax.Dense(4), stax.FanOut(2), stax.parallel(block, stax.Identity()),
        stax.FanInSum(), stax.repeat(block, 2), stax.Dense(2))
    x1, x2 = _normal(1, (3, 3)), _normal(2, (2, 3))
    _, params = init_fn(jax.random.PRNGKey(0), x1.shape)
    self._check(apply_fn, params, x1, x2, implementation, vmap_axes,
                jit=True)

  @_named(implementation=_IMPL, vmap_axes=_VMAP_NONE_ZERO)
  def test_rng_keyword(self, implementation, vmap_axes):
    def f(params, x, rng):
      # Dropout-like: one mask over features, shared by the batch.
      h = jnp.tanh(x @ params[0])
      mask = jax.random.bernoulli(rng, 0.6, (1,) + h.shape[-1:])
      return (h * mask) @ params[1]

    params = (_normal(1, (3, 5)), _normal(2, (5, 2)))
    x1, x2 = _normal(3, (3, 3)), _normal(4, (2, 3))
    rng = jax.random.PRNGKey(7)
    ntk_fn = nt.empirical_ntk_fn(f, vmap_axes=vmap_axes,
                                 implementation=implementation)
    # x2 is None: both calls get `rng`; else x2's gets `fold_in(rng, 1)`.
    for second, rng2 in ((None, rng), (x2, jax.random.fold_in(rng, 1))):
      expected = explicit_ntk(f, params, x1, second, kwargs1={'rng': rng},
                              kwargs2={'rng': rng2})
      self.assertAllClose(ntk_fn(x1, second, params, rng=rng), expected,
                          rtol=_TOL, atol=_TOL)
    # A pair of keys: one for x1's call, one for x2's.
    k1, k2 = jax.random.PRNGKey(1), jax.random.PRNGKey(2)
    expected = explicit_ntk(f, params, x1, x2, kwargs1={'rng': k1},
                            kwargs2={'rng': k2})
    self.assertAllClose(ntk_fn(x1, x2, params, rng=(k1, k2)), expected,
                        rtol=_TOL, atol=_TOL)

  @_named(implementation=_IMPL,
          vmap_axes={'vmap_none': None, 'vmap_0': 0, 'vmap_pytree': (
              {'a': 0, 'b': 0}, (0, {'c': 0}), {})})
  def test_pytree_inputs_and_outputs(self, implementation, vmap_axes):
    def f(params, x):
      h = jnp.tanh(x['a'] @ params['w'] + x['b'] @ params['v'])
      return (h @ params['o1'],
              {'c': jnp.einsum('nh,hkc->nkc', h, params['o2'])})

    params = {'w': _normal(1, (3, 4)), 'v': _normal(2, (2, 4)),
              'o1': _normal(3, (4, 2)), 'o2': _normal(4, (4, 3, 2))}
    x1 = {'a': _normal(5, (3, 3)), 'b': _normal(6, (3, 2))}
    x2 = {'a': _normal(7, (2, 3)), 'b': _normal(8, (2, 2))}
    self._check(f, params, x1, x2, implementation, vmap_axes,
                trace_axes=(-1,))

  @_named(implementation=_IMPL)
  def test_batch_items_interact(self, implementation):
    def f(params, x):
      # Batch-norm-like: statistics over the batch couple the examples.
      h = x @ params[0]
      h = ((h - h.mean(0, keepdims=True)) /
           jnp.sqrt(h.var(0, keepdims=True) + 1.))
      return jnp.tanh(h) @ params[1]

    params = (_normal(1, (3, 4)), _normal(2, (4, 2)))
    self._check(f, params, _normal(3, (4, 3)), _normal(4, (3, 3)),
                implementation, None, trace_axes=())

  @_named(implementation=_IMPL)
  def test_batched_keyword_argument(self, implementation):
    def f(params, x, mask):
      return (jnp.tanh(x @ params[0]) * mask) @ params[1]

    params = (_normal(1, (3, 4)), _normal(2, (4, 2)))
    x1, x2 = _normal(3, (3, 3)), _normal(4, (2, 3))
    m1, m2 = _normal(5, (3, 4)), _normal(6, (2, 4))
    expected = explicit_ntk(f, params, x1, x2, kwargs1={'mask': m1},
                            kwargs2={'mask': m2})
    # Explicitly batched keyword; then an int `vmap_axes`, which batches
    # keywords that have the batch size along it.
    for vmap_axes in ((0, 0, {'mask': 0}), 0):
      ntk_fn = nt.empirical_ntk_fn(f, vmap_axes=vmap_axes,
                                   implementation=implementation)
      self.assertAllClose(ntk_fn(x1, x2, params, mask=(m1, m2)), expected,
                          rtol=_TOL, atol=_TOL)


def _batch_axis_1(params, x):
  """`(3, 4) -> (7, 3, 2)`: the output's batch axis is 1."""
  h = jnp.tanh(x @ params['w'])
  return jnp.moveaxis(h.reshape(x.shape[0], 7, 2), 0, 1)


def _batch_axis_1_params():
  return {'w': _normal(1, (4, 14), 0.5)}


class PublishedConventionsTest(test_utils.NeuralTangentsTestCase):
  """`rng`, `vmap_axes`, batch-axis layouts and nested inputs, as published.

  The reference is the explicit Jacobian contraction (`explicit_ntk`).
  """

  @_named(implementation=_IMPL)
  def test_dropout_rng_keys(self, implementation):
    # f(x1) gets rng, f(x2) fold_in(rng, 1), unless x2 is None or equal to
    # x1; a pair of keys is used as given.
    init_fn, apply_fn, _ = stax.serial(stax.Dense(16), stax.Dropout(0.5),
                                       stax.Relu(), stax.Dense(2))
    x1, x2 = _normal(1, (3, 4)), _normal(2, (2, 4))
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
      self.assertAllClose(k.ntk, expected, rtol=_TOL, atol=_TOL)
      f1 = apply_fn(params, x1, rng=rng1)
      f2 = apply_fn(params, x, rng=rng2)
      self.assertAllClose(k.nngp, f1 @ f2.T / 2, rtol=_TOL, atol=_TOL)
    # Different masks for x1 and x2 change the kernel (the test has power).
    same_keys = explicit_ntk(apply_fn, params, x1, x2, kwargs1={'rng': rng})
    self.assertGreater(
        np.abs(kernel_fn(x1, x2, 'ntk', params, rng=rng) - same_keys).max(),
        1e-3)
    # Under jit the comparison of x1 and x2 is traced.
    jitted = jax.jit(kernel_fn, static_argnames='get')
    self.assertAllClose(jitted(x1, x1, 'ntk', params, rng=rng),
                        kernel_fn(x1, None, 'ntk', params, rng=rng),
                        rtol=_TOL, atol=_TOL)
    self.assertAllClose(jitted(x1, x2, 'ntk', params, rng=rng),
                        kernel_fn(x1, x2, 'ntk', params, rng=rng),
                        rtol=_TOL, atol=_TOL)

  @_named(implementation=_IMPL,
          vmap_axes={'pair': (0, 1), 'triple': (0, 1, None)})
  def test_output_batch_axis_keeps_the_layout(self, implementation,
                                              vmap_axes):
    # Outputs (7, 3, 2) with batch axis 1: the kernel is (7, 7, 3, 3, 2, 2),
    # as without vmap_axes.
    params = _batch_axis_1_params()
    x1, x2 = _normal(2, (3, 4)), _normal(3, (2, 4))
    ntk_fn = nt.empirical_ntk_fn(_batch_axis_1, (), (), vmap_axes,
                                 implementation)
    for second, n2 in ((None, 3), (x2, 2)):
      actual = ntk_fn(x1, second, params)
      self.assertEqual(actual.shape, (7, 7, 3, n2, 2, 2))
      self.assertAllClose(actual, explicit_ntk(_batch_axis_1, params, x1,
                                               second, ()),
                          rtol=_TOL, atol=_TOL)

  @_named(implementation=_IMPL)
  def test_pytree_vmap_axes(self, implementation):
    def f(params, x):
      h = jnp.tanh(x['a'] @ params['w'] + x['b'].T @ params['v'])
      return jnp.moveaxis(h.reshape(x['a'].shape[0], 7, 2), 0, 1), jnp.sin(h)

    params = {'w': _normal(1, (4, 14), 0.5), 'v': _normal(2, (2, 14), 0.5)}
    x1 = {'a': _normal(3, (3, 4)), 'b': _normal(4, (2, 3))}
    x2 = {'a': _normal(5, (2, 4)), 'b': _normal(6, (2, 2))}
    # A pair `(in_axes, out_axes)` of pytrees; the triple with kwargs axes.
    for vmap_axes in (({'a': 0, 'b': 1}, (1, 0)),
                      ({'a': 0, 'b': 1}, (1, 0), {})):
      ntk_fn = nt.empirical_ntk_fn(f, (), (), vmap_axes, implementation)
      for second in (None, x2):
        self.assertAllClose(ntk_fn(x1, second, params),
                            explicit_ntk(f, params, x1, second, ()),
                            rtol=_TOL, atol=_TOL)

  def test_pytree_vmap_axes_of_inputs_and_outputs(self):
    # A pytree prefix of both x and f(x) is the batch axes of both.
    def f(params, x):
      a, b = x
      return jnp.tanh(a @ params), jnp.tanh(b.T @ params).T

    params = _normal(1, (3, 2))
    x1 = (_normal(2, (4, 3)), _normal(3, (3, 4)))
    ntk_fn = nt.empirical_ntk_fn(f, (), (), (0, 1))
    self.assertAllClose(ntk_fn(x1, None, params),
                        explicit_ntk(f, params, x1, None, ()),
                        rtol=_TOL, atol=_TOL)

  @_named(implementation=_IMPL,
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
      f, params = _batch_axis_1, _batch_axis_1_params()
      swap = lambda axes: tuple({0: 1, 1: 0}.get(a, a) for a in axes)
      trace_axes, diagonal_axes = swap(trace_axes), swap(diagonal_axes)
    x1, x2 = _normal(2, (3, 4 if f is _batch_axis_1 else 3)), None
    x2 = _normal(3, x1.shape)  # Diagonal batch axes need equal batch sizes.
    ntk_fn = nt.empirical_ntk_fn(f, trace_axes, diagonal_axes, vmap_axes,
                                 implementation)
    for second in (None, x2):
      self.assertAllClose(
          ntk_fn(x1, second, params),
          explicit_ntk(f, params, x1, second, trace_axes, diagonal_axes),
          rtol=_TOL, atol=_TOL)

  @parameterized.parameters(None, 0)
  def test_diagonal_batch_axis_needs_equal_batch_sizes(self, vmap_axes):
    ntk_fn = nt.empirical_ntk_fn(mlp, (), (0,), vmap_axes)
    with self.assertRaisesRegex(ValueError, 'diagonal_axes'):
      ntk_fn(_normal(1, (4, 3)), _normal(2, (3, 3)), mlp_params())

  def test_nngp_batch_axis_traced_or_diagonal(self):
    params, x1, x2 = mlp_params(), _normal(1, (3, 3)), _normal(2, (3, 3))
    for trace_axes, diagonal_axes in (((0,), ()), ((), (0,)), ((-1,), (0,))):
      nngp_fn = nt.empirical_nngp_fn(mlp, trace_axes, diagonal_axes)
      self.assertAllClose(
          nngp_fn(x1, x2, params),
          explicit_nngp(mlp, params, x1, x2, trace_axes, diagonal_axes),
          rtol=_TOL, atol=_TOL)

  @_named(implementation=_IMPL, vmap_axes=_VMAP_NONE_ZERO)
  def test_nested_tuple_inputs(self, implementation, vmap_axes):
    init_fn, apply_fn, _ = stax.parallel(
        stax.parallel(stax.Dense(3), stax.Dense(4)), stax.Dense(2))
    x1 = ((_normal(1, (3, 5)), _normal(2, (3, 6))), _normal(3, (3, 2)))
    x2 = ((_normal(4, (2, 5)), _normal(5, (2, 6))), _normal(6, (2, 2)))
    _, params = init_fn(jax.random.PRNGKey(0),
                        jax.tree_util.tree_map(jnp.shape, x1))
    kernel_fn = nt.empirical_kernel_fn(apply_fn, vmap_axes=vmap_axes,
                                       implementation=implementation)
    for second in (None, x2):
      k = kernel_fn(x1, second, ('nngp', 'ntk'), params)
      self.assertAllClose(k.ntk, explicit_ntk(apply_fn, params, x1, second),
                          rtol=_TOL, atol=_TOL)
      self.assertAllClose(k.nngp,
                          explicit_nngp(apply_fn, params, x1, second),
                          rtol=_TOL, atol=_TOL)


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

  @_named(name={n: n for n in _FUNCTIONS},
          implementation={'auto': 0, 'structured_derivatives': 3},
          vmap_axes=_VMAP_NONE_ZERO)
  def test_equals_explicit(self, name, implementation, vmap_axes):
    params = {'w': _normal(1, (3, 3)), 'o': _normal(2, (3, 2)),
              'k': _normal(3, (2, 1, 1, 6)), 'b': _normal(4, (18,)),
              's': _normal(7, (2, 3, 3))}
    x1, x2 = _normal(5, (4, 3)), _normal(6, (3, 3))
    f = self._FUNCTIONS[name]
    # Untraced per example, traced on the whole batch: both kinds of letters.
    trace_axes = () if vmap_axes == 0 else (-1,)
    ntk_fn = nt.empirical_ntk_fn(f, trace_axes, (), vmap_axes, implementation)
    for second in (None, x2):
      expected = explicit_ntk(f, params, x1, second, trace_axes,
                              cache_key=name)
      self.assertAllClose(ntk_fn(x1, second, params), expected, rtol=_TOL,
                          atol=_TOL)


@jax.jit
def _jitted_layer(x, w):
  return x @ w


class OtherKernelsTest(test_utils.NeuralTangentsTestCase):

  @parameterized.parameters(((-1,), ()), ((), ()), ((), (-1,)))
  def test_nngp_equals_explicit(self, trace_axes, diagonal_axes):
    params = mlp_params()
    x1, x2 = _normal(1, (4, 3)), _normal(2, (3, 3))
    nngp_fn = nt.empirical_nngp_fn(mlp, trace_axes, diagonal_axes)
    for second in (None, x2):
      self.assertAllClose(
          nngp_fn(x1, second, params),
          explicit_nngp(mlp, params, x1, second, trace_axes, diagonal_axes),
          rtol=_TOL, atol=_TOL)

  def test_kernel_fn_get(self):
    params = mlp_params()
    x1, x2 = _normal(1, (4, 3)), _normal(2, (3, 3))
    kernel_fn = nt.empirical_kernel_fn(mlp, vmap_axes=0, implementation=3)
    ntk = explicit_ntk(mlp, params, x1, x2)
    nngp = explicit_nngp(mlp, params, x1, x2)
    self.assertAllClose(kernel_fn(x1, x2, 'ntk', params), ntk, rtol=_TOL)
    self.assertAllClose(kernel_fn(x1, x2, 'nngp', params), nngp, rtol=_TOL)
    both = kernel_fn(x1, x2, None, params)
    self.assertEqual(type(both).__name__, 'Kernel')
    self.assertEqual(both._fields, ('nngp', 'ntk'))
    self.assertAllClose(both.ntk, ntk, rtol=_TOL)
    self.assertAllClose(both.nngp, nngp, rtol=_TOL)
    only = kernel_fn(x1, x2, ('ntk',), params)
    self.assertEqual(only._fields, ('ntk',))
    self.assertAllClose(only.ntk, ntk, rtol=_TOL)
    # One result type per `get`, shared with stax: results are the same
    # pytree structure and can be combined, e.g. averaged over ensembles.
    again = kernel_fn(x2, x2, None, params)
    self.assertIs(type(again), type(both))
    _, _, stax_kernel_fn = stax.serial(stax.Dense(1))
    self.assertIs(type(stax_kernel_fn(x1, x2, ('nngp', 'ntk'))), type(both))
    total = jax.tree_util.tree_map(jnp.add, again,
                                   kernel_fn(x2, x2, None, params))
    self.assertAllClose(total.ntk, 2 * again.ntk, rtol=_TOL)

  def test_ntk_vp_equals_full_ntk_times_vector(self):
    params = mlp_params()
    x1, x2 = _normal(1, (4, 3)), _normal(2, (3, 3))
    v = _normal(3, (3, 2))
    full = explicit_ntk(mlp, params, x1, x2, trace_axes=())  # (4, 3, 2, 2)
    expected = jnp.einsum('ijab,jb->ia', full, v)
    vp = nt.empirical_ntk_vp_fn(mlp, x1, x2, params)
    self.assertAllClose(vp(v), expected, rtol=_TOL)

  def test_linearize_is_first_order_taylor(self):
    params = mlp_params()
    x = _normal(1, (4, 3))
    dp = jax.tree_util.tree_map(lambda p: 1e-3 * jnp.ones_like(p), params)
    shifted = jax.tree_util.tree_map(jnp.add, params, dp)
    f_lin = nt.linearize(mlp, params)
    _, df = jax.jvp(lambda p: mlp(p, x), (params,), (dp,))
    self.assertAllClose(f_lin(shifted, x), mlp(params, x) + df, rtol=_TOL)
    self.assertAllClose(f_lin(params, x), mlp(params, x), rtol=_TOL)

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


def _batch_size_scaled(params, x):
  # Examples do not interact, but f on a batch of one is a different function.
  return mlp(params, x) / x.shape[0]


def _batch_position_scaled(params, x):
  return mlp(params, x) * np.arange(1, x.shape[0] + 1)[:, None]


def _batch_position_iota(params, x):
  # The positions are an `iota` in the program, not a constant.
  return mlp(params, x) * jnp.arange(1., x.shape[0] + 1)[:, None]


class AutoTest(test_utils.NeuralTangentsTestCase):
  """AUTO weighs per-example and whole-batch formulations when they agree."""

  def _formulation(self, f, vmap_axes, x2=None):
    # As `AUTO` calls it: separability comes from planning the candidates.
    params = mlp_params()
    x1 = _normal(1, (4, 3))
    setup = functools.partial(empirical_api._setup, f, x1, x2, params, {}, (-1,),
                              ())
    problem, p, d1, d2 = setup(vmap_axes)
    separable = empirical_api._SEPARABLE in empirical_api._candidates(problem, p, d1,
                                                              d2)
    return empirical_api._other_formulation(setup, vmap_axes, p, d1, d2,
                                        separable=separable)

  def test_per_example_formulation_without_vmap_axes(self):
    other = self._formulation(mlp, None, _normal(2, (3, 3)))
    self.assertIsNotNone(other)
    self.assertTrue(other.per_example)
    # And the whole-batch one with vmap_axes=0.
    self.assertFalse(self._formulation(mlp, 0).per_example)

  @parameterized.named_parameters(
      ('batch_size_literal', _batch_size_scaled),
      ('batch_position_constant', _batch_position_scaled),
      ('batch_position_iota', _batch_position_iota))
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
    x1, x2 = _normal(1, (4, 3)), _normal(2, (3, 3))
    ntk_fn = nt.empirical_ntk_fn(f, (), (), None, nt.NtkImplementation.AUTO)
    for train in (False, True, False):
      self.assertAllClose(
          ntk_fn(x1, x2, params, train=train),
          explicit_ntk(functools.partial(f, train=train), params, x1, x2, ()),
          rtol=_TOL, atol=_TOL)

  @parameterized.named_parameters(
      ('mlp', mlp), ('batch_size_literal', _batch_size_scaled),
      ('batch_position_constant', _batch_position_scaled),
      ('batch_position_iota', _batch_position_iota))
  def test_auto_without_vmap_axes_equals_explicit(self, f):
    params = mlp_params()
    x1, x2 = _normal(1, (4, 3)), _normal(2, (3, 3))
    ntk_fn = nt.empirical_ntk_fn(f, (), (), None, nt.NtkImplementation.AUTO)
    for second in (None, x2):
      self.assertAllClose(ntk_fn(x1, second, params),
                          explicit_ntk(f, params, x1, second, ()),
                          rtol=_TOL, atol=_TOL)


class BadInputTest(test_utils.NeuralTangentsTestCase):

  def _ntk(self, **kwargs):
    return nt.empirical_ntk_fn(mlp, **kwargs)(_normal(1, (4, 3)), None,
                                              mlp_params())

  @parameterized.parameters(7, -1, 'jacobian', 1.5, None, True)
  def test_invalid_implementation(self, implementation):
    with self.assertRaisesRegex(ValueError, r'implementation.*STRUCTURED'):
      nt.empirical_ntk_fn(mlp, implementation=implementation)

  def test_implementation_as_int(self):
    for i in range(4):
      self.assertEqual(self._ntk(implementation=i).shape, (4, 4))

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
          _normal(1, (4, 3)), None, mlp_params(), **(
              {'z': jnp.ones(3)} if isinstance(vmap_axes, tuple) and
              len(vmap_axes) == 3 and vmap_axes[2] else {}))

  def test_invalid_get(self):
    kernel_fn = nt.empirical_kernel_fn(mlp)
    with self.assertRaisesRegex(ValueError, 'get'):
      kernel_fn(_normal(1, (4, 3)), None, 'ntkk', mlp_params())


if __name__ == '__main__':
  absltest.main()
