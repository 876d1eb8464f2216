"""Exact features of graph aggregation: `AggregateFeatures`.

`stax.Aggregate` sums node features over a graph, `out[n, j] = sum_i
P[n, i, j] x[n, i]` (nodes `i`, `j` the positions along the aggregated
spatial axes, the same for every channel), and maps kernels two-sidedly,
`nngp'(x_n, x'_m) = P_n^T nngp(x_n, x'_m) P'_m` over the node axes (the
same for the NTK). That is the inner product of the aggregated features:

  nngp_feat'[n, j] = sum_i P[n, i, j] nngp_feat[n, i]
  ntk_feat'[n, j]  = sum_i P[n, i, j] ntk_feat[n, i]

The aggregation itself is `stax.Aggregate`'s `apply_fn`, so the pattern's
formats (dense with `to_dense`, or sparse edge lists), its checks and the
order of its node axes are the same by construction.
"""
from typing import Callable, Optional, Sequence, Union

import jax

from neural_tangents._src.experimental.features.feature_type import as_features
from neural_tangents._src.experimental.features.feature_type import FeatureLayer
from neural_tangents._src.experimental.features.feature_type import Features
from neural_tangents._src.experimental.features.feature_type import feature_shapes
from neural_tangents._src.stax.aggregate import Aggregate

Array = jax.Array


def _renamed(e: Exception) -> Exception:
  """`e` naming this layer instead of `stax`'s."""
  message = str(e)
  if '`Aggregate`' in message:
    return type(e)(message.replace('`Aggregate`', '`AggregateFeatures`'))
  return type(e)(f'`AggregateFeatures`: {message}')


def AggregateFeatures(
    aggregate_axis: Optional[Union[int, Sequence[int]]] = None,
    batch_axis: int = 0,
    channel_axis: int = -1,
    to_dense: Optional[Callable[[Array], Array]] = lambda p: p,
    implementation: str = 'DENSE') -> FeatureLayer:
  """Exact features of `stax.Aggregate`: the aggregated features.

  The pattern of each batch is passed at call time,
  `feature_fn(f, params, pattern=p)`, with `p` the pattern of the examples
  of `f` in the format of `stax.Aggregate` (`implementation='DENSE'`:
  `to_dense(p)` of shape `(N, *S, *S)` or `(1, *S, *S)`, `p[n, i, j]` the
  weight of node `i` in node `j`; `'SPARSE'`: integer `(N, n_edges, 2)`
  edge lists `(sender, receiver)`, padded with -1). `pattern=None` (the
  default) is the identity. Where `stax`'s `kernel_fn(x1, x2,
  pattern=(p1, p2))` takes both sides' patterns, features are computed for
  each input batch with its own: the features of `x1` with `p1` and of `x2`
  with `p2` have the inner products of that kernel.

  Args:
    aggregate_axis: spatial axis or axes holding the nodes; None for all.
    batch_axis: batch axis of the features.
    channel_axis: channel axis of the features.
    to_dense: maps a 'DENSE' pattern to a dense array.
    implementation: 'DENSE' or 'SPARSE'.

  Returns:
    `(init_fn, feature_fn)`.

  Example:
    >>> from neural_tangents.experimental import features as ft
    >>> _, feature_fn = ft.AggregateFeatures()
    >>> x = jnp.ones((2, 3, 4))  # 2 graphs of 3 nodes with 4 features.
    >>> pattern = jnp.ones((2, 3, 3))  # Complete graphs.
    >>> f = feature_fn(x, (), pattern=pattern)
    >>> f.nngp_feat[0, 0]  # 3 neighbors of x / sqrt(4).
    Array([1.5, 1.5, 1.5, 1.5], dtype=float32)
  """
  try:
    stax_init, aggregate, _ = Aggregate(aggregate_axis, batch_axis,
                                        channel_axis, to_dense, implementation)
  except (TypeError, ValueError) as e:
    raise _renamed(e) from None

  def init_fn(key, input_shape):
    del key
    shapes = feature_shapes(input_shape, channel_axis)
    try:
      stax_init(None, shapes[0])  # Validates `aggregate_axis`.
    except ValueError as e:
      raise _renamed(e) from None
    return shapes, ()

  def feature_fn(f, params=(), *, pattern=None, **kwargs) -> Features:
    del params, kwargs
    f = as_features(f, batch_axis, channel_axis, 'AggregateFeatures')
    if pattern is None:
      return f
    try:
      return f.replace(nngp_feat=aggregate((), f.nngp_feat, pattern=pattern),
                       ntk_feat=aggregate((), f.ntk_feat, pattern=pattern))
    except ValueError as e:
      raise _renamed(e) from None

  return init_fn, feature_fn
