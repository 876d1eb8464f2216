"""The problem: one call of an empirical kernel function, flattened.

`setup` turns `f`, `x1`, `x2`, `params`, keyword arguments, `trace_axes`,
`diagonal_axes` and `vmap_axes` into a `Problem` (everything static: each
side's flat function of arrays, the kernel layouts and shapes) and its
arrays, checking the arguments on the way. Every implementation maps
`(problem, params, data1, data2)` to the kernels of the output leaves.
"""
import dataclasses
from typing import Any, Callable, Optional, Sequence, Union

import jax
from jax import tree_util
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.empirical import layout as layout_lib
from neural_tangents._src.empirical import rng as rng_lib
from neural_tangents._src.utils import arguments
from neural_tangents._src.utils.typing import Axes, PyTree

ApplyFn = Callable[..., PyTree]
VMapAxes = Union[None, int, PyTree, tuple[Any, Any], tuple[Any, Any, Any]]


# ---------------------------------------------------------------------------
# Arguments.
# ---------------------------------------------------------------------------


def parse_output_axes(axes: Axes, name: str) -> tuple[int, ...]:
  """`trace_axes` / `diagonal_axes` as a tuple of ints (checked per output).

  Example:
    >>> parse_output_axes(-1, 'trace_axes')
    (-1,)
  """
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


def canonical_x2(x2: Optional[PyTree]) -> Optional[PyTree]:
  """`x2`, or None if it is made only of Nones.

  As published, `x2=(None, None)` (e.g. for a two-input `parallel` network)
  means `x2=None`: the kernel of x1 with itself.

  Example:
    >>> canonical_x2((None, None)) is None
    True
  """
  if x2 is None or tree_util.tree_leaves(x2):
    return x2
  nones = tree_util.tree_leaves(x2, is_leaf=lambda v: v is None)
  return None if nones else x2


_INPUTS_FIX = ('Pass the inputs themselves (arrays, or the pytree of arrays '
               'the function takes); a `Kernel` is the input of an analytic '
               '`kernel_fn` only.')


def check_inputs(x1: PyTree, x2: Optional[PyTree]) -> None:
  """Raises a `TypeError` naming `x1` or `x2` if it is a `Kernel`."""
  arguments.reject_kernel(x1, 'x1', _INPUTS_FIX)
  arguments.reject_kernel(x2, 'x2', _INPUTS_FIX)


def check_params(params: PyTree) -> None:
  """Raises unless `params` has floating-point leaves to differentiate by.

  Example:
    >>> check_params({'w': jnp.ones(3)})
  """
  fix = ('Pass the params returned by `init_fn` (e.g. `_, params = '
         'init_fn(key, x.shape)`), with floating-point arrays.')
  arguments.reject_kernel(params, 'params', fix)
  leaves = tree_util.tree_leaves(params)
  if not any(jnp.issubdtype(jnp.result_type(leaf), jnp.inexact)
             for leaf in leaves):
    got = tree_util.tree_map(lambda l: jnp.result_type(l).name, params)
    raise ValueError(
        f'`params` has no floating-point leaves (got {got!r}); the kernel '
        f'differentiates `f` with respect to them. {fix}')


def reject_complex_params(params: PyTree) -> None:
  """Raises a `TypeError` if a leaf of `params` is complex.

  The NTK sums `J J^T` over real parameters; a complex parameter has no one
  such Jacobian (the implementations would each take a different one:
  `jacrev` refuses complex outputs, vector products conjugate or not), so
  it is refused, with the fix: its real and imaginary parts as two real
  parameters, which is the NTK of gradient descent on both.

  Example:
    >>> reject_complex_params({'w': jnp.ones(3)})
  """
  complex_leaves = [
      (tree_util.keystr(path), jnp.result_type(leaf).name)
      for path, leaf in tree_util.tree_leaves_with_path(params)
      if jnp.issubdtype(jnp.result_type(leaf), jnp.complexfloating)]
  if complex_leaves:
    path, dtype = complex_leaves[0]
    raise TypeError(
        f'`params` must be real for the NTK; got a {dtype} leaf at '
        f'params{path}. Pass its real and imaginary parts as two real '
        "parameters, e.g. `{'re': w.real, 'im': w.imag}` with `f` using "
        "`p['re'] + 1j * p['im']`: the NTK is then that of gradient "
        'descent on both parts.')


