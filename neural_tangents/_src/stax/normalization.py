"""Normalization layers: `LayerNorm`.

Also importable from `neural_tangents._src.stax.linear`, where the published
package defines it.
"""
from typing import Any, Optional, Sequence, Union

import jax
from jax import lax
import jax.numpy as jnp

from neural_tangents._src.stax import kernel_maps
from neural_tangents._src.stax import masking
from neural_tangents._src.stax.layout import check_layout
from neural_tangents._src.stax.masking import supports_masking
from neural_tangents._src.stax.protocol import Diagonal
from neural_tangents._src.stax.requirements import layer
from neural_tangents._src.stax.requirements import requires
from neural_tangents._src.utils import arguments
from neural_tangents._src.utils import kernel as kernel_lib
from neural_tangents._src.utils import scaling
from neural_tangents._src.utils.kernel import Kernel
from neural_tangents._src.utils.typing import Layer

Array = jax.Array


def _check_axes(axis: Union[int, Sequence[int]]) -> tuple[int, ...]:
  """`axis` as a non-empty tuple of ints, or a `TypeError`."""
  axes = (axis,) if isinstance(axis, int) else axis
  try:
    axes = tuple(axes)
  except TypeError:
    axes = None
  if (not axes or any(isinstance(a, bool) or not isinstance(a, int)
                      for a in axes)):
    raise TypeError(f'`axis` must be an int or a non-empty tuple of ints; got '
                    f'{axis!r}. Pass e.g. `axis=-1` (channels) or '
                    '`axis=(1, 2, 3)` (positions and channels of images).')
  return axes


def _normalize_axes(axes: tuple[int, ...], ndim: int) -> tuple[int, ...]:
  """Axes in `[0, ndim)`, or a `ValueError` naming `axis`."""
  out = arguments.canonicalize_axes(axes, ndim, 'axis')
  if len(out) != len(axes):
    raise ValueError(f'`axis`={axes} repeats an axis. Pass each axis once.')
  return out


def layer_norm(x: Array, axes: tuple[int, ...], eps: float,
               mask: Optional[Array] = None) -> Array:
  """`(x - mean) / sqrt(var + eps)`, statistics over `axes` of each example.

  Args:
    x: activations.
    axes: axes to normalize over.
    eps: added to the variance.
    mask: `True` at masked entries (broadcastable to `x`), excluded from the
      statistics and zero in the output; or None.
  """
  if mask is None:
    mean = jnp.mean(x, axes, keepdims=True)
    centered = x - mean
    var = jnp.mean(centered**2, axes, keepdims=True)
    return centered * lax.rsqrt(var + eps)
  keep = jnp.broadcast_to(~mask, x.shape)
  count = jnp.maximum(jnp.sum(keep, axes, keepdims=True), 1)
  mean = jnp.sum(jnp.where(keep, x, 0), axes, keepdims=True) / count
  centered = jnp.where(keep, x - mean, 0)
  var = jnp.sum(centered**2, axes, keepdims=True) / count
  return centered * lax.rsqrt(var + eps)


def _normalized_variances(var: Array, spatial_axes: tuple[int, ...],
                          eps: Any, position_mask: Optional[Array]) -> Array:
  """`var + eps`, averaged over `spatial_axes` (axes of `(N, S_1, ..)`).

  Masked positions (`position_mask`, `(N, S_1, ...)`, or None) are left out
  of the average, as `layer_norm` leaves them out of the statistics.
  """
  if spatial_axes:
    if position_mask is None:
      mean = jnp.mean(var, spatial_axes, keepdims=True)
    else:
      keep = ~position_mask
      count = jnp.maximum(jnp.sum(keep, spatial_axes, keepdims=True), 1)
      mean = jnp.sum(jnp.where(keep, var, 0), spatial_axes,
                     keepdims=True) / count
    var = jnp.broadcast_to(mean, var.shape)
  return var + eps


