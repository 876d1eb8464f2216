"""Constant linear maps of positions: `ImageResize`, `Index`, `DotGeneral`.

Each layer applies a fixed linear map `M` to the positions of its inputs, the
same for every channel and every example. Channels stay independent and
identically distributed, so the kernel is the *two-point* map of the input
kernel (one copy of `M` on the positions of `x1`, one on those of `x2`):

  nngp'(x, x')[t, t'] = sum_{s, s'} M[t, s] M[t', s'] nngp(x, x')[s, s']

and the same for `ntk`, `cov1`, `cov2` (the layers have no parameters).
"""
from typing import Any, Optional, Sequence, Union

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.stax.layout import check_layout
from neural_tangents._src.stax.layout import ensure_full_spatial
from neural_tangents._src.stax.layout import standard_order
from neural_tangents._src.stax.masking import supports_masking
from neural_tangents._src.stax.protocol import Bool
from neural_tangents._src.stax.protocol import Diagonal
from neural_tangents._src.stax.requirements import layer
from neural_tangents._src.stax.requirements import requires
from neural_tangents._src.utils import kernel as kernel_lib
from neural_tangents._src.utils.kernel import Kernel
from neural_tangents._src.utils.typing import Layer

Array = jax.Array


def _reported_axis(axis: int, ndim: int) -> int:
  """An output channel axis as the `Kernel` records it: the last axis is -1
  (the published default, as `Dense`, `Conv` and `Flatten` report it)."""
  return -1 if axis == ndim - 1 else axis


def _map_spatial_pairs(k: Kernel, fn) -> Kernel:
  """Applies `fn(x, axis)` to both axes of every spatial pair of every
  covariance (or to the single axis of each, when spatially diagonal).

  `fn(x, axis, spatial_index, side)` maps axis `axis` of `x`, which holds
  spatial dimension `spatial_index` of the positions of input `side` (1 for
  `x1`, 2 for `x2`: their spatial shapes may differ), and may change its
  size (or remove it).
  """
  def apply(x, n_batch, left, right):
    if x is None:
      return None
    # Walk dimensions last to first so that earlier axis numbers stay valid.
    for i in reversed(range(k.n_spatial)):
      if k.diagonal_spatial:
        x = fn(x, n_batch + i, i, left)
      else:
        x = fn(x, n_batch + 2 * i + 1, i, right)
        x = fn(x, n_batch + 2 * i, i, left)
    return x

  n_cov = 1 if k.diagonal_batch else 2
  return k.replace(nngp=apply(k.nngp, 2, 1, 2), ntk=apply(k.ntk, 2, 1, 2),
                   cov1=apply(k.cov1, n_cov, 1, 1),
                   cov2=apply(k.cov2, n_cov, 2, 2))


# -----------------------------------------------------------------------------
# `ImageResize`.


def _resize_shape(shape: Sequence[int], input_shape: Sequence[int],
                  batch_axis: int, channel_axis: int) -> tuple[int, ...]:
  """The output shape: `shape` with `-1` entries taken from `input_shape`."""
  ndim = len(input_shape)
  if len(shape) != ndim:
    raise ValueError(
        f'`shape` must have one entry per input axis ({ndim}); got '
        f'{tuple(shape)} for inputs of shape {tuple(input_shape)}. Use -1 '
        'for axes to keep, e.g. `(-1, 16, 16, -1)`.')
  out = tuple(i if s == -1 else s for s, i in zip(shape, input_shape))
  for axis, name in ((batch_axis % ndim, 'batch'),
                     (channel_axis % ndim, 'channel')):
    if shape[axis] != -1 and out[axis] != input_shape[axis]:
      raise ValueError(
          f'`shape`={tuple(shape)} resizes the {name} axis {axis} (from '
          f'{input_shape[axis]} to {shape[axis]}), which `ImageResize` cannot '
          f'do: only spatial axes are resized. Pass -1 for the {name} axis.')
  if any(s <= 0 and s != -1 for s in shape):
    raise ValueError(f'`shape` must hold positive sizes or -1; got '
                     f'{tuple(shape)}. Pass the size of each resized axis, '
                     'and -1 for axes to keep, e.g. `(-1, 16, 16, -1)`.')
  return out


