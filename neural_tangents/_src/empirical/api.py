"""Empirical (finite-width) kernels of any JAX function `f(params, x)`.

The empirical NTK is `Theta(x1, x2) = J(x1) J(x2)^T` with
`J(x) = df(params, x) / dparams`, and the empirical NNGP kernel is
`f(x1) f(x2)^T`. Three ways to compute the NTK give the same answer:

* `JACOBIAN_CONTRACTION`: Jacobians (`jacrev`/`jacfwd`, per example under
  `vmap` when `vmap_axes` is given), contracted leaf by leaf.
* `NTK_VECTOR_PRODUCTS`: `Theta v = J(x1) (J(x2)^T v)` by a VJP then a JVP,
  applied to a basis of x2's output cotangents; no Jacobian is stored.
* `STRUCTURED_DERIVATIVES`: reads `f`'s jaxpr and contracts, for each
  parameter, the inputs and output cotangents of the layers it enters
  instead of its Jacobian (see `structured_derivatives`).

`AUTO` estimates the cost of each with XLA's cost analysis and picks the
cheapest; with `vmap_axes=None` it also tries to prove from the jaxpr that
batch items do not interact, which makes per-example derivatives valid.

Kernel layout: for an output leaf of shape `(O_0, ..., O_k)` (the batch
axis among them: axis 0 without `vmap_axes`), the kernel has, for each
non-traced axis in order, `O_i` once if it is in `diagonal_axes` and
`(O_i, O_i)` otherwise: `(N1, N2, O_1, O_1, ...)` for a batch axis 0 and no
traced or diagonal axes. Traced axes are averaged over (mean, not sum). For
pytree outputs the result is a pytree of kernels, one per output leaf.

Keyword arguments of `f` are passed to both calls, `f(x1)` and `f(x2)`; to
pass different values, give the pair `(value_for_x1, value_for_x2)` as a
tuple. (A tuple of exactly two elements is always read as such a pair.) A
single PRNG key `rng` follows the published convention: `f(x1)` gets `rng`
and `f(x2)` gets `jax.random.fold_in(rng, 1)`, unless x2 is None or equal
to x1, when both get `rng` (`read_rng`).

`vmap_axes` is None, an int, a pytree of axes that is a prefix of both the
inputs and the outputs, a pair `(in_axes, out_axes)`, or a triple
`(in_axes, out_axes, kwargs_axes)`. Whatever `vmap_axes`, the kernel has
the layout it has without it: the batch axis is an output axis like the
others (its pair `(N1, N2)` sits at its place among the output axes), and
may be traced or diagonal.
"""
import dataclasses
import enum
import functools
import math
import re
from typing import Any, Callable, Optional, Sequence, Union

import jax
from jax import tree_util
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.empirical import layout as layout_lib
from neural_tangents._src.empirical import structured
from neural_tangents._src.utils import utils
from neural_tangents._src.utils.typing import Array, Axes, PyTree

ApplyFn = Callable[..., PyTree]
VMapAxes = Union[None, int, PyTree, tuple[Any, Any], tuple[Any, Any, Any]]


class NtkImplementation(enum.IntEnum):
  """How `empirical_ntk_fn` computes the NTK (all give the same answer).

  Attributes:
    AUTO: estimate the cost of each implementation (XLA cost analysis of
      the compiled candidates, at these input shapes) and use the cheapest.
    JACOBIAN_CONTRACTION: materialize Jacobians and contract them.
    NTK_VECTOR_PRODUCTS: apply `J(x1) J(x2)^T` to a basis by VJPs and JVPs.
    STRUCTURED_DERIVATIVES: contract layer inputs and output cotangents
      using the structure of each layer's Jacobian.
  """
  AUTO = 0
  JACOBIAN_CONTRACTION = 1
  NTK_VECTOR_PRODUCTS = 2
  STRUCTURED_DERIVATIVES = 3


DEFAULT_NTK_IMPLEMENTATION = NtkImplementation.JACOBIAN_CONTRACTION

# Above this many bytes of stored VJPs, `NTK_VECTOR_PRODUCTS` loops over
# chunks of x2's examples instead of vmapping all of them.
_VECTOR_PRODUCTS_MAX_BYTES = 2 ** 30


# ---------------------------------------------------------------------------
# Arguments.
# ---------------------------------------------------------------------------


def _implementation(implementation: Any) -> NtkImplementation:
  try:
    if isinstance(implementation, (bool, np.bool_)):
      raise ValueError
    return NtkImplementation(implementation)
  except (ValueError, TypeError):
    valid = ', '.join(f'{i.value} ({i.name})' for i in NtkImplementation)
    raise ValueError(
        f'`implementation={implementation!r}` is not an NtkImplementation; '
        f'pass one of {valid}, e.g. '
        '`implementation=nt.NtkImplementation.STRUCTURED_DERIVATIVES`.'
    ) from None


def _axes_tuple(axes: Axes, name: str) -> tuple[int, ...]:
  if isinstance(axes, (int, np.integer)) and not isinstance(axes, bool):
    return (int(axes),)
  try:
    out = tuple(axes)
  except TypeError:
    out = None
  if out is None or not all(isinstance(a, (int, np.integer)) and
                            not isinstance(a, bool) for a in out):
    raise ValueError(f'`{name}={axes!r}` must be an int or a sequence of ints '
                     f'(output axes, negative ones counted from the end), '
                     f'e.g. `{name}=(-1,)`.')
  return tuple(int(a) for a in out)


def _split_kwargs(kwargs: dict[str, Any], x1: PyTree,
                  x2: Optional[PyTree]) -> tuple[dict, dict, bool]:
  """Per-call keyword arguments: a 2-tuple is `(for x1, for x2)`.

  A single PRNG key `rng` follows the published convention, `read_rng`.
  Returns `(kwargs of f(x1), kwargs of f(x2), whether they are the same)`.
  """
  kw1, kw2, same = {}, {}, True
  for k, v in kwargs.items():
    if k == 'rng' and is_single_key(v):
      kw1[k], kw2[k] = read_rng(v, x1, x2)
      same = same and kw1[k] is kw2[k]
    elif isinstance(v, tuple) and len(v) == 2:
      kw1[k], kw2[k] = v
      same = same and v[0] is v[1]
    else:
      kw1[k] = kw2[k] = v
  return kw1, kw2, same


def takes_rng_pairs(kernel_fn: Callable) -> Callable:
  """Marks `kernel_fn` as following `read_rng`'s convention for `rng`.

  `nt.batch` then chooses the keys of `f(x1)` and `f(x2)` once for the whole
  call and passes them to every block as a pair, since a block cannot tell
  whether its `x2` is the call's `x1`.
  """
  kernel_fn.takes_rng_pairs = True
  return kernel_fn


def is_single_key(x: Any) -> bool:
  """A legacy PRNG key (uint32[2]) or a scalar typed key array."""
  return _is_array(x) and _is_raw_key(x)


def _x1_is_x2(x1: PyTree, x2: Optional[PyTree]) -> Union[bool, Array]:
  """Whether x2 is None or has x1's values (a traced bool under tracing)."""
  if x2 is None or x2 is x1:
    return True
  leaves1, treedef1 = tree_util.tree_flatten(x1)
  leaves2, treedef2 = tree_util.tree_flatten(x2)
  if treedef1 != treedef2 or any(np.shape(a) != np.shape(b)
                                 for a, b in zip(leaves1, leaves2)):
    return False
  if not any(isinstance(l, jax.core.Tracer) for l in leaves1 + leaves2):
    return all(np.array_equal(np.asarray(a), np.asarray(b))
               for a, b in zip(leaves1, leaves2))
  return jnp.all(jnp.stack([jnp.all(a == b)
                            for a, b in zip(leaves1, leaves2)]))


