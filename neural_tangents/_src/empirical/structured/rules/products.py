"""Records of products: `mul`, `div`, `dot_general`, convolutions.

A product is linear in each factor (`div` in its numerator): its Jacobian in
one input is an einsum of the other input (`d(a * b)/da = b`; `dot_general`
pairs letters of contracting and batch dimensions; a convolution is an einsum
of the input's windows, `conv_windows`, and the kernel).

Example:
  >>> [r.name for r in PRODUCT_RULES]
  ['mul', 'div']
"""
import functools
import itertools
import math
from typing import Any, Optional, Sequence

from jax import lax
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.empirical.einsum import Letter
from neural_tangents._src.empirical.einsum import Letters
from neural_tangents._src.empirical.einsum import mask
from neural_tangents._src.empirical.structured import ir
from neural_tangents._src.empirical.structured import params
from neural_tangents._src.empirical.structured.factor import Factor
from neural_tangents._src.empirical.structured.rules import common
from neural_tangents._src.empirical.structured.rules import elementwise
from neural_tangents._src.empirical.structured.rules.record import FormParts
from neural_tangents._src.empirical.structured.rules.record import Rule
from neural_tangents._src.utils.typing import Array

# ---------------------------------------------------------------------------
# Products: mul, div.
# ---------------------------------------------------------------------------


def _scaling_back(eqn, k, out):
  """`v = c * in` or `in / c` with a scalar constant `c`."""
  c = common.scalar_value(eqn.inputs[1 - k])
  if eqn.inputs[k].shape != eqn.outputs[0].shape or c is None or (
      eqn.name == 'div' and c == 0):
    return None
  return out, c if eqn.name == 'mul' else 1 / c


def _product_form(eqn: ir.Eqn, k: int,
                  letters: Letters) -> Optional[FormParts]:
  """`d(a * b)/da = b`, `d(a / b)/da = 1 / b` (elementwise, broadcast)."""
  if eqn.name == 'div' and k == 1:
    return None
  y = letters.many(len(eqn.outputs[0].shape))
  ins = common.broadcast_letters(eqn, y)
  other = eqn.inputs[1 - k]
  other_letters = mask(ins[1 - k], other.shape)
  transform = jnp.reciprocal if eqn.name == 'div' else None
  factor = Factor(other, other_letters, transform, other_letters)
  return y, (factor,), ins[k], 1.


def _scaling_passes(eqn: ir.Eqn, k: int) -> Optional[float]:
  """A scaling by a constant (e.g. stax's `W_std / sqrt(fan_in)`)."""
  c = common.scalar_value(eqn.inputs[1 - k])
  if not c or (eqn.name == 'div' and k == 1):
    return None
  return c if eqn.name == 'mul' else 1 / c


def _product_tail(eqn, k, letters, new):
  if eqn.name == 'div' and k == 1:
    return elementwise.elementwise_tail(eqn, k, letters, new)
  if not common.same_shape(eqn, k):
    return None
  other = eqn.inputs[1 - k]
  c = common.scalar_value(other)
  if c is not None and c != 0:
    return letters, [], c if eqn.name == 'mul' else 1 / c, 0
  other_letters = common.broadcast_letters(eqn, letters)[1 - k]
  transform = None if eqn.name == 'mul' else jnp.reciprocal
  return letters, [Factor(other, other_letters, transform)], 1., 0


PRODUCT_RULES = (
    Rule('mul', linear_in=common.linear_in_any, leaf_letters=_scaling_back,
         jacobian_form=_product_form, passes_cotangent=_scaling_passes,
         tail_step=_product_tail, batch_axis=common.elementwise_axis,
         elementwise=True),
    Rule('div', linear_in=common.linear_in_first, leaf_letters=_scaling_back,
         jacobian_form=_product_form, passes_cotangent=_scaling_passes,
         tail_step=_product_tail, batch_axis=common.elementwise_axis,
         elementwise=True),
)


# ---------------------------------------------------------------------------
# dot_general.
# ---------------------------------------------------------------------------


