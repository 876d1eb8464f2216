"""Exact features of pooling layers: `AvgPoolFeatures`, `GlobalAvgPoolFeatures`.

Pooling is linear and acts on each channel alike, so the features of its
outputs are the pooled features: if `y = P x` (per channel) then
`<y[s], y'[s']> = sum_{t, t'} P[s, t] P[s', t'] <x[t], x'[t']>`, the kernel
`stax` computes. The pooling itself is `stax`'s `apply_fn`, so that windows,
padding and edge normalization are the same by construction.
"""
from typing import Optional, Sequence, Union

from neural_tangents._src.experimental.features.feature_type import deterministic_layer
from neural_tangents._src.experimental.features.feature_type import FeatureLayer
from neural_tangents._src.experimental.features.feature_type import Features
from neural_tangents._src.stax.pooling import AvgPool
from neural_tangents._src.stax.pooling import GlobalAvgPool
from neural_tangents._src.stax.windows import Padding


def AvgPoolFeatures(window_shape: Sequence[int],
                    strides: Optional[Sequence[int]] = None,
                    padding: Union[str, Padding] = 'VALID',
                    normalize_edges: bool = False,
                    batch_axis: int = 0,
                    channel_axis: int = -1) -> FeatureLayer:
  """Exact features of `stax.AvgPool`: the average-pooled features.

  `nngp'[s, s'] = 1/|w|^2 sum_{t in w(s), t' in w(s')} nngp[t, t']` is the
  inner product of window averages of the features (with `normalize_edges`,
  averages over the non-padded entries).

  Args:
    window_shape: the window's size along each spatial axis.
    strides: the strides (default 1).
    padding: 'VALID', 'SAME' or 'CIRCULAR'.
    normalize_edges: with 'SAME', average over non-padded entries only.
    batch_axis: batch axis of the features.
    channel_axis: channel axis of the features.

  Returns:
    `(init_fn, feature_fn)`.

  Example:
    >>> from neural_tangents.experimental import features as ft
    >>> _, feature_fn = ft.AvgPoolFeatures((2, 2), (2, 2))
    >>> feature_fn(jnp.ones((1, 4, 4, 3)), ()).nngp_feat.shape
    (1, 2, 2, 3)
  """
  try:
    _, pool, _ = AvgPool(window_shape, strides, padding, normalize_edges,
                         batch_axis, channel_axis)
  except (TypeError, ValueError) as e:  # Name this layer, not `stax`'s.
    raise type(e)(str(e).replace('`AvgPool`', '`AvgPoolFeatures`')) from None

  def transform(f: Features) -> Features:
    try:
      return f.replace(nngp_feat=pool((), f.nngp_feat),
                       ntk_feat=pool((), f.ntk_feat))
    except ValueError as e:
      raise ValueError(str(e).replace('`AvgPool`', '`AvgPoolFeatures`')
                      ) from None

  return deterministic_layer('AvgPoolFeatures', batch_axis, channel_axis,
                             transform)


def GlobalAvgPoolFeatures(batch_axis: int = 0, channel_axis: int = -1
                          ) -> FeatureLayer:
  """Exact features of `stax.GlobalAvgPool`: features averaged over positions.

  `nngp' = 1/S^2 sum_{s, s'} nngp[s, s']`, the inner product of the mean
  features. The output is `(N, C)` (or `(C, N)` if the batch axis came after
  the channel axis), so `f.nngp_feat @ f.nngp_feat.T` is the kernel.

  Args:
    batch_axis: batch axis of the features.
    channel_axis: channel axis of the features.

  Returns:
    `(init_fn, feature_fn)`.

  Example:
    >>> from neural_tangents.experimental import features as ft
    >>> _, feature_fn = ft.GlobalAvgPoolFeatures()
    >>> feature_fn(jnp.ones((2, 4, 4, 3)), ()).nngp_feat.shape
    (2, 3)
  """
  _, pool, _ = GlobalAvgPool(batch_axis, channel_axis)

  def transform(f: Features) -> Features:
    ndim = f.nngp_feat.ndim
    batch_first = batch_axis % ndim < channel_axis % ndim
    return Features(pool((), f.nngp_feat), pool((), f.ntk_feat),
                    0 if batch_first else 1, 1 if batch_first else 0)

  return deterministic_layer('GlobalAvgPoolFeatures', batch_axis,
                             channel_axis, transform)
