"""One definition of the network: `from_stax`, the features of a stax network.

Every stax layer's `kernel_fn` records the constructor call that made it
(`stax.protocol.LayerSpec`: the name and arguments); `from_stax` reads it and
builds the feature layer of the same name and hyperparameters, recursing into
`serial` and `repeat`. The layout `(batch_axis, channel_axis)` of the
features is followed through the network, so that nonlinearities (which
have no axes in `stax`) act on the channels of whatever precedes them.
"""
import functools
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp

from neural_tangents._src.experimental.features.aggregate import AggregateFeatures
from neural_tangents._src.experimental.features.combinators import serial
from neural_tangents._src.experimental.features.convolution import ConvFeatures
from neural_tangents._src.experimental.features.elementwise import ElementwiseFeatures
from neural_tangents._src.experimental.features.elementwise import ElementwiseFeaturesImplementation
from neural_tangents._src.experimental.features.feature_type import deterministic_layer
from neural_tangents._src.experimental.features.feature_type import FeatureLayer
from neural_tangents._src.experimental.features.linear import DenseFeatures
from neural_tangents._src.experimental.features.linear import FlattenFeatures
from neural_tangents._src.experimental.features.normalization import LayerNormFeatures
from neural_tangents._src.experimental.features.pooling import AvgPoolFeatures
from neural_tangents._src.experimental.features.pooling import GlobalAvgPoolFeatures
from neural_tangents._src.experimental.features.relu import ReluFeatures
from neural_tangents._src.experimental.features.relu import ReluFeaturesImplementation
from neural_tangents._src.stax.protocol import layer_spec
from neural_tangents._src.utils import arguments

Layout = tuple[int, int]  # (batch_axis, channel_axis)

# Nonlinearities whose features are those of their `apply_fn` as an
# elementwise function (`ElementwiseFeatures`, by its Hermite series).
ELEMENTWISE_LAYERS = ('ABRelu', 'Abs', 'Cos', 'Elementwise',
                      'ElementwiseNumerical', 'Erf', 'Exp', 'Gabor',
                      'Gaussian', 'Gelu', 'Hermite', 'LeakyRelu', 'Monomial',
                      'Polynomial', 'Rbf', 'RectifiedMonomial', 'Sigmoid_like',
                      'Sign', 'Sin')

_BRANCHING = ('parallel', 'FanOut', 'FanInSum', 'FanInConcat', 'FanInProd')

SUPPORTED_LAYERS = ('serial', 'repeat', 'Identity', 'Dense', 'Conv',
                    'AvgPool', 'GlobalAvgPool', 'Flatten', 'LayerNorm',
                    'Aggregate', 'Relu') + ELEMENTWISE_LAYERS


