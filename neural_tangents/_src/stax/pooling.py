"""Pooling: `AvgPool`, `SumPool`, `GlobalAvgPool`, `GlobalSumPool`.

Pooling is linear and has no params: `y[h] = c[h] sum_{i in window} x[h s + i]`
with `c[h] = 1` (sum), `1 / window size` (average), or `1 / (number of
non-padded entries of window h)` (average with `normalize_edges`). Its
kernel is the two-point pooling of the covariance,

  nngp'[h, h'] = c[h] c[h'] sum_{i, j in window} nngp[h s + i, h' s + j]

(the same for `ntk`, `cov1`, `cov2`), over *all* pairs of window positions
`(i, j)`, not just equal ones: unlike a convolution, no random filter
decorrelates different taps. So pooling needs the full spatial covariance.
Global pooling sums over all position pairs `(h, h')` and leaves no spatial
dimensions. Pooling keeps the kernel Gaussian if it was.

Masking (see `masking`): masked positions (all channels masked) are zeros;
averages divide by the number of unmasked entries of each window (padding
counting as masked only with `normalize_edges`), so that `c[h]` above depends
on the example; an output position is masked iff its whole window is. Global
pooling averages over the unmasked positions and returns unmasked outputs.
"""
import math
from typing import Any, Callable, Optional, Sequence, Union

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.stax import masking
from neural_tangents._src.stax.layout import check_layout
from neural_tangents._src.stax.layout import ensure_full_spatial
from neural_tangents._src.stax.layout import from_standard
from neural_tangents._src.stax.layout import reduce_spatial
from neural_tangents._src.stax.layout import spatial_axes
from neural_tangents._src.stax.masking import supports_masking
from neural_tangents._src.stax.protocol import Bool
from neural_tangents._src.stax.protocol import Diagonal
from neural_tangents._src.stax.requirements import layer
from neural_tangents._src.stax.requirements import requires
from neural_tangents._src.stax.windows import axis_windows
from neural_tangents._src.stax.windows import Padding
from neural_tangents._src.stax.windows import padding_of
from neural_tangents._src.stax.windows import prepare_axis
from neural_tangents._src.stax.windows import separable_window_sum
from neural_tangents._src.stax.windows import window_output_mask
from neural_tangents._src.stax.windows import WindowDim
from neural_tangents._src.utils import arguments
from neural_tangents._src.utils import kernel as kernel_lib
from neural_tangents._src.utils.kernel import Kernel
from neural_tangents._src.utils.typing import Layer

Array = jax.Array


def _unmasked_positions(mask: Optional[Array], shape: Sequence[int],
                        batch_axis: int, channel_axis: int) -> Array:
  """`(N or 1, S_1, ..., S_d)` int array, 1 where a position is unmasked.

  A position is masked iff all its channels are (as in the kernel, which
  holds one covariance per position).
  """
  if mask is None:
    spatial = kernel_lib.spatial_shape(tuple(shape), batch_axis % len(shape),
                                       channel_axis % len(shape))
    return jnp.ones((1,) + spatial, jnp.int32)
  positions = masking.position_mask(mask, shape, batch_axis, channel_axis)
  return (~positions).astype(jnp.int32)


def _window_sums(x: Array, dims: Sequence[WindowDim]) -> Array:
  """Multi-dimensional window sums of `(B, S_1, ..., S_d)` over `S_j`."""
  return separable_window_sum(x, range(1, 1 + len(dims)), dims)


def _average_weights(unmasked: Array, dims: Sequence[WindowDim],
                     normalize_edges: bool, dtype: Any) -> Array:
  """`c[n, h] = 1 / count[n, h]` (0 where the count is 0): `(B, *out)`.

  `count` is the number of entries of window `h` an average divides by: the
  window size less its masked entries, and, with `normalize_edges`, less its
  zero-padded entries. Without masks and `normalize_edges` it is the window
  size.
  """
  if normalize_edges:
    count = _window_sums(unmasked, dims)
  else:
    size = math.prod(d.size for d in dims)
    count = size - _window_sums(1 - unmasked, dims)
  positive = count > 0
  count = jnp.where(positive, count, 1).astype(dtype)
  return jnp.where(positive, 1 / count, jnp.zeros((), dtype))


