"""Convolutions: `Conv`, `ConvTranspose`, `ConvLocal`, and the `Padding` enum.

A convolution with a filter of `f = prod(filter_shape)` taps over `C` input
channels, in the NTK parameterization,

  y[h, o] = W_std / sqrt(f C) sum_{i, c} W[i, c, o] x[h s + i, c] + b_std b[o]

with `W, b ~ N(0, 1)`, maps the channel-averaged covariance of its inputs to

  nngp'[h, h'] = W_std^2 / f * sum_i nngp[h s + i, h' s + i] + b_std^2
  ntk'[h, h']  = nngp'[h, h'] + W_std^2 / f * sum_i ntk[h s + i, h' s + i]

(Novak et al. 2019; Garriga-Alonso et al. 2019): a *two-point* convolution of
the covariance with a diagonal filter, taken over each interleaved pair of
spatial axes `(S_j, S_j')` of the `Kernel` layout, with the stride and the
padding applied to both positions of a pair. Zero-padded activations have zero
covariance with everything, so `SAME` padding zero-pads the covariance; wrapped
activations (`CIRCULAR`) have the covariance of the positions they copy, so
`CIRCULAR` wraps the covariance around.

The diagonal `nngp'[h, h]` depends only on diagonal entries `nngp[p, p]`, so a
network that never needs off-diagonal entries (e.g. a CNN read out through
`Flatten`) only ever stores `(N1, N2, S_1, ..., S_d)` covariances.

Masking (see `masking`): masked input positions are zeros, in the activations
and in the covariances; an output position is masked iff no unmasked input
position lies in its window, and covariances at masked output positions are
zeroed (they would otherwise hold the bias).

The helpers `WindowDim`, `window_sum`, `diagonal_window_sum`, `padding_of` and
`window_output_mask` describe sliding windows and are shared with the pooling
layers.
"""
import dataclasses
import enum
import itertools
import math
from typing import Callable, Optional, Sequence, Union

import jax
from jax import lax
from jax import random
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.stax.requirements import Diagonal
from neural_tangents._src.stax.requirements import ensure_full_spatial
from neural_tangents._src.stax.requirements import layer
from neural_tangents._src.stax.requirements import map_covariances
from neural_tangents._src.stax.requirements import requires
from neural_tangents._src.stax.requirements import supports_masking
from neural_tangents._src.utils import arguments
from neural_tangents._src.utils import kernel as kernel_lib
from neural_tangents._src.utils import row_blocks
from neural_tangents._src.utils.kernel import Kernel
from neural_tangents._src.utils.typing import Layer

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
  if isinstance(padding, Padding):
    return padding
  if isinstance(padding, str):
    try:
      return Padding(padding.upper())
    except ValueError:
      pass
  raise ValueError(
      f'`padding` must be one of "VALID", "SAME", "CIRCULAR" (or a '
      f'`stax.Padding`); got {padding!r}. Pass e.g. padding="SAME".')


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


def _strided(x: Array, axis: int, start: int, dim: WindowDim) -> Array:
  """`x[start::stride]` along `axis`, `dim.out_size` entries."""
  stop = start + (dim.out_size - 1) * dim.stride + 1
  return lax.slice_in_dim(x, start, stop, dim.stride, axis)


