"""Convolutions: `Conv`, `ConvTranspose` and `ConvLocal`.

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
and in the covariances; an output position is masked iff the input position
at the centre of its window is (the published rule, `windows.window_centres`),
and covariances at masked output positions are zeroed (they would otherwise
hold the bias).

The geometry of the windows (`Padding`, `WindowDim`, `ConvLayout`), the sums
over them and the mask of window outputs are in `windows`, shared with the
pooling layers.
"""
import dataclasses
import itertools
import math
from typing import Callable, Optional, Sequence, Union

import jax
from jax import lax
from jax import random
import jax.numpy as jnp

from neural_tangents._src.stax.layout import ensure_full_spatial
from neural_tangents._src.stax.layout import map_covariances
from neural_tangents._src.stax.layout import permute_spatial
from neural_tangents._src.stax.masking import supports_masking
from neural_tangents._src.stax.parameterization import Parameterization
from neural_tangents._src.stax.protocol import Diagonal
from neural_tangents._src.stax.requirements import layer
from neural_tangents._src.stax.requirements import requires
# Window geometry and sums (`Padding` stays importable from here).
from neural_tangents._src.stax.windows import check_input_rank
from neural_tangents._src.stax.windows import conv_layout
from neural_tangents._src.stax.windows import ConvLayout
from neural_tangents._src.stax.windows import diagonal_window_sum
from neural_tangents._src.stax.windows import letter_windows
from neural_tangents._src.stax.windows import Padding
from neural_tangents._src.stax.windows import padding_of
from neural_tangents._src.stax.windows import prepare_axis
from neural_tangents._src.stax.windows import window_output_mask
from neural_tangents._src.stax.windows import window_output_shape
from neural_tangents._src.stax.windows import window_tap
from neural_tangents._src.stax.windows import WindowDim
from neural_tangents._src.utils import arguments
from neural_tangents._src.utils import kernel as kernel_lib
from neural_tangents._src.utils import row_blocks
from neural_tangents._src.utils.kernel import Kernel
from neural_tangents._src.utils.typing import Layer

Array = jax.Array