def _pool_kernel_op(batch_axis: int, channel_axis: int, layer_name: str,
                    pool_kernel: Callable[[Kernel], Kernel]) -> Callable:
  """The kernel op of a pooling layer: `pool_kernel` of the input kernel
  with full spatial covariances, after checking its layout."""

  @requires(batch_axis=batch_axis, channel_axis=channel_axis,
            diagonal_batch=Diagonal(),
            diagonal_spatial=Diagonal(input=Bool.NO))
  def kernel_fn(k: Kernel, **kwargs) -> Kernel:
    check_layout(k, batch_axis, channel_axis, layer_name,
                 "Pass the axes of the previous layer's outputs.")
    return pool_kernel(ensure_full_spatial(k))

  return kernel_fn


def _pool(layer_name: str, window_shape, strides, padding,
          normalize_edges: bool, batch_axis: int, channel_axis: int,
          average: bool) -> Layer:
  """A sliding-window pooling layer (see the module docstring)."""
  window_shape = arguments.positive_ints(window_shape, 'window_shape',
                                     layer_name, example='(2, 2)')
  n = len(window_shape)
  strides = ((1,) * n if strides is None else
             arguments.positive_ints(strides, 'strides', layer_name, n,
                                 'entry of `window_shape`', '(2, 2)'))
  padding = padding_of(padding)

  def windows(shape):
    axes = spatial_axes(len(shape), batch_axis, channel_axis, layer_name)
    return axes, axis_windows(shape, axes, window_shape, strides, padding,
                               layer_name)

  def output_shape(shape):
    axes, dims = windows(shape)
    out = list(shape)
    for axis, dim in zip(axes, dims):
      out[axis] = dim.out_size
    return tuple(out)

  def weights(mask, shape, dtype):
    """Averaging weights `(N or 1, *out)` in the kernel's layout, or None."""
    if not average:
      return None
    _, dims = windows(shape)
    unmasked = _unmasked_positions(mask, shape, batch_axis, channel_axis)
    return _average_weights(unmasked, dims, normalize_edges, dtype)

  def init_fn(rng, input_shape):
    return output_shape(input_shape), ()

  def apply_fn(params, inputs, mask=None, **kwargs):
    c = weights(mask, inputs.shape, inputs.dtype)
    axes, dims = windows(inputs.shape)
    window_dims, window_strides = [1] * inputs.ndim, [1] * inputs.ndim
    pads = [(0, 0)] * inputs.ndim
    for axis, dim in zip(axes, dims):
      window_dims[axis], window_strides[axis] = dim.size, dim.stride
      if dim.wrap:
        inputs = prepare_axis(inputs, axis, dim)
      else:
        pads[axis] = dim.pads
    # A concrete zero makes this a differentiable window sum.
    out = lax.reduce_window(inputs, np.array(0, inputs.dtype), lax.add,
                            window_dims, window_strides, pads)
    if c is not None:
      out = out * from_standard(c[..., None], out.shape, batch_axis,
                                  channel_axis)
    return out

  def pool_kernel(k: Kernel) -> Kernel:
    # The windows of `x1` and of `x2`, whose spatial shapes may differ.
    dims = {1: windows(k.shape1)[1], 2: windows(k.shape2)[1]}

    def pool(x, n_batch, left, right):
      # Every tap of one window with every tap of the other: both axes of
      # each pair `(S_j, S_j')` summed independently.
      if x is None:
        return None
      pairs = [d for pair in zip(dims[left], dims[right]) for d in pair]
      return separable_window_sum(x, range(n_batch, n_batch + len(pairs)),
                                  pairs)

    n_cov_batch = 1 if k.diagonal_batch else 2
    pooled = k.replace(nngp=pool(k.nngp, 2, 1, 2), ntk=pool(k.ntk, 2, 1, 2),
                       cov1=pool(k.cov1, n_cov_batch, 1, 1),
                       cov2=pool(k.cov2, n_cov_batch, 2, 2))
    if average:
      dtype = k.nngp.dtype
      pooled = _weigh_covariances(pooled, weights(k.mask1, k.shape1, dtype),
                                  weights(k.mask2, k.shape2, dtype))
    return pooled.replace(
        is_input=False,
        shape1=output_shape(k.shape1),
        shape2=output_shape(k.shape2))

  kernel_fn = _pool_kernel_op(batch_axis, channel_axis, layer_name,
                              pool_kernel)

  def mask_fn(mask, input_shape):
    # An output is masked iff the centre of its window is (the published
    # rule); its covariances, averages of unmasked entries, are zeroed.
    b = batch_axis % len(input_shape)
    c = channel_axis % len(input_shape)
    spec = ''.join('N' if i == b else 'C' if i == c else chr(ord('a') + i)
                   for i in range(len(input_shape)))
    axes, dims = windows(input_shape)
    return window_output_mask(mask, input_shape, spec,
                              {spec[a]: d for a, d in zip(axes, dims)}, spec)

  return init_fn, apply_fn, kernel_fn, mask_fn