def read_rng(rng: Any, x1: PyTree,
             x2: Optional[PyTree]) -> tuple[Any, Any]:
  """The PRNG keys of `f(x1)` and `f(x2)` from an `rng` keyword argument.

  The published convention: `f(x1)` gets `rng` and `f(x2)` gets
  `random.fold_in(rng, 1)`, unless x2 is None or equal to x1 (by value),
  when both get `rng`. A pair `(key1, key2)` is used as given.

  Args:
    rng: a PRNG key, or a pair of keys.
    x1: the first inputs.
    x2: the second inputs, or None.

  Returns:
    `(key for f(x1), key for f(x2))`.

  Example:
    >>> k = jax.random.PRNGKey(0)
    >>> read_rng(k, jnp.ones(2), jnp.zeros(2))[1] == jax.random.fold_in(k, 1)
    Array([ True,  True], dtype=bool)
  """
  if isinstance(rng, tuple) and len(rng) == 2:
    return rng
  same = _x1_is_x2(x1, x2)
  if same is True:
    return rng, rng
  other = jax.random.fold_in(rng, 1)
  if same is False:
    return rng, other
  # Under tracing: select between the keys' data (typed keys included).
  typed = jnp.issubdtype(rng.dtype, jax.dtypes.prng_key)
  data = (lambda k: jax.random.key_data(k)) if typed else (lambda k: k)
  selected = jnp.where(same, data(rng), data(other))
  if typed:
    selected = jax.random.wrap_key_data(selected,
                                        impl=jax.random.key_impl(rng))
  return rng, selected


def _is_array(x: Any) -> bool:
  return isinstance(x, (jax.Array, np.ndarray, np.generic))


def _dynamic_kwargs(kwargs: dict[str, Any]) -> tuple[dict, dict]:
  """Splits kwargs into arrays (traced) and other values (closed over)."""
  dynamic, static = {}, {}
  for k, v in kwargs.items():
    leaves = tree_util.tree_leaves(v)
    if leaves and all(_is_array(l) for l in leaves):
      dynamic[k] = v
    else:
      static[k] = v
  return dynamic, static


def _static_key(kwargs: dict[str, Any]) -> tuple:
  """Identifies the non-array keyword arguments (e.g. `mode='train'`).

  `f` may compute differently for other values, so AUTO's choice is cached
  per value (per object, for unhashable values).
  """
  _, static = _dynamic_kwargs(kwargs)
  items = []
  for name in sorted(static):
    value = static[name]
    try:
      hash(value)
      items.append((name, value))
    except TypeError:
      items.append((name, id(value)))
  return tuple(items)


def _is_raw_key(x: Any) -> bool:
  """A legacy PRNG key (uint32[2]) or typed key array, shared by default."""
  dtype = getattr(x, 'dtype', None)
  if dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key):
    return np.ndim(x) == 0
  return dtype == np.uint32 and np.shape(x) == (2,)


def _broadcast_prefix(prefix: Any, tree: Any, name: str, value: Any) -> list:
  """The leaves of `prefix` broadcast to the leaves of `tree`."""
  try:
    full = tree_util.tree_map(
        lambda p, sub: tree_util.tree_map(lambda _: p, sub), prefix, tree,
        is_leaf=lambda p: p is None)
  except ValueError as e:
    raise ValueError(
        f'`vmap_axes={value!r}`: its {name} do not match the structure of '
        f'the {name.split()[0]} ({tree_util.tree_structure(tree)}); give an '
        'int, or a pytree with the same structure (a prefix of it).'
    ) from e
  return tree_util.tree_leaves(full, is_leaf=lambda p: p is None)


def _normalize_axis(axis: Any, ndim: int, what: str, value: Any) -> Optional[int]:
  if axis is None:
    return None
  if not isinstance(axis, (int, np.integer)) or not -ndim <= axis < ndim:
    raise ValueError(
        f'`vmap_axes={value!r}` gives axis {axis!r} for {what} with {ndim} '
        f'axes; pass an axis in [-{ndim}, {ndim}) (the batch axis), or None.')
  return int(axis) % ndim


# ---------------------------------------------------------------------------
# The problem: f on x1 and x2 as flat functions of arrays.
# ---------------------------------------------------------------------------



@dataclasses.dataclass(frozen=True, eq=False)
class _Side:
  """`f` on one of x1, x2, as functions of flat lists of arrays.

  Attributes:
    fn: `fn(param_leaves, data) -> output leaves` on the whole batch, where
      `data` holds the leaves of x, of the array keyword arguments, and the
      non-differentiable parameter leaves.
    single_fn: `single_fn(param_leaves, example_data) -> output leaves` of
      one example, without batch axes (None without `vmap_axes`).
    data_axes: the example axis of each data leaf, None for shared leaves
      (None without `vmap_axes`).
    out_shapes: the shape of each output leaf of one call of `fn` (of
      `single_fn` with `vmap_axes`).
    n: number of examples.
    n_x: number of data leaves that are leaves of x (they come first).
  """
  fn: Callable[[list, list], list]
  single_fn: Optional[Callable[[list, list], list]]
  data_axes: Optional[tuple[Optional[int], ...]]
  out_shapes: tuple[tuple[int, ...], ...]
  n: int
  n_x: int

  def call(self, per_example: bool) -> Callable[[list, list], list]:
    """The function of one call: one example's, or the whole batch's."""
    return self.single_fn if per_example else self.fn

  def over_examples(self, fn: Callable, per_example: bool,
                    out_axes: Any = 0) -> Callable:
    """`fn(params, data)` of one example -> of all examples (at axis 0)."""
    if not per_example:
      return fn
    return jax.vmap(fn, in_axes=(None, list(self.data_axes)),
                    out_axes=out_axes)


@dataclasses.dataclass(frozen=True, eq=False)
class _Problem:
  """Everything static about one call of `ntk_fn`.

  Attributes:
    sides: x1's and x2's `_Side`.
    symmetric: whether x2 is x1 with the same keyword arguments.
    per_example: whether `vmap_axes` was given.
    layouts: the kernel layout of each output leaf.
    result_shapes: the kernel shape of each output leaf.
    out_treedef: the structure of `f`'s output.
    same_calls: whether both sides call `f` with the same non-array keyword
      arguments, so that inputs of equal shapes trace to the same program.
    placements: per output leaf, with `per_example`, `(kinds, batch_axis)`:
      the kind of every axis of the whole-batch output and its batch axis,
      to move the example axes of the computed kernel to their place (see
      `layout_lib.place_example_axes`); None without `per_example`.
  """
  sides: tuple[_Side, _Side]
  symmetric: bool
  per_example: bool
  layouts: tuple[layout_lib.KernelLayout, ...]
  result_shapes: tuple[tuple[int, ...], ...]
  out_treedef: Any
  same_calls: bool
  placements: tuple[Optional[tuple[tuple[str, ...], int]], ...]


