"""The reference of the empirical-kernel tests, and the networks they use.

Every implementation is compared with an explicit reference written here
from the definition: the Jacobian of the whole batch with `jax.jacobian`,
contracted with an explicit einsum, in float64.
"""
import functools
import itertools
import string

from absl.testing import parameterized
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

import neural_tangents as nt
from tests import test_utils


IMPLEMENTATIONS = tuple(nt.NtkImplementation)
TOL = 1e-10


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


def normal(seed, shape, scale=1.):
  return scale * jax.random.normal(jax.random.PRNGKey(seed), shape)


def mlp(params, x):
  for w, b in params[:-1]:
    x = jnp.tanh(x @ w + jnp.expand_dims(b, 0))
  w, b = params[-1]
  return x @ w + jnp.expand_dims(b, 0)


def mlp_params():
  sizes = [3, 5, 4, 2]
  return [(normal(i, (a, b), a ** -0.5), normal(10 + i, (b,), 0.1))
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
  return (normal(1, (3, 3, 2, 3), 0.3), normal(2, (3,), 0.1),
          normal(3, (2, 2, 3, 2), 0.3))


def cnn_batch_axis_1(params, x):
  """`cnn` on a dict input with batch axis 1; output batch axis 1."""
  out = cnn(params, jnp.moveaxis(x['img'], 1, 0))
  return jnp.moveaxis(out, 0, 1)


def cnn_inputs():
  return normal(4, (3, 4, 5, 2)), normal(5, (2, 4, 5, 2))


# `(trace_axes, diagonal_axes)`: none, one, several traced; one diagonal;
# one diagonal also traced; one traced and another diagonal.
AXES = (((), ()), ((-1,), ()), ((-1, -2), ()), ((), (-2,)), ((-1,), (-1,)),
         ((-1,), (-2,)))

# vmap_axes: none, 0, and a pytree with non-zero axes (on `cnn_batch_axis_1`).
VMAP = ('none', 'zero', 'pytree')


def named(**factors):
  """`named_parameters` of a seeded pairwise-covering subset of `factors`.

  `factors` maps each argument name to `{label: value}`. The default tier
  runs a subset of the cross product that covers every pair of values
  (`test_utils.sample_cases`), with `NtkImplementation.AUTO` (which compiles
  every other implementation and picks one, so each of its cases repeats
  theirs) in one case per test; `NT_TEST_FULL=1` runs the whole product.
  """
  def decorator(test_fn):
    implementations = factors.get('implementation')
    auto = {k: v for k, v in (implementations or {}).items()
            if v == nt.NtkImplementation.AUTO}
    if test_utils.FULL or not auto or len(auto) == len(implementations):
      cases = test_utils.sample_cases(seed_name=test_fn.__name__, **factors)
    else:
      others = dict(factors, implementation={
          k: v for k, v in implementations.items() if k not in auto})
      cases = test_utils.sample_cases(seed_name=test_fn.__name__, **others)
      # One AUTO case: the first sampled case with AUTO in its place.
      first = dict(cases[0], implementation=next(iter(auto.values())))
      label = next(k for k, v in others['implementation'].items()
                   if v == cases[0]['implementation'])
      first['testcase_name'] = first['testcase_name'].replace(
          label, next(iter(auto)), 1)
      cases.append(first)
    return parameterized.named_parameters(*cases)(test_fn)
  return decorator


IMPL = {i.name.lower(): i for i in IMPLEMENTATIONS}
VMAP_NONE_ZERO = {'vmap_none': None, 'vmap_0': 0}


def batch_axis_1(params, x):
  """`(3, 4) -> (7, 3, 2)`: the output's batch axis is 1."""
  h = jnp.tanh(x @ params['w'])
  return jnp.moveaxis(h.reshape(x.shape[0], 7, 2), 0, 1)


def batch_axis_1_params():
  return {'w': normal(1, (4, 14), 0.5)}



def batch_size_scaled(params, x):
  # Examples do not interact, but f on a batch of one is a different function.
  return mlp(params, x) / x.shape[0]


def batch_position_scaled(params, x):
  return mlp(params, x) * np.arange(1, x.shape[0] + 1)[:, None]


def batch_position_iota(params, x):
  # The positions are an `iota` in the program, not a constant.
  return mlp(params, x) * jnp.arange(1., x.shape[0] + 1)[:, None]