def is_int(vmap_axes: VMapAxes) -> bool:
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


def check_vmap_axes(vmap_axes: VMapAxes) -> None:
  """Raises a `ValueError` unless `vmap_axes` has one of the accepted forms."""
  if vmap_axes is None or is_int(vmap_axes):
    return
  leaves = tree_util.tree_leaves(vmap_axes)
  if (isinstance(vmap_axes, (tuple, list, dict)) and
      all(is_int(a) for a in leaves)):
    return
  raise ValueError(
      f'`vmap_axes={vmap_axes!r}` is not None, an int, a pytree of ints '
      '(and None), a pair `(in_axes, out_axes)` or a triple `(in_axes, '
      'out_axes, kwargs_axes)`; e.g. `vmap_axes=0` when axis 0 of inputs and '
      'outputs is the batch axis.')


def _array_and_other_kwargs(kwargs: dict[str, Any]) -> tuple[dict, dict]:
  """Splits kwargs into arrays (traced) and other values (closed over)."""
  arrays, static = {}, {}
  for name, value in kwargs.items():
    leaves = tree_util.tree_leaves(value)
    if leaves and all(rng_lib.is_array(leaf) for leaf in leaves):
      arrays[name] = value
    else:
      static[name] = value
  return arrays, static


def static_kwargs_key(kwargs: dict[str, Any]) -> tuple:
  """Identifies the non-array keyword arguments (e.g. `mode='train'`).

  `f` may compute differently for other values, so AUTO's choice is cached
  per value (per object, for unhashable values).
  """
  _, static = _array_and_other_kwargs(kwargs)
  items = []
  for name in sorted(static):
    value = static[name]
    try:
      hash(value)
      items.append((name, value))
    except TypeError:
      items.append((name, id(value)))
  return tuple(items)


def _broadcast_prefix(prefix: Any, tree: Any, name: str, value: Any) -> list:
  """The leaves of `prefix` broadcast to the leaves of `tree`, one per leaf.

  A None in `prefix` over a None subtree of `tree` (an absent input) gives
  no entry, so that the result lines up with `tree_leaves(tree)`.
  """
  try:
    full = tree_util.tree_map(
        lambda p, sub: tree_util.tree_map(lambda _: _Axis(p), sub), prefix,
        tree, is_leaf=lambda p: p is None)
  except ValueError as e:
    raise ValueError(
        f'`vmap_axes={value!r}`: its {name} do not match the structure of '
        f'the {name.split()[0]} ({tree_util.tree_structure(tree)}); give an '
        'int, or a pytree with the same structure (a prefix of it).'
    ) from e
  return [axis.value for axis in tree_util.tree_leaves(full)]


@dataclasses.dataclass(frozen=True)
class _Axis:
  """A pytree leaf holding one broadcast axis (None included)."""
  value: Optional[int]