def from_stax(*layers: Any,
              relu_method: str = 'RANDFEAT',
              elementwise_method: str = 'POLYSKETCH',
              feature_dim: int = 1024,
              poly_degree: Optional[int] = None,
              generate_rand_mtx: bool = True) -> FeatureLayer:
  """The feature layers of a stax network, with the same hyperparameters.

  Maps each stax layer to its feature layer: `Dense` -> `DenseFeatures`,
  `Conv` -> `ConvFeatures`, `AvgPool`, `GlobalAvgPool`, `Flatten`,
  `LayerNorm`, `Aggregate` -> their `*Features`, `Relu` ->
  `ReluFeatures(relu_method)`, the other elementwise nonlinearities (`Erf`,
  `Gelu`, `Sin`, `Elementwise(fn, ...)`, ...) ->
  `ElementwiseFeatures(apply_fn, elementwise_method)`, and `serial`,
  `repeat`, `Identity` -> their composition. Every random feature map and
  sketch of the network gets `feature_dim` coordinates. So a network is
  defined once, in `stax`, and its features follow:

    kernel_fn's NNGP, NTK ~ inner products of feature_fn's features

  (equal to rounding with the 'EXACT' methods; `ElementwiseFeatures` also
  truncates the Hermite series at `poly_degree`).

  Args:
    *layers: stax layers `(init_fn, apply_fn, kernel_fn)` (e.g. one
      `stax.serial(...)`), composed in order.
    relu_method: the `ReluFeaturesImplementation` of every `Relu`.
    elementwise_method: the `ElementwiseFeaturesImplementation` of every
      other nonlinearity.
    feature_dim: `feature_dim0`, `feature_dim1`, `sketch_dim` and
      `poly_sketch_dim` of every nonlinearity.
    poly_degree: the polynomial degree of every nonlinearity; None for each
      layer's default (8 for `ReluFeatures`, 16 for `ElementwiseFeatures`).
    generate_rand_mtx: as for `ReluFeatures`.

  Returns:
    `(init_fn, feature_fn)`, the `serial` composition of the feature layers.

  Raises:
    ValueError: for a layer without features here (attention, `Dropout`,
      branching combinators, ...) or not made by a stax constructor, naming
      it.

  Example:
    >>> from neural_tangents.experimental import features as ft
    >>> _, _, kernel_fn = network = stax.serial(
    ...     stax.Conv(1, (3, 3), padding='SAME'), stax.Relu(),
    ...     stax.GlobalAvgPool(), stax.Dense(1))
    >>> init_fn, feature_fn = ft.from_stax(network, relu_method='EXACT')
    >>> x = random.normal(random.PRNGKey(1), (3, 4, 4, 2))
    >>> _, params = init_fn(random.PRNGKey(0), x.shape)
    >>> f = feature_fn(x, params)
    >>> ntk = kernel_fn(x, None, 'ntk')
    >>> bool(jnp.allclose(f.ntk_feat @ f.ntk_feat.T, ntk, atol=1e-4))
    True
  """
  arguments.parse_enum(relu_method, ReluFeaturesImplementation, 'relu_method')
  arguments.parse_enum(elementwise_method, ElementwiseFeaturesImplementation,
                       'elementwise_method')
  arguments.positive_int(feature_dim, 'feature_dim', 'Pass e.g. '
                         'feature_dim=1024.', layer_name='from_stax')
  if poly_degree is not None:
    arguments.positive_int(poly_degree, 'poly_degree', 'Pass e.g. '
                           'poly_degree=16, or None.', layer_name='from_stax')
  if not layers:
    raise ValueError('`from_stax` needs at least one stax layer. Pass e.g. '
                     '`from_stax(stax.serial(stax.Dense(1), stax.Relu()))`.')
  options = dict(relu_method=relu_method,
                 elementwise_method=elementwise_method,
                 feature_dim=feature_dim, poly_degree=poly_degree,
                 generate_rand_mtx=generate_rand_mtx)
  converted, _ = _convert_all(layers, (0, -1), options, 'argument')
  return serial(*converted)


def _convert_all(layers, layout: Layout, options: dict, where: str
                 ) -> tuple[list[FeatureLayer], Layout]:
  out = []
  for i, layer in enumerate(layers):
    new, layout = _convert(layer, layout, options, f'{where} {i}')
    out.extend(new)
  return out, layout


def _unsupported(name: str, where: str) -> ValueError:
  if name in _BRANCHING:
    reason = ('features of branching networks (`parallel`, `FanOut`, '
              '`FanIn*`) are not implemented')
  else:
    reason = 'it has no feature map in `nt.experimental.features`'
  return ValueError(
      f'`from_stax` cannot convert `stax.{name}` ({where}): {reason}. '
      f'Supported layers: {", ".join(SUPPORTED_LAYERS)}. Remove the layer '
      "or replace it with a supported one, or compute this network's kernel "
      "with `stax`'s `kernel_fn`.")


def _global_pool_layout(batch_axis: int, channel_axis: int) -> Layout:
  """The `(N, C)` or `(C, N)` layout of a global pooling's output."""
  if (batch_axis < 0) == (channel_axis < 0):
    batch_first = batch_axis < channel_axis
  else:
    batch_first = batch_axis >= 0
  return (0, 1) if batch_first else (1, 0)


