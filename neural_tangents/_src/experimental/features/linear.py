"""Exact features of linear layers: `DenseFeatures`, `FlattenFeatures`."""
import inspect
import math
from typing import Optional

import jax.numpy as jnp

from neural_tangents._src.experimental.features.feature_type import concatenate_channels
from neural_tangents._src.experimental.features.feature_type import deterministic_layer
from neural_tangents._src.experimental.features.feature_type import FeatureLayer
from neural_tangents._src.experimental.features.feature_type import Features
from neural_tangents._src.experimental.features.feature_type import replace_channels
from neural_tangents._src.stax.parameterization import Parameterization
from neural_tangents._src.utils import arguments


def check_ntk_parameterization(parameterization: str, layer_name: str) -> None:
  """Raises unless `parameterization` is 'ntk' (the one with features)."""
  param = arguments.parse_enum(parameterization, Parameterization,
                               'parameterization')
  if param != Parameterization.NTK:
    raise NotImplementedError(
        f'`{layer_name}(parameterization={parameterization!r})`: features '
        'exist for the NTK parameterization only (the standard one scales '
        'the NTK by the width of the previous layer, which features do not '
        "track). Pass parameterization='ntk'.")


def check_finite_stds(layer_name: str, W_std: float,  # pylint: disable=invalid-name
                      b_std: Optional[float]) -> None:
  """Raises a `ValueError` for a NaN or infinite `W_std` or `b_std`, as
  `stax`'s layers do (the features would be NaN or infinite)."""

  def stds(W_std: float = 1., b_std: Optional[float] = None):  # pylint: disable=invalid-name
    del W_std, b_std

  arguments.finite_hyperparameters(
      layer_name, inspect.signature(stds).bind(W_std=W_std, b_std=b_std))


def DenseFeatures(out_dim: int,
                  W_std: float = 1.,
                  b_std: Optional[float] = None,
                  batch_axis: int = 0,
                  channel_axis: int = -1,
                  parameterization: str = 'ntk') -> FeatureLayer:
  """Exact features of `stax.Dense`.

  `stax.Dense` maps kernels as `nngp' = W_std^2 nngp + b_std^2` and
  `ntk' = nngp' + W_std^2 ntk` (no `b_std^2` term when `b_std` is None),
  which are the inner products of the concatenated features

    nngp_feat' = [W_std nngp_feat, b_std 1]
    ntk_feat'  = [W_std ntk_feat, nngp_feat']

  (the bias channel only when `b_std` is not None). Channels grow by
  `nngp` channels + 1 per layer on the NTK side; the nonlinearities' sketches
  bring them back down.

  Args:
    out_dim: the width of the finite layer; accepted for symmetry with
      `stax.Dense` and unused (the kernel does not depend on it).
    W_std: weight standard deviation.
    b_std: bias standard deviation; None for no bias.
    batch_axis: batch axis of the features.
    channel_axis: channel axis of the features.
    parameterization: 'ntk' (the standard parameterization raises
      `NotImplementedError`).

  Returns:
    `(init_fn, feature_fn)`.

  Example:
    >>> from neural_tangents.experimental import features as ft
    >>> _, feature_fn = ft.DenseFeatures(1, W_std=2., b_std=0.5)
    >>> f = feature_fn(jnp.ones((2, 4)), ())
    >>> f.nngp_feat @ f.nngp_feat.T  # 4 * <x, x'> / 4 + 0.25
    Array([[4.25, 4.25],
           [4.25, 4.25]], dtype=float32)
  """
  arguments.positive_int(out_dim, 'out_dim', 'Pass e.g. `DenseFeatures(1)` '
                         '(the width does not change the kernel).',
                         layer_name='DenseFeatures')
  arguments.real_number(W_std, 'W_std', 'Pass e.g. `W_std=1.5`.',
                        layer_name='DenseFeatures')
  arguments.real_number(b_std, 'b_std', 'Pass e.g. `b_std=0.05`, or None for '
                        'no bias.', layer_name='DenseFeatures',
                        allow_none=True)
  check_ntk_parameterization(parameterization, 'DenseFeatures')
  check_finite_stds('DenseFeatures', W_std, b_std)

  def transform(f: Features) -> Features:
    x = f.nngp_feat
    nngp = W_std * x
    if b_std is not None:
      bias = jnp.full(replace_channels(x.shape, channel_axis, 1), b_std,
                      x.dtype)
      nngp = concatenate_channels([nngp, bias], channel_axis)
    ntk = concatenate_channels([W_std * f.ntk_feat.astype(nngp.dtype), nngp],
                               channel_axis)
    return f.replace(nngp_feat=nngp, ntk_feat=ntk)

  return deterministic_layer('DenseFeatures', batch_axis, channel_axis,
                             transform)


def FlattenFeatures(batch_axis: int = 0, batch_axis_out: int = 0
                    ) -> FeatureLayer:
  """Exact features of `stax.Flatten`.

  `stax.Flatten` averages the spatial diagonal of the kernel over the `S`
  positions, `nngp' = 1/S sum_s nngp[s, s]`: the inner product of the
  features flattened into `S C` channels and divided by `sqrt(S)`.

  Args:
    batch_axis: batch axis of the input features (their channel axis may be
      any).
    batch_axis_out: 0 for `(N, S C)` outputs, 1 for `(S C, N)`.

  Returns:
    `(init_fn, feature_fn)`.

  Example:
    >>> from neural_tangents.experimental import features as ft
    >>> _, feature_fn = ft.FlattenFeatures()
    >>> feature_fn(jnp.ones((2, 3, 3, 4)), ()).nngp_feat.shape
    (2, 36)
  """
  if batch_axis_out not in (0, 1, -1, -2):
    raise ValueError(
        f'`batch_axis_out` of `FlattenFeatures` must be 0 or 1; got '
        f'{batch_axis_out!r}. Pass 0 for `(batch, features)` outputs.')
  batch_axis_out %= 2

  def flatten(x, b, c):
    positions = math.prod(s for i, s in enumerate(x.shape) if i not in (b, c))
    # Not -1: with 0 examples (or 0 channels) the size does not say it.
    out = jnp.moveaxis(x, b, 0).reshape((x.shape[b], positions * x.shape[c]))
    out = out / math.sqrt(max(positions, 1))
    return out if batch_axis_out == 0 else out.T

  def transform(f: Features) -> Features:
    ndim = f.nngp_feat.ndim
    b = arguments.canonicalize_axis(batch_axis, ndim, 'batch_axis')
    c = arguments.canonicalize_axis(f.channel_axis, ndim, 'channel_axis')
    return Features(flatten(f.nngp_feat, b, c), flatten(f.ntk_feat, b, c),
                    batch_axis_out, 1 - batch_axis_out)

  return deterministic_layer('FlattenFeatures', batch_axis, None, transform)