def dot_general_letters(eqn: ir.Eqn, k: int, operand: Sequence[Letter],
                        letters: Letters) -> tuple[list, list]:
  """Letters of the other input and of the output of a `dot_general`.

  Args:
    eqn: the `dot_general` equation.
    k: which input (0 or 1) has letters `operand`.
    operand: its letters.
    letters: fresh letters for the other input's remaining dimensions.

  Returns:
    `(other_letters, output_letters)`.
  """
  dims = params.dot_general_dimensions(eqn)
  mine, theirs = dims.of(k), dims.of(1 - k)
  other_atom = eqn.inputs[1 - k]
  unset = object()
  other: list[Any] = [unset] * len(other_atom.shape)
  for a, b in zip(mine[0] + mine[1], theirs[0] + theirs[1]):
    other[b] = operand[a]
  other = list(mask([letters.new() if letter is unset else letter
                     for letter in other], other_atom.shape))
  lhs, rhs = (operand, other) if k == 0 else (other, operand)
  lc, lb = dims.of(0)
  rc, rb = dims.of(1)
  free_l = [lhs[d] for d in range(len(lhs)) if d not in lc and d not in lb]
  free_r = [rhs[d] for d in range(len(rhs)) if d not in rc and d not in rb]
  return other, [lhs[d] for d in lb] + free_l + free_r


def _dot_general_form(eqn: ir.Eqn, k: int, letters: Letters) -> FormParts:
  operand = eqn.inputs[k]
  v = list(mask(letters.many(len(operand.shape)), operand.shape))
  other_letters, y = dot_general_letters(eqn, k, v, letters)
  factor = Factor(eqn.inputs[1 - k], tuple(other_letters),
                  atom_letters=tuple(other_letters))
  return y, (factor,), v, 1.


def _dot_general_tail(eqn, k, letters, new):
  other, out = dot_general_letters(eqn, k, letters, new)
  return out, [Factor(eqn.inputs[1 - k], tuple(other))], 1., 1


def _dot_general_axis(eqn, in_axes):
  dims = params.dot_general_dimensions(eqn)
  lc, lb = dims.of(0)
  rc, rb = dims.of(1)
  la, ra = in_axes
  lhs_free = [d for d in range(len(eqn.inputs[0].shape))
              if d not in lc and d not in lb]
  rhs_free = [d for d in range(len(eqn.inputs[1].shape))
              if d not in rc and d not in rb]
  if la is not None and ra is not None:
    # Both batched: only an elementwise pairing of examples is separable.
    common.require(la in lb and ra in rb and lb.index(la) == rb.index(ra))
    return [lb.index(la)]
  if la is not None:
    common.require(la not in lc)
    return [lb.index(la) if la in lb else len(lb) + lhs_free.index(la)]
  common.require(ra not in rc)
  return [rb.index(ra) if ra in rb else
          len(lb) + len(lhs_free) + rhs_free.index(ra)]


DOT_RULES = (
    Rule('dot_general', linear_in=common.linear_in_any,
         jacobian_form=_dot_general_form, tail_step=_dot_general_tail,
         batch_axis=_dot_general_axis),
)

# ---------------------------------------------------------------------------
# Convolutions: conv_general_dilated.
# ---------------------------------------------------------------------------


def _conv_form(eqn: ir.Eqn, k: int,
               letters: Letters) -> Optional[FormParts]:
  """`y = conv(x, W)` is `einsum(windows(x), W)` over the kernel's offsets."""
  conv = params.convolution(eqn)
  if k != 1 or conv.feature_group_count != 1 or conv.batch_group_count != 1:
    return None
  lhs, rhs = eqn.inputs
  out = eqn.outputs[0]
  y = letters.many(len(out.shape))
  feature = letters.new()
  offsets = letters.many(len(conv.rhs_spec) - 2)
  x_letters: list[Any] = [None] * len(lhs.shape)
  x_letters[conv.lhs_spec[0]] = y[conv.out_spec[0]]
  x_letters[conv.lhs_spec[1]] = feature
  for i, d in enumerate(conv.lhs_spec[2:]):
    x_letters[d] = y[conv.out_spec[2 + i]]
  v: list[Any] = [None] * len(rhs.shape)
  v[conv.rhs_spec[0]], v[conv.rhs_spec[1]] = y[conv.out_spec[1]], feature
  for i, d in enumerate(conv.rhs_spec[2:]):
    v[d] = offsets[i]
  atom_letters = letters.many(len(lhs.shape))
  atom_letters[conv.lhs_spec[0]] = y[conv.out_spec[0]]
  filter_shape = tuple(rhs.shape[d] for d in conv.rhs_spec[2:])
  out_spatial = tuple(out.shape[d] for d in conv.out_spec[2:])
  x_shape = list(lhs.shape)
  for i, d in enumerate(conv.lhs_spec[2:]):
    x_shape[d] = out_spatial[i]
  # Windows have the input's dimensions (spatial ones of the output's size),
  # with one dimension per kernel offset inserted before the feature one.
  f = conv.lhs_spec[1]
  x_letters[f:f] = offsets
  x_shape[f:f] = filter_shape
  windows = functools.partial(
      conv_windows, filter_shape=filter_shape, out_spatial=out_spatial,
      strides=conv.window_strides, padding=conv.padding,
      lhs_dilation=conv.lhs_dilation, rhs_dilation=conv.rhs_dilation,
      spatial=conv.lhs_spec[2:], feature=f)
  factor = Factor(lhs, mask(x_letters, x_shape), windows,
                  mask(atom_letters, lhs.shape))
  return y, (factor,), v, 1.