def _convert(layer: Any, layout: Layout, options: dict, where: str
             ) -> tuple[list[FeatureLayer], Layout]:
  """The feature layers of one stax layer, and the layout after them."""
  if (not isinstance(layer, (tuple, list)) or len(layer) != 3 or
      not all(callable(fn) for fn in layer)):
    raise TypeError(
        f'`from_stax` takes stax layers `(init_fn, apply_fn, kernel_fn)`; '
        f'{where} is {layer!r}. Pass e.g. `from_stax(stax.serial('
        'stax.Dense(1), stax.Relu()))`.')
  spec = layer_spec(layer[2])
  if spec is None:
    raise ValueError(
        f'`from_stax` cannot convert {where}: its `kernel_fn` was not made by '
        'a stax layer constructor (it has no `layer_spec`), so its '
        'hyperparameters are unknown. Build the network from `stax` layers, '
        'or compose feature layers with `ft.serial`.')
  name, a = spec.name, spec.arguments
  b, c = layout
  if name == 'serial':
    return _convert_all(a['layers'], layout, options,
                        f'{where}, serial layer')
  if name == 'repeat':
    out = []
    for _ in range(a['n']):
      new, layout = _convert(a['layer'], layout, options,
                             f'{where}, repeated layer')
      out.extend(new)
    return out, layout
  if name == 'Identity':
    return [deterministic_layer('Identity', b, c, lambda f: f)], layout
  if name == 'Dense':
    return [DenseFeatures(a['out_dim'], a['W_std'], a['b_std'],
                          a['batch_axis'], a['channel_axis'],
                          a['parameterization'])
           ], (a['batch_axis'], a['channel_axis'])
  if name == 'Conv':
    numbers = a['dimension_numbers']
    out_spec = 'N...C' if numbers is None else numbers[2]
    return [ConvFeatures(a['out_chan'], a['filter_shape'], a['strides'],
                         a['padding'], a['W_std'], a['b_std'], numbers,
                         a['parameterization'])
           ], ((0, -1) if numbers is None else
               (out_spec.index('N'), out_spec.index('C')))
  if name == 'AvgPool':
    return [AvgPoolFeatures(a['window_shape'], a['strides'], a['padding'],
                            a['normalize_edges'], a['batch_axis'],
                            a['channel_axis'])
           ], (a['batch_axis'], a['channel_axis'])
  if name == 'GlobalAvgPool':
    return ([GlobalAvgPoolFeatures(a['batch_axis'], a['channel_axis'])],
            _global_pool_layout(a['batch_axis'], a['channel_axis']))
  if name == 'Flatten':
    out = a['batch_axis_out'] % 2
    return ([FlattenFeatures(a['batch_axis'], a['batch_axis_out'])],
            (out, 1 - out))
  if name == 'LayerNorm':
    return [LayerNormFeatures(a['axis'], a['eps'], a['batch_axis'],
                              a['channel_axis'])
           ], (a['batch_axis'], a['channel_axis'])
  if name == 'Aggregate':
    return [AggregateFeatures(a['aggregate_axis'], a['batch_axis'],
                              a['channel_axis'], a['to_dense'],
                              a['implementation'])
           ], (a['batch_axis'], a['channel_axis'])
  dim, degree = options['feature_dim'], options['poly_degree']
  if name == 'Relu':
    return [ReluFeatures(options['relu_method'], dim, dim, dim,
                         8 if degree is None else degree, dim,
                         options['generate_rand_mtx'], b, c)], layout
  if name in ELEMENTWISE_LAYERS:
    fn = _activation(name, a, layer[1], where)
    # `stax` takes the derivative of a step as 0, not a delta.
    step = name == 'Sign' or (name == 'RectifiedMonomial' and
                              a['degree'] == 0)
    return [ElementwiseFeatures(fn, options['elementwise_method'],
                                16 if degree is None else degree, dim, dim,
                                generate_rand_mtx=options['generate_rand_mtx'],
                                batch_axis=b, channel_axis=c,
                                derivative_fn=jnp.zeros_like if step else None)
           ], layout
  raise _unsupported(name, where)


def _activation(name: str, args: Any, apply_fn: Callable, where: str
                ) -> Callable[[jax.Array], jax.Array]:
  """The elementwise function whose kernel the stax layer computes."""
  if name == 'Gelu':  # The kernel is the exact GELU's, whatever `apply_fn`.
    return functools.partial(jax.nn.gelu, approximate=False)
  if name in ('Elementwise', 'ElementwiseNumerical'):
    if args['fn'] is None:
      raise ValueError(
          f'`from_stax` cannot convert `stax.{name}(fn=None)` ({where}): '
          'features need the activation itself, not only its '
          'kernel. Pass `fn=` to `stax.Elementwise`.')
    return args['fn']
  return functools.partial(apply_fn, ())