@layer
def ImageResize(shape: Sequence[int],
                method: Union[str, jax.image.ResizeMethod],
                antialias: bool = True,
                precision: lax.Precision = lax.Precision.HIGHEST,
                batch_axis: int = 0,
                channel_axis: int = -1) -> Layer:
  """Resizes the spatial axes of activations with `jax.image.resize`.

  Every method (`nearest`, `linear`/`bilinear`/`trilinear`, `cubic`,
  `lanczos3`, `lanczos5`, ...) is a separable linear map of positions
  `M = M_1 x ... x M_d`, so the kernel is the two-point resize

    nngp'[t_1, t_1', ..., t_d, t_d'] =
        sum M_1[t_1, s_1] M_1[t_1', s_1'] ... nngp[s_1, s_1', ..., s_d, s_d']

  (and likewise `ntk`, `cov1`, `cov2`), with `M_i` the resize of an identity
  matrix. `nearest` only selects positions, so it keeps a spatially diagonal
  kernel diagonal; the other methods need the full spatial covariance.

  Masked inputs are not supported (`ValueError`).

  Args:
    shape: output shape, one entry per input axis; `-1` keeps an axis' size.
      The batch and channel axes must be kept (`-1` or their current size).
    method: a `jax.image.ResizeMethod` or its name.
    antialias: whether to antialias when downsampling (see
      `jax.image.resize`).
    precision: precision of the resize's contractions.
    batch_axis: batch axis of the inputs.
    channel_axis: channel axis of the inputs.

  Returns:
    `(init_fn, apply_fn, kernel_fn)`.

  Example:
    >>> _, apply_fn, kernel_fn = stax.ImageResize((-1, 16, 16, -1), 'linear')
    >>> apply_fn((), jnp.ones((2, 8, 8, 3))).shape
    (2, 16, 16, 3)
  """
  if isinstance(method, str):
    try:
      method = jax.image.ResizeMethod.from_string(method)
    except ValueError as e:
      raise ValueError(f'`method` {method!r} is not a resize method: {e}. '
                       'Pass e.g. "nearest" or "linear".') from None
  shape = tuple(shape)
  selects = method == jax.image.ResizeMethod.NEAREST

  def resize(x, out_shape):
    return jax.image.resize(x, out_shape, method=method, antialias=antialias,
                            precision=precision)

  def init_fn(rng, input_shape):
    return _resize_shape(shape, input_shape, batch_axis, channel_axis), ()

  def apply_fn(params, inputs, **kwargs):
    return resize(inputs, _resize_shape(shape, inputs.shape, batch_axis,
                                        channel_axis))

  @requires(batch_axis=batch_axis, channel_axis=channel_axis,
            diagonal_batch=Diagonal(),
            diagonal_spatial=Diagonal(input=Bool.YES if selects else
                                      Bool.NO))
  def kernel_fn(k: Kernel, **kwargs) -> Kernel:
    check_layout(k, batch_axis, channel_axis, 'ImageResize')
    if not selects:
      k = ensure_full_spatial(k)
    out1 = _resize_shape(shape, k.shape1, batch_axis, channel_axis)
    out2 = _resize_shape(shape, k.shape2, batch_axis, channel_axis)
    # The resize matrix of each spatial dimension of each side (`x1` and
    # `x2` may have different spatial shapes).
    sizes_in = {1: k.spatial_shape1, 2: k.spatial_shape2}
    sizes_out = {side: kernel_lib.spatial_shape(out, k.batch_axis,
                                                k.channel_axis)
                 for side, out in ((1, out1), (2, out2))}
    matrices = {side: [resize(jnp.eye(s, dtype=k.nngp.dtype), (t, s))
                       for s, t in zip(sizes_in[side], sizes_out[side])]
                for side in (1, 2)}

    def resize_axis(x, axis, i, side):
      if sizes_in[side][i] == sizes_out[side][i]:
        return x
      return jnp.moveaxis(jnp.tensordot(matrices[side][i], x, axes=(1, axis),
                                        precision=lax.Precision.HIGHEST),
                          0, axis)

    return _map_spatial_pairs(k, resize_axis).replace(shape1=out1,
                                                      shape2=out2)

  return init_fn, apply_fn, kernel_fn