def _normalize_axis(axis: Any, ndim: int, what: str,
                    value: Any) -> Optional[int]:
  """`axis` of `what` in `[0, ndim)` (None stays None), checked."""
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
class Side:
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
class Problem:
  """Everything static about one call of `ntk_fn`.

  Attributes:
    sides: x1's and x2's `Side`.
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
  sides: tuple[Side, Side]
  symmetric: bool
  per_example: bool
  layouts: tuple[layout_lib.KernelLayout, ...]
  result_shapes: tuple[tuple[int, ...], ...]
  out_treedef: Any
  same_calls: bool
  placements: tuple[Optional[tuple[tuple[str, ...], int]], ...]


def setup(f: ApplyFn, x1: PyTree, x2: Optional[PyTree], params: PyTree,
          kwargs: dict[str, Any], trace_axes: tuple[int, ...],
          diagonal_axes: tuple[int, ...], vmap_axes: VMapAxes
          ) -> tuple[Problem, list, list, list]:
  """Flattens a call of `ntk_fn` into a `Problem` and its arrays.

  Returns:
    `(problem, param_leaves, data1, data2)`: the differentiable (inexact)
    parameter leaves, and each side's data leaves.

  Example:
    >>> problem, param_leaves, data1, data2 = setup(
    ...     lambda p, x: x @ p, x1, x2, jnp.ones((4, 2)), {}, (-1,), (), None)
    >>> problem.result_shapes, problem.per_example
    (((3, 2),), False)
  """
  kwargs1, kwargs2, same_kwargs = rng_lib.split_kwargs(kwargs, x1, x2)
  symmetric = x2 is None and same_kwargs
  if x2 is None:
    x2 = x1
  all_param_leaves, params_treedef = tree_util.tree_flatten(params)
  differentiable = [jnp.issubdtype(jnp.result_type(leaf), jnp.inexact)
                    for leaf in all_param_leaves]
  param_leaves = [leaf for leaf, d in zip(all_param_leaves, differentiable)
                  if d]
  other_params = [leaf for leaf, d in zip(all_param_leaves, differentiable)
                  if not d]
  per_example = vmap_axes is not None

  sides, datas, out_trees, statics = [], [], [], []
  for x, side_kwargs in ((x1, kwargs1), (x2, kwargs2)):
    if symmetric and sides:  # x2 is x1: the same side twice.
      sides.append(sides[0])
      datas.append(datas[0])
      out_trees.append(out_trees[0])
      statics.append(statics[0])
      continue
    arrays, static = _array_and_other_kwargs(side_kwargs)
    statics.append(static)
    x_leaves, x_treedef = tree_util.tree_flatten(x)
    kwarg_leaves, kwargs_treedef = tree_util.tree_flatten(arrays)
    n_x, n_kwargs = len(x_leaves), len(kwarg_leaves)

    def tree_fn(param_leaves, data, x_treedef=x_treedef,
                kwargs_treedef=kwargs_treedef, n_x=n_x, n_kwargs=n_kwargs,
                static=static):
      params = tree_util.tree_unflatten(
          params_treedef, _merge_param_leaves(
              param_leaves, data[n_x + n_kwargs:], differentiable))
      x = tree_util.tree_unflatten(x_treedef, data[:n_x])
      array_kwargs = tree_util.tree_unflatten(kwargs_treedef,
                                              data[n_x:n_x + n_kwargs])
      return f(params, x, **static, **array_kwargs)

    fn = lambda p, d, tree_fn=tree_fn: tree_util.tree_leaves(tree_fn(p, d))
    data = list(x_leaves) + list(kwarg_leaves) + other_params
    axes, out_tree = vmap_axes, None
    if per_example and not (is_int(vmap_axes) or _is_triple(vmap_axes)):
      # Which of the published readings applies depends on f's outputs.
      out_tree = jax.eval_shape(tree_fn, param_leaves, data)
      axes = _pytree_vmap_axes(vmap_axes, x, out_tree)
    if per_example:  # Checked before calling f, which may fail otherwise.
      in_axes, kwarg_axes = _input_axes(axes, x, arrays)
      batch_size(data, in_axes + kwarg_axes, vmap_axes)
    if out_tree is None:
      out_tree = jax.eval_shape(tree_fn, param_leaves, data)
    _check_outputs(tree_util.tree_leaves(out_tree))
    if per_example:
      out_axes = _output_axes(axes, out_tree)
      data_axes = tuple(in_axes + kwarg_axes + [None] * len(other_params))
      side = _per_example_side(fn, param_leaves, data, data_axes, out_tree,
                               out_axes, axes, n_x)
    else:
      out_axes = None
      shapes = tuple(tuple(out.shape)
                     for out in tree_util.tree_leaves(out_tree))
      side = Side(fn, None, None, shapes, shapes[0][0], n_x)
    sides.append((side, out_axes))
    datas.append(data)
    out_trees.append(out_tree)

  if tree_util.tree_structure(out_trees[0]) != tree_util.tree_structure(
      out_trees[1]):
    raise ValueError(
        '`f(params, x1)` and `f(params, x2)` return outputs of different '
        f'structures, {tree_util.tree_structure(out_trees[0])} and '
        f'{tree_util.tree_structure(out_trees[1])}; the kernel pairs their '
        'leaves, so make `f` return the same pytree structure for `x1` and '
        '`x2`.')
  layouts, result_shapes, placements = [], [], []
  (side1, out_axes), (side2, _) = sides
  outputs = tree_util.tree_leaves(out_trees[0])
  for leaf, (shape1, shape2) in enumerate(zip(side1.out_shapes,
                                              side2.out_shapes)):
    batch_axis = out_axes[leaf] if per_example else 0
    ndim = outputs[leaf].ndim
    layout = layout_lib.KernelLayout.build(ndim, batch_axis, trace_axes,
                                           diagonal_axes, per_example)
    layouts.append(layout)
    result_shapes.append(_result_shape(layout, shape1, shape2, side1.n,
                                       side2.n, per_example))
    placements.append(_placement(ndim, batch_axis, trace_axes,
                                 diagonal_axes, side1.n, side2.n)
                      if per_example else None)
  same_calls = statics[0].keys() == statics[1].keys() and all(
      statics[0][name] is statics[1][name] for name in statics[0])
  problem = Problem((side1, side2), symmetric, per_example, tuple(layouts),
                    tuple(result_shapes),
                    tree_util.tree_structure(out_trees[0]), same_calls,
                    tuple(placements))
  return problem, param_leaves, datas[0], datas[1]


def _placement(ndim: int, batch_axis: int, trace_axes: tuple[int, ...],
               diagonal_axes: tuple[int, ...], n1: int,
               n2: int) -> tuple[tuple[str, ...], int]:
  """`(kinds, batch_axis)` of a per-example kernel, see `Problem`."""
  kinds = layout_lib.axis_kinds(ndim, trace_axes, diagonal_axes)
  if kinds[batch_axis] != layout_lib.PAIR and n1 != n2:
    name = ('trace_axes' if kinds[batch_axis] == layout_lib.TRACE else
            'diagonal_axes')
    raise ValueError(
        f'`{name}` contains the batch axis {batch_axis}, which needs as many '
        f'examples in x1 as in x2; got {n1} and {n2}. Remove axis '
        f'{batch_axis} from `{name}`, or pass inputs of equal batch sizes.')
  return kinds, batch_axis


def place_example_axes(problem: Problem, kernels: list) -> list:
  """Moves each per-example kernel's example axes to the published layout."""
  return [kernel if placement is None else
          layout_lib.place_example_axes(kernel, *placement)
          for kernel, placement in zip(kernels, problem.placements)]


