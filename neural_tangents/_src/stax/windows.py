"""The geometry of sliding windows: where the windows of a convolution or a
pooling layer lie on its inputs.

Along one spatial dimension, the input of length `in_size` is dilated
(`dilation - 1` zeros between entries, as a transposed convolution does),
padded (`Padding`: none, zeros, or wrapped around), and windows of `size` taps
start every `stride` positions (`WindowDim`). A convolution names its axes
with `dimension_numbers` strings (`ConvLayout`); a pooling layer with its
batch and channel axes. This module computes the windows of every spatial
dimension, the output shapes they give, and the sums over windows that
convolutions and pooling apply to activations, covariances and masks: along
one axis (`window_sum`), along several axes independently
(`separable_window_sum`, every tap paired with every tap: pooling), and
over pairs of axes with equal taps (`diagonal_window_sum`: a shared filter).
"""
import dataclasses
import enum
import itertools
import math
from typing import Sequence, Union

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.utils import arguments

Array = jax.Array


class Padding(str, enum.Enum):
  """Padding of a sliding window.

  * `VALID`: no padding; windows lie inside the input.
  * `SAME`: zero padding, `ceil(size / stride)` outputs per dimension (the
    padding of `jax.lax.conv_general_dilated(..., padding='SAME')`).
  * `CIRCULAR`: as `SAME`, but the input wraps around (periodic boundary)
    instead of being padded with zeros.
  """
  VALID = 'VALID'
  SAME = 'SAME'
  CIRCULAR = 'CIRCULAR'


def padding_of(padding: Union[str, Padding]) -> Padding:
  """`padding` as a `Padding`, accepting strings in any case.

  Raises:
    ValueError: `padding` names no `Padding`.
  """
  try:
    return arguments.parse_enum(padding, Padding, 'padding')
  except ValueError:
    raise ValueError(
        f'`padding` must be one of "VALID", "SAME", "CIRCULAR" (or a '
        f'`stax.Padding`); got {padding!r}. Pass e.g. padding="SAME".'
    ) from None


# -----------------------------------------------------------------------------
# Sliding windows along one spatial dimension.


@dataclasses.dataclass(frozen=True)
class WindowDim:
  """A sliding window along one spatial dimension.

  The input of length `in_size` is first dilated by `dilation` (`dilation - 1`
  zeros between entries, as a transposed convolution does), then padded by
  `pads` (zeros, or wrapped around if `wrap`); windows of `size` taps then
  start every `stride` positions.

  Attributes:
    in_size: length of the input.
    size: number of taps of the window.
    stride: distance between the starts of consecutive windows.
    pads: `(before, after)` padding.
    wrap: whether padding wraps around (`CIRCULAR`) rather than adds zeros.
    dilation: input dilation factor.
  """
  in_size: int
  size: int
  stride: int = 1
  pads: tuple[int, int] = (0, 0)
  wrap: bool = False
  dilation: int = 1

  @property
  def dilated_size(self) -> int:
    # A periodic signal dilated by `d` has period `in_size * d`, so it keeps
    # the `d - 1` zeros after its last entry.
    if self.wrap:
      return self.in_size * self.dilation
    return (self.in_size - 1) * self.dilation + 1

  @property
  def out_size(self) -> int:
    return (self.dilated_size + sum(self.pads) - self.size) // self.stride + 1