# -----------------------------------------------------------------------------
# `Index` and `Slice`.


class _SliceHelper:
  """`Slice[...]` returns its index: `stax.Slice[:, 1:, ::2]` is
  `(slice(None), slice(1, None), slice(None, None, 2))`."""

  def __getitem__(self, idx: Any) -> Any:
    return idx


Slice = _SliceHelper()


def _expand_index(idx: Any, ndim: int) -> list[Union[int, slice]]:
  """`idx` as one `int` or `slice` per axis (`Ellipsis` expanded)."""
  idx = idx if isinstance(idx, tuple) else (idx,)
  for i in idx:
    if not (i is Ellipsis or isinstance(i, slice) or
            (isinstance(i, (int, np.integer)) and not isinstance(i, bool))):
      raise TypeError(
          f'`idx` may only hold ints, slices and `...`; got {i!r} in {idx!r}. '
          'Build it with `stax.Slice`, e.g. `stax.Slice[:, 1:, ::2]`.')
  n_ellipsis = sum(i is Ellipsis for i in idx)
  if n_ellipsis > 1:
    raise ValueError(f'`idx` may hold at most one `...`; got {idx!r}. Spell '
                     'out the slices on one side, e.g. '
                     '`stax.Slice[..., 1:, :]` instead of `[..., 1:, ...]`.')
  n_given = len(idx) - n_ellipsis
  if n_given > ndim:
    raise ValueError(f'`idx`={idx!r} indexes {n_given} axes of inputs of rank '
                     f'{ndim}. Index at most {ndim} axes.')
  if n_ellipsis:
    at = idx.index(Ellipsis)
    idx = idx[:at] + (slice(None),) * (ndim - n_given) + idx[at + 1:]
  else:
    idx = idx + (slice(None),) * (ndim - n_given)
  return list(idx)


def _indexed_size(i: Union[int, slice], size: int, axis: int,
                  idx: Any) -> Optional[int]:
  """Size of an axis of `size` after index `i` (`None`: the axis is gone)."""
  if isinstance(i, slice):
    return len(range(*i.indices(size)))
  if not -size <= i < size:
    raise ValueError(f'`idx`={idx!r} indexes axis {axis} of size {size} with '
                     f'{i}, which is out of range. Pass an index in '
                     f'[{-size}, {size}), or a slice.')
  return None