def _setup(f: ApplyFn, x1: PyTree, x2: Optional[PyTree], params: PyTree,
           kwargs: dict[str, Any], trace_axes: tuple[int, ...],
           diagonal_axes: tuple[int, ...], vmap_axes: VMapAxes
           ) -> tuple[_Problem, list, list, list]:
  """Flattens a call of `ntk_fn` into a `_Problem` and its arrays.

  Returns:
    `(problem, param_leaves, data1, data2)`: the differentiable (inexact)
    parameter leaves, and each side's data leaves.
  """
  kw1, kw2, same_kwargs = _split_kwargs(kwargs, x1, x2)
  symmetric = x2 is None and same_kwargs
  if x2 is None:
    x2 = x1
  p_leaves, p_treedef = tree_util.tree_flatten(params)
  diff = [jnp.issubdtype(jnp.result_type(l), jnp.inexact) for l in p_leaves]
  param_leaves = [l for l, d in zip(p_leaves, diff) if d]
  other_params = [l for l, d in zip(p_leaves, diff) if not d]
  per_example = vmap_axes is not None

  sides, datas, out_trees, statics = [], [], [], []
  for x, kw in ((x1, kw1), (x2, kw2)):
    if symmetric and sides:  # x2 is x1: the same side twice.
      sides.append(sides[0])
      datas.append(datas[0])
      out_trees.append(out_trees[0])
      statics.append(statics[0])
      continue
    dynamic, static = _dynamic_kwargs(kw)
    statics.append(static)
    x_leaves, x_treedef = tree_util.tree_flatten(x)
    kw_leaves, kw_treedef = tree_util.tree_flatten(dynamic)
    n_x, n_kw = len(x_leaves), len(kw_leaves)

    def tree_fn(param_leaves, data, x_treedef=x_treedef, kw_treedef=kw_treedef,
                n_x=n_x, n_kw=n_kw, static=static):
      params = tree_util.tree_unflatten(
          p_treedef, _merge(param_leaves, data[n_x + n_kw:], diff))
      x = tree_util.tree_unflatten(x_treedef, data[:n_x])
      kw = tree_util.tree_unflatten(kw_treedef, data[n_x:n_x + n_kw])
      return f(params, x, **static, **kw)

    fn = lambda p, d, tree_fn=tree_fn: tree_util.tree_leaves(tree_fn(p, d))
    data = list(x_leaves) + list(kw_leaves) + other_params
    axes, out_tree = vmap_axes, None
    if per_example and not (_is_int(vmap_axes) or _is_triple(vmap_axes)):
      # Which of the published readings applies depends on f's outputs.
      out_tree = jax.eval_shape(tree_fn, param_leaves, data)
      axes = _pytree_vmap_axes(vmap_axes, x, out_tree)
    if per_example:  # Checked before calling f, which may fail otherwise.
      in_axes, kw_axes = _input_axes(axes, x, dynamic)
    if out_tree is None:
      out_tree = jax.eval_shape(tree_fn, param_leaves, data)
    _check_outputs(tree_util.tree_leaves(out_tree))
    if per_example:
      out_axes = _output_axes(axes, out_tree)
      data_axes = tuple(in_axes + kw_axes + [None] * len(other_params))
      side = _per_example_side(fn, param_leaves, data, data_axes, out_tree,
                               out_axes, axes, n_x)
    else:
      out_axes = None
      shapes = tuple(tuple(o.shape) for o in tree_util.tree_leaves(out_tree))
      side = _Side(fn, None, None, shapes, shapes[0][0], n_x)
    sides.append((side, out_axes))
    datas.append(data)
    out_trees.append(out_tree)

  if tree_util.tree_structure(out_trees[0]) != tree_util.tree_structure(
      out_trees[1]):
    raise ValueError('`f(params, x1)` and `f(params, x2)` return outputs of '
                     'different structures; the kernel pairs their leaves.')
  layouts, result_shapes, placements = [], [], []
  (side1, out_axes), (side2, _) = sides
  full = tree_util.tree_leaves(out_trees[0])
  for l, (s1, s2) in enumerate(zip(side1.out_shapes, side2.out_shapes)):
    batch_axis = out_axes[l] if per_example else 0
    layout = layout_lib.KernelLayout.build(full[l].ndim, batch_axis,
                                           trace_axes, diagonal_axes,
                                           per_example)
    layouts.append(layout)
    result_shapes.append(_result_shape(layout, s1, s2, side1.n, side2.n,
                                       per_example))
    placements.append(_placement(full[l].ndim, batch_axis, trace_axes,
                                 diagonal_axes, side1.n, side2.n)
                      if per_example else None)
  same_calls = statics[0].keys() == statics[1].keys() and all(
      statics[0][k] is statics[1][k] for k in statics[0])
  problem = _Problem((side1, side2), symmetric, per_example, tuple(layouts),
                     tuple(result_shapes),
                     tree_util.tree_structure(out_trees[0]), same_calls,
                     tuple(placements))
  return problem, param_leaves, datas[0], datas[1]


def _placement(ndim: int, batch_axis: int, trace_axes: tuple[int, ...],
               diagonal_axes: tuple[int, ...], n1: int,
               n2: int) -> tuple[tuple[str, ...], int]:
  """`(kinds, batch_axis)` of a per-example kernel, see `_Problem`."""
  kinds = layout_lib.axis_kinds(ndim, trace_axes, diagonal_axes)
  if kinds[batch_axis] != layout_lib.PAIR and n1 != n2:
    name = ('trace_axes' if kinds[batch_axis] == layout_lib.TRACE else
            'diagonal_axes')
    raise ValueError(
        f'`{name}` contains the batch axis {batch_axis}, which needs as many '
        f'examples in x1 as in x2; got {n1} and {n2}. Remove axis '
        f'{batch_axis} from `{name}`, or pass inputs of equal batch sizes.')
  return kinds, batch_axis


def _place_example_axes(problem: _Problem, kernels: list) -> list:
  """Moves each per-example kernel's example axes to the published layout."""
  return [k if p is None else layout_lib.place_example_axes(k, *p)
          for k, p in zip(kernels, problem.placements)]


def _merge(diff_leaves: Sequence[Any], other_leaves: Sequence[Any],
           diff: Sequence[bool]) -> list:
  """Interleaves differentiable and other parameter leaves back in order."""
  d, o = iter(diff_leaves), iter(other_leaves)
  return [next(d) if x else next(o) for x in diff]


def _check_outputs(outs: Sequence[Any]) -> None:
  for o in outs:
    if not jnp.issubdtype(o.dtype, jnp.inexact):
      raise ValueError(f'`f` returned an output of dtype {o.dtype}; the '
                       'empirical kernels need floating-point outputs.')
    if o.ndim == 0:
      raise ValueError('`f` returned a scalar output; every output needs a '
                       'batch axis (axis 0, or the one given by `vmap_axes`).')


def _input_axes(vmap_axes: VMapAxes, x: PyTree,
                kwargs: dict[str, Any]) -> tuple[list, list]:
  """Batch axes of each x leaf and each array-keyword leaf.

  An int is the batch axis of every input leaf, and of every keyword
  argument whose array leaves all have the batch size along it (others,
  e.g. one PRNG key for the whole batch, are shared). In the triple
  `(in_axes, out_axes, kwargs_axes)`, `in_axes` is a pytree prefix of x and
  `kwargs_axes` an int, None, or a dict from keyword to a pytree prefix of
  its value (absent keywords are shared).
  """
  x_leaves = tree_util.tree_leaves(x)
  if not isinstance(vmap_axes, (tuple, list)):
    in_axes = [_normalize_axis(vmap_axes, np.ndim(l), 'an input leaf',
                               vmap_axes) for l in x_leaves]
    n = np.shape(x_leaves[0])[in_axes[0]] if x_leaves else None
    kw_axes = []
    for k, value in kwargs.items():
      leaves = tree_util.tree_leaves(value)
      batched = all(-np.ndim(l) <= vmap_axes < np.ndim(l) and
                    np.shape(l)[vmap_axes] == n and not _is_raw_key(l)
                    for l in leaves)
      kw_axes += [int(vmap_axes) % np.ndim(l) if batched else None
                  for l in leaves]
    return in_axes, kw_axes
  in_spec, _, kw_spec = vmap_axes
  in_axes = [_normalize_axis(a, np.ndim(l), 'an input leaf', vmap_axes)
             for a, l in zip(_broadcast_prefix(in_spec, x, 'in_axes (inputs)',
                                               vmap_axes), x_leaves)]
  if all(a is None for a in in_axes):
    raise ValueError(f'`vmap_axes={vmap_axes!r}`: no input leaf has a batch '
                     'axis; give the batch axis of x in `in_axes`.')
  if kw_spec is None or isinstance(kw_spec, (int, np.integer)):
    kw_spec = {k: kw_spec for k in kwargs}
  if not isinstance(kw_spec, dict):
    raise ValueError(f'`vmap_axes={vmap_axes!r}`: `kwargs_axes` must be None, '
                     'an int, or a dict from keyword name to axis.')
  kw_axes = []
  for k, value in kwargs.items():
    leaves = tree_util.tree_leaves(value)
    axes = _broadcast_prefix(kw_spec.get(k), value,
                             f'kwargs_axes[{k!r}] (keyword `{k}`)', vmap_axes)
    kw_axes += [_normalize_axis(a, np.ndim(l), f'keyword `{k}`', vmap_axes)
                for a, l in zip(axes, leaves)]
  return in_axes, kw_axes