# Windows of at most this many entries (per call of `conv_windows`: per
# example under `vmap_axes`) are gathered; larger ones are copied by a loop.
# Measured on the 2-core CPU of `benchmarks/RESULTS.md` ("Small convolution
# windows gathered"): a gather instead of the loop saves 0.03-0.1 s of XLA
# compilation per windows, and up to this size costs 3-17 us more per example
# and call; the loop's runtime advantage grows with the windows' size.
GATHERED_WINDOWS_MAX_ELEMENTS = 2**13


def conv_windows(x: Array, filter_shape: Sequence[int],
                 out_spatial: Sequence[int], strides: Sequence[int],
                 padding: Sequence[tuple[int, int]],
                 lhs_dilation: Sequence[int], rhs_dilation: Sequence[int],
                 spatial: Sequence[int], feature: int) -> Array:
  """The input window of each output position, per kernel offset.

  `out[s] = sum_k xp[s * stride + k * rhs_dilation] W[k]`, where `xp` is the
  input dilated by `lhs_dilation` and padded. The windows have `x`'s axes,
  the spatial ones of the output's size, with one axis per kernel offset
  inserted before the feature axis `feature`: for NHWC,
  `windows[n, h, w, kh, kw, c] = xp[n, h * sh + kh * dh, w * sw + kw * dw, c]`,
  so that each offset's features are one contiguous row.

  The windows are copied exactly (no FLOPs, unlike a patches convolution),
  in one of two ways, both differentiable in both modes:
  * up to `GATHERED_WINDOWS_MAX_ELEMENTS` windows entries (per example under
    `vmap_axes`; the first convolution of an image network, on a few input
    channels): one `lax.gather` of every window entry, one XLA kernel;
  * larger windows: one offset per iteration of a `lax.fori_loop`, which XLA
    compiles as about seven kernels under `vmap` (the body's indices and
    bounds checks, the loop's condition) but which runs 2.5-4x as fast as the
    gather on up to a few hundred examples (XLA:CPU fuses the gather with the
    transpose to this layout and copies entry by entry, where the loop copies
    rows of features). A strided slice per offset compiled a kernel per
    offset and a concatenation XLA does not fuse (the structured NTK of
    `benchmarks/first_call.py`'s CNN compiled in 1.2-1.3 s with them,
    0.7-0.8 s with the loop, and runs as fast).

  Example:
    >>> conv_windows(jnp.ones((1, 5, 2)), (3,), (3,), (1,), ((0, 0),), (1,),
    ...              (1,), (1,), 2).shape
    (1, 3, 3, 2)
  """
  config = [(0, 0, 0)] * x.ndim
  for i, d in enumerate(spatial):
    config[d] = (padding[i][0], padding[i][1], lhs_dilation[i] - 1)
  xp = lax.pad(x, jnp.zeros((), x.dtype), config)
  # One offset's window: `size` entries of `xp` from its start, every `step`.
  size, step, shape = list(xp.shape), [1] * x.ndim, list(xp.shape)
  for i, d in enumerate(spatial):
    size[d] = (out_spatial[i] - 1) * strides[i] + 1
    step[d], shape[d] = strides[i], out_spatial[i]
  offsets = np.array(list(itertools.product(*map(range, filter_shape))),
                     np.int32).reshape(-1, len(spatial))
  shape.insert(feature, len(offsets))
  if math.prod(shape) <= GATHERED_WINDOWS_MAX_ELEMENTS:
    return _gathered_windows(xp, filter_shape, out_spatial, strides,
                             rhs_dilation, spatial, feature)

  def window(offset) -> Array:
    start = [np.int32(0)] * x.ndim
    for i, d in enumerate(spatial):
      start[d] = offset[i] * rhs_dilation[i]
    w = lax.dynamic_slice(xp, start, size)
    if any(s != 1 for s in step):
      w = lax.slice(w, [0] * x.ndim, size, step)
    return jnp.expand_dims(w, feature)

  if len(offsets) == 1:
    stacked = window(offsets[0])
  else:
    table = jnp.asarray(offsets)
    copy = lambda k, stacked: lax.dynamic_update_slice_in_dim(
        stacked, window(table[k]), k, feature)
    stacked = lax.fori_loop(0, len(offsets), copy, jnp.zeros(shape, x.dtype))
  return stacked.reshape(shape[:feature] + list(filter_shape) +
                         shape[feature + 1:])