@layer
@supports_masking(remask_kernel=False)
def Index(idx: Any, batch_axis: int = 0, channel_axis: int = -1) -> Layer:
  """Indexes activations: `apply_fn(params, x) = x[idx]`.

  `idx` holds ints, slices and at most one `...` (build it with `stax.Slice`).

  * Spatial axes: ints and slices select positions, so the kernel is indexed
    the same way on both axes of each spatial pair (an int removes the pair).
  * Channel axis: `apply_fn` keeps a subset of channels, but `kernel_fn`
    raises `NotImplementedError` (as the published release does): the
    channels of raw inputs, or of a `FanInConcat` on channels, are not
    identically distributed. Index the inputs before calling `kernel_fn`.
  * Batch axis: a slice selects examples of both `x1` and `x2`; the kernel's
    rows and columns are indexed alike.
  * Ints on the batch or channel axis (which would remove the axis) raise
    `NotImplementedError` (as the published release does); use a length-1
    slice instead.

  Masks are indexed with the activations.

  Args:
    idx: the index, e.g. `stax.Slice[:, 1:, ::2]`.
    batch_axis: batch axis of the inputs.
    channel_axis: channel axis of the inputs.

  Returns:
    `(init_fn, apply_fn, kernel_fn)`.

  Example:
    >>> _, apply_fn, _ = stax.Index(stax.Slice[:, ::2])
    >>> apply_fn((), jnp.ones((2, 8, 3))).shape
    (2, 4, 3)
  """
  _expand_index(idx, 64)  # Validates the entries' types early.

  def resolve(ndim: int) -> list[Union[int, slice]]:
    full = _expand_index(idx, ndim)
    for axis, name in ((batch_axis % ndim, 'batch'),
                       (channel_axis % ndim, 'channel')):
      if not isinstance(full[axis], slice):  # As the published release.
        raise NotImplementedError(
            f'`idx`={idx!r} indexes the {name} axis {axis} with the integer '
            f'{full[axis]}, which would remove it. Use a length-1 slice, e.g. '
            f'`{full[axis]}:{full[axis] + 1}`.')
    return full

  def output_shape(input_shape):
    full = resolve(len(input_shape))
    sizes = [_indexed_size(i, s, axis, idx)
             for axis, (i, s) in enumerate(zip(full, input_shape))]
    return tuple(s for s in sizes if s is not None)

  def output_axes(ndim: int) -> tuple[int, int]:
    full = resolve(ndim)
    kept = [a for a in range(ndim) if isinstance(full[a], slice)]
    return kept.index(batch_axis % ndim), kept.index(channel_axis % ndim)

  def reported_axes(ndim: int) -> tuple[int, int]:
    n_kept = sum(isinstance(i, slice) for i in resolve(ndim))
    b, c = output_axes(ndim)
    return b, _reported_axis(c, n_kept)

  def init_fn(rng, input_shape):
    shape = tuple(input_shape)
    ndim = len(shape)
    b = batch_axis % ndim
    if shape[b] == -1:  # Unknown batch size: any slice keeps it unknown.
      out = output_shape(shape[:b] + (1,) + shape[b + 1:])
      return out[:output_axes(ndim)[0]] + (-1,) + out[output_axes(ndim)[0] +
                                                       1:], ()
    return output_shape(shape), ()

  def apply_fn(params, inputs, **kwargs):
    return inputs[tuple(resolve(inputs.ndim))]

  @requires(batch_axis=batch_axis, channel_axis=channel_axis,
            diagonal_batch=Diagonal(), diagonal_spatial=Diagonal())
  def kernel_fn(k: Kernel, **kwargs) -> Kernel:
    check_layout(k, batch_axis, channel_axis, 'Index')
    ndim = len(k.shape1)
    full = resolve(ndim)
    b, c = k.batch_axis % ndim, k.channel_axis % ndim
    if full[c] != slice(None):
      raise NotImplementedError(
          f'`Index` with `idx`={idx!r} indexes the channel axis ({full[c]}), '
          'which has no kernel here (as in the published release): the '
          'channels of raw inputs are not identically distributed, and those '
          'of a `FanInConcat` on channels are not either. Index the inputs '
          'before calling `kernel_fn`, or index only the batch and spatial '
          'axes.')
    spatial_idx = [full[a] for a in standard_order(ndim, b, c)[1:-1]]

    def index_axis(x, axis, i, side):
      return x[(slice(None),) * axis + (spatial_idx[i],)]

    k = _map_spatial_pairs(k, index_axis)
    bi = full[b]
    if bi != slice(None):
      pair = lambda x: None if x is None else x[bi][:, bi]
      single = lambda x: None if x is None else x[bi]
      cov = single if k.diagonal_batch else pair
      k = k.replace(nngp=pair(k.nngp), ntk=pair(k.ntk), cov1=cov(k.cov1),
                    cov2=cov(k.cov2))
    new_b, new_c = reported_axes(ndim)
    return k.replace(shape1=output_shape(k.shape1),
                     shape2=output_shape(k.shape2),
                     batch_axis=new_b, channel_axis=new_c)

  def mask_fn(mask, input_shape):
    ndim = len(input_shape)
    full = resolve(ndim)
    c = channel_axis % ndim
    # Broadcast first, as a size-1 mask axis must be indexed like a full one;
    # except a channel-independent mask, which stays so.
    shape = list(input_shape)
    if mask.shape[c] == 1:
      shape[c], full[c] = 1, slice(None)
    return jnp.broadcast_to(mask, shape)[tuple(full)]

  return init_fn, apply_fn, kernel_fn, mask_fn


