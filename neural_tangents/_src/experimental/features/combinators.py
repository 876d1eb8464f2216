"""`serial`: the composition of feature layers."""
from typing import Any

from jax import random

from neural_tangents._src.experimental.features.feature_type import FeatureLayer
from neural_tangents._src.experimental.features.feature_type import Features
from neural_tangents._src.utils import precision


def serial(*layers: FeatureLayer) -> FeatureLayer:
  """Composes feature layers, first to last.

  `init_fn(key, input_shape)` splits `key` once per layer and returns the
  last output shapes and the list of each layer's params (`()` for layers
  without randomness); `feature_fn(f, params, **kwargs)` applies the layers in
  turn, passing `kwargs` to each.

  Args:
    *layers: `(init_fn, feature_fn)` pairs.

  Returns:
    `(init_fn, feature_fn)` of the composition.

  Example:
    >>> from neural_tangents.experimental import features as ft
    >>> init_fn, feature_fn = ft.serial(ft.DenseFeatures(1),
    ...                                 ft.DenseFeatures(1))
    >>> shapes, params = init_fn(random.PRNGKey(0), (-1, 4))
    >>> shapes, params
    (((-1, 4), (-1, 8)), [(), ()])
  """
  for i, layer in enumerate(layers):
    if (not isinstance(layer, (tuple, list)) or len(layer) != 2 or
        not all(callable(fn) for fn in layer)):
      raise TypeError(
          f'`serial` takes feature layers `(init_fn, feature_fn)`; argument '
          f'{i} is {layer!r}. Call the layer constructor, e.g. '
          '`serial(DenseFeatures(1), ReluFeatures(method="EXACT"))`.')
  init_fns = [layer[0] for layer in layers]
  feature_fns = [layer[1] for layer in layers]

  def init_fn(key, input_shape):
    params = []
    shape = input_shape
    for init in init_fns:
      if key is None:
        sub = None
      else:
        key, sub = random.split(key)
      shape, p = init(sub, shape)
      params.append(p)
    return shape, params

  def feature_fn(f: Any, params, **kwargs) -> Features:
    if len(params) != len(feature_fns):
      raise ValueError(
          f'`serial` of {len(feature_fns)} layers got {len(params)} params. '
          "Pass the list of params this network's `init_fn` returned.")
    for fn, p in zip(feature_fns, params):
      f = fn(f, p, **kwargs)
    return f

  # float32-accurate products on every backend (see `utils/precision`).
  return init_fn, precision.library_precision(feature_fn)
