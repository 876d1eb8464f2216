"""The geometry of sliding windows: where the windows of a convolution or a
pooling layer lie on its inputs.

Along one spatial dimension, the input of length `in_size` is dilated
(`dilation - 1` zeros between entries, as a transposed convolution does),
padded (`Padding`: none, zeros, or wrapped around), and windows of `size` taps
start every `stride` positions (`WindowDim`). A convolution names its axes
with `dimension_numbers` strings (`ConvLayout`); a pooling layer with its
batch and channel axes. This module computes the windows of every spatial
dimension and the output shapes they give; the sums over windows (of
activations and of covariances) are in `convolution`.
"""
import dataclasses
import enum
import math
from typing import Sequence, Union

from neural_tangents._src.utils import arguments


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
    raise ValueError(f'At most {len(pool)} spatial dimensions are supported; '
                     f'got {n}.')
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