# -----------------------------------------------------------------------------
# `DotGeneral`.


DimensionNumbers = tuple[tuple[Sequence[int], Sequence[int]],
                         tuple[Sequence[int], Sequence[int]]]


def _dot_general_axis(axis: int, ndim: int, const_ndim: int,
                      dimension_numbers: DimensionNumbers,
                      inputs_are_lhs: bool) -> Optional[int]:
  """Where `lax.dot_general` puts free input axis `axis` (None if not free)."""
  (c_lhs, c_rhs), (b_lhs, b_rhs) = dimension_numbers
  x_contract, x_batch = (c_lhs, b_lhs) if inputs_are_lhs else (c_rhs, b_rhs)
  used = {a % ndim for a in tuple(x_contract) + tuple(x_batch)}
  if axis in used:
    return None
  x_free = [a for a in range(ndim) if a not in used]
  n_batch = len(tuple(b_lhs))
  if inputs_are_lhs:
    return n_batch + x_free.index(axis)
  n_const_free = const_ndim - len(tuple(c_lhs)) - n_batch
  return n_batch + n_const_free + x_free.index(axis)


@layer
@supports_masking(remask_kernel=False)
def DotGeneral(lhs: Optional[Array] = None,
               rhs: Optional[Array] = None,
               dimension_numbers: DimensionNumbers = (((), ()), ((), ())),
               precision: Optional[lax.Precision] = None,
               batch_axis: int = 0,
               channel_axis: int = -1) -> Layer:
  """Multiplies activations by a constant array with `lax.dot_general`.

  `apply_fn(params, x) = lax.dot_general(x, rhs, dimension_numbers,
  precision)` when `rhs` is given, `lax.dot_general(lhs, x, ...)` when `lhs`
  is given, and `x` when neither is. The constant is not a parameter.

  Supported by `kernel_fn`: any contraction or (dot_general-)batching of the
  *spatial* axes of `x` with axes of the constant. The result is a fixed
  linear map of positions, identical for every channel and example, so the
  kernel is the two-point map (see the module docstring); it is computed by
  applying the same `dot_general` to the covariances, once on the positions
  of `x1` and once on those of `x2`. New free axes of the constant become
  spatial axes of the output. The output's batch and channel axes are where
  `dot_general` puts them (its batch dims, then the free axes of the left,
  then of the right operand); the kernel records them, and the next layers
  must be given those axes.

  Not supported (`kernel_fn` raises `ValueError`): the batch axis or the
  channel axis in `dimension_numbers`. A constant cannot mix the infinitely
  many channels of an infinite-width layer (use `Dense` for a learned channel
  map), and mixing examples depends on which examples are in `x1` and `x2`.
  `apply_fn` computes any `dot_general`.

  Masked inputs (see `masking`): masked entries are zeros, so the output and
  the kernel are those of the zeroed inputs; an output entry is masked iff
  every input entry it depends on through a nonzero entry of the constant is
  masked.

  Args:
    lhs: constant left operand, or `None` (inputs on the left).
    rhs: constant right operand, or `None` (inputs on the right). At most one
      of `lhs`, `rhs` may be given.
    dimension_numbers: `((lhs_contracting, rhs_contracting), (lhs_batch,
      rhs_batch))`, as in `lax.dot_general`.
    precision: precision of `apply_fn`'s contraction (`kernel_fn` uses the
      highest).
    batch_axis: batch axis of the inputs.
    channel_axis: channel axis of the inputs.

  Returns:
    `(init_fn, apply_fn, kernel_fn)`.

  Example:
    >>> # Averages pairs of neighboring positions of (N, 8, C) inputs.
    >>> pool = jnp.kron(jnp.eye(4), jnp.ones((1, 2)) / 2)  # (4, 8)
    >>> _, apply_fn, kernel_fn = stax.DotGeneral(
    ...     lhs=pool, dimension_numbers=(((1,), (1,)), ((), ())))
    >>> apply_fn((), jnp.ones((2, 8, 3))).shape  # lhs's free axis comes first
    (4, 2, 3)
    >>> kernel_fn(jnp.ones((2, 8, 3))).batch_axis  # so the batch axis is 1.
    1
  """
  if lhs is not None and rhs is not None:
    raise ValueError(
        '`DotGeneral` takes one constant, but both `lhs` (shape '
        f'{jnp.shape(lhs)}) and `rhs` (shape {jnp.shape(rhs)}) were given: '
        'pass `lhs` or `rhs`, not both. Chain two `DotGeneral` layers to '
        'multiply on both sides.')
  const = lhs if lhs is not None else rhs
  inputs_are_lhs = rhs is not None
  const = None if const is None else jnp.asarray(const)

  def dot(x, prec):
    if const is None:
      return x
    if inputs_are_lhs:
      return lax.dot_general(x, const, dimension_numbers, prec)
    return lax.dot_general(const, x, dimension_numbers, prec)

  def out_axes(ndim: int, which: str) -> tuple[int, int]:
    b, c = batch_axis % ndim, channel_axis % ndim
    if const is None:
      return b, c
    axes = [_dot_general_axis(a, ndim, const.ndim, dimension_numbers,
                              inputs_are_lhs) for a in (b, c)]
    for a, name, out in zip((b, c), ('batch', 'channel'), axes):
      if out is None:
        raise ValueError(
            f'`dimension_numbers`={dimension_numbers} contracts or batches the '
            f'{name} axis {a} of the inputs, which `DotGeneral`\'s {which} '
            'does not support. Only contract / batch spatial axes; use '
            '`Dense` to map channels, and index examples before the network.')
    return axes[0], axes[1]

  def output_shape(input_shape):
    shape = tuple(1 if s == -1 else s for s in input_shape)
    out = jax.eval_shape(lambda x: dot(x, precision),
                         jax.ShapeDtypeStruct(shape, jnp.float32)).shape
    b = batch_axis % len(input_shape)
    if input_shape[b] == -1:
      out_b = _dot_general_axis(b, len(shape), 0 if const is None else
                                const.ndim, dimension_numbers, inputs_are_lhs)
      if out_b is not None:
        out = out[:out_b] + (-1,) + out[out_b + 1:]
    return tuple(out)

  def init_fn(rng, input_shape):
    return output_shape(input_shape), ()

  def apply_fn(params, inputs, **kwargs):
    return dot(inputs, precision)

  @requires(batch_axis=batch_axis, channel_axis=channel_axis,
            diagonal_batch=Diagonal(), diagonal_spatial=Diagonal(
                input=Bool.NO if const is not None else Bool.YES))
  def kernel_fn(k: Kernel, **kwargs) -> Kernel:
    check_layout(k, batch_axis, channel_axis, 'DotGeneral')
    if const is None:
      return k
    k = ensure_full_spatial(k)
    ndim = len(k.shape1)
    b, c = k.batch_axis % ndim, k.channel_axis % ndim
    out_b, out_c = out_axes(ndim, 'kernel_fn')
    out_shape1, out_shape2 = output_shape(k.shape1), output_shape(k.shape2)
    out_ndim = len(out_shape1)
    in_order = standard_order(ndim, b, c)
    out_order = standard_order(out_ndim, out_b, out_c)
    spatial_out = tuple(out_shape1[i] for i in out_order[1:-1])
    hi = lax.Precision.HIGHEST

    def map_positions(x_std):
      """`(B, S..., P)` -> `(B, T..., P)`: the map on positions, with the
      channel axis carrying `P` columns of the other side's covariance."""
      x = jnp.transpose(x_std, np.argsort(in_order))
      return jnp.transpose(dot(x, hi), out_order)

    n_cov_pair = not k.diagonal_batch
    apply = lambda x, paired: None if x is None else _map_both_sides(
        x, paired, map_positions, len(spatial_out))
    return k.replace(nngp=apply(k.nngp, True), ntk=apply(k.ntk, True),
                     cov1=apply(k.cov1, n_cov_pair),
                     cov2=apply(k.cov2, n_cov_pair),
                     shape1=out_shape1, shape2=out_shape2,
                     batch_axis=out_b,
                     channel_axis=_reported_axis(out_c, out_ndim))

  def mask_fn(mask, input_shape):
    if const is None:
      return mask
    return _dot_general_mask(mask, input_shape, const, dimension_numbers,
                             inputs_are_lhs)

  return init_fn, apply_fn, kernel_fn, mask_fn