def _merge_param_leaves(differentiable_leaves: Sequence[Any],
                        other_leaves: Sequence[Any],
                        differentiable: Sequence[bool]) -> list:
  """Interleaves differentiable and other parameter leaves back in order."""
  differentiable_it, other_it = (iter(differentiable_leaves),
                                 iter(other_leaves))
  return [next(differentiable_it) if is_differentiable else next(other_it)
          for is_differentiable in differentiable]


def _check_outputs(outputs: Sequence[Any]) -> None:
  """Raises a `ValueError` for an output that cannot have a kernel."""
  for output in outputs:
    if not jnp.issubdtype(output.dtype, jnp.inexact):
      raise ValueError(f'`f` returned an output of dtype {output.dtype}; the '
                       'empirical kernels need floating-point outputs: cast '
                       "the output in `f`, e.g. `out.astype('float32')`.")
    if jnp.issubdtype(output.dtype, jnp.complexfloating):
      # `J J^T` or `J J^H`? The implementations differ: refused, with the
      # real formulation, which all agree on.
      raise TypeError(
          f'`f` returned a complex output (dtype {output.dtype}); the NTK '
          'needs real outputs. Return the real and imaginary parts as two '
          'real outputs, e.g. `jnp.stack([y.real, y.imag], -1)`.')
    if output.ndim == 0:
      raise ValueError('`f` returned a scalar output (shape ()); every '
                       'output needs a batch axis (axis 0, or the one given '
                       'by `vmap_axes`): return one value per example, e.g. '
                       'of shape `(batch_size, 1)`.')


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
    in_axes = [_normalize_axis(vmap_axes, np.ndim(leaf), 'an input leaf',
                               vmap_axes) for leaf in x_leaves]
    n = np.shape(x_leaves[0])[in_axes[0]] if x_leaves else None
    kwarg_axes = []
    for name, value in kwargs.items():
      leaves = tree_util.tree_leaves(value)
      batched = all(-np.ndim(leaf) <= vmap_axes < np.ndim(leaf) and
                    np.shape(leaf)[vmap_axes] == n and not rng_lib.is_raw_key(leaf)
                    for leaf in leaves)
      kwarg_axes += [int(vmap_axes) % np.ndim(leaf) if batched else None
                  for leaf in leaves]
    return in_axes, kwarg_axes
  in_spec, _, kwargs_spec = vmap_axes
  in_axes = [_normalize_axis(a, np.ndim(leaf), 'an input leaf', vmap_axes)
             for a, leaf in zip(_broadcast_prefix(in_spec, x, 'in_axes (inputs)',
                                               vmap_axes), x_leaves)]
  if all(a is None for a in in_axes):
    raise ValueError(f'`vmap_axes={vmap_axes!r}`: no input leaf has a batch '
                     'axis; give the batch axis of x in `in_axes`.')
  if kwargs_spec is None or isinstance(kwargs_spec, (int, np.integer)):
    kwargs_spec = {name: kwargs_spec for name in kwargs}
  if not isinstance(kwargs_spec, dict):
    raise ValueError(f'`vmap_axes={vmap_axes!r}`: `kwargs_axes` is '
                     f'{kwargs_spec!r}, not None, an int, or a dict from '
                     'keyword name to axis; pass e.g. '
                     "`vmap_axes=(0, 0, {'mask': 0})`.")
  kwarg_axes = []
  for name, value in kwargs.items():
    leaves = tree_util.tree_leaves(value)
    axes = _broadcast_prefix(kwargs_spec.get(name), value,
                             f'kwargs_axes[{name!r}] (keyword `{name}`)', vmap_axes)
    kwarg_axes += [_normalize_axis(a, np.ndim(leaf), f'keyword `{name}`', vmap_axes)
                for a, leaf in zip(axes, leaves)]
  return in_axes, kwarg_axes


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
                     'batch axis, but `out_axes` contains None; give each '
                     'output leaf its batch axis in `out_axes`.')
  return axes


