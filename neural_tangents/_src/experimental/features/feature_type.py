"""`Features`: explicit feature maps of the NNGP and the NTK of a network.

A feature layer maps the features of its inputs to those of its outputs, so
that inner products of features are the kernels `stax` computes for the same
layers:

  nngp(x, x') = <nngp_feat(x), nngp_feat(x')>
  ntk(x, x')  = <ntk_feat(x), ntk_feat(x')>

the inner product taken over the channel axis. For spatial features
`(N, S_1, ..., S_d, C)`, `sum_c feat[n, s, c] feat[n', s', c]` is the
kernel entry `(n, n', s_1, s_1', ..., s_d, s_d')` of the `stax` layout; after
`FlattenFeatures` or `GlobalAvgPoolFeatures` the features are `(N, C)` and
`feat @ feat.T` is the kernel matrix.

A layer is a pair `(init_fn, feature_fn)`: `init_fn(key, input_shape)` draws
the layer's random matrices and returns `(output_shape, params)`, where
shapes are either the shape of raw inputs or a pair `(nngp_feat_shape,
ntk_feat_shape)`; `feature_fn(f, params, **kwargs)` maps an input array or a
`Features` to a `Features`.
"""
import math
from typing import Any, Callable, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.utils import arguments
from neural_tangents._src.utils import dataclasses

Array = jax.Array
Shape = tuple[int, ...]
# `(nngp_feat_shape, ntk_feat_shape)`.
FeatureShapes = tuple[Shape, Shape]
InitFn = Callable[[Array, Any], tuple[FeatureShapes, Any]]
FeatureFn = Callable[..., 'Features']
FeatureLayer = tuple[InitFn, FeatureFn]


@dataclasses.dataclass
class Features:
  """Features of the NNGP and the NTK of a batch of inputs.

  `nngp_feat` and `ntk_feat` have the same shape except on the channel axis:
  `<nngp_feat(x), nngp_feat(x')>` over channels approximates (or equals) the
  NNGP, and `<ntk_feat(x), ntk_feat(x')>` the NTK, of the network that made
  them. Immutable; change fields with `replace`. A pytree: passes through
  `jax.jit` (the axes are static).

  Attributes:
    nngp_feat: NNGP features, e.g. `(N, C)` or `(N, H, W, C)`.
    ntk_feat: NTK features, the same shape but for the number of channels.
    batch_axis: the batch axis of both.
    channel_axis: the channel axis of both (the one inner products contract).

  Example:
    >>> f = Features(jnp.ones((3, 4)), jnp.zeros((3, 0)))
    >>> (f.nngp_feat @ f.nngp_feat.T).shape
    (3, 3)
    >>> f.replace(ntk_feat=f.nngp_feat).ntk_feat.shape
    (3, 4)
  """
  nngp_feat: Array
  ntk_feat: Array
  batch_axis: int = dataclasses.field(pytree_node=False, default=0)
  channel_axis: int = dataclasses.field(pytree_node=False, default=-1)


def input_features(x: Array, batch_axis: int = 0,
                   channel_axis: int = -1) -> Features:
  """The features of raw inputs: `nngp_feat = x / sqrt(C)`, empty `ntk_feat`.

  `<x, x'> / C` is the input kernel `stax` starts from (`C` the number of
  channels); the NTK of the inputs is 0, held by zero channels.

  Example:
    >>> input_features(jnp.ones((2, 4))).nngp_feat
    Array([[0.5, 0.5, 0.5, 0.5],
           [0.5, 0.5, 0.5, 0.5]], dtype=float32)
  """
  x = jnp.asarray(x)
  check_real(x.dtype, 'inputs')
  if x.ndim < 2:
    raise ValueError(
        f'Feature layers take a batch of inputs with a batch and a channel '
        f'axis (rank 2 or more, as `stax`); got inputs of shape {x.shape}. '
        'Pass e.g. `x[None]` for one example or `x[:, None]` for examples '
        'of one feature.')
  if not jnp.issubdtype(x.dtype, jnp.inexact):
    x = x.astype(jnp.result_type(float))
  c = arguments.canonicalize_axis(channel_axis, x.ndim, 'channel_axis')
  arguments.canonicalize_axis(batch_axis, x.ndim, 'batch_axis')
  if x.shape[c] == 0:
    raise ValueError(
        f'Feature layers need inputs with at least one channel; got inputs '
        f'of shape {x.shape} with 0 channels on axis {channel_axis} (their '
        'kernel <x, x\'> / channels is undefined). Pass inputs with '
        'features, or the right `channel_axis`.')
  ntk_shape = list(x.shape)
  ntk_shape[c] = 0
  return Features(x / math.sqrt(x.shape[c]),
                  jnp.zeros(ntk_shape, x.dtype), batch_axis, channel_axis)