@layer
@supports_masking(remask_kernel=False)
def LayerNorm(axis: Union[int, Sequence[int]] = -1,
              eps: float = 1e-12,
              batch_axis: int = 0,
              channel_axis: int = -1) -> Layer:
  """Layer normalization (Ba et al. 2016), without learned scale or shift.

  `apply_fn` normalizes each example over `axis` to zero mean and unit
  variance: `(x - mean_axis(x)) / sqrt(var_axis(x) + eps)`.

  Kernel. `axis` must contain the channel axis, and may contain spatial axes
  (not the batch axis). For zero-mean Gaussian pre-activations (the output
  of a `Dense` or convolution), as the number of channels grows the channel
  mean tends to 0 (so the centering vanishes) and the mean square over
  `axis` tends to the mean, over the normalized spatial positions, of the
  variances `q(x, s)`. The layer thus divides every covariance by the
  product of these root mean variances:

    nngp'(x, s; x', s') = nngp(x, s; x', s') /
                          sqrt((mean_S q(x) + eps) (mean_S q(x') + eps))

  where `mean_S` averages over the normalized spatial axes only (for
  `axis=channel_axis`, `mean_S q(x) = q(x, s)`), and the same for `cov1`,
  `cov2` and the NTK (the derivative of the normalizer contributes
  `O(1/width)`).

  Masked entries (see `masking`) are left out of the statistics, and masked
  positions out of the spatial means of variances.

  Args:
    axis: axis or axes of the activations to normalize over.
    eps: added to the variance before the square root.
    batch_axis: batch axis of the activations.
    channel_axis: channel axis of the activations.

  Returns:
    `(init_fn, apply_fn, kernel_fn)`.

  Raises:
    ValueError (from `kernel_fn`): if `axis` misses the channel axis or
      contains the batch axis, or the input kernel is not Gaussian (raw
      inputs, or the output of a nonlinearity, whose channel mean does not
      vanish and is not tracked by the kernel).

  Example:
    >>> init_fn, apply_fn, kernel_fn = stax.serial(
    ...     stax.Dense(512), stax.LayerNorm(axis=(1, 2)), stax.Relu())
    >>> k = kernel_fn(jnp.ones((2, 5, 3)), None, 'nngp')  # (2, 2, 5, 5)
  """
  axes = _check_axes(axis)
  eps_value = arguments.concrete_real(eps)
  if eps_value is None or not eps_value >= 0:
    raise ValueError(f'`eps` must be a non-negative number (a Python, NumPy '
                     f'or JAX scalar); got {eps!r}. Pass e.g. `eps=1e-12`.')
  eps = eps_value

  init_fn = lambda rng, input_shape: (input_shape, ())

  def apply_fn(params, inputs, mask=None, **kwargs):
    return layer_norm(inputs, _normalize_axes(axes, inputs.ndim), eps, mask)

  @requires(batch_axis=batch_axis, channel_axis=channel_axis,
            diagonal_batch=Diagonal(), diagonal_spatial=Diagonal(),
            accepts_scaled=True)
  def kernel_fn(k: Kernel, **kwargs) -> Kernel:
    # Scale-invariant: a scaled kernel (`Kernel.scale_exponents`, inputs
    # whose covariances would overflow) is normalized as stored, with `eps`
    # stored alike, and the result is the kernel itself.
    ndim = len(k.shape1)
    b, c = k.batch_axis % ndim, k.channel_axis % ndim
    check_layout(k, batch_axis, channel_axis, 'LayerNorm')
    norm_axes = _normalize_axes(axes, ndim)
    if b in norm_axes or c not in norm_axes:
      raise ValueError(
          f'`LayerNorm(axis={axis})` must normalize over the channel axis '
          f'({channel_axis}) and not the batch axis ({batch_axis}) for its '
          'kernel to be defined. Pass e.g. `axis=-1`, or the channel axis with '
          'spatial axes.')
    if not k.is_gaussian:
      source = 'the raw inputs' if k.is_input else 'not Gaussian'
      raise ValueError(
          f'`LayerNorm` needs zero-mean Gaussian pre-activations for its '
          f'kernel (the channel mean must vanish), but its input kernel is '
          f'{source}. Put a `Dense` (or convolution) layer before `LayerNorm`.')
    spatial = [i for i in range(ndim) if i not in (b, c)]
    spatial_axes = tuple(1 + spatial.index(a) for a in norm_axes if a != c)

    mask1 = masking.position_mask(k.mask1, k.shape1, b, c)
    mask2 = masking.position_mask(k.mask2, k.shape2, b, c)
    eps1 = eps2 = eps
    if k.scale_exponents is not None:
      n_spatial = len(k.shape1) - 2
      eps1, eps2 = (scaling.times_powers_of_two(
          jnp.asarray(eps, k.cov1.dtype), -a, -a).reshape((-1,) +
                                                         (1,) * n_spatial)
                    for a in k.scale_exponents)
    var1 = kernel_lib.variances(k.cov1, k.diagonal_batch, k.diagonal_spatial)
    var1 = _normalized_variances(var1, spatial_axes, eps1, mask1)
    var2 = (var1 if k.cov2 is None else _normalized_variances(
        kernel_lib.variances(k.cov2, k.diagonal_batch, k.diagonal_spatial),
        spatial_axes, eps2, mask2))

    def normalize(x, v1, v2, batch_pair):
      if x is None:
        return None
      v1, v2 = kernel_lib.outer_variances(v1, v2, batch_pair,
                                          k.diagonal_spatial)
      # `x / sqrt(v1 v2)` with the product of variances formed without
      # over- or underflow, so that the layer stays scale-invariant for
      # any input magnitude (see `kernel_maps.correlation`). A covariance
      # that overflowed has lost the ratio: NaN, not a finite guess (compute
      # in float64 for such inputs).
      rho = kernel_maps.correlation(v1, v2, x, clip=False)[1]
      return jnp.where(jnp.isinf(x), jnp.nan, rho)

    return k.replace(
        nngp=normalize(k.nngp, var1, var2, True),
        ntk=normalize(k.ntk, var1, var2, True),
        cov1=normalize(k.cov1, var1, var1, not k.diagonal_batch),
        cov2=normalize(k.cov2, var2, var2, not k.diagonal_batch),
        is_input=False,
        scale_exponents=None)

  return init_fn, apply_fn, kernel_fn