def _output_axes(vmap_axes: VMapAxes, out_tree: PyTree) -> list:
  """Batch axis of each output leaf (`out_axes`, an int or a pytree prefix)."""
  out_leaves = tree_util.tree_leaves(out_tree)
  spec = vmap_axes[1] if isinstance(vmap_axes, (tuple, list)) else vmap_axes
  axes = [_normalize_axis(a, o.ndim, 'an output leaf', vmap_axes)
          for a, o in zip(_broadcast_prefix(spec, out_tree,
                                            'out_axes (outputs)', vmap_axes),
                          out_leaves)]
  if any(a is None for a in axes):
    raise ValueError(f'`vmap_axes={vmap_axes!r}`: every output leaf needs a '
                     'batch axis; `out_axes` cannot contain None.')
  return axes


def _per_example_side(fn: Callable, param_leaves: list, data: list,
                      data_axes: tuple, out_tree: PyTree,
                      out_axes: Sequence[int], vmap_axes: VMapAxes,
                      n_x: int) -> _Side:
  """A `_Side` whose `single_fn` runs `f` on one example (a batch of one)."""
  sizes = {np.shape(d)[a] for d, a in zip(data, data_axes) if a is not None}
  if len(sizes) != 1:
    raise ValueError(
        f'`vmap_axes={vmap_axes!r}`: the batch axes of the inputs (and '
        f'batched keyword arguments) have different sizes {sorted(sizes)}; '
        'give each leaf its batch axis, and None for shared leaves.')
  n = sizes.pop()
  for o, a in zip(tree_util.tree_leaves(out_tree), out_axes):
    if o.shape[a] != n:
      raise ValueError(
          f'`vmap_axes={vmap_axes!r}`: output axis {a} of an output of shape '
          f'{o.shape} has size {o.shape[a]}, not the batch size {n}; give the '
          'output batch axis as `out_axes` in `(in_axes, out_axes, '
          'kwargs_axes)`.')

  def single_fn(param_leaves: list, example: list) -> list:
    # f sees a batch of one example, since most networks expect a batch.
    batch = [e if a is None else jnp.expand_dims(e, a)
             for e, a in zip(example, data_axes)]
    outs = fn(param_leaves, batch)
    return [jnp.squeeze(o, a) for o, a in zip(outs, out_axes)]

  example = [d if a is None else
             jax.ShapeDtypeStruct(tuple(np.delete(np.shape(d), a)),
                                  jnp.result_type(d))
             for d, a in zip(data, data_axes)]
  try:
    outs = jax.eval_shape(single_fn, param_leaves, example)
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(
        f'`vmap_axes={vmap_axes!r}`: `f` failed on a batch of one example '
        f'({type(e).__name__}: {e}); check that these are the batch axes of '
        'the inputs, outputs and keyword arguments.') from e
  return _Side(fn, single_fn, data_axes, tuple(tuple(o.shape) for o in outs),
               n, n_x)


def _result_shape(layout: layout_lib.KernelLayout, s1: Sequence[int],
                  s2: Sequence[int], n1: int, n2: int,
                  per_example: bool) -> tuple[int, ...]:
  shape = [n1, n2] if per_example else []
  for kind, a, b in zip(layout.kinds, s1, s2):
    if kind == layout_lib.PAIR:
      shape += [a, b]
      continue
    if a != b:
      raise ValueError(
          f'An output axis of sizes {a} (x1) and {b} (x2) is traced or '
          'diagonal, which needs equal sizes; remove it from `trace_axes` '
          'and `diagonal_axes`.')
    if kind == layout_lib.DIAGONAL:
      shape.append(a)
  return tuple(shape)


# ---------------------------------------------------------------------------
# Implementations: each maps (problem, params, data1, data2) to the list of
# kernels of the output leaves.
# ---------------------------------------------------------------------------


def _jacobian_contraction(problem: _Problem, params: list, data1: list,
                          data2: list) -> list[Array]:
  """`sum_p J1_p J2_p^T`, with per-example Jacobians under `vmap_axes`."""
  per_example = problem.per_example

  def jacobians(side: _Side, data: list) -> list[list[Array]]:
    fn = side.call(per_example)
    out_size = sum(math.prod(s) for s in side.out_shapes)
    n_params = sum(np.size(p) for p in params)
    # Reverse mode costs a pass per output entry, forward one per parameter.
    jac = jax.jacrev(fn) if out_size <= n_params else jax.jacfwd(fn)
    return side.over_examples(jac, per_example)(params, data)

  j1 = jacobians(problem.sides[0], data1)
  j2 = j1 if problem.symmetric else jacobians(problem.sides[1], data2)
  kernels = []
  for l, (layout, shape) in enumerate(zip(problem.layouts,
                                          problem.result_shapes)):
    letters = layout_lib.Letters()
    kl = layout_lib.kernel_letters(layout, letters)
    lead1 = ([kl.example1] if per_example else []) + list(kl.out1)
    lead2 = ([kl.example2] if per_example else []) + list(kl.out2)
    kernel = jnp.zeros(shape, _dtype(j1[l]))
    for a, b in zip(j1[l], j2[l]):
      p = letters.many(a.ndim - len(lead1))
      kernel += layout_lib.einsum((a, lead1 + p), (b, lead2 + p),
                                  result=kl.result)
    out_shape = problem.sides[0].out_shapes[l]
    kernels.append(kernel / layout_lib.trace_size(layout, out_shape))
  return kernels


def _dtype(arrays: Sequence[Array]) -> Any:
  return jnp.result_type(*arrays) if arrays else jnp.float32


def _output_basis(out_shapes: Sequence[tuple[int, ...]],
                  dtypes: Sequence[Any]) -> list[Array]:
  """Rows of the identity over all output entries, split into output leaves."""
  sizes = [math.prod(s) for s in out_shapes]
  total, start, basis = sum(sizes), 0, []
  for shape, size, dtype in zip(out_shapes, sizes, dtypes):
    basis.append(jnp.eye(total, size, -start, dtype=dtype).reshape(
        (total,) + tuple(shape)))
    start += size
  return basis


def _vector_products(problem: _Problem, params: list, data1: list,
                     data2: list) -> list[Array]:
  """`Theta e_o = J(x1) (J(x2)^T e_o)` for each output entry `o` of x2."""
  per_example = problem.per_example
  side1, side2 = problem.sides
  fn1 = side1.over_examples(side1.call(per_example), per_example)
  fn2 = side2.call(per_example)
  dtypes = [o.dtype for o in jax.eval_shape(fn2, params, [
      d if a is None else jax.ShapeDtypeStruct(
          tuple(np.delete(np.shape(d), a)), jnp.result_type(d))
      for d, a in zip(data2, side2.data_axes or [None] * len(data2))])]
  basis = _output_basis(side2.out_shapes, dtypes)

  def theta_rows(example: list) -> list[Array]:
    # VJPs of x2's basis cotangents, then JVPs of x1's outputs along them.
    _, vjp_fn = jax.vjp(lambda p: fn2(p, example), params)
    tangents, = jax.vmap(vjp_fn)(basis)
    push = lambda t: jax.jvp(lambda p: fn1(p, data1), (params,), (t,))[1]
    return jax.vmap(push)(tangents)

  if per_example:
    theta = _map_examples(theta_rows, data2, side2.data_axes,
                          _chunk(side2.n, len(basis[0]), params))
  else:
    theta = theta_rows(data2)
  kernels = []
  start = 0
  for l, layout in enumerate(problem.layouts):
    s1, s2 = side1.out_shapes[l], side2.out_shapes[l]
    size = math.prod(s2)
    t = theta[l]
    lead = (side2.n,) if per_example else ()
    t = jax.lax.slice_in_dim(t, start, start + size, axis=len(lead))
    t = t.reshape(lead + tuple(s2) + t.shape[len(lead) + 1:])
    start += size
    letters = layout_lib.Letters()
    kl = layout_lib.kernel_letters(layout, letters)
    e1 = [kl.example1] if per_example else []
    e2 = [kl.example2] if per_example else []
    kernel = layout_lib.einsum((t, e2 + list(kl.out2) + e1 + list(kl.out1)),
                               result=kl.result)
    kernels.append(kernel / layout_lib.trace_size(layout, s1))
  return kernels