def as_features(f: Union[Array, Features], batch_axis: int,
                channel_axis: Optional[int], layer_name: str) -> Features:
  """`f` if a `Features` laid out with these axes, else `input_features(f)`.

  `channel_axis=None` accepts features with any channel axis (raw inputs
  then have channels last).

  Raises:
    ValueError: if `f` is a `Features` whose axes differ from the layer's.
  """
  if not isinstance(f, Features):
    return input_features(f, batch_axis,
                          -1 if channel_axis is None else channel_axis)
  check_real(f.nngp_feat.dtype, 'features')
  check_real(f.ntk_feat.dtype, 'features')
  ndim = f.nngp_feat.ndim
  pairs = [(f.batch_axis, batch_axis, 'batch_axis')]
  if channel_axis is not None:
    pairs.append((f.channel_axis, channel_axis, 'channel_axis'))
  same = all(
      arguments.canonicalize_axis(a, ndim, name) ==
      arguments.canonicalize_axis(b, ndim, name) for a, b, name in pairs)
  if not same:
    raise ValueError(
        f'`{layer_name}(batch_axis={batch_axis}, channel_axis={channel_axis})`'
        f' got features with batch_axis={f.batch_axis} and channel_axis='
        f'{f.channel_axis}. Pass the axes of the previous layer\'s features '
        f'to `{layer_name}`.')
  return f


# The abstract raw PRNG key the layers' parameter draws are evaluated on.
KEY_SHAPE = jax.ShapeDtypeStruct((2,), jnp.uint32)


def check_real(dtype: Any, what: str) -> None:
  """Raises a `TypeError` for complex `dtype` (`stax` rejects complex
  inputs; the kernels here are of real networks)."""
  if jnp.issubdtype(dtype, jnp.complexfloating):
    raise TypeError(
        f'Feature layers take real {what}; got dtype {dtype}. The kernels are '
        'those of real networks (`stax` rejects complex inputs too): pass '
        'the real and imaginary parts as channels, e.g. '
        '`jnp.concatenate([x.real, x.imag], axis=-1)`.')


def check_params(params: Any, expected: Any, layer_name: str) -> None:
  """Raises a `ValueError` unless `params` has the structure, shapes and
  dtypes of `expected` (e.g. `jax.eval_shape` of the layer's draw for these
  inputs).

  Params drawn by `init_fn` for inputs of another width, or by another
  layer or method, would otherwise reach an index or shape error inside
  JAX, or worse, fit by chance and give wrong features.
  """
  leaves, tree = jax.tree_util.tree_flatten(params)
  expected_leaves, expected_tree = jax.tree_util.tree_flatten(expected)
  same = tree == expected_tree and all(
      np.shape(a) == b.shape and jnp.result_type(a) == b.dtype
      for a, b in zip(leaves, expected_leaves))
  if not same:

    def describe(tree):
      text = str(jax.tree_util.tree_map(
          lambda a: f'{jnp.result_type(a).name}{list(np.shape(a))}', tree))
      return text if len(text) < 300 else text[:300] + '...'

    raise ValueError(
        f'`{layer_name}` got params that were not drawn for these features '
        f'(another input width, layer or method): expected '
        f'{describe(expected)}, got {describe(params)}. Pass the params '
        "that this layer's `init_fn` returned for inputs of this shape.")


def feature_shapes(input_shape: Any, channel_axis: int) -> FeatureShapes:
  """`(nngp_feat_shape, ntk_feat_shape)` of `input_shape`.

  Args:
    input_shape: the shape of raw inputs (a tuple of ints, the batch size
      may be -1), or already a pair of feature shapes.
    channel_axis: the channel axis of raw inputs.
  """
  if (isinstance(input_shape, (tuple, list)) and len(input_shape) == 2 and
      all(isinstance(s, (tuple, list)) for s in input_shape)):
    return tuple(input_shape[0]), tuple(input_shape[1])
  shape = tuple(arguments.input_shape(input_shape))
  if len(shape) < 2:
    raise ValueError(
        f'Feature layers take a batch of inputs with a batch and a channel '
        f'axis (rank 2 or more, as `stax`); got the input shape {shape}. '
        'Pass e.g. `(1,) + shape` for one example.')
  c = arguments.canonicalize_axis(channel_axis, len(shape), 'channel_axis')
  if shape[c] == 0:
    raise ValueError(
        f'Feature layers need inputs with at least one channel; got the '
        f'input shape {shape} with 0 channels on axis {channel_axis}. Pass '
        'inputs with features, or the right `channel_axis`.')
  ntk_shape = list(shape)
  ntk_shape[c] = 0
  return shape, tuple(ntk_shape)