def batch_size(data: Sequence[Any], data_axes: Sequence[Optional[int]],
               vmap_axes: VMapAxes) -> int:
  """The one size of the batch axes `data_axes` of `data`, or raises a
  `ValueError` naming `vmap_axes` (before `f` is called, which may fail
  otherwise with an error of its own).

  Example:
    >>> batch_size([jnp.ones((4, 3)), jnp.ones(2)], [0, None], 0)
    4
  """
  sizes = {np.shape(d)[a] for d, a in zip(data, data_axes) if a is not None}
  if len(sizes) != 1:
    raise ValueError(
        f'`vmap_axes={vmap_axes!r}`: the batch axes of the inputs (and '
        f'batched keyword arguments) have different sizes {sorted(sizes)}; '
        'give each leaf its batch axis, and None for shared leaves.')
  return next(iter(sizes))


def _per_example_side(fn: Callable, param_leaves: list, data: list,
                      data_axes: tuple, out_tree: PyTree,
                      out_axes: Sequence[int], vmap_axes: VMapAxes,
                      n_x: int) -> Side:
  """A `Side` whose `single_fn` runs `f` on one example (a batch of one)."""
  n = batch_size(data, data_axes, vmap_axes)
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
  return Side(fn, single_fn, data_axes, tuple(tuple(o.shape) for o in outs),
              n, n_x)


def _result_shape(layout: layout_lib.KernelLayout, shape1: Sequence[int],
                  shape2: Sequence[int], n1: int, n2: int,
                  per_example: bool) -> tuple[int, ...]:
  """The kernel's shape for outputs of shapes `shape1` and `shape2`."""
  shape = [n1, n2] if per_example else []
  for kind, a, b in zip(layout.kinds, shape1, shape2):
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


def abstract(x: Any) -> jax.ShapeDtypeStruct:
  """The shape and dtype of `x`."""
  return jax.ShapeDtypeStruct(np.shape(x), jnp.result_type(x))


def example_avals(data: list, axes: Optional[Sequence[Optional[int]]]
                  ) -> list[jax.ShapeDtypeStruct]:
  """Shapes and dtypes of one example of `data` (of all of it if no axes)."""
  if axes is None:
    return [abstract(d) for d in data]
  return [jax.ShapeDtypeStruct(tuple(np.delete(np.shape(d), a)) if a is not
                               None else np.shape(d), jnp.result_type(d))
          for d, a in zip(data, axes)]


def same_avals(a: Sequence[Any], b: Sequence[Any]) -> bool:
  """Whether two lists of arrays have the same shapes and dtypes."""
  return len(a) == len(b) and all(
      tuple(x.shape) == tuple(y.shape) and x.dtype == y.dtype
      for x, y in zip(a, b))