def _weigh_covariances(k: Kernel, c1: Array, c2: Array) -> Kernel:
  """Multiplies each covariance entry by `c1[left] * c2[right]`.

  Args:
    k: kernel with full spatial covariances.
    c1: `(N1 or 1, S_1, ..., S_d)` weights of the positions of `x1`.
    c2: the same for `x2`.
  """
  def weigh(x, w1, w2, batch_pair):
    if x is None:
      return None
    v1, v2 = kernel_lib.outer_variances(w1, w2, batch_pair, False)
    return x * v1 * v2

  pair = not k.diagonal_batch
  return k.replace(nngp=weigh(k.nngp, c1, c2, True),
                   ntk=weigh(k.ntk, c1, c2, True),
                   cov1=weigh(k.cov1, c1, c1, pair),
                   cov2=weigh(k.cov2, c2, c2, pair))


@layer
@supports_masking(remask_kernel=True)
def AvgPool(window_shape: Sequence[int],
            strides: Optional[Sequence[int]] = None,
            padding: Union[str, Padding] = Padding.VALID.value,
            normalize_edges: bool = False,
            batch_axis: int = 0,
            channel_axis: int = -1) -> Layer:
  """Average pooling over the spatial axes (all but batch and channel).

  `y[h] = c[h] sum_{i in window} x[h s + i]`, with `c[h] = 1 / prod(
  window_shape)`, or, with `normalize_edges` and `SAME` padding,
  `1 / (number of non-padded entries of window h)`. Kernel:

    nngp'[h, h'] = c[h] c[h'] sum_{i, j in window} nngp[h s + i, h' s + j]

  over all pairs of taps, on the covariance padded as the activations are;
  the same map applies to `ntk`, `cov1` and `cov2`. Needs full spatial
  covariances. With masked inputs, each window averages its unmasked entries
  only. No params: `()`.

  Args:
    window_shape: window size per spatial dimension, in the order of the
      spatial axes of the inputs.
    strides: stride per spatial dimension; `None` for all 1s.
    padding: 'VALID', 'SAME' or 'CIRCULAR' (any case), or a `Padding`.
    normalize_edges: with `SAME` padding, average over the non-padded entries
      of each window only.
    batch_axis: batch axis of the inputs.
    channel_axis: channel axis of the inputs.

  Returns:
    `(init_fn, apply_fn, kernel_fn)`.

  Example:
    >>> init_fn, apply_fn, kernel_fn = stax.AvgPool((2, 2), (2, 2))
    >>> init_fn(None, (-1, 8, 8, 3))[0]
    (-1, 4, 4, 3)
  """
  return _pool('AvgPool', window_shape, strides, padding, normalize_edges,
               batch_axis, channel_axis, average=True)


@layer
@supports_masking(remask_kernel=True)
def SumPool(window_shape: Sequence[int],
            strides: Optional[Sequence[int]] = None,
            padding: Union[str, Padding] = Padding.VALID.value,
            batch_axis: int = 0,
            channel_axis: int = -1) -> Layer:
  """Sum pooling over the spatial axes (all but batch and channel).

  `y[h] = sum_{i in window} x[h s + i]`; kernel
  `nngp'[h, h'] = sum_{i, j in window} nngp[h s + i, h' s + j]` (and the same
  for `ntk`, `cov1`, `cov2`). Needs full spatial covariances. No params.

  Args:
    window_shape: window size per spatial dimension, in the order of the
      spatial axes of the inputs.
    strides: stride per spatial dimension; `None` for all 1s.
    padding: 'VALID', 'SAME' or 'CIRCULAR' (any case), or a `Padding`.
    batch_axis: batch axis of the inputs.
    channel_axis: channel axis of the inputs.

  Returns:
    `(init_fn, apply_fn, kernel_fn)`.

  Example:
    >>> _, apply_fn, _ = stax.SumPool((2,), padding='SAME')
    >>> apply_fn((), jnp.ones((1, 3, 1)))[0, :, 0]
    Array([2., 2., 1.], dtype=float32)
  """
  return _pool('SumPool', window_shape, strides, padding, False, batch_axis,
               channel_axis, average=False)