def _reduce_window_sum(x: Array, axes: Sequence[int],
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
  return sum(_strided(x, axis, i, dim) for i in range(dim.size))


def diagonal_window_sum(x: Array, axes: Sequence[Sequence[int]],
                        dims: Sequence[WindowDim]) -> Array:
  """The two-point window sum over several spatial dimensions at once.

  `out[h, h'] = sum_i x[h s + i, h' s + i]`, with `h`, `h'`, `i` multi-indices
  over the spatial dimensions: only equal taps `i` of the two windows are
  paired, as for a filter shared by the two positions.

  Args:
    x: array to sum over.
    axes: for each spatial dimension, the axes of `x` it occupies: a pair
      `(S_j, S_j')`, or one axis for a spatially diagonal `x` (then
      `out[h] = sum_i x[h s + i]`).
    dims: the window of each spatial dimension, applied to all its axes.

  Returns:
    The window sums, of size `dim.out_size` on each axis of `axes`.
  """
  if all(len(dim_axes) == 1 for dim_axes in axes):
    # A spatially diagonal `x`: an ordinary window sum.
    return _reduce_window_sum(x, [a for a, in axes], dims)
  for dim_axes, dim in zip(axes, dims):
    for axis in dim_axes:
      x = prepare_axis(x, axis, dim)
  # One sum over all taps of strided slices of the padded array: XLA fuses it
  # into a single pass, without a temporary per spatial dimension.
  out = None
  for taps in itertools.product(*(range(dim.size) for dim in dims)):
    tap = x
    for dim_axes, dim, i in zip(axes, dims, taps):
      for axis in dim_axes:
        tap = _strided(tap, axis, i, dim)
    out = tap if out is None else out + tap
  return out


def conv_covariance(x: Array, n_batch: int, dims: Sequence[WindowDim],
                    diagonal_spatial: bool) -> Array:
  """The covariance map of a shared filter, without `W_std` and bias.

  `out[h, h'] = 1/f sum_i x[h s + i, h' s + i]` on each pair of spatial axes
  (`f` the number of taps), or on a spatially diagonal `x` of shape
  `(B..., S_1, ..., S_d)` its diagonal `out[h] = 1/f sum_i x[h s + i]`.

  Args:
    x: covariance, `n_batch` batch axes then spatial axes (pairs, or single
      axes if `diagonal_spatial`).
    n_batch: number of leading batch axes.
    dims: one window per spatial dimension, in the order of `x`'s axes.
    diagonal_spatial: whether `x` keeps only spatial diagonals.

  Returns:
    The mapped covariance, same layout.
  """
  axes = [[n_batch + j] if diagonal_spatial else
          [n_batch + 2 * j, n_batch + 2 * j + 1] for j in range(len(dims))]
  n_taps = math.prod(d.size for d in dims)
  window_mean = lambda x: (diagonal_window_sum(x, axes, dims) / n_taps,)
  if diagonal_spatial or n_batch == 0:
    return window_mean(x)[0]
  # Rows of the first batch axis are independent: a large full covariance
  # (whose padded copies and taps XLA would materialize at full size) is
  # summed in place, a block of rows at a time, when the sums keep its shape.
  return row_blocks.map_rows_in_place(window_mean, [x])[0]


def permute_spatial(x: Array, n_batch: int, perm: Sequence[int],
                    diagonal_spatial: bool) -> Array:
  """Reorders spatial dimensions: new dimension `j` is old `perm[j]`."""
  if list(perm) == sorted(perm):
    return x
  order = list(range(n_batch))
  for p in perm:
    order += ([n_batch + p] if diagonal_spatial else
              [n_batch + 2 * p, n_batch + 2 * p + 1])
  return jnp.transpose(x, order)


# -----------------------------------------------------------------------------
# Argument checks and layouts.


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


def _check_input_rank(shape: Sequence[int], layout: ConvLayout,
                      layer_name: str) -> None:
  if len(shape) != len(layout.lhs):
    raise ValueError(
        f'`{layer_name}` with dimension numbers {layout.dimension_numbers} '
        f'expects inputs of rank {len(layout.lhs)} ({layout.lhs}); got shape '
        f'{tuple(shape)}. Pass inputs with one axis per letter of '
        f'{layout.lhs!r}, or a `filter_shape` with one entry per spatial '
        'dimension of the inputs.')


def _check_kernel_layout(k: Kernel, layout: ConvLayout,
                         layer_name: str) -> None:
  _check_input_rank(k.shape1, layout, layer_name)
  ndim = len(k.shape1)
  if (k.batch_axis % ndim != layout.lhs.index('N') or
      k.channel_axis % ndim != layout.lhs.index('C')):
    raise ValueError(
        f'`{layer_name}` expects inputs laid out as {layout.lhs!r} (batch axis '
        f'{layout.lhs.index("N")}, channel axis {layout.lhs.index("C")}); its '
        f'input kernel has batch axis {k.batch_axis} and channel axis '
        f'{k.channel_axis}. Pass `dimension_numbers` whose input spec matches '
        "the previous layer's output layout.")


def _windows(input_shape: Sequence[int], layout: ConvLayout,
             filter_shape: Sequence[int], strides: Sequence[int],
             padding: Padding, layer_name: str,
             transpose: bool = False) -> dict[str, WindowDim]:
  """The window of every spatial letter, for inputs of `input_shape`."""
  _check_input_rank(input_shape, layout, layer_name)
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


def _output_shape(input_shape: Sequence[int], layout: ConvLayout,
                  windows: dict[str, WindowDim],
                  out_chan: int) -> tuple[int, ...]:
  batch = input_shape[layout.lhs.index('N')]
  return tuple(batch if c == 'N' else out_chan if c == 'C' else
               windows[c].out_size for c in layout.out)


def _affine_conv_kernel(k: Kernel, spatial_map: Callable[[Array, int], Array],
                        W_std: float, b_std: Optional[float],
                        parameterization: str, s: tuple[int, int],
                        n_taps: int) -> Kernel:
  """Covariances and NTK of `W_std * M(x) + b_std` for a linear spatial `M`.

  NTK parameterization: `ntk' = nngp' + W_std^2 M(ntk)`. Standard: the
  gradient w.r.t. the stored `W ~ N(0, W_std^2 / fan_in)` of
  `conv(x, W) / sqrt(s[0])` gives `fan_in * M(nngp)` with the nominal
  `fan_in = C * n_taps / s[0]`, the bias `1`, and the earlier layers
  `W_std^2 M(ntk)` (Sohl-Dickstein et al. 2020).
  """
  def affine(x, n_batch):
    if x is None:
      return None
    out = W_std**2 * spatial_map(x, n_batch)
    return out if b_std is None else out + b_std**2

  mapped_nngp = spatial_map(k.nngp, 2)
  nngp = W_std**2 * mapped_nngp
  if b_std is not None:
    nngp = nngp + b_std**2
  ntk = None
  if k.ntk is not None:
    # The NTK of raw inputs is zero (`inputs_to_kernel`): mapping it would
    # only have XLA constant-fold a large window sum while compiling.
    ntk = 0. if k.is_input else W_std**2 * spatial_map(k.ntk, 2)
    if parameterization == 'ntk':
      ntk = ntk + nngp
    else:
      fan_in = k.channels * n_taps / s[0]
      ntk = ntk + fan_in * mapped_nngp + (0. if b_std is None else 1.)
  n_cov_batch = 1 if k.diagonal_batch else 2
  return k.replace(nngp=nngp, ntk=ntk, cov1=affine(k.cov1, n_cov_batch),
                   cov2=affine(k.cov2, n_cov_batch))


def _parameterization(parameterization: str, layer_name: str) -> str:
  value = str(getattr(parameterization, 'value', parameterization)).lower()
  if value not in ('ntk', 'standard'):
    raise ValueError(
        f'`parameterization` of `{layer_name}` must be "ntk" or "standard"; '
        f'got {parameterization!r}.')
  return value


def _check_s(s, layer_name: str) -> tuple[int, int]:
  if (not isinstance(s, (tuple, list)) or len(s) != 2 or
      any(isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in s)):
    raise ValueError(f'`s` of `{layer_name}` must be a pair of positive ints; '
                     f'got {s!r}. Pass e.g. s=(1, 1).')
  return tuple(s)


def _check_out_chan(out_chan, layer_name: str) -> int:
  if isinstance(out_chan, bool) or not isinstance(out_chan, int):
    raise TypeError(f'`out_chan` of `{layer_name}` must be a positive int; got '
                    f'{out_chan!r}. Pass e.g. `{layer_name}(64, (3, 3))`.')
  if out_chan <= 0:
    raise ValueError(f'`out_chan` of `{layer_name}` must be a positive int; '
                     f'got {out_chan}. Pass the number of output channels.')
  return out_chan


@dataclasses.dataclass(frozen=True)
class _ConvSpec:
  """Validated arguments shared by the three convolutions."""
  name: str
  out_chan: int
  filter_shape: tuple[int, ...]
  strides: tuple[int, ...]
  padding: Padding
  W_std: float
  b_std: Optional[float]
  layout: ConvLayout
  parameterization: str
  s: tuple[int, int]

  @property
  def n_taps(self) -> int:
    return math.prod(self.filter_shape)

  @property
  def width(self) -> int:
    """The actual number of output channels: `s[1] * out_chan` in the
    standard parameterization, `out_chan` in the NTK one."""
    if self.parameterization == 'standard':
      return self.s[1] * self.out_chan
    return self.out_chan

  def filter_param_shape(self, in_chan: int) -> tuple[int, ...]:
    sizes = dict(zip(self.layout.filter_spatial, self.filter_shape))
    return tuple(self.width if c == 'O' else in_chan if c == 'I' else
                 sizes[c] for c in self.layout.rhs)

  def in_chan(self, input_shape: Sequence[int]) -> int:
    return input_shape[self.layout.lhs.index('C')]

  def scale(self, in_chan: int) -> float:
    """Multiplier of the stored `W` in `apply_fn`."""
    if self.parameterization == 'ntk':
      return self.W_std / math.sqrt(in_chan * self.n_taps)
    return 1. / math.sqrt(self.s[0])

  def init_scale(self, in_chan: int) -> float:
    """Standard deviation of the stored `W`: 1 (NTK), or `W_std / sqrt(
    in_chan * n_taps / s[0])` (standard; the nominal fan-in)."""
    if self.parameterization == 'ntk':
      return 1.
    return self.W_std / math.sqrt(in_chan * self.n_taps / self.s[0])


def _is_empty_sequence(value) -> bool:
  return isinstance(value, (tuple, list)) and not value


def _conv_spec(name, out_chan, filter_shape, strides, padding, W_std, b_std,
               dimension_numbers, parameterization, s) -> _ConvSpec:
  out_chan = _check_out_chan(out_chan, name)
  if _is_empty_sequence(filter_shape):
    # No spatial dimensions: a `Dense` layer on `(N, C)` inputs.
    filter_shape = ()
    if strides is not None and not _is_empty_sequence(strides):
      raise ValueError(
          f'`strides` of `{name}` must be None or () with filter_shape=(); '
          f'got {strides!r}.')
    strides = ()
  else:
    filter_shape = arguments.positive_ints(filter_shape, 'filter_shape', name)
    strides = ((1,) * len(filter_shape) if strides is None else
               arguments.positive_ints(strides, 'strides', name, len(filter_shape),
                                   'spatial dimension of the filter/window'))
  return _ConvSpec(
      name=name,
      out_chan=out_chan,
      filter_shape=filter_shape,
      strides=strides,
      padding=padding_of(padding),
      W_std=W_std,
      b_std=b_std,
      layout=conv_layout(dimension_numbers, len(filter_shape), name),
      parameterization=_parameterization(parameterization, name),
      s=_check_s(s, name))


def _init_bias(rng: Array, spec: _ConvSpec,
               output_shape: Sequence[int], untied: bool) -> Optional[Array]:
  """Bias `(1, ..., out_chan, ..., 1)`, or with output positions if untied."""
  if spec.b_std is None:
    return None
  shape = tuple(1 if c == 'N' else size if (c == 'C' or untied) else 1
                for c, size in zip(spec.layout.out, output_shape))
  b = random.normal(rng, shape)
  return b if spec.parameterization == 'ntk' else spec.b_std * b


def _add_bias(out: Array, b: Optional[Array], spec: _ConvSpec) -> Array:
  if b is None:
    return out
  return out + (spec.b_std * b if spec.parameterization == 'ntk' else b)


def _kernel_windows(k: Kernel, spec: _ConvSpec, transpose: bool = False
                    ) -> tuple[list[WindowDim], dict[str, WindowDim]]:
  """Windows in the kernel's spatial order (that of the input spec)."""
  _check_kernel_layout(k, spec.layout, spec.name)
  windows = _windows(k.shape1, spec.layout, spec.filter_shape, spec.strides,
                     spec.padding, spec.name, transpose)
  return [windows[c] for c in spec.layout.lhs_spatial], windows


def _to_output_layout(k: Kernel, spec: _ConvSpec,
                      windows: dict[str, WindowDim]) -> Kernel:
  """Moves spatial dims to the output spec's order; updates shapes and axes."""
  layout = spec.layout
  perm = [layout.lhs_spatial.index(c) for c in layout.out_spatial]
  k = map_covariances(
      k, lambda x, n: permute_spatial(x, n, perm, k.diagonal_spatial))
  width = spec.width
  return k.replace(
      is_gaussian=True,
      is_input=False,
      shape1=_output_shape(k.shape1, layout, windows, width),
      shape2=_output_shape(k.shape2, layout, windows, width),
      batch_axis=layout.axis(layout.out, 'N'),
      channel_axis=layout.axis(layout.out, 'C'))


_CONV_ARGS_DOC = """
  Args:
    out_chan: number of output channels, positive.
    filter_shape: spatial shape of the filter, one entry per spatial
      dimension, e.g. `(3, 3)` for images, `(5,)` for sequences, in the order
      of the spatial letters of the filter spec of `dimension_numbers`.
    strides: stride per spatial dimension (same order); `None` for all 1s.
    padding: 'VALID', 'SAME' or 'CIRCULAR' (any case), or a `Padding`.
    W_std: weight standard deviation.
    b_std: bias standard deviation; `None` for no bias.
    dimension_numbers: `(lhs, rhs, out)` layout strings of the inputs, the
      filter and the outputs, as in `jax.lax.conv_general_dilated`; `None`
      for channels last, `('NHWC', 'HWIO', 'NHWC')` for images (`'NHC'`,
      `'HIO'` for sequences, `'NDHWC'`, `'DHWIO'` for volumes).
    parameterization: 'ntk' or 'standard' (see `Dense`).
    s: width multipliers `(s0, s1)` for the standard parameterization (see
      `Dense`): `W` has `s1 * out_chan` output channels and the nominal
      fan-in is `in_chan * prod(filter_shape) / s0`; ignored for 'ntk'.
"""


def window_output_mask(mask: Array, input_shape: Sequence[int],
                       spec: str, windows: dict[str, WindowDim],
                       out_spec: str) -> Array:
  """The mask of a sliding-window layer's outputs.

  An output position is masked iff no unmasked input position lies in its
  window (a position is masked iff all its channels are; padding and the
  zeros a transposed convolution inserts count as masked, wrapped positions
  keep their mask).

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
  unmasked = jnp.broadcast_to(~masked, shape).astype(jnp.int32)
  for letter, dim in windows.items():
    unmasked = window_sum(unmasked, spec.index(letter), dim)
  return jnp.transpose(unmasked == 0, [spec.index(a) for a in out_spec])


# -----------------------------------------------------------------------------
# The layers.


@layer
@supports_masking(remask_kernel=True)
def Conv(out_chan: int,
         filter_shape: Sequence[int],
         strides: Optional[Sequence[int]] = None,
         padding: Union[str, Padding] = Padding.VALID.value,
         W_std: float = 1.,
         b_std: Optional[float] = None,
         dimension_numbers: Optional[tuple[str, str, str]] = None,
         parameterization: str = 'ntk',
         s: tuple[int, int] = (1, 1)) -> Layer:
  """Convolution over any number of spatial dimensions.

  NTK parameterization: `y = W_std / sqrt(fan_in) * conv(x, W) + b_std * b`,
  `fan_in = prod(filter_shape) * in_chan`, with `W ~ N(0, 1)` laid out as the
  filter spec (`(*filter_shape, in_chan, out_chan)` by default) and
  `b ~ N(0, 1)` of shape `(1, ..., 1, out_chan)` (`out_chan` on the output's
  channel axis; `None` when `b_std` is None). Standard parameterization:
  `y = conv(x, W) / sqrt(s[0]) + b` with the stored
  `W ~ N(0, W_std^2 / (fan_in / s[0]))` of `s[1] * out_chan` output channels,
  `b ~ N(0, b_std^2)`. `CIRCULAR` pads the inputs by wrapping around, then
  convolves with `VALID` padding. Params are `(W, b)`.

  Kernel (Novak et al. 2019; Garriga-Alonso et al. 2019), on each pair of
  spatial axes, with `f = prod(filter_shape)`:

    nngp'[h, h'] = W_std^2 / f * sum_i nngp[h s + i, h' s + i] + b_std^2
    ntk'[h, h']  = nngp'[h, h'] + W_std^2 / f * sum_i ntk[h s + i, h' s + i]

  the covariance padded like the activations (zeros for `SAME`, wrapped for
  `CIRCULAR`). With `diagonal_spatial`, only `nngp'[h, h]` is computed, from
  diagonal entries only. Standard parameterization: as `Dense`, with the
  nominal `fan_in = in_chan * f / s[0]`:
  `ntk' = fan_in / f * sum_i nngp[h s + i, h' s + i] + W_std^2 / f * sum_i
  ntk[h s + i, h' s + i] + [b_std is not None]`.
  """ + _CONV_ARGS_DOC + """
  Returns:
    `(init_fn, apply_fn, kernel_fn)`.

  Example:
    >>> init_fn, apply_fn, kernel_fn = stax.Conv(32, (3, 3), padding='SAME')
    >>> out_shape, (W, b) = init_fn(random.PRNGKey(0), (-1, 8, 8, 3))
    >>> out_shape, W.shape, b
    ((-1, 8, 8, 32), (3, 3, 3, 32), None)
    >>> kernel_fn(jnp.ones((2, 8, 8, 3)), None, 'nngp').shape
    (2, 2, 8, 8, 8, 8)
  """
  spec = _conv_spec('Conv', out_chan, filter_shape, strides, padding, W_std,
                    b_std, dimension_numbers, parameterization, s)
  layout = spec.layout

  def init_fn(rng, input_shape):
    windows = _windows(input_shape, layout, spec.filter_shape, spec.strides,
                       spec.padding, spec.name)
    output_shape = _output_shape(input_shape, layout, windows, spec.width)
    in_chan = spec.in_chan(input_shape)
    k1, k2 = random.split(rng)
    W = spec.init_scale(in_chan) * random.normal(
        k1, spec.filter_param_shape(in_chan))
    return output_shape, (W, _init_bias(k2, spec, output_shape, False))

  def apply_fn(params, inputs, **kwargs):
    inputs, W = _promote(inputs, params[0])
    b = params[1]
    windows = _windows(inputs.shape, layout, spec.filter_shape, spec.strides,
                       spec.padding, spec.name)
    inputs = _wrap_inputs(inputs, layout, windows)
    pads = [(0, 0) if w.wrap else w.pads
            for w in (windows[c] for c in layout.filter_spatial)]
    out = lax.conv_general_dilated(inputs, W, spec.strides, pads,
                                   dimension_numbers=layout.dimension_numbers)
    return _add_bias(spec.scale(spec.in_chan(inputs.shape)) * out, b, spec)

  @requires(batch_axis=layout.axis(layout.lhs, 'N'),
            channel_axis=layout.axis(layout.lhs, 'C'),
            diagonal_batch=Diagonal(), diagonal_spatial=Diagonal())
  def kernel_fn(k: Kernel, **kwargs) -> Kernel:
    dims, windows = _kernel_windows(k, spec)
    spatial_map = lambda x, n: conv_covariance(x, n, dims, k.diagonal_spatial)
    k = _affine_conv_kernel(k, spatial_map, spec.W_std, spec.b_std,
                            spec.parameterization, spec.s, spec.n_taps)
    return _to_output_layout(k, spec, windows)

  def mask_fn(mask, input_shape):
    windows = _windows(input_shape, layout, spec.filter_shape, spec.strides,
                       spec.padding, spec.name)
    return window_output_mask(mask, input_shape, layout.lhs, windows,
                              layout.out)

  return init_fn, apply_fn, kernel_fn, mask_fn


def _promote(inputs: Array, W: Array) -> tuple[Array, Array]:
  """Casts to a common dtype: `jax.lax` convolutions need equal dtypes, and
  `Dense`'s matmul promotes."""
  dtype = jnp.result_type(inputs, W)
  return inputs.astype(dtype), W.astype(dtype)


def _wrap_inputs(inputs: Array, layout: ConvLayout,
                 windows: dict[str, WindowDim]) -> Array:
  """Applies circular padding (and dilation) to the input's spatial axes."""
  for c, w in windows.items():
    if w.wrap:
      inputs = prepare_axis(inputs, layout.lhs.index(c), w)
  return inputs


@layer
@supports_masking(remask_kernel=True)
def ConvTranspose(out_chan: int,
                  filter_shape: Sequence[int],
                  strides: Optional[Sequence[int]] = None,
                  padding: Union[str, Padding] = Padding.VALID.value,
                  W_std: float = 1.,
                  b_std: Optional[float] = None,
                  dimension_numbers: Optional[tuple[str, str, str]] = None,
                  parameterization: str = 'ntk',
                  s: tuple[int, int] = (1, 1)) -> Layer:
  """Transposed convolution, as `jax.lax.conv_transpose`.

  `y = W_std / sqrt(fan_in) * conv_transpose(x, W, strides, padding) +
  b_std * b` with `fan_in = prod(filter_shape) * in_chan` and params `(W, b)`
  laid out as for `Conv`. `jax.lax.conv_transpose` (default
  `transpose_kernel=False`) is a stride-1 convolution of the input dilated by
  `strides` (`strides - 1` zeros between entries) and zero-padded; it has
  `in_size * stride` outputs per dimension for `SAME`, and
  `in_size * stride + max(filter - stride, 0)` for `VALID`. `CIRCULAR` is
  `SAME` on the periodic extension of the dilated input (period
  `in_size * stride`), so that shifting the input by one position shifts the
  output by `stride` positions.

  Kernel: the two-point convolution of `Conv`, with stride 1, of the
  covariance dilated and padded as the activations are (zeros at inserted
  positions):

    nngp'[o, o'] = W_std^2 / f * sum_i dilate(nngp)[o + i, o' + i] + b_std^2
    ntk'[o, o']  = nngp'[o, o'] + W_std^2 / f * sum_i dilate(ntk)[o + i, o' + i]
  """ + _CONV_ARGS_DOC + """
  Returns:
    `(init_fn, apply_fn, kernel_fn)`.

  Example:
    >>> init_fn, _, _ = stax.ConvTranspose(8, (3, 3), (2, 2), padding='SAME')
    >>> init_fn(random.PRNGKey(0), (-1, 4, 4, 3))[0]
    (-1, 8, 8, 8)
  """
  spec = _conv_spec('ConvTranspose', out_chan, filter_shape, strides, padding,
                    W_std, b_std, dimension_numbers, parameterization, s)
  layout = spec.layout

  def windows_of(shape):
    return _windows(shape, layout, spec.filter_shape, spec.strides,
                    spec.padding, spec.name, transpose=True)

  def init_fn(rng, input_shape):
    output_shape = _output_shape(input_shape, layout, windows_of(input_shape),
                                 spec.width)
    in_chan = spec.in_chan(input_shape)
    k1, k2 = random.split(rng)
    W = spec.init_scale(in_chan) * random.normal(
        k1, spec.filter_param_shape(in_chan))
    return output_shape, (W, _init_bias(k2, spec, output_shape, False))

  def apply_fn(params, inputs, **kwargs):
    inputs, W = _promote(inputs, params[0])
    b = params[1]
    windows = windows_of(inputs.shape)
    if spec.padding == Padding.CIRCULAR:
      out = lax.conv_general_dilated(_wrap_inputs(inputs, layout, windows), W,
                                     (1,) * len(spec.filter_shape), 'VALID',
                                     dimension_numbers=layout.dimension_numbers)
    else:
      out = lax.conv_transpose(inputs, W, spec.strides, spec.padding.value,
                               dimension_numbers=layout.dimension_numbers)
    return _add_bias(spec.scale(spec.in_chan(inputs.shape)) * out, b, spec)

  @requires(batch_axis=layout.axis(layout.lhs, 'N'),
            channel_axis=layout.axis(layout.lhs, 'C'),
            diagonal_batch=Diagonal(), diagonal_spatial=Diagonal())
  def kernel_fn(k: Kernel, **kwargs) -> Kernel:
    dims, windows = _kernel_windows(k, spec, transpose=True)
    spatial_map = lambda x, n: conv_covariance(x, n, dims, k.diagonal_spatial)
    k = _affine_conv_kernel(k, spatial_map, spec.W_std, spec.b_std,
                            spec.parameterization, spec.s, spec.n_taps)
    return _to_output_layout(k, spec, windows)

  def mask_fn(mask, input_shape):
    return window_output_mask(mask, input_shape, layout.lhs,
                              windows_of(input_shape), layout.out)

  return init_fn, apply_fn, kernel_fn, mask_fn


@layer
@supports_masking(remask_kernel=True)
def ConvLocal(out_chan: int,
              filter_shape: Sequence[int],
              strides: Optional[Sequence[int]] = None,
              padding: Union[str, Padding] = Padding.VALID.value,
              W_std: float = 1.,
              b_std: Optional[float] = None,
              dimension_numbers: Optional[tuple[str, str, str]] = None,
              parameterization: str = 'ntk',
              s: tuple[int, int] = (1, 1)) -> Layer:
  """Locally connected layer: a convolution with a different filter per output.

  `y[h] = W_std / sqrt(fan_in) * sum_{i, c} W[h, i, c] x[h s + i, c] +
  b_std * b[h]` with `fan_in = prod(filter_shape) * in_chan`. Params
  `(W, b)`: `W ~ N(0, 1)` of shape `(*out_spatial, *filter)`, the output's
  spatial shape (in the order of the filter spec's spatial letters) followed
  by a filter laid out as `Conv`'s (`(H_out, W_out, fh, fw, in_chan,
  out_chan)` by default); the bias is untied too: `b` has the output's shape
  with batch size 1 (`(1, H_out, W_out, out_chan)` by default), `None` when
  `b_std` is None.

  Kernel: weights (and biases) at different output positions are
  independent, so covariances vanish off the spatial diagonal, and on it

    nngp'[h, h] = W_std^2 / f * sum_i nngp[h s + i, h s + i] + b_std^2
    ntk'[h, h]  = nngp'[h, h] + W_std^2 / f * sum_i ntk[h s + i, h s + i]

  only needs the input's spatial diagonal. When a later layer needs the full
  covariance the output is full, with zeros off the diagonal.
  """ + _CONV_ARGS_DOC + """
  Returns:
    `(init_fn, apply_fn, kernel_fn)`.

  Example:
    >>> init_fn, _, _ = stax.ConvLocal(8, (3, 3), b_std=0.1)
    >>> _, (W, b) = init_fn(random.PRNGKey(0), (-1, 5, 5, 2))
    >>> W.shape, b.shape
    ((3, 3, 3, 3, 2, 8), (1, 3, 3, 8))
  """
  spec = _conv_spec('ConvLocal', out_chan, filter_shape, strides, padding,
                    W_std, b_std, dimension_numbers, parameterization, s)
  layout = spec.layout
  n_spatial = len(spec.filter_shape)

  def windows_of(shape):
    return _windows(shape, layout, spec.filter_shape, spec.strides,
                    spec.padding, spec.name)

  def init_fn(rng, input_shape):
    windows = windows_of(input_shape)
    output_shape = _output_shape(input_shape, layout, windows, spec.width)
    in_chan = spec.in_chan(input_shape)
    out_spatial = tuple(windows[c].out_size for c in layout.filter_spatial)
    k1, k2 = random.split(rng)
    W = spec.init_scale(in_chan) * random.normal(
        k1, out_spatial + spec.filter_param_shape(in_chan))
    return output_shape, (W, _init_bias(k2, spec, output_shape, True))

  def apply_fn(params, inputs, **kwargs):
    W, b = params
    windows = windows_of(inputs.shape)
    patches = _patches(inputs, layout, windows)  # (N, *out, taps, C)
    # Filter to (*out, taps, I, O), taps in the order of `_patches`.
    filter_axes = [layout.rhs.index(c) for c in layout.filter_spatial]
    W = jnp.moveaxis(W, [n_spatial + a for a in filter_axes] +
                     [n_spatial + layout.rhs.index('I'),
                      n_spatial + layout.rhs.index('O')],
                     list(range(n_spatial, 2 * n_spatial + 2)))
    W = W.reshape(W.shape[:n_spatial] + (-1,) + W.shape[-2:])
    out = jnp.einsum('n...pc,...pco->n...o', patches, W)
    # (N, *out in filter order, O) -> the output spec's layout.
    canonical = 'N' + layout.filter_spatial + 'C'
    out = jnp.transpose(out, [canonical.index(c) for c in layout.out])
    return _add_bias(spec.scale(spec.in_chan(inputs.shape)) * out, b, spec)

  @requires(batch_axis=layout.axis(layout.lhs, 'N'),
            channel_axis=layout.axis(layout.lhs, 'C'),
            diagonal_batch=Diagonal(), diagonal_spatial=Diagonal())
  def kernel_fn(k: Kernel, **kwargs) -> Kernel:
    # Untied weights make every off-diagonal entry zero; compute on the
    # diagonal whatever the input's representation, and embed back if the
    # rest of the network asked for full covariances. (Declaring
    # `output=Bool.YES` instead would let a nonlinearity or a bias between
    # this layer and a pooling layer fill those zeros wrongly.)
    dims, windows = _kernel_windows(k, spec)
    full = not k.diagonal_spatial
    if full:
      k = map_covariances(k, kernel_lib.spatial_diagonal).replace(
          diagonal_spatial=True)
    spatial_map = lambda x, n: conv_covariance(x, n, dims, True)
    k = _affine_conv_kernel(k, spatial_map, spec.W_std, spec.b_std,
                            spec.parameterization, spec.s, spec.n_taps)
    k = _to_output_layout(k, spec, windows)
    return ensure_full_spatial(k) if full else k

  def mask_fn(mask, input_shape):
    return window_output_mask(mask, input_shape, layout.lhs,
                              windows_of(input_shape), layout.out)

  return init_fn, apply_fn, kernel_fn, mask_fn


def _patches(inputs: Array, layout: ConvLayout,
             windows: dict[str, WindowDim]) -> Array:
  """Input patches `(N, *out_spatial, taps, C)`, spatial in filter order.

  Taps are ordered row-major over the filter's spatial dimensions, in the
  order of the filter spec's spatial letters.
  """
  x = jnp.transpose(inputs, [layout.lhs.index(c) for c in
                             'N' + layout.filter_spatial + 'C'])
  dims = [windows[c] for c in layout.filter_spatial]
  for j, dim in enumerate(dims):
    x = prepare_axis(x, 1 + j, dim)
  taps = []
  for offsets in itertools.product(*(range(d.size) for d in dims)):
    tap = x
    for j, (i, dim) in enumerate(zip(offsets, dims)):
      tap = _strided(tap, 1 + j, i, dim)
    taps.append(tap)
  return jnp.stack(taps, axis=-2)