def same_pads(in_size: int, size: int, stride: int) -> tuple[int, int]:
  """`(before, after)` padding giving `ceil(in_size / stride)` windows."""
  out_size = -(-in_size // stride)
  total = max((out_size - 1) * stride + size - in_size, 0)
  return total // 2, total - total // 2


def conv_window(in_size: int, size: int, stride: int,
                padding: Padding) -> WindowDim:
  """The window of a convolution or pooling layer along one dimension."""
  if padding == Padding.VALID:
    return WindowDim(in_size, size, stride)
  return WindowDim(in_size, size, stride, same_pads(in_size, size, stride),
                   wrap=padding == Padding.CIRCULAR)


def conv_transpose_window(in_size: int, size: int, stride: int,
                          padding: Padding) -> WindowDim:
  """The window of a transposed convolution along one dimension.

  `jax.lax.conv_transpose(x, W, strides, padding)` (with its default
  `transpose_kernel=False`) is a stride-1 convolution of the input dilated by
  `strides`, padded as below; it has `in_size * stride` outputs for `SAME`
  and `in_size * stride + max(size - stride, 0)` for `VALID`. `CIRCULAR` is
  `SAME` on the periodic extension of the dilated input.
  """
  if padding == Padding.VALID:
    pads = (size - 1, stride - 1 + max(size - stride, 0))
  else:
    before = (size - 1 if stride > size - 1 else
              math.ceil((size + stride - 2) / 2))
    pads = (before, size + stride - 2 - before)
    if padding == Padding.CIRCULAR:
      # The dilated period already ends with `stride - 1` zeros.
      pads = (before, pads[1] - (stride - 1))
  return WindowDim(in_size, size, 1, pads, wrap=padding == Padding.CIRCULAR,
                   dilation=stride)


# -----------------------------------------------------------------------------
# The windows of a layer.


def _default_spatial_chars(n: int) -> str:
  # 'HW' for images so that the default is ('NHWC', 'HWIO', 'NHWC'); extra
  # letters avoid 'N', 'C', 'I', 'O', which name batch and channel axes.
  pool = 'ABEFGJKLMPQRSTUVXYZ' + 'DHW'
  if n > len(pool):
    raise ValueError(
        f'`filter_shape` has {n} entries, more than the {len(pool)} spatial '
        'dimensions the default `dimension_numbers` can name. Pass '
        '`dimension_numbers` with one distinct letter per spatial '
        'dimension.')
  return pool[len(pool) - n:]


@dataclasses.dataclass(frozen=True)
class ConvLayout:
  """The `(lhs, rhs, out)` dimension numbers of a convolution, as strings.

  `lhs` and `out` name the axes of the inputs and outputs (`N` batch, `C`
  channels, other letters spatial dimensions); `rhs` those of the filter (`I`
  input and `O` output channels). `filter_shape` and `strides` are given in
  the order of the spatial letters of `rhs`, as `jax.lax` does.
  """
  lhs: str
  rhs: str
  out: str

  @property
  def filter_spatial(self) -> str:
    return ''.join(c for c in self.rhs if c not in 'IO')

  @property
  def lhs_spatial(self) -> str:
    return ''.join(c for c in self.lhs if c not in 'NC')

  @property
  def out_spatial(self) -> str:
    return ''.join(c for c in self.out if c not in 'NC')

  @property
  def dimension_numbers(self) -> tuple[str, str, str]:
    return self.lhs, self.rhs, self.out

  @staticmethod
  def axis(spec: str, letter: str) -> int:
    """Axis of `letter` in `spec`; a last axis is -1, as in `Dense`."""
    index = spec.index(letter)
    return -1 if index == len(spec) - 1 else index


def conv_layout(dimension_numbers, n_spatial: int,
                layer_name: str) -> ConvLayout:
  """Validates `dimension_numbers` (`None` for the channels-last default)."""
  if dimension_numbers is None:
    spatial = _default_spatial_chars(n_spatial)
    return ConvLayout('N' + spatial + 'C', spatial + 'IO', 'N' + spatial + 'C')
  fix = ("Pass three strings such as ('NHWC', 'HWIO', 'NHWC') or "
         "('NCHW', 'OIHW', 'NCHW'), with one spatial letter per entry of "
         '`filter_shape`.')
  if (not isinstance(dimension_numbers, (tuple, list)) or
      len(dimension_numbers) != 3 or
      not all(isinstance(s, str) for s in dimension_numbers)):
    raise ValueError(f'`dimension_numbers` of `{layer_name}` must be a tuple '
                     f'of 3 strings; got {dimension_numbers!r}. {fix}')
  lhs, rhs, out = dimension_numbers
  layout = ConvLayout(lhs, rhs, out)
  spatial = set(layout.filter_spatial)
  ok = all(len(s) == n_spatial + 2 and len(set(s)) == len(s)
           for s in (lhs, rhs, out))
  ok = ok and all(c in lhs and c in out for c in 'NC')
  ok = ok and all(c in rhs for c in 'IO')
  ok = ok and set(layout.lhs_spatial) == spatial == set(layout.out_spatial)
  if not ok:
    raise ValueError(
        f'`dimension_numbers` of `{layer_name}` is {dimension_numbers!r}, '
        f'which is not a valid layout for {n_spatial} spatial dimensions: '
        'each string needs the same spatial letters once, `N` and `C` in the '
        f'input and output specs and `I` and `O` in the filter spec. {fix}')
  return layout


def check_input_rank(shape: Sequence[int], layout: ConvLayout,
                      layer_name: str) -> None:
  """Raises a `ValueError` unless `shape` has one axis per letter of
  `layout.lhs`."""
  if len(shape) != len(layout.lhs):
    raise ValueError(
        f'`{layer_name}` with dimension numbers {layout.dimension_numbers} '
        f'expects inputs of rank {len(layout.lhs)} ({layout.lhs}); got shape '
        f'{tuple(shape)}. Pass inputs with one axis per letter of '
        f'{layout.lhs!r}, or a `filter_shape` with one entry per spatial '
        'dimension of the inputs.')



def letter_windows(input_shape: Sequence[int], layout: ConvLayout,
             filter_shape: Sequence[int], strides: Sequence[int],
             padding: Padding, layer_name: str,
             transpose: bool = False) -> dict[str, WindowDim]:
  """The window of every spatial letter of `layout`, for inputs of
  `input_shape` (`transpose`: those of a transposed convolution)."""
  check_input_rank(input_shape, layout, layer_name)
  windows = {}
  for c, size, stride in zip(layout.filter_spatial, filter_shape, strides):
    in_size = input_shape[layout.lhs.index(c)]
    if transpose:
      windows[c] = conv_transpose_window(in_size, size, stride, padding)
      continue
    if padding == Padding.VALID and size > in_size:
      raise ValueError(
          f'`filter_shape`={tuple(filter_shape)} of `{layer_name}` is larger '
          f'than its input along spatial dimension {c!r} ({size} > {in_size}, '
          f'inputs of shape {tuple(input_shape)}), so padding="VALID" leaves '
          'no output positions. Use a filter no larger than the input, or '
          'padding="SAME" or "CIRCULAR".')
    windows[c] = conv_window(in_size, size, stride, padding)
  return windows


def window_output_shape(input_shape: Sequence[int], layout: ConvLayout,
                  windows: dict[str, WindowDim],
                  out_chan: int) -> tuple[int, ...]:
  """The shape of a convolution's outputs, laid out as `layout.out`."""
  batch = input_shape[layout.lhs.index('N')]
  return tuple(batch if c == 'N' else out_chan if c == 'C' else
               windows[c].out_size for c in layout.out)



def axis_windows(shape: Sequence[int], spatial_axes: Sequence[int],
                 window_shape: Sequence[int], strides: Sequence[int],
                 padding: Padding, layer_name: str) -> list[WindowDim]:
  """The window of each of `spatial_axes` of inputs of `shape` (pooling).

  Example:
    >>> [d.out_size for d in axis_windows((1, 8, 8, 3), (1, 2), (2, 2),
    ...                                   (2, 2), Padding.VALID, 'AvgPool')]
    [4, 4]
  """
  if len(spatial_axes) != len(window_shape):
    raise ValueError(
        f'`window_shape`={tuple(window_shape)} of `{layer_name}` has '
        f'{len(window_shape)} entries, but its inputs of shape {tuple(shape)} '
        f'have {len(spatial_axes)} spatial dimensions. Pass one window size '
        'per spatial dimension.')
  dims = []
  for axis, size, stride in zip(spatial_axes, window_shape, strides):
    if padding == Padding.VALID and size > shape[axis]:
      raise ValueError(
          f'`window_shape`={tuple(window_shape)} of `{layer_name}` is larger '
          f'than its input along axis {axis} ({size} > {shape[axis]}, inputs '
          f'of shape {tuple(shape)}), so padding="VALID" leaves no output '
          'positions. Use a smaller window, or padding="SAME" or "CIRCULAR".')
    dims.append(conv_window(shape[axis], size, stride, padding))
  return dims


# -----------------------------------------------------------------------------
# Sums over sliding windows, shared by convolutions and pooling.


def prepare_axis(x: Array, axis: int, dim: WindowDim) -> Array:
  """Dilates and pads `x` along `axis` as `dim` describes."""
  if dim.dilation > 1:
    config = [(0, 0, 0)] * x.ndim
    trailing = dim.dilated_size - ((dim.in_size - 1) * dim.dilation + 1)
    config[axis] = (0, trailing, dim.dilation - 1)
    x = lax.pad(x, jnp.zeros((), x.dtype), config)
  if dim.pads != (0, 0):
    widths = [(0, 0)] * x.ndim
    widths[axis] = dim.pads
    x = jnp.pad(x, widths, mode='wrap' if dim.wrap else 'constant')
  return x


def window_tap(x: Array, axis: int, start: int, dim: WindowDim) -> Array:
  """Tap `start` of every window along `axis` of a prepared `x`:
  `x[start::stride]`, `dim.out_size` entries."""
  stop = start + (dim.out_size - 1) * dim.stride + 1
  return lax.slice_in_dim(x, start, stop, dim.stride, axis)


def reduce_window_sum(x: Array, axes: Sequence[int],
                       dims: Sequence[WindowDim]) -> Array:
  """`out[h] = sum_i x[h s + i]` over `axes` (multi-indices `h`, `i`).

  One `lax.reduce_window` sums the whole window in a single pass over `x`,
  with zero padding and dilation applied on the fly rather than materialized
  (only wrapped padding is), in the same row-major order of taps as a sum of
  strided slices, so the result is bitwise that sum.
  """
  window, strides = [1] * x.ndim, [1] * x.ndim
  pads, dilation = [(0, 0)] * x.ndim, [1] * x.ndim
  for axis, dim in zip(axes, dims):
    axis %= x.ndim
    if dim.wrap or min(dim.pads) < 0:
      x = prepare_axis(x, axis, dim)
    else:
      pads[axis], dilation[axis] = dim.pads, dim.dilation
    window[axis], strides[axis] = dim.size, dim.stride
  return lax.reduce_window(x, np.zeros((), x.dtype), lax.add, window, strides,
                           pads, base_dilation=dilation)


def window_sum(x: Array, axis: int, dim: WindowDim) -> Array:
  """`out[h] = sum_i x[h s + i]` along `axis` (after dilation and padding)."""
  x = prepare_axis(x, axis, dim)
  return sum(window_tap(x, axis, i, dim) for i in range(dim.size))


def separable_window_sum(x: Array, axes: Sequence[int],
                         dims: Sequence[WindowDim]) -> Array:
  """`out[h] = sum_i x[h s + i]` along each of `axes` in turn.

  Every tap of one axis is paired with every tap of the others (unlike
  `diagonal_window_sum`): a pooling window, or the count of unmasked
  entries of a window.

  Example:
    >>> separable_window_sum(jnp.ones((1, 4, 4)), [1, 2],
    ...                      [WindowDim(4, 2, 2)] * 2)[0]
    Array([[4., 4.],
           [4., 4.]], dtype=float32)
  """
  for axis, dim in zip(axes, dims):
    x = window_sum(x, axis, dim)
  return x


def diagonal_window_sum(
    x: Array, axes: Sequence[Sequence[int]],
    dims: Sequence[Union[WindowDim, Sequence[WindowDim]]]) -> Array:
  """The two-point window sum over several spatial dimensions at once.

  `out[h, h'] = sum_i x[h s + i, h' s + i]`, with `h`, `h'`, `i` multi-indices
  over the spatial dimensions: only equal taps `i` of the two windows are
  paired, as for a filter shared by the two positions.

  Args:
    x: array to sum over.
    axes: for each spatial dimension, the axes of `x` it occupies: a pair
      `(S_j, S_j')`, or one axis for a spatially diagonal `x` (then
      `out[h] = sum_i x[h s + i]`).
    dims: the window of each spatial dimension: one `WindowDim` for all its
      axes, or one per axis (the windows of two inputs of different sizes,
      e.g. the covariance of `x1` with `x2`), all with the same `size`.

  Returns:
    The window sums, of size `out_size` on each axis of `axes`.
  """
  axis_dims = [[d] * len(a) if isinstance(d, WindowDim) else list(d)
               for a, d in zip(axes, dims)]
  if all(len(dim_axes) == 1 for dim_axes in axes):
    # A spatially diagonal `x`: an ordinary window sum.
    return reduce_window_sum(x, [a for a, in axes], [d for d, in axis_dims])
  for dim_axes, ds in zip(axes, axis_dims):
    for axis, dim in zip(dim_axes, ds):
      x = prepare_axis(x, axis, dim)
  # One sum over all taps of strided slices of the padded array: XLA fuses it
  # into a single pass, without a temporary per spatial dimension.
  out = None
  for taps in itertools.product(*(range(ds[0].size) for ds in axis_dims)):
    tap = x
    for dim_axes, ds, i in zip(axes, axis_dims, taps):
      for axis, dim in zip(dim_axes, ds):
        tap = window_tap(tap, axis, i, dim)
    out = tap if out is None else out + tap
  return out




def window_centres(dim: WindowDim) -> np.ndarray:
  """The input index at the centre tap of each window (-1: none there).

  The centre tap of a window of `size` taps is `(size - 1) // 2`; it falls
  on padding (-1), on a zero inserted by `dilation` (-1), or on an input
  position (wrapped around with `wrap`).

  Example:
    >>> window_centres(WindowDim(6, 3, 2, (0, 1)))
    array([1, 3, 5])
  """
  q = (np.arange(dim.out_size) * dim.stride + (dim.size - 1) // 2 -
       dim.pads[0])
  if dim.wrap:
    q = q % dim.dilated_size
  inside = (q >= 0) & (q < dim.dilated_size) & (q % dim.dilation == 0)
  return np.where(inside, q // dim.dilation, -1)


def window_output_mask(mask: Array, input_shape: Sequence[int],
                       spec: str, windows: dict[str, WindowDim],
                       out_spec: str) -> Array:
  """The mask of a sliding-window layer's outputs (the published rule).

  An output position is masked iff the input position at the centre of its
  window is (`window_centres`; a position is masked iff all its channels
  are; padding and the zeros a transposed convolution inserts count as
  masked, wrapped positions keep their mask). For `SAME` padding and stride
  1 the mask passes through unchanged; with strides it is strided through
  the window centres.

  Args:
    mask: boolean input mask (`True` = masked), broadcastable to
      `input_shape`.
    input_shape: shape of the inputs, laid out as `spec`.
    spec: axis letters of the inputs (`N`, `C` and spatial letters).
    windows: the window of each spatial letter.
    out_spec: axis letters of the outputs.

  Returns:
    Boolean output mask laid out as `out_spec`, of size 1 on the channel axis
    (and on the batch axis if `mask` is).
  """
  c_axis = spec.index('C')
  masked = jnp.all(mask, axis=c_axis, keepdims=True)
  shape = [1 if a == 'C' else masked.shape[i] if a == 'N' else input_shape[i]
           for i, a in enumerate(spec)]
  masked = jnp.broadcast_to(masked, shape)
  for letter, dim in windows.items():
    axis = spec.index(letter)
    centres = window_centres(dim)
    masked = jnp.take(masked, np.maximum(centres, 0), axis=axis)
    outside = (centres < 0).reshape(
        [-1 if i == axis else 1 for i in range(masked.ndim)])
    masked = masked | outside
  return jnp.transpose(masked, [spec.index(a) for a in out_spec])