def _global_pool(layer_name: str, batch_axis: int, channel_axis: int,
                 average: bool) -> Layer:
  """Pooling over all spatial positions (see the module docstring)."""

  def output_shape(shape):
    axes = spatial_axes(len(shape), batch_axis, channel_axis, layer_name)
    return tuple(s for i, s in enumerate(shape) if i not in axes)

  def output_axes(ndim):
    spatial_axes(ndim, batch_axis, channel_axis, layer_name)
    return (0, 1) if batch_axis % ndim < channel_axis % ndim else (1, 0)

  def init_fn(rng, input_shape):
    return output_shape(input_shape), ()

  def weights(mask, shape, dtype):
    """`1 / (number of unmasked positions)` per example, `(N or 1,)`."""
    unmasked = _unmasked_positions(mask, shape, batch_axis, channel_axis)
    count = jnp.sum(unmasked, tuple(range(1, unmasked.ndim)))
    positive = count > 0
    count = jnp.where(positive, count, 1).astype(dtype)
    return jnp.where(positive, 1 / count, jnp.zeros((), dtype))

  def apply_fn(params, inputs, mask=None, **kwargs):
    axes = tuple(spatial_axes(inputs.ndim, batch_axis, channel_axis,
                               layer_name))
    out = jnp.sum(inputs, axes)
    if not average:
      return out
    c = weights(mask, inputs.shape, out.dtype)
    out_batch, _ = output_axes(inputs.ndim)
    return out * (c[:, None] if out_batch == 0 else c[None, :])

  def pool_kernel(k: Kernel) -> Kernel:

    def pool(x, n_batch):
      return jnp.sum(x, tuple(range(n_batch, x.ndim)))

    out = reduce_spatial(k, pool, output_shape,
                         *output_axes(len(k.shape1)))
    if average:
      dtype = k.nngp.dtype
      out = _weigh_covariances(out, weights(k.mask1, k.shape1, dtype),
                               weights(k.mask2, k.shape2, dtype))
    return out

  kernel_fn = _pool_kernel_op(batch_axis, channel_axis, layer_name,
                              pool_kernel)

  def mask_fn(mask, input_shape):
    # Masked positions are zeros summed over (or left out of the average);
    # as published, the output stays a `MaskedArray`, masked where every
    # position and channel of an example is.
    ndim = len(input_shape)
    axes = spatial_axes(ndim, batch_axis, channel_axis, layer_name)
    masked = jnp.all(mask, axis=tuple(axes) + (channel_axis % ndim,),
                     keepdims=True)
    masked = jnp.squeeze(masked, tuple(axes))
    return masked

  return init_fn, apply_fn, kernel_fn, mask_fn


@layer
@supports_masking(remask_kernel=False)
def GlobalAvgPool(batch_axis: int = 0, channel_axis: int = -1) -> Layer:
  """Average over all spatial positions: `(N, S..., C)` -> `(N, C)`.

  `y = 1/S sum_h x[h]` over the `S` spatial positions; kernel
  `nngp' = 1/S^2 sum_{h, h'} nngp[h, h']` (and the same for `ntk`, `cov1`,
  `cov2`), without spatial dimensions. The output keeps the relative order
  of the batch and channel axes. No params.

  Args:
    batch_axis: batch axis of the inputs.
    channel_axis: channel axis of the inputs.

  Returns:
    `(init_fn, apply_fn, kernel_fn)`.

  Example:
    >>> init_fn, _, _ = stax.GlobalAvgPool()
    >>> init_fn(None, (-1, 8, 8, 3))[0]
    (-1, 3)
  """
  return _global_pool('GlobalAvgPool', batch_axis, channel_axis, True)


@layer
@supports_masking(remask_kernel=False)
def GlobalSumPool(batch_axis: int = 0, channel_axis: int = -1) -> Layer:
  """Sum over all spatial positions: `(N, S..., C)` -> `(N, C)`.

  `y = sum_h x[h]`; kernel `nngp' = sum_{h, h'} nngp[h, h']` (and the same for
  `ntk`, `cov1`, `cov2`). No params. Arguments and returns as
  `GlobalAvgPool`'s.

  Example:
    >>> _, apply_fn, _ = stax.GlobalSumPool()
    >>> apply_fn((), jnp.ones((2, 4, 4, 3))).shape
    (2, 3)
  """
  return _global_pool('GlobalSumPool', batch_axis, channel_axis, False)