def conv_covariance(x: Array, n_batch: int, dims: Sequence[WindowDim],
                    diagonal_spatial: bool,
                    dims2: Optional[Sequence[WindowDim]] = None) -> Array:
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
    dims2: the windows of the second position `h'` of each pair, when the
      two sides of a full `x` have different sizes (`x1` and `x2` of
      different spatial shapes); `None` for `dims`.

  Returns:
    The mapped covariance, same layout.
  """
  axes = [[n_batch + j] if diagonal_spatial else
          [n_batch + 2 * j, n_batch + 2 * j + 1] for j in range(len(dims))]
  n_taps = math.prod(d.size for d in dims)
  if dims2 is not None and not diagonal_spatial:
    dims = list(zip(dims, dims2))
  window_mean = lambda x: (diagonal_window_sum(x, axes, dims) / n_taps,)
  if diagonal_spatial or n_batch == 0:
    return window_mean(x)[0]
  # Rows of the first batch axis are independent: a large full covariance
  # (whose padded copies and taps XLA would materialize at full size) is
  # summed in place, a block of rows at a time, when the sums keep its shape.
  return row_blocks.map_rows_in_place(window_mean, [x])[0]


def _check_kernel_layout(k: Kernel, layout: ConvLayout,
                         layer_name: str) -> None:
  check_input_rank(k.shape1, layout, layer_name)
  ndim = len(k.shape1)
  if (k.batch_axis % ndim != layout.lhs.index('N') or
      k.channel_axis % ndim != layout.lhs.index('C')):
    raise ValueError(
        f'`{layer_name}` expects inputs laid out as {layout.lhs!r} (batch axis '
        f'{layout.lhs.index("N")}, channel axis {layout.lhs.index("C")}); its '
        f'input kernel has batch axis {k.batch_axis} and channel axis '
        f'{k.channel_axis}. Pass `dimension_numbers` whose input spec matches '
        "the previous layer's output layout.")


def _affine_conv_kernel(k: Kernel,
                        spatial_map: Callable[[Array, int, int, int], Array],
                        W_std: float, b_std: Optional[float],
                        parameterization: str, s: tuple[int, int],
                        n_taps: int) -> Kernel:
  """Covariances and NTK of `W_std * M(x) + b_std` for a linear spatial `M`.

  NTK parameterization: `ntk' = nngp' + W_std^2 M(ntk)`. Standard: the
  gradient w.r.t. the stored `W ~ N(0, W_std^2 / fan_in)` of
  `conv(x, W) / sqrt(s[0])` gives `fan_in * M(nngp)` with the nominal
  `fan_in = C * n_taps / s[0]`, the bias `1`, and the earlier layers
  `W_std^2 M(ntk)` (Sohl-Dickstein et al. 2020). `spatial_map(x, n_batch,
  left, right)` maps a covariance between positions of inputs `left` and
  `right` (1 for `x1`, 2 for `x2`), whose spatial shapes may differ.
  """
  def bias(field, value):
    # As the covariance stores it (`kernel_lib.stored_constant`).
    return kernel_lib.stored_constant(k, field, value)

  def affine(x, n_batch, side):
    if x is None:
      return None
    out = W_std**2 * spatial_map(x, n_batch, side, side)
    return out if b_std is None else out + bias(f'cov{side}', b_std**2)

  mapped_nngp = spatial_map(k.nngp, 2, 1, 2)
  nngp = W_std**2 * mapped_nngp
  if b_std is not None:
    nngp = nngp + bias('nngp', b_std**2)
  ntk = None
  if k.ntk is not None:
    # The NTK of raw inputs is zero (`inputs_to_kernel`): mapping it would
    # only have XLA constant-fold a large window sum while compiling.
    ntk = 0. if k.is_input else W_std**2 * spatial_map(k.ntk, 2, 1, 2)
    if parameterization == 'ntk':
      ntk = ntk + nngp
    else:
      fan_in = k.channels * n_taps / s[0]
      ntk = ntk + fan_in * mapped_nngp + (0. if b_std is None else
                                          bias('nngp', 1.))
  n_cov_batch = 1 if k.diagonal_batch else 2
  return k.replace(nngp=nngp, ntk=ntk, cov1=affine(k.cov1, n_cov_batch, 1),
                   cov2=affine(k.cov2, n_cov_batch, 2))


def _check_s(s, layer_name: str) -> tuple[int, int]:
  return arguments.positive_int_tuple(
      s, 's', 'Pass e.g. s=(1, 1).', layer_name=layer_name, length=2,
      length_of='width multiplier (input, output)')


def _check_out_chan(out_chan, layer_name: str) -> int:
  return arguments.positive_int(
      out_chan, 'out_chan', 'Pass the number of output channels, e.g. '
      f'`{layer_name}(64, (3, 3))`.', layer_name=layer_name)


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
  transpose: bool = False

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

  def windows(self, input_shape: Sequence[int]) -> dict[str, WindowDim]:
    """The window of every spatial letter, for inputs of `input_shape`."""
    return letter_windows(input_shape, self.layout, self.filter_shape,
                          self.strides, self.padding, self.name,
                          self.transpose)

  def output_shape(self, input_shape: Sequence[int]) -> tuple[int, ...]:
    return window_output_shape(input_shape, self.layout,
                               self.windows(input_shape), self.width)


def _is_empty_sequence(value) -> bool:
  return isinstance(value, (tuple, list)) and not value


def _conv_spec(name, out_chan, filter_shape, strides, padding, W_std, b_std,
               dimension_numbers, parameterization, s,
               transpose: bool) -> _ConvSpec:
  out_chan = _check_out_chan(out_chan, name)
  if _is_empty_sequence(filter_shape):
    # No spatial dimensions: a `Dense` layer on `(N, C)` inputs.
    filter_shape = ()
    if strides is not None and not _is_empty_sequence(strides):
      raise ValueError(
          f'`strides` of `{name}` must be None or () with filter_shape=(), '
          f'which has no spatial dimension to stride over; got {strides!r}. '
          'Pass strides=None, or a `filter_shape` with one entry per spatial '
          'dimension.')
    strides = ()
  else:
    filter_shape = arguments.positive_ints(filter_shape, 'filter_shape', name)
    strides = ((1,) * len(filter_shape) if strides is None else
               arguments.positive_ints(strides, 'strides', name,
                                       len(filter_shape),
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
      parameterization=arguments.parse_enum(
          parameterization, Parameterization, 'parameterization').value,
      s=_check_s(s, name),
      transpose=transpose)


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


def _kernel_windows(k: Kernel, spec: _ConvSpec
                    ) -> tuple[dict[int, list[WindowDim]],
                               dict[int, dict[str, WindowDim]]]:
  """The windows of each side (1 for `x1`, 2 for `x2`), as a list in the
  kernel's spatial order (that of the input spec) and by letter."""
  _check_kernel_layout(k, spec.layout, spec.name)
  windows = {1: spec.windows(k.shape1), 2: spec.windows(k.shape2)}
  dims = {side: [w[c] for c in spec.layout.lhs_spatial]
          for side, w in windows.items()}
  return dims, windows


