"""Exact features of layer normalization: `LayerNormFeatures`."""
from typing import Sequence, Union

import jax.numpy as jnp
import numpy as np

from neural_tangents._src.experimental.features.feature_type import deterministic_layer
from neural_tangents._src.experimental.features.feature_type import FeatureLayer
from neural_tangents._src.experimental.features.feature_type import Features
from neural_tangents._src.utils import arguments


def LayerNormFeatures(axis: Union[int, Sequence[int]] = -1,
                      eps: float = 1e-12,
                      batch_axis: int = 0,
                      channel_axis: int = -1) -> FeatureLayer:
  """Exact features of `stax.LayerNorm`: features divided by their norms.

  `stax.LayerNorm` divides every covariance by the root mean variances of
  both sides, `nngp'(x, s; x', s') = nngp(x, s; x', s') / sqrt((v(x) + eps)
  (v(x') + eps))`, with `v(x)` the mean over the normalized spatial axes of
  the variances `nngp(x, s; x, s) = |feat(x)[s]|^2`, and the same for the NTK.
  So both features are divided by `sqrt(v(x) + eps)` computed from the NNGP
  features: with `axis` the channel axis only, each position's NNGP
  features get unit norm (the per-example kernel diagonal is 1).

  As in `stax`, this is the kernel of a layer norm of Gaussian
  pre-activations (after a dense or convolutional layer).

  Args:
    axis: the axis or axes normalized over; must contain the channel axis
      and not the batch axis.
    eps: added to the variance.
    batch_axis: batch axis of the features.
    channel_axis: channel axis of the features.

  Returns:
    `(init_fn, feature_fn)`.

  Example:
    >>> from neural_tangents.experimental import features as ft
    >>> _, feature_fn = ft.LayerNormFeatures()
    >>> f = feature_fn(3 * jnp.ones((2, 4)), ())
    >>> f.nngp_feat @ f.nngp_feat.T
    Array([[1., 1.],
           [1., 1.]], dtype=float32)
  """
  axes = (axis,) if isinstance(axis, int) else axis
  try:
    axes = tuple(axes)
  except TypeError:
    axes = None
  if not axes or any(isinstance(a, bool) or not isinstance(a, int)
                     for a in axes):
    raise TypeError(f'`axis` of `LayerNormFeatures` must be an int or a '
                    f'non-empty tuple of ints; got {axis!r}. Pass e.g. '
                    '`axis=-1` (channels).')
  if (isinstance(eps, (bool, np.bool_)) or
      not isinstance(eps, (int, float, np.integer, np.floating)) or
      not 0 <= eps < np.inf):  # NaN fails too.
    raise ValueError(f'`eps` of `LayerNormFeatures` must be a non-negative '
                     f'finite float; got {eps!r}. Pass e.g. `eps=1e-12`.')
  eps = float(eps)

  def transform(f: Features) -> Features:
    x = f.nngp_feat
    ndim = x.ndim
    b = arguments.canonicalize_axis(batch_axis, ndim, 'batch_axis')
    c = arguments.canonicalize_axis(channel_axis, ndim, 'channel_axis')
    norm_axes = arguments.canonicalize_axes(axes, ndim, 'axis')
    if b in norm_axes or c not in norm_axes:
      raise ValueError(
          f'`LayerNormFeatures(axis={axis})` must normalize over the channel '
          f'axis ({channel_axis}) and not the batch axis ({batch_axis}). Pass '
          'e.g. `axis=-1`, or the channel axis with spatial axes.')
    variance = jnp.sum(x * x, axis=c, keepdims=True)
    spatial = tuple(a for a in norm_axes if a != c)
    if spatial:
      variance = jnp.mean(variance, axis=spatial, keepdims=True)
    # A zero row with `eps=0` has zero features, as `stax`'s kernel (whose
    # correlations of zero variances are 0), not 0 / 0.
    variance = variance + eps
    positive = variance > 0
    scale = jnp.where(positive, 1 / jnp.sqrt(jnp.where(positive, variance, 1)),
                      0)
    return f.replace(nngp_feat=x * scale,
                     ntk_feat=f.ntk_feat * scale.astype(f.ntk_feat.dtype))

  return deterministic_layer('LayerNormFeatures', batch_axis, channel_axis,
                             transform)