def _map_both_sides(x: Array, paired: bool, map_positions,
                    n_t: int) -> Array:
  """Maps the positions of both sides of a covariance `x` (interleaved
  layout), whose leading axes are `(N1, N2)` if `paired` else `(N,)`.

  `map_positions` maps `(B, S..., P)` to `(B, T..., P)`, the channel axis
  carrying `P` columns of the other side's covariance; `n_t` is the number
  of output spatial axes `T...`.
  """
  n_batch = 2 if paired else 1
  n_sp = (x.ndim - n_batch) // 2
  first = [n_batch + 2 * i for i in range(n_sp)]
  second = [n_batch + 2 * i + 1 for i in range(n_sp)]
  # Side 1: (N1, S..., [N2,] S'...) with the trailing axes as channels.
  x = jnp.transpose(x, [0] + first + list(range(1, n_batch)) + second)
  rest = x.shape[1 + n_sp:]
  x = map_positions(x.reshape(x.shape[:1 + n_sp] + (-1,)))
  x = x.reshape(x.shape[:-1] + rest)  # (N1, T..., [N2,] S'...)
  # Side 2: bring (N2 or N1, S'...) first, carrying (N1, T...) / (T...).
  if paired:
    order = [1 + n_t] + list(range(2 + n_t, x.ndim)) + list(range(1 + n_t))
  else:
    order = [0] + list(range(1 + n_t, x.ndim)) + list(range(1, 1 + n_t))
  x = jnp.transpose(x, order)
  rest = x.shape[1 + n_sp:]
  x = map_positions(x.reshape(x.shape[:1 + n_sp] + (-1,)))
  x = x.reshape(x.shape[:-1] + rest)  # (N2, T'..., [N1,] T...)
  # Back to (N1, [N2,] T_1, T_1', ..., T_d, T_d').
  if paired:
    lead = [1 + n_t, 0]
    t1 = list(range(2 + n_t, x.ndim))
  else:
    lead = [0]
    t1 = list(range(1 + n_t, x.ndim))
  t2 = list(range(1, 1 + n_t))
  order = lead + [a for pair in zip(t1, t2) for a in pair]
  return jnp.transpose(x, order)


def _dot_general_mask(mask: Array, input_shape: Sequence[int], const: Array,
                      dimension_numbers: DimensionNumbers,
                      inputs_are_lhs: bool) -> Array:
  """The output mask of `DotGeneral`: an output entry is masked iff every
  input entry it depends on through a nonzero entry of `const` is masked."""
  # Contracted and dot_general-batched axes must have their full sizes;
  # free axes of size 1 stay so (the output mask broadcasts along them).
  (c_lhs, c_rhs), (b_lhs, b_rhs) = dimension_numbers
  used = (tuple(c_lhs) + tuple(b_lhs) if inputs_are_lhs else
          tuple(c_rhs) + tuple(b_rhs))
  used = {a % len(input_shape) for a in used}
  shape = [input_shape[a] if a in used else mask.shape[a]
           for a in range(len(input_shape))]
  unmasked = jnp.broadcast_to(~mask, shape).astype(const.dtype)
  nonzero = (const != 0).astype(const.dtype)
  if inputs_are_lhs:
    reach = lax.dot_general(unmasked, nonzero, dimension_numbers)
  else:
    reach = lax.dot_general(nonzero, unmasked, dimension_numbers)
  return reach == 0