def _check_equal_spatial_shapes(k: Kernel, layer_name: str,
                                why: str) -> None:
  """Raises a `ValueError` if `x1` and `x2` reach `layer_name` with
  different spatial shapes, which its kernel cannot compare."""
  if k.spatial_shape1 != k.spatial_shape2:
    raise ValueError(
        f'`{layer_name}` needs `x1` and `x2` of the same spatial shape '
        f'({why}); they reach it with shapes {k.shape1} and {k.shape2}. Pass '
        '`x2` of the same spatial shape as `x1` (crop or resize it).')


def _to_output_layout(k: Kernel, spec: _ConvSpec,
                      windows: dict[int, dict[str, WindowDim]]) -> Kernel:
  """Moves spatial dims to the output spec's order; updates shapes and axes."""
  layout = spec.layout
  perm = [layout.lhs_spatial.index(c) for c in layout.out_spatial]
  k = map_covariances(
      k, lambda x, n: permute_spatial(x, n, perm, k.diagonal_spatial))
  width = spec.width
  return k.replace(
      is_gaussian=True,
      is_input=False,
      shape1=window_output_shape(k.shape1, layout, windows[1], width),
      shape2=window_output_shape(k.shape2, layout, windows[2], width),
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


# -----------------------------------------------------------------------------
# The layers: one constructor, three ways to build the functions.


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


def _conv_requirements(spec: _ConvSpec) -> Callable[[Callable], Callable]:
  """`@requires` of every convolution's kernel op: local in batch and space."""
  layout = spec.layout
  return requires(batch_axis=layout.axis(layout.lhs, 'N'),
                  channel_axis=layout.axis(layout.lhs, 'C'),
                  diagonal_batch=Diagonal(), diagonal_spatial=Diagonal(),
                  accepts_scaled=True)


def _init_fn(spec: _ConvSpec, untied: bool) -> Callable:
  """`init_fn` of a convolution; `untied`: one filter and bias per output
  position (`ConvLocal`)."""

  def init_fn(rng, input_shape):
    windows = spec.windows(input_shape)
    output_shape = window_output_shape(input_shape, spec.layout, windows,
                                       spec.width)
    in_chan = spec.in_chan(input_shape)
    shape = spec.filter_param_shape(in_chan)
    if untied:
      shape = tuple(windows[c].out_size
                    for c in spec.layout.filter_spatial) + shape
    k1, k2 = random.split(rng)
    W = spec.init_scale(in_chan) * random.normal(k1, shape)
    return output_shape, (W, _init_bias(k2, spec, output_shape, untied))

  return init_fn


def _mask_fn(spec: _ConvSpec) -> Callable:
  """`mask_fn` of a convolution: masked iff its window centre is (module)."""

  def mask_fn(mask, input_shape):
    return window_output_mask(mask, input_shape, spec.layout.lhs,
                              spec.windows(input_shape), spec.layout.out)

  return mask_fn


def _shared_filter_layer(spec: _ConvSpec):
  """The functions of `Conv` and `ConvTranspose`: one filter for all
  positions."""
  layout = spec.layout

  def apply_fn(params, inputs, **kwargs):
    inputs, W = _promote(inputs, params[0])
    windows = spec.windows(inputs.shape)
    if spec.transpose and spec.padding != Padding.CIRCULAR:
      out = lax.conv_transpose(inputs, W, spec.strides, spec.padding.value,
                               dimension_numbers=layout.dimension_numbers)
    else:
      # A transposed `CIRCULAR` convolution is a stride-1 one of the wrapped
      # dilated input; other circular paddings are applied to the inputs too.
      strides = (1,) * len(spec.filter_shape) if spec.transpose else (
          spec.strides)
      pads = [(0, 0) if w.wrap else w.pads
              for w in (windows[c] for c in layout.filter_spatial)]
      out = lax.conv_general_dilated(_wrap_inputs(inputs, layout, windows), W,
                                     strides, pads,
                                     dimension_numbers=layout.dimension_numbers)
    return _add_bias(spec.scale(spec.in_chan(inputs.shape)) * out, params[1],
                     spec)

  @_conv_requirements(spec)
  def kernel_fn(k: Kernel, **kwargs) -> Kernel:
    dims, windows = _kernel_windows(k, spec)
    spatial_map = lambda x, n, left, right: conv_covariance(
        x, n, dims[left], k.diagonal_spatial, dims[right])
    k = _affine_conv_kernel(k, spatial_map, spec.W_std, spec.b_std,
                            spec.parameterization, spec.s, spec.n_taps)
    return _to_output_layout(k, spec, windows)

  return _init_fn(spec, False), apply_fn, kernel_fn, _mask_fn(spec)


def _local_layer(spec: _ConvSpec):
  """The functions of `ConvLocal`: one filter per output position."""
  layout = spec.layout
  n_spatial = len(spec.filter_shape)

  def apply_fn(params, inputs, **kwargs):
    W, b = params
    windows = spec.windows(inputs.shape)
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

  @_conv_requirements(spec)
  def kernel_fn(k: Kernel, **kwargs) -> Kernel:
    # Untied weights make every off-diagonal entry zero; compute on the
    # diagonal whatever the input's representation, and embed back if the
    # rest of the network asked for full covariances. (Declaring
    # `output=Bool.YES` instead would let a nonlinearity or a bias between
    # this layer and a pooling layer fill those zeros wrongly.)
    _check_equal_spatial_shapes(k, spec.name, 'its filters differ from one '
                                'output position to the next')
    dims, windows = _kernel_windows(k, spec)
    full = not k.diagonal_spatial
    if full:
      k = map_covariances(k, kernel_lib.spatial_diagonal).replace(
          diagonal_spatial=True)
    spatial_map = lambda x, n, left, right: conv_covariance(x, n, dims[1],
                                                            True)
    k = _affine_conv_kernel(k, spatial_map, spec.W_std, spec.b_std,
                            spec.parameterization, spec.s, spec.n_taps)
    k = _to_output_layout(k, spec, windows)
    return ensure_full_spatial(k) if full else k

  return _init_fn(spec, True), apply_fn, kernel_fn, _mask_fn(spec)


def _conv_constructor(name: str, doc: str,
                      build: Callable[[_ConvSpec], tuple[Callable, ...]]
                      ) -> Callable[..., Layer]:
  """The public constructor `name` of a convolution: validates its arguments
  into a `_ConvSpec` and builds the layer's functions with `build`."""

  def constructor(out_chan: int,
                  filter_shape: Sequence[int],
                  strides: Optional[Sequence[int]] = None,
                  padding: Union[str, Padding] = Padding.VALID.value,
                  W_std: float = 1.,
                  b_std: Optional[float] = None,
                  dimension_numbers: Optional[tuple[str, str, str]] = None,
                  parameterization: str = 'ntk',
                  s: tuple[int, int] = (1, 1)) -> Layer:
    return build(_conv_spec(name, out_chan, filter_shape, strides, padding,
                            W_std, b_std, dimension_numbers, parameterization,
                            s, transpose=name == 'ConvTranspose'))

  constructor.__name__ = constructor.__qualname__ = name
  constructor.__doc__ = doc
  return layer(supports_masking(remask_kernel=True)(constructor))


_CONV_DOC = """Convolution over any number of spatial dimensions.

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


_CONVTRANSPOSE_DOC = """Transposed convolution, as `jax.lax.conv_transpose`.

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


_CONVLOCAL_DOC = """Locally connected layer: a convolution with a different filter per output.

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


Conv = _conv_constructor('Conv', _CONV_DOC, _shared_filter_layer)
ConvTranspose = _conv_constructor('ConvTranspose', _CONVTRANSPOSE_DOC,
                                  _shared_filter_layer)
ConvLocal = _conv_constructor('ConvLocal', _CONVLOCAL_DOC, _local_layer)


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
      tap = window_tap(tap, 1 + j, i, dim)
    taps.append(tap)
  return jnp.stack(taps, axis=-2)
