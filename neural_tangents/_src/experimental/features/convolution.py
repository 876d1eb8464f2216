"""Exact features of a convolution: `ConvFeatures`.

`stax.Conv` (NTK parameterization, filter of `f = prod(filter_shape)` taps)
maps kernels as

  nngp'[h, h'] = W_std^2 / f sum_i nngp[h s + i, h' s + i] + b_std^2
  ntk'[h, h']  = nngp'[h, h'] + W_std^2 / f sum_i ntk[h s + i, h' s + i]

(Novak et al. 2019; Arora et al. 2019): the inner products of the *patches*
of the features, i.e. the `f C` channels `x[h s + i, c]` of the window of
each output position, scaled by `W_std / sqrt(f)`, padded as the activations
are (zeros for 'SAME', wrapped around for 'CIRCULAR'). A convolution
multiplies the channels by `f` (the patches, formed by strided slices);
the sketches of the nonlinearities bring them
back down.
"""
import functools
import itertools
import math
from typing import Optional, Sequence, Union

import jax
from jax import lax
import jax.numpy as jnp

from neural_tangents._src.experimental.features.feature_type import concatenate_channels
from neural_tangents._src.experimental.features.feature_type import deterministic_layer
from neural_tangents._src.experimental.features.feature_type import FeatureLayer
from neural_tangents._src.experimental.features.feature_type import Features
from neural_tangents._src.experimental.features.feature_type import replace_channels
from neural_tangents._src.experimental.features.linear import check_finite_stds
from neural_tangents._src.experimental.features.linear import check_ntk_parameterization
from neural_tangents._src.stax.windows import conv_layout
from neural_tangents._src.stax.windows import ConvLayout
from neural_tangents._src.stax.windows import Padding
from neural_tangents._src.stax.windows import padding_of
from neural_tangents._src.stax.windows import same_pads
from neural_tangents._src.utils import arguments

Array = jax.Array


def ConvFeatures(out_chan: int,
                 filter_shape: Sequence[int],
                 strides: Optional[Sequence[int]] = None,
                 padding: Union[str, Padding] = 'SAME',
                 W_std: float = 1.,
                 b_std: Optional[float] = None,
                 dimension_numbers: Optional[tuple[str, str, str]] = None,
                 parameterization: str = 'ntk') -> FeatureLayer:
  """Exact features of `stax.Conv` (the CNTK features of a convolution).

  With `P(x)[h]` the patch of `x` at output position `h` (its `f C`
  channels, see the module docstring):

    nngp_feat' = [W_std / sqrt(f) P(nngp_feat), b_std 1]
    ntk_feat'  = [W_std / sqrt(f) P(ntk_feat), nngp_feat']

  Args:
    out_chan: the width of the finite layer; accepted for symmetry with
      `stax.Conv`, unused.
    filter_shape: the filter's spatial shape, in the order of the spatial
      letters of the filter spec.
    strides: the strides (default 1).
    padding: 'SAME' (the default here), 'VALID' or 'CIRCULAR'.
    W_std: weight standard deviation.
    b_std: bias standard deviation; None for no bias.
    dimension_numbers: `(lhs, rhs, out)` specs as for `stax.Conv`, e.g.
      `('NCHW', 'OIHW', 'NCHW')`; None for channels last.
    parameterization: 'ntk' (the standard one raises `NotImplementedError`).

  Returns:
    `(init_fn, feature_fn)`.

  Example:
    >>> from neural_tangents.experimental import features as ft
    >>> _, feature_fn = ft.ConvFeatures(1, (3, 3))
    >>> f = feature_fn(jnp.ones((2, 5, 5, 3)), ())
    >>> f.nngp_feat.shape  # 3 x 3 x 3 channels per position.
    (2, 5, 5, 27)
  """
  arguments.positive_int(out_chan, 'out_chan', 'Pass e.g. `ConvFeatures(1, '
                         '(3, 3))` (the width does not change the kernel).',
                         layer_name='ConvFeatures')
  filter_shape = arguments.positive_ints(filter_shape, 'filter_shape',
                                         'ConvFeatures', example='(3, 3)')
  n = len(filter_shape)
  strides = ((1,) * n if strides is None else
             arguments.positive_ints(strides, 'strides', 'ConvFeatures', n,
                                     'entry of `filter_shape`', '(1, 1)'))
  padding = padding_of(padding)
  arguments.real_number(W_std, 'W_std', 'Pass e.g. `W_std=1.5`.',
                        layer_name='ConvFeatures')
  arguments.real_number(b_std, 'b_std', 'Pass e.g. `b_std=0.05`, or None for '
                        'no bias.', layer_name='ConvFeatures', allow_none=True)
  check_ntk_parameterization(parameterization, 'ConvFeatures')
  check_finite_stds('ConvFeatures', W_std, b_std)
  layout = conv_layout(dimension_numbers, n, 'ConvFeatures')
  batch_axis = layout.axis(layout.lhs, 'N')
  channel_axis = layout.axis(layout.lhs, 'C')
  out_batch_axis = layout.axis(layout.out, 'N')
  out_channel_axis = layout.axis(layout.out, 'C')
  scale = W_std / math.sqrt(math.prod(filter_shape))

  def patches(x: Array) -> Array:
    if x.ndim != n + 2:
      raise ValueError(
          f'`ConvFeatures` with a filter of shape {filter_shape} expects '
          f'features of rank {n + 2} ({layout.lhs}); got shape {x.shape}. Pass '
          'a `filter_shape` with one entry per spatial axis.')
    for letter, size in zip(layout.filter_spatial, filter_shape):
      in_size = x.shape[layout.lhs.index(letter)]
      if padding == Padding.VALID and size > in_size:
        raise ValueError(
            f'`filter_shape`={filter_shape} of `ConvFeatures` is larger than '
            f'its input along spatial dimension {letter!r} ({size} > '
            f'{in_size}, features of shape {x.shape}), so padding="VALID" '
            'leaves no output positions. Use a smaller filter, or '
            'padding="SAME" or "CIRCULAR".')
    out = window_patches(x, layout, filter_shape, strides, padding)
    return jnp.transpose(out, [layout.lhs.index(a) for a in layout.out])

  def transform(f: Features, check_size: bool = True) -> Features:
    if check_size:
      check_patch_size(f, layout, filter_shape, strides, padding,
                       b_std is not None)
    nngp = scale * patches(f.nngp_feat)
    if b_std is not None:
      bias = jnp.full(replace_channels(nngp.shape, out_channel_axis, 1), b_std,
                      nngp.dtype)
      nngp = concatenate_channels([nngp, bias], out_channel_axis)
    ntk = concatenate_channels(
        [scale * patches(f.ntk_feat).astype(nngp.dtype), nngp],
        out_channel_axis)
    return Features(nngp, ntk, out_batch_axis, out_channel_axis)

  # `init_fn` only evaluates shapes: the shapes of a whole data set, whose
  # features are then computed in batches, are not refused.
  init_fn, _ = deterministic_layer(
      'ConvFeatures', batch_axis, channel_axis,
      functools.partial(transform, check_size=False))
  _, feature_fn = deterministic_layer('ConvFeatures', batch_axis,
                                      channel_axis, transform)
  return init_fn, feature_fn