def _chunk(n: int, rows: int, params: list) -> int:
  """Examples of x2 per step so that their stored VJPs fit in memory."""
  size = sum(np.size(p) * jnp.dtype(jnp.result_type(p)).itemsize
             for p in params)
  per_example = max(1, rows * size)
  return int(max(1, min(n, _VECTOR_PRODUCTS_MAX_BYTES // per_example)))


def _map_examples(fn: Callable[[list], Any], data: list,
                  axes: Sequence[Optional[int]], chunk: int) -> Any:
  """`fn` on each example of `data`, results stacked along axis 0."""
  batched = [jnp.moveaxis(d, a, 0) for d, a in zip(data, axes)
             if a is not None]

  def one(example_batched: list) -> Any:
    it = iter(example_batched)
    return fn([next(it) if a is not None else d for d, a in zip(data, axes)])

  n = batched[0].shape[0]
  if chunk >= n:
    return jax.vmap(one)(batched)
  return jax.lax.map(one, batched, batch_size=chunk)


def _structured(problem: _Problem, params: list, data1: list, data2: list,
                mode: Optional[structured.Mode] = None) -> list[Array]:
  """Structured derivatives; falls back to Jacobians where unsupported."""
  try:
    plan, mode = _structured_plan(problem, params, data1, data2, mode)
  except structured.Unsupported:
    return _jacobian_contraction(problem, params, data1, data2)
  return _structured_kernels(problem, plan, mode, params, data1, data2)


def _abstract(x: Any) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(np.shape(x), jnp.result_type(x))


def _example_avals(data: list, axes: Optional[Sequence[Optional[int]]]
                   ) -> list[jax.ShapeDtypeStruct]:
  if axes is None:
    return [_abstract(d) for d in data]
  return [jax.ShapeDtypeStruct(tuple(np.delete(np.shape(d), a)) if a is not
                               None else np.shape(d), jnp.result_type(d))
          for d, a in zip(data, axes)]


def _structured_plan(problem: _Problem, params: list, data1: list,
                     data2: list, mode: Optional[structured.Mode]
                     ) -> tuple[structured.Plan, structured.Mode]:
  """Traces both sides' programs and plans structured derivatives."""
  if mode is None:
    mode = structured.Mode.EXAMPLE if problem.per_example else structured.Mode.WHOLE
  per_example = mode == structured.Mode.EXAMPLE
  p_avals = [_abstract(p) for p in params]
  programs, avals = [], []
  for side, data in zip(problem.sides, (data1, data2)):
    a = _example_avals(data, side.data_axes if per_example else None)
    same = avals and problem.same_calls and _same_avals(a, avals[0])
    programs.append(programs[0] if same or (problem.symmetric and programs)
                    else structured.trace_program(side.call(per_example), p_avals, a))
    avals.append(a)
  batch_axes = (None, None)
  if mode == structured.Mode.SEPARABLE:
    if min(side.n for side in problem.sides) < 2:
      raise structured.Unsupported('a batch of one example')
    batch_axes = tuple(_separable_axes(p, len(params), side.n_x)
                       for p, side in zip(programs, problem.sides))
  plan = structured.make_plan(tuple(programs), len(params), mode, batch_axes)
  return plan, mode


def _same_avals(a: Sequence[Any], b: Sequence[Any]) -> bool:
  return len(a) == len(b) and all(
      tuple(x.shape) == tuple(y.shape) and x.dtype == y.dtype
      for x, y in zip(a, b))


def _separable_axes(program: structured.Program, n_params: int, n_x: int) -> dict:
  """Batch axes proving x's examples do not interact, else Unsupported."""
  # Params and keyword arguments are shared; x leaves are batched at 0.
  n_other = len(program.inputs) - n_params - n_x
  input_axes = [None] * n_params + [0] * n_x + [None] * n_other
  return _batch_axes_or_unsupported(program, input_axes)


def _batch_axes_or_unsupported(program: structured.Program,
                               input_axes: list) -> dict:
  try:
    axes = structured.batch_axes(program, input_axes)
  except structured.NotSeparable as e:
    raise structured.Unsupported(f'batch items may interact ({e})') from e
  if not structured.outputs_batched_at(program, axes, 0):
    raise structured.Unsupported('an output is not batched along axis 0')
  return axes


def _structured_kernels(problem: _Problem, plan: structured.Plan, mode: structured.Mode,
                        params: list, data1: list, data2: list) -> list[Array]:
  per_example = mode == structured.Mode.EXAMPLE
  # The two sides are independent computations, which XLA runs concurrently
  # (one pass over both sides' examples at once would serialize them).
  values = []
  for i, (side, data) in enumerate(zip(problem.sides, (data1, data2))):
    if i == 1 and problem.symmetric:
      values.append(values[0])
      continue
    row_ndims = [len(s) for s in side.out_shapes]
    if mode == structured.Mode.SEPARABLE:
      row_ndims = [n - 1 for n in row_ndims]
    fn = functools.partial(_side_values, plan, i, row_ndims)
    values.append(side.over_examples(fn, per_example,
                                     structured.value_axes(plan, i))(params, data))
  out_shapes = problem.sides[0].out_shapes
  layouts = problem.layouts
  if mode == structured.Mode.SEPARABLE:
    # Axis 0 (paired, first) is the batch axis: it becomes the example axes.
    out_shapes = [s[1:] for s in out_shapes]
    layouts = [layout_lib.KernelLayout(l.kinds[1:], True) for l in layouts]
  return structured.contract(plan, tuple(values), layouts, out_shapes,
                     problem.result_shapes)


def _planned_structured(plan: structured.Plan, mode: structured.Mode, problem: _Problem,
                        params: list, data1: list, data2: list) -> list[Array]:
  return _structured_kernels(problem, plan, mode, params, data1, data2)


def _side_values(plan: structured.Plan, side: int, row_ndims: list, params: list,
                 data: list) -> dict:
  return structured.side_values(plan, side, list(params) + list(data), row_ndims)


_IMPLEMENTATIONS = {
    NtkImplementation.JACOBIAN_CONTRACTION: _jacobian_contraction,
    NtkImplementation.NTK_VECTOR_PRODUCTS: _vector_products,
    NtkImplementation.STRUCTURED_DERIVATIVES: _structured,
}

# XLA's cost analysis counts FLOPs and bytes accessed; a byte costs about as
# much time as this many FLOPs on CPUs (and more so on accelerators).
_FLOPS_PER_BYTE = 8.
# Structured derivatives spend their FLOPs in a few large matrix products,
# which run several times faster per FLOP than the per-example convolution
# transposes and small backward passes of the other implementations; their
# estimated cost is divided by this.
_STRUCTURED_SPEEDUP = 2.
# Per-example structured derivatives (under `vmap`) ran faster than the same
# contractions on the whole batch (`separable`) at about equal estimated cost
# on every workload of `../shared/bench/entk_bench.py` (three runs: fcn_full
# 1.06-1.33x, cnn 1.23-1.53x); near-ties go to them.
_EXAMPLE_SPEEDUP = 1.1


def _structured_name(mode: structured.Mode) -> str:
  return f'structured_{mode.value}'


_SEPARABLE = _structured_name(structured.Mode.SEPARABLE)
_EXAMPLE = _structured_name(structured.Mode.EXAMPLE)


def _candidates(problem: _Problem, params: list, data1: list,
                data2: list) -> dict[str, Callable]:
  """The implementations AUTO compares, for this problem."""
  candidates = {
      'jacobian_contraction': _jacobian_contraction,
      'ntk_vector_products': _vector_products,
  }
  modes = [structured.Mode.EXAMPLE] if problem.per_example else [structured.Mode.WHOLE,
                                                         structured.Mode.SEPARABLE]
  if any(l.kinds[0] != layout_lib.PAIR for l in problem.layouts):
    # SEPARABLE makes axis 0, the batch axis, the (paired) example axes.
    modes = [m for m in modes if m != structured.Mode.SEPARABLE]
  for mode in modes:
    try:
      plan, _ = _structured_plan(problem, params, data1, data2, mode)
    except structured.Unsupported:
      continue
    candidates[_structured_name(mode)] = functools.partial(
        _planned_structured, plan, mode)
  return candidates


def _estimated_cost(fn: Callable, problem: _Problem, params: list,
                    data1: list, data2: list) -> float:
  """FLOPs (plus bytes, weighted) of `fn` compiled at these shapes."""
  lowered = jax.jit(lambda p, d1, d2: fn(problem, p, d1, d2)).lower(
      *tree_util.tree_map(_abstract, (params, data1, data2)))
  cost = lowered.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else {}
  cost = cost or {}
  return (float(cost.get('flops', 0.)) +
          _FLOPS_PER_BYTE * float(cost.get('bytes accessed', 0.)))


def _auto(problem: _Problem,
          other: Callable[..., Optional[_Problem]], params: list, data1: list,
          data2: list, static_key: tuple, choices: dict
          ) -> tuple[_Problem, Callable]:
  """The cheapest implementation at these shapes (cached per shapes).

  Each candidate (Jacobian contraction, NTK-vector products, structured
  derivatives, and without `vmap_axes` also structured derivatives with
  per-example cotangents if the jaxpr proves batch items independent) is
  lowered at the input shapes, and XLA's cost analysis gives its FLOPs and
  bytes accessed. The cost is `FLOPs + 8 * bytes`, halved for structured
  derivatives (whose FLOPs are large matrix products) and divided by a
  further 1.1 for per-example ones (measured); the lowest wins. If no
  candidate can be lowered (e.g. `f` closes over traced values), structured
  derivatives are used.

  The candidates of `other(verify=True, separable=...)`, an equivalent
  formulation of the same kernel (see `_other_formulation`), compete too, so
  that `vmap_axes=0` and `vmap_axes=None` choose among the same
  implementations whenever they are known to agree.

  Returns:
    `(problem, fn)`: the formulation and implementation to use.
  """
  key = (tree_util.tree_structure((params, data1, data2)),
         tuple((np.shape(x), str(jnp.result_type(x)))
               for x in tree_util.tree_leaves((params, data1, data2))),
         problem.symmetric, problem.layouts, problem.per_example, static_key)
  if key not in choices:
    candidates = _candidates(problem, params, data1, data2)
    alternative = other(verify=True, separable=_SEPARABLE in candidates)
    options = [(problem, candidates)]
    if alternative is not None:
      options.append((alternative,
                      _candidates(alternative, params, data1, data2)))
    best, best_cost = (0, _structured), math.inf
    for i, (candidate_problem, candidates) in enumerate(options):
      for name, fn in candidates.items():
        try:
          cost = _estimated_cost(fn, candidate_problem, params, data1, data2)
        except Exception:  # pylint: disable=broad-except
          continue  # e.g. f closes over tracers; such a candidate is skipped.
        if name.startswith('structured'):
          cost /= _STRUCTURED_SPEEDUP
        if name == _EXAMPLE:
          cost /= _EXAMPLE_SPEEDUP
        if cost < best_cost:
          best, best_cost = (i, fn), cost
    choices[key] = best
  i, fn = choices[key]
  # Whether the other formulation agrees was verified for these shapes.
  return (problem if i == 0 else other(verify=False)), fn


def _other_formulation(setup: Callable[[VMapAxes], tuple],
                       vmap_axes: VMapAxes, params: list, data1: list,
                       data2: list, verify: bool = True,
                       separable: bool = False) -> Optional[_Problem]:
  """The same kernel with `vmap_axes` 0 <-> None, where both provably agree.

  With `vmap_axes=0` the user promises that examples do not interact, and
  then the whole-batch formulation (`vmap_axes=None`) gives the same kernel.
  Without `vmap_axes`, the per-example formulation (`vmap_axes=0`) is used
  only if (a) the jaxpr proves that examples do not interact (`separable`:
  structured derivatives could be planned in `SEPARABLE` mode without
  `vmap_axes`), and (b) `f` on a batch of one is the same program as on the
  whole batch up to the batch size (no constant depends on it, e.g.
  `x / x.shape[0]`). `verify=False` skips (a) and (b), for shapes at which
  they were already verified.

  Args:
    setup: `setup(vmap_axes)` is `_setup` of this call with those axes.
    vmap_axes: the user's `vmap_axes`.
    params, data1, data2: the arrays of `setup(vmap_axes)`.
    verify: whether to check (a) and (b).
    separable: (a), when `vmap_axes` is None.

  Returns:
    The other formulation's problem, or None.
  """
  if _is_int(vmap_axes) and vmap_axes == 0:
    return setup(None)[0]
  if vmap_axes is not None or (verify and not separable):
    return None
  try:
    per_example = setup(0)[0]
  except ValueError:
    return None
  if verify and not all(_batch_of_one_agrees(side, params, data)
                        for side, data in zip(per_example.sides,
                                              (data1, data2))):
    return None
  return per_example


def _batch_of_one_agrees(side: _Side, params: list, data: list) -> bool:
  """Whether `side.fn` is the same program at batch sizes N and 1.

  `side.fn` is traced at batch sizes N, 1 and a probe size P (a prime that
  appears nowhere in the batch-N jaxpr). Replacing P by N (resp. 1) in the
  batch-P jaxpr's text must give the batch-N (resp. batch-1) jaxpr's text,
  and all constants must be equal: so every occurrence of the batch size is
  a batch axis, and nothing else (a literal such as `x / x.shape[0]`, a
  constant, a Python branch on the batch size) depends on it. Any difference
  makes the check fail, which is safe: the per-example formulation is then
  not used.
  """
  n = side.n
  if n < 2 or any(a not in (None, 0) for a in side.data_axes):
    return False
  p_avals = [_abstract(x) for x in params]
  full = [_abstract(d) for d in data]

  def trace(size):
    batch = [a if axis is None else
             jax.ShapeDtypeStruct((size,) + a.shape[1:], a.dtype)
             for a, axis in zip(full, side.data_axes)]
    return jax.make_jaxpr(side.fn)(p_avals, batch)

  def size_to(text, old, new):
    return re.sub(rf'(?<![\w.]){old}(?![\w.])', str(new), text)

  def text(jaxpr):  # Line breaks of the printed jaxpr depend on line lengths.
    return ' '.join(str(jaxpr).split())

  try:
    jaxpr_n = trace(n)
    text_n = text(jaxpr_n)
    probe = next(q for q in (1009, 1013, 1019, 1021)
                 if q != n and not re.search(rf'(?<![\w.]){q}(?![\w.])',
                                             text_n))
    jaxpr_p, jaxpr_1 = trace(probe), trace(1)
    text_p = text(jaxpr_p)
    if (size_to(text_p, probe, n) != text_n or
        size_to(text_p, probe, 1) != text(jaxpr_1)):
      return False
    consts = [jaxpr_n.consts, jaxpr_p.consts, jaxpr_1.consts]
    return all(len(c) == len(consts[0]) for c in consts) and all(
        np.shape(a) == np.shape(b) and
        np.array_equal(np.asarray(a), np.asarray(b))
        for c in consts[1:] for a, b in zip(consts[0], c))
  except Exception:  # pylint: disable=broad-except
    return False  # e.g. no probe size, or a constant closed over a tracer.


def _is_int(vmap_axes: VMapAxes) -> bool:
  """Whether `vmap_axes` is one int (not a bool): the same axis everywhere."""
  return (isinstance(vmap_axes, (int, np.integer)) and
          not isinstance(vmap_axes, bool))


def _is_triple(vmap_axes: VMapAxes) -> bool:
  """Whether `vmap_axes` is `(in_axes, out_axes, kwargs_axes)`."""
  return isinstance(vmap_axes, (tuple, list)) and len(vmap_axes) == 3


def _is_prefix(axes: Any, tree: PyTree) -> bool:
  """Whether `axes` is a pytree prefix of `tree` (None leaves allowed)."""
  try:
    tree_util.tree_map(lambda a, sub: None, axes, tree,
                       is_leaf=lambda a: a is None)
  except (ValueError, TypeError):
    return False
  return True


def _pytree_vmap_axes(vmap_axes: VMapAxes, x: PyTree,
                      out_tree: PyTree) -> tuple[Any, Any, None]:
  """`(in_axes, out_axes, None)` of a `vmap_axes` neither int nor triple.

  As published, a pytree of axes is the batch axes of both the inputs and
  the outputs, if it is a prefix of both; otherwise a pair is read as
  `(in_axes, out_axes)`. Keyword arguments are shared by the batch.
  """
  if _is_prefix(vmap_axes, x) and _is_prefix(vmap_axes, out_tree):
    return vmap_axes, vmap_axes, None
  if (isinstance(vmap_axes, (tuple, list)) and len(vmap_axes) == 2 and
      _is_prefix(vmap_axes[0], x) and _is_prefix(vmap_axes[1], out_tree)):
    return vmap_axes[0], vmap_axes[1], None
  raise ValueError(
      f'`vmap_axes={vmap_axes!r}` is neither a pytree prefix of both the '
      f'inputs ({tree_util.tree_structure(x)}) and the outputs '
      f'({tree_util.tree_structure(out_tree)}), nor a pair `(in_axes, '
      'out_axes)` of prefixes of them; e.g. `vmap_axes=(0, 1)` when axis 0 '
      'of the inputs and axis 1 of the outputs is the batch axis.')


def _check_vmap_axes(vmap_axes: VMapAxes) -> None:
  if vmap_axes is None or _is_int(vmap_axes):
    return
  leaves = tree_util.tree_leaves(vmap_axes)
  if (isinstance(vmap_axes, (tuple, list, dict)) and
      all(_is_int(a) for a in leaves)):
    return
  raise ValueError(
      f'`vmap_axes={vmap_axes!r}` is not None, an int, a pytree of ints '
      '(and None), a pair `(in_axes, out_axes)` or a triple `(in_axes, '
      'out_axes, kwargs_axes)`; e.g. `vmap_axes=0` when axis 0 of inputs and '
      'outputs is the batch axis.')


# ---------------------------------------------------------------------------
# Public API.
# ---------------------------------------------------------------------------


def empirical_ntk_fn(
    f: ApplyFn,
    trace_axes: Axes = (-1,),
    diagonal_axes: Axes = (),
    vmap_axes: VMapAxes = None,
    implementation: Union[NtkImplementation, int] = DEFAULT_NTK_IMPLEMENTATION
) -> Callable[..., PyTree]:
  """The empirical NTK `Theta(x1, x2) = J(x1) J(x2)^T` of `f`.

  `J(x) = df(params, x) / dparams`, contracted over all parameter leaves.

  Args:
    f: `f(params, x, **kwargs)`; params, x and the output may be pytrees.
    trace_axes: output axes averaged over (their diagonal's mean), indexed
      in `f(x)`'s shape; may contain the batch axis.
    diagonal_axes: output axes of which only the diagonal is kept. An axis
      in both is traced. May contain the batch axis (x1 and x2 then need
      equal batch sizes).
    vmap_axes: the batch axis, promising that examples do not interact so
      that per-example derivatives can be used: None (no promise; axis 0 of
      the outputs is the batch axis), an int (the batch axis of inputs,
      outputs, and of keyword arguments whose leaves all have the batch size
      along it), a pytree prefix of both x and the output (their batch
      axes), a pair `(in_axes, out_axes)` of pytree prefixes of x and of the
      output, or `(in_axes, out_axes, kwargs_axes)` with also a dict from
      keyword name to axis (None or absent: shared by the batch). Keyword
      arguments are shared unless given in `kwargs_axes` or batched by an
      int `vmap_axes`.
    implementation: an `NtkImplementation` or its int value.

  Returns:
    `ntk_fn(x1, x2, params, **kwargs)` giving the kernel (a pytree like the
    output): for each output axis (the batch axis included, whatever
    `vmap_axes`) in order, none if traced, `O` if diagonal, else `(O, O)`.
    `x2=None` means `x2 = x1`. A keyword argument given as a tuple
    `(for_x1, for_x2)` is split between the two calls; others are passed to
    both, except a single PRNG key `rng`: `f(x1)` gets `rng` and `f(x2)`
    gets `jax.random.fold_in(rng, 1)` unless x2 is None or equals x1.

  Raises:
    ValueError: for an unknown `implementation`, axes out of range, or
      `vmap_axes` that do not match the inputs.

  Example:
    >>> def f(params, x):
    ...   return jnp.tanh(x @ params['w']) @ params['v']
    >>> params = {'w': jnp.ones((3, 8)), 'v': jnp.ones((8, 2))}
    >>> ntk_fn = empirical_ntk_fn(f, vmap_axes=0)
    >>> ntk_fn(jnp.ones((4, 3)), None, params).shape
    (4, 4)
  """
  implementation = _implementation(implementation)
  trace_axes = _axes_tuple(trace_axes, 'trace_axes')
  diagonal_axes = _axes_tuple(diagonal_axes, 'diagonal_axes')
  _check_vmap_axes(vmap_axes)
  choices: dict = {}

  def ntk_fn(x1: PyTree, x2: Optional[PyTree], params: PyTree,
             **apply_fn_kwargs) -> PyTree:
    setup = functools.partial(_setup, f, x1, x2, params, apply_fn_kwargs,
                              trace_axes, diagonal_axes)
    problem, p, d1, d2 = setup(vmap_axes)
    if implementation == NtkImplementation.AUTO:
      other = functools.partial(_other_formulation, setup, vmap_axes, p, d1,
                                d2)
      problem, fn = _auto(problem, other, p, d1, d2,
                          _static_key(apply_fn_kwargs), choices)
    else:
      fn = _IMPLEMENTATIONS[implementation]
    kernels = _place_example_axes(problem, fn(problem, p, d1, d2))
    return tree_util.tree_unflatten(problem.out_treedef, kernels)

  return takes_rng_pairs(ntk_fn)


def empirical_nngp_fn(f: ApplyFn, trace_axes: Axes = (-1,),
                      diagonal_axes: Axes = ()) -> Callable[..., PyTree]:
  """The empirical NNGP kernel `f(x1) f(x2)^T` of `f`.

  Args:
    f: `f(params, x, **kwargs)`; x and the output may be pytrees.
    trace_axes: output axes averaged over (may contain the batch axis).
    diagonal_axes: output axes of which only the diagonal is kept (may
      contain the batch axis).

  Returns:
    `nngp_fn(x1, x2, params, **kwargs)` with the layout and keyword
    arguments (`rng` included) of `empirical_ntk_fn`.

  Example:
    >>> nngp_fn = empirical_nngp_fn(lambda p, x: x @ p)
    >>> nngp_fn(jnp.ones((4, 3)), None, jnp.ones((3, 2))).shape
    (4, 4)
  """
  trace_axes = _axes_tuple(trace_axes, 'trace_axes')
  diagonal_axes = _axes_tuple(diagonal_axes, 'diagonal_axes')

  def nngp_fn(x1: PyTree, x2: Optional[PyTree], params: PyTree,
              **apply_fn_kwargs) -> PyTree:
    kw1, kw2, same = _split_kwargs(apply_fn_kwargs, x1, x2)
    out1 = f(params, x1, **kw1)
    out2 = out1 if x2 is None and same else f(
        params, x1 if x2 is None else x2, **kw2)
    leaves1, treedef = tree_util.tree_flatten(out1)
    leaves2 = tree_util.tree_leaves(out2)
    kernels = []
    for a, b in zip(leaves1, leaves2):
      layout = layout_lib.KernelLayout.build(a.ndim, 0, trace_axes,
                                             diagonal_axes, per_example=False)
      kl = layout_lib.kernel_letters(layout, layout_lib.Letters())
      k = layout_lib.einsum((a, kl.out1), (b, kl.out2), result=kl.result)
      kernels.append(k / layout_lib.trace_size(layout, a.shape))
    return tree_util.tree_unflatten(treedef, kernels)

  return takes_rng_pairs(nngp_fn)


_KERNELS = ('nngp', 'ntk')


def empirical_kernel_fn(
    f: ApplyFn,
    trace_axes: Axes = (-1,),
    diagonal_axes: Axes = (),
    vmap_axes: VMapAxes = None,
    implementation: Union[NtkImplementation, int] = DEFAULT_NTK_IMPLEMENTATION
) -> Callable[..., Any]:
  """Empirical NNGP and NTK kernels of `f`, selected by `get`.

  Args:
    f: `f(params, x, **kwargs)`.
    trace_axes: see `empirical_ntk_fn`.
    diagonal_axes: see `empirical_ntk_fn`.
    vmap_axes: see `empirical_ntk_fn` (used by the NTK).
    implementation: see `empirical_ntk_fn`.

  Returns:
    `kernel_fn(x1, x2, get, params, **kwargs)`: for `get` `'nngp'` or
    `'ntk'` that kernel; for a tuple of them a namedtuple `Kernel` with
    those fields; for `get=None` the namedtuple `(nngp, ntk)`.

  Example:
    >>> kernel_fn = empirical_kernel_fn(lambda p, x: x @ p)
    >>> k = kernel_fn(jnp.ones((4, 3)), None, ('nngp', 'ntk'),
    ...               jnp.ones((3, 2)))
    >>> k.ntk.shape
    (4, 4)
  """
  kernel_fns = {
      'nngp': empirical_nngp_fn(f, trace_axes, diagonal_axes),
      'ntk': empirical_ntk_fn(f, trace_axes, diagonal_axes, vmap_axes,
                              implementation),
  }

  def kernel_fn(x1: PyTree, x2: Optional[PyTree], get: Any, params: PyTree,
                **apply_fn_kwargs) -> Any:
    names, single = _canonicalize_get(get)
    values = [kernel_fns[n](x1, x2, params, **apply_fn_kwargs) for n in names]
    if single:
      return values[0]
    return utils.get_namedtuple(tuple(names))(*values)

  return takes_rng_pairs(kernel_fn)


def _canonicalize_get(get: Any) -> tuple[tuple[str, ...], bool]:
  if get is None:
    return _KERNELS, False
  if isinstance(get, str) and get in _KERNELS:
    return (get,), True
  if (isinstance(get, (tuple, list)) and get and
      all(isinstance(g, str) and g in _KERNELS for g in get) and
      len(set(get)) == len(get)):
    return tuple(get), False
  raise ValueError(f'`get={get!r}` is not a kernel name; pass \'nngp\', '
                   '\'ntk\', a tuple of them, or None for both.')


def empirical_ntk_vp_fn(f: ApplyFn, x1: PyTree, x2: Optional[PyTree],
                        params: PyTree, **apply_fn_kwargs
                        ) -> Callable[[PyTree], PyTree]:
  """`v -> Theta(x1, x2) v` by a VJP and a JVP, without forming `Theta`.

  `Theta` is the full (untraced) NTK, summed over x2's output entries:
  `Theta v = J(x1) (J(x2)^T v)`.

  Args:
    f: `f(params, x, **kwargs)`.
    x1: the inputs whose outputs the result is shaped like.
    x2: the inputs whose outputs `v` is shaped like (None: x1).
    params: the parameters.
    **apply_fn_kwargs: keyword arguments of `f`; a tuple `(for_x1,
      for_x2)` is split between the two calls.

  Returns:
    `ntk_vp(cotangents)`, cotangents shaped like `f(params, x2)`, returning
    an array shaped like `f(params, x1)`.

  Example:
    >>> f = lambda p, x: x @ p
    >>> vp = empirical_ntk_vp_fn(f, jnp.ones((4, 3)), None, jnp.ones((3, 2)))
    >>> vp(jnp.ones((4, 2))).shape
    (4, 2)
  """
  kw1, kw2, _ = _split_kwargs(apply_fn_kwargs, x1, x2)
  x2 = x1 if x2 is None else x2

  def ntk_vp(cotangents: PyTree) -> PyTree:
    _, vjp_fn = jax.vjp(lambda p: f(p, x2, **kw2), params)
    tangents, = vjp_fn(cotangents)
    return jax.jvp(lambda p: f(p, x1, **kw1), (params,), (tangents,))[1]

  return ntk_vp


def linearize(f: Callable[..., PyTree], params: PyTree) -> Callable[..., PyTree]:
  """`f`'s first-order Taylor expansion in its parameters around `params`.

  `f_lin(p, *args) = f(params, *args) + df(params, *args)/dparams (p - params)`,
  computed with one `jax.jvp`.

  Args:
    f: `f(params, *args, **kwargs)`.
    params: the expansion point.

  Returns:
    `f_lin(p, *args, **kwargs)`.

  Example:
    >>> f_lin = linearize(lambda p, x: jnp.sin(p * x), 1.)
    >>> f_lin(1., 2.) == jnp.sin(2.)
    Array(True, dtype=bool)
  """

  def f_lin(p: PyTree, *args, **kwargs) -> PyTree:
    dparams = tree_util.tree_map(jnp.subtract, p, params)
    f_params, df = jax.jvp(lambda q: f(q, *args, **kwargs), (params,),
                           (dparams,))
    return tree_util.tree_map(jnp.add, f_params, df)

  return f_lin


def taylor_expand(f: Callable[..., PyTree], params: PyTree,
                  degree: int) -> Callable[..., PyTree]:
  """`f`'s Taylor expansion of degree `degree` in its parameters.

  `f_tayl(p) = sum_{k <= degree} D^k f(params)[p - params]^k / k!`, with the
  k-th directional derivative from k nested `jax.jvp`s.

  Args:
    f: `f(params, *args, **kwargs)`.
    params: the expansion point.
    degree: the degree (0: constant, 1: `linearize`).

  Returns:
    `f_tayl(p, *args, **kwargs)`.

  Example:
    >>> f2 = taylor_expand(lambda p, x: jnp.exp(p * x), 0., 2)
    >>> f2(1., 1.)  # 1 + 1 + 1/2
    Array(2.5, dtype=float32, weak_type=True)
  """
  if not isinstance(degree, (int, np.integer)) or degree < 0:
    raise ValueError(f'`degree={degree!r}` must be a non-negative int.')

  def f_tayl(p: PyTree, *args, **kwargs) -> PyTree:
    dparams = tree_util.tree_map(jnp.subtract, p, params)
    g = lambda q: f(q, *args, **kwargs)
    # derivatives[k](q) = D^k g(q)[dparams, ..., dparams]
    derivatives = [g]
    for _ in range(degree):
      prev = derivatives[-1]
      derivatives.append(
          lambda q, prev=prev: jax.jvp(prev, (q,), (dparams,))[1])
    total = None
    for k, d in enumerate(derivatives):
      term = tree_util.tree_map(lambda t, k=k: t / math.factorial(k),
                                d(params))
      total = term if total is None else tree_util.tree_map(jnp.add, total,
                                                            term)
    return total

  return f_tayl