def output_shapes(feature_fn: Callable[[Features], Features],
                  shapes: FeatureShapes, batch_axis: int,
                  channel_axis: int) -> FeatureShapes:
  """The feature shapes `feature_fn` outputs, by abstract evaluation.

  Unknown sizes (-1, e.g. the batch size) are evaluated as 1 and as 2; the
  output sizes that differ between the two are reported as -1.
  """

  def evaluate(unknown_size):
    concrete = lambda shape: tuple(unknown_size if s < 0 else s
                                   for s in shape)
    dtype = jnp.result_type(float)
    f = Features(jax.ShapeDtypeStruct(concrete(shapes[0]), dtype),
                 jax.ShapeDtypeStruct(concrete(shapes[1]), dtype),
                 batch_axis, channel_axis)
    out = jax.eval_shape(feature_fn, f)
    return out.nngp_feat.shape, out.ntk_feat.shape

  first = evaluate(1)
  if not any(s < 0 for shape in shapes for s in shape):
    return first
  second = evaluate(2)
  return tuple(tuple(a if a == b else -1 for a, b in zip(s1, s2))
               for s1, s2 in zip(first, second))


def channel_rows(x: Array, channel_axis: int
                 ) -> tuple[Array, Callable[[Array], Array]]:
  """`x` as rows `(R, C)` (all non-channel axes flattened), and the inverse.

  Layers acting on the channels of each position (dense layers,
  nonlinearities) work on rows; `restore(rows)` puts `(R, C')` rows back in
  the layout of `x`, with `C'` channels.
  """
  c = arguments.canonicalize_axis(channel_axis, x.ndim, 'channel_axis')
  moved = jnp.moveaxis(x, c, -1)
  rest = moved.shape[:-1]

  def restore(rows: Array) -> Array:
    return jnp.moveaxis(rows.reshape(rest + rows.shape[-1:]), -1, c)

  rows = math.prod(rest)  # Not -1: there may be 0 channels.
  return moved.reshape((rows, moved.shape[-1])), restore


def concatenate_channels(arrays: Sequence[Array], channel_axis: int) -> Array:
  """Concatenation on the channel axis (the inner products add up)."""
  return jnp.concatenate(arrays, axis=channel_axis)


def replace_channels(shape: Shape, channel_axis: int, channels: int) -> Shape:
  """`shape` with `channels` on the channel axis."""
  shape = list(shape)
  shape[arguments.canonicalize_axis(channel_axis, len(shape),
                                    'channel_axis')] = channels
  return tuple(shape)


def rows_of(shape: Shape, channel_axis: int) -> int:
  """The number of rows of `channel_rows` for a shape (-1 if unknown)."""
  c = arguments.canonicalize_axis(channel_axis, len(shape), 'channel_axis')
  rest = [s for i, s in enumerate(shape) if i != c]
  return -1 if any(s < 0 for s in rest) else int(np.prod(rest, dtype=int))


def deterministic_layer(layer_name: str, batch_axis: int,
                        channel_axis: Optional[int],
                        transform: Callable[[Features], Features]
                        ) -> FeatureLayer:
  """The `(init_fn, feature_fn)` of a layer without randomness.

  Args:
    layer_name: the layer's name, for error messages.
    batch_axis, channel_axis: the axes of its input features
      (`channel_axis=None`: any, channels last for raw inputs).
    transform: maps input `Features` (laid out with these axes) to output
      `Features`.

  Returns:
    `init_fn(key, input_shape) -> (output_shapes, ())` (the key is unused and
    may be None) and `feature_fn(f, params, **kwargs) -> Features`.
  """

  def init_fn(key, input_shape):
    del key
    c = -1 if channel_axis is None else channel_axis
    shapes = feature_shapes(input_shape, c)
    return output_shapes(transform, shapes, batch_axis, c), ()

  def feature_fn(f, params=(), **kwargs):
    del params, kwargs
    return transform(as_features(f, batch_axis, channel_axis, layer_name))

  return init_fn, feature_fn