def _gathered_windows(xp: Array, filter_shape: Sequence[int],
                      out_spatial: Sequence[int], strides: Sequence[int],
                      rhs_dilation: Sequence[int], spatial: Sequence[int],
                      feature: int) -> Array:
  """`conv_windows` of the padded input `xp`, by one `lax.gather`.

  The spatial axes are flattened into one, between the other axes and the
  feature axis, and each window entry `(position, offset)` is gathered as a
  row of features: `windows[..., s, k, c] = xp[..., s * stride + k *
  rhs_dilation, c]` over the flattened spatial axis.
  """
  others = [d for d in range(xp.ndim) if d not in spatial and d != feature]
  order = others + list(spatial) + [feature]
  padded_spatial = [xp.shape[d] for d in spatial]
  flat = jnp.transpose(xp, order).reshape(
      [xp.shape[d] for d in others] +
      [math.prod(padded_spatial), xp.shape[feature]])
  n = len(spatial)
  grid = np.meshgrid(
      *[np.arange(o) * s for o, s in zip(out_spatial, strides)],
      *[np.arange(k) * r for k, r in zip(filter_shape, rhs_dilation)],
      indexing='ij')
  index = np.ravel_multi_index([grid[i] + grid[n + i] for i in range(n)],
                               padded_spatial).reshape(-1, 1)
  axis = len(others)
  numbers = lax.GatherDimensionNumbers(
      offset_dims=tuple(d for d in range(flat.ndim) if d != axis),
      collapsed_slice_dims=(axis,), start_index_map=(axis,))
  slice_sizes = flat.shape[:axis] + (1,) + flat.shape[axis + 1:]
  gathered = lax.gather(flat, jnp.asarray(index, np.int32), numbers,
                        slice_sizes, indices_are_sorted=False,
                        unique_indices=False,
                        mode=lax.GatherScatterMode.PROMISE_IN_BOUNDS)
  # Gathered axes: others, output positions, offsets, features; the windows'
  # are x's, with the offsets before the feature axis.
  gathered = gathered.reshape(
      [xp.shape[d] for d in others] + list(out_spatial) + list(filter_shape) +
      [xp.shape[feature]])
  labels = others + list(spatial) + [('offset', i) for i in range(n)] + [
      feature]
  target = []
  for d in range(xp.ndim):
    if d == feature:
      target += [('offset', i) for i in range(n)]
    target.append(d)
  return jnp.transpose(gathered, [labels.index(label) for label in target])


def _conv_axis(eqn, in_axes):
  conv = params.convolution(eqn)
  common.require(in_axes[1] is None and in_axes[0] == conv.lhs_spec[0] and
                 conv.batch_group_count == 1)
  return [conv.out_spec[0]]


CONV_RULES = (
    Rule('conv_general_dilated', linear_in=common.linear_in_any,
         jacobian_form=_conv_form, batch_axis=_conv_axis),
)