# The most elements `ConvFeatures` forms in one output (NNGP and NTK
# features together): 2^28, 2 GiB in float64.
MAX_FEATURE_ELEMENTS = 1 << 28


def _output_size(in_size: int, size: int, stride: int,
                 padding: Padding) -> int:
  if padding == Padding.VALID:
    return max(in_size - size, -1) // stride + 1
  return -(-in_size // stride)


def window_patches(x: Array, layout: ConvLayout, filter_shape: Sequence[int],
                   strides: Sequence[int], padding: Padding) -> Array:
  """The patches of `x` (laid out as `layout.lhs`), in the same layout.

  Channel `(i, c)` of output position `h` is `x[h s + i, c]` (offsets `i`
  of the filter in row-major order), padded with zeros ('SAME') or wrapped
  ('CIRCULAR'). Formed by strided slices, so memory is that of the output:
  `jax.lax.conv_general_dilated_patches` convolves with a dense identity
  filter of `(f C)^2` entries (`f` taps, `C` channels), 12 GB in float64
  for the NTK features of a fourth 3x3 convolution.
  """
  axes = [layout.lhs.index(letter) for letter in layout.filter_spatial]
  outs = []
  for axis, size, stride in zip(axes, filter_shape, strides):
    in_size = x.shape[axis]
    outs.append(_output_size(in_size, size, stride, padding))
    if padding != Padding.VALID:
      widths = [(0, 0)] * x.ndim
      widths[axis] = same_pads(in_size, size, stride)
      x = jnp.pad(x, widths,
                  mode='wrap' if padding == Padding.CIRCULAR else 'constant')
  pieces = []
  for offsets in itertools.product(*(range(size) for size in filter_shape)):
    piece = x
    for axis, offset, stride, out in zip(axes, offsets, strides, outs):
      piece = lax.slice_in_dim(piece, offset, offset + stride * (out - 1) + 1,
                               stride, axis)
    pieces.append(piece)
  return jnp.concatenate(pieces, axis=layout.lhs.index('C'))


def check_patch_size(f: Features, layout: ConvLayout,
                     filter_shape: Sequence[int], strides: Sequence[int],
                     padding: Padding, bias: bool) -> None:
  """Raises a `ValueError` if the features of `f`'s convolution would have
  more than `MAX_FEATURE_ELEMENTS` elements, saying how many (checked on
  the shapes when `feature_fn` is traced, before anything is allocated)."""
  shape = f.nngp_feat.shape
  if len(shape) != len(layout.lhs):
    return  # `patches` names the rank.
  rows = shape[layout.lhs.index('N')]
  for letter, size, stride in zip(layout.filter_spatial, filter_shape,
                                  strides):
    rows *= max(_output_size(shape[layout.lhs.index(letter)], size, stride,
                             padding), 0)
  c = layout.lhs.index('C')
  taps = math.prod(filter_shape)
  nngp = taps * shape[c] + bias
  channels = nngp + taps * f.ntk_feat.shape[c] + nngp
  if rows * channels > MAX_FEATURE_ELEMENTS:
    raise ValueError(
        f'`ConvFeatures(filter_shape={tuple(filter_shape)})` on features of '
        f'{shape[c]} NNGP and {f.ntk_feat.shape[c]} NTK channels (shape '
        f'{shape}) would form {rows} rows of {channels} channels, '
        f'{rows * channels:.3g} elements (more than '
        f'{MAX_FEATURE_ELEMENTS:.3g}): a convolution\'s features are its '
        'patches, so every exact convolution multiplies the channels by its '
        'filter size. Put a nonlinearity with a sketch or random features '
        '(`ReluFeatures`, `ElementwiseFeatures`) between convolutions to '
        'bring the channels back to its feature dimension, or compute the '
        'features of fewer examples at a time.')
