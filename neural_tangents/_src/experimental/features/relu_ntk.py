"""One-pass sketch of a deep ReLU network's NTK: `ReluNTKFeatures`.

The NTKSketch of Zandieh et al. (2021, arXiv 2106.07880, section 4), for the
`stax` network of `L = num_layers` hidden ReLU layers

  serial(*[Dense(1, W_std, b_std), Relu()] * L, Dense(1, W_std, b_std))

(every dense layer, the readout included, with the same `W_std` and
`b_std`; `W_std=1`, `b_std=0` by default). Its kernels follow `stax`'s
recursion: with `F^(h)` NNGP features of the `h`-th dense layer's outputs
(`<F^(h)(x), F^(h)(x')> = nngp^(h)`), `q^(h) = |F^(h)|^2` the variances and
`u^(h) = F^(h) / |F^(h)|` the unit rows (whose inner products are the
correlations `rho^(h)`), and the arc-cosine duals `kappa_0`, `kappa_1` of
`arccos_polynomials`:

  F^(1) = [W_std x / sqrt(d), b_std]
  nngp^(h+1) = W_std^2 sqrt(q q') kappa_1(rho^(h)) / 2 + b_std^2
  ntk^(h+1)  = nngp^(h+1) + W_std^2 kappa_0(rho^(h)) / 2 ntk^(h)

(`ntk^(1) = nngp^(1)`), whose features are

  F^(h+1) = [W_std |F^(h)| / sqrt(2) PolySketch(P_1; u^(h)), b_std]
  G^(h+1) = [W_std / sqrt(2) TensorSRHT(G^(h), PolySketch(P_0; u^(h))),
             F^(h+1)]

with `P_1`, `P_0` the polynomial fits of `kappa_1`, `kappa_0` of degree
`poly_degree` (non-negative coefficients), sketched by
`sketches.polynomial_sketch` (PolySketch) into `poly_sketch_dim + 1`
coordinates; the outputs are `F^(L+1)` and `G^(L+1)` (the bias channel only
when `b_std != 0`). Every sketch is rescaled to the exact norm of the
kernel's diagonal (`kappa_0(1) = kappa_1(1) = 1`), as in `relu`, so the
diagonals of both kernels are exact. Unlike a chain of `DenseFeatures` and
`ReluFeatures`, the NTK features do not grow with the dense layers'
concatenations: `2 poly_sketch_dim + 1` channels (plus the bias) throughout.

Without biases the kernels are `|x| |x'| / d` times the normalized
recursion of the paper, `K^(0) = Theta^(0) = rho`, `K^(h) =
kappa_1(K^(h-1))`, `Theta^(h) = Theta^(h-1) kappa_0(K^(h-1)) + K^(h)`, scaled
by `W_std^2 (W_std^2 / 2)^L` (1 for the He-scaled hidden layers
`W_std = sqrt(2)` with a readout of `W_std = 1`).
"""
import functools
import math
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.experimental.features import sketches
from neural_tangents._src.experimental.features.arccos_polynomials import arccos_coefficients
from neural_tangents._src.experimental.features.feature_type import as_features
from neural_tangents._src.experimental.features.feature_type import channel_rows
from neural_tangents._src.experimental.features.feature_type import check_params
from neural_tangents._src.experimental.features.feature_type import KEY_SHAPE
from neural_tangents._src.experimental.features.feature_type import feature_shapes
from neural_tangents._src.experimental.features.feature_type import FeatureLayer
from neural_tangents._src.experimental.features.feature_type import Features
from neural_tangents._src.experimental.features.feature_type import replace_channels
from neural_tangents._src.experimental.features.relu import trimmed
from neural_tangents._src.utils import arguments

Array = jax.Array


def ReluNTKFeatures(num_layers: int,
                    poly_degree: int = 16,
                    poly_sketch_dim: int = 1024,
                    batch_axis: int = 0,
                    channel_axis: int = -1,
                    *,
                    W_std: float = 1.,
                    b_std: Optional[float] = 0.) -> FeatureLayer:
  """Sketched NNGP and NTK features of a whole deep ReLU network, in one layer.

  The network is `stax.serial(*[stax.Dense(1, W_std, b_std), stax.Relu()] *
  num_layers, stax.Dense(1, W_std, b_std))` (see the module docstring for its
  kernels and the sketch). The layer takes raw inputs (or their `Features`
  before any dense layer, with an empty NTK) and returns features of
  `poly_sketch_dim + 1` (NNGP) and `2 poly_sketch_dim + 1` (NTK) channels,
  one more each when `b_std != 0`. Time per row `O(L p (m log m + d log
  d))`, params `O(L p (d + m))` signs and indices (`L = num_layers`,
  `p = poly_degree`, `m = poly_sketch_dim`, `d` the input channels). The
  relative Frobenius error falls as `m^(-1/2)` down to the polynomial fits'
  bias (see `docs/features.md`).

  Args:
    num_layers: the number `L >= 1` of hidden ReLU layers.
    poly_degree: the degree of the polynomial fits of the arc-cosine duals.
    poly_sketch_dim: the coordinates `m` of each sketch.
    batch_axis: batch axis of the inputs.
    channel_axis: channel axis of the inputs.
    W_std: the weight standard deviation of every dense layer (keyword
      only; `sqrt(2)` for He-scaled layers).
    b_std: the bias standard deviation of every dense layer (keyword only;
      0 or None for no bias).

  Returns:
    `(init_fn, feature_fn)`.

  Example:
    >>> from neural_tangents.experimental import features as ft
    >>> init_fn, feature_fn = ft.ReluNTKFeatures(2, poly_sketch_dim=4096,
    ...                                          W_std=1.5, b_std=0.1)
    >>> _, params = init_fn(random.PRNGKey(0), x1.shape)
    >>> f = feature_fn(x1, params)
    >>> f.ntk_feat.shape
    (3, 8194)
    >>> _, _, kernel_fn = stax.serial(
    ...     *[stax.Dense(1, 1.5, 0.1), stax.Relu()] * 2, stax.Dense(1, 1.5, 0.1))
    >>> ntk = kernel_fn(x1, None, 'ntk')
    >>> error = jnp.linalg.norm(f.ntk_feat @ f.ntk_feat.T - ntk)
    >>> bool(error < 0.1 * jnp.linalg.norm(ntk))
    True
  """
  for name, value, example in (('num_layers', num_layers, 2),
                               ('poly_degree', poly_degree, 16),
                               ('poly_sketch_dim', poly_sketch_dim, 1024)):
    arguments.positive_int(value, name, f'Pass e.g. {name}={example}.',
                           layer_name='ReluNTKFeatures')
  w_std, b_std = _standard_deviations(W_std, b_std)
  root1 = tuple(np.sqrt(trimmed(arccos_coefficients(1, poly_degree))))
  root0 = tuple(np.sqrt(trimmed(arccos_coefficients(0, poly_degree))))
  config = (num_layers, poly_sketch_dim, root1, root0, w_std, b_std)
  bias = int(b_std != 0)

  def init_fn(key, input_shape):
    nngp_shape, ntk_shape = feature_shapes(input_shape, channel_axis)
    c = arguments.canonicalize_axis(channel_axis, len(nngp_shape),
                                    'channel_axis')
    _check_no_ntk(ntk_shape[c])
    m = poly_sketch_dim
    shapes = (replace_channels(nngp_shape, c, m + 1 + bias),
              replace_channels(nngp_shape, c, 2 * m + 1 + bias))
    key = arguments.prng_key(key, 'key')
    return shapes, draw_relu_ntk_params(key, config=config, d=nngp_shape[c])

  def feature_fn(f, params, **kwargs) -> Features:
    del kwargs
    f = as_features(f, batch_axis, channel_axis, 'ReluNTKFeatures')
    c = arguments.canonicalize_axis(channel_axis, f.ntk_feat.ndim,
                                    'channel_axis')
    _check_no_ntk(f.ntk_feat.shape[c])
    x, restore = channel_rows(f.nngp_feat, channel_axis)
    check_params(params, jax.eval_shape(functools.partial(
        draw_relu_ntk_params, config=config, d=x.shape[1]), KEY_SHAPE),
                 'ReluNTKFeatures')
    nngp, ntk = relu_ntk_rows(x, params, config=config)
    return f.replace(nngp_feat=restore(nngp), ntk_feat=restore(ntk))

  return init_fn, feature_fn


def _standard_deviations(w_std, b_std) -> tuple[float, float]:
  """`(W_std, b_std)` as floats (`b_std=None` is 0), or a `ValueError`."""
  arguments.real_number(w_std, 'W_std', 'Pass e.g. `W_std=1.` (or '
                        '`2**0.5` for He-scaled layers).',
                        layer_name='ReluNTKFeatures')
  arguments.real_number(b_std, 'b_std', 'Pass e.g. `b_std=0.1`, or 0 for '
                        'no bias.', layer_name='ReluNTKFeatures',
                        allow_none=True)
  b_std = 0. if b_std is None else float(b_std)
  for name, value in (('W_std', float(w_std)), ('b_std', b_std)):
    if not math.isfinite(value):
      raise ValueError(f'`{name}` of `ReluNTKFeatures` must be finite; got '
                       f'{value!r}. Pass e.g. `{name}=1.`.')
  # The kernels depend on the variances only: the sign is irrelevant.
  return abs(float(w_std)), abs(b_std)


def _check_no_ntk(channels: int) -> None:
  if channels:
    raise ValueError(
        '`ReluNTKFeatures` is a whole network from its inputs: it takes raw '
        f'inputs, but got features with {channels} NTK channels (after a '
        'dense or convolutional layer). Apply it to the inputs, or use '
        '`DenseFeatures` and `ReluFeatures` layer by layer.')


@functools.partial(jax.jit, static_argnames=('config', 'd'))
def draw_relu_ntk_params(key: Array, config: tuple, d: int) -> list[dict]:
  """The sketches of each layer, for inputs of `d` channels (one draw)."""
  num_layers, m, root1, root0, _, b_std = config
  p1, p0 = len(root1) - 1, len(root0) - 1
  bias = int(b_std != 0)
  sizes, makers = [], []
  for h in range(num_layers):
    d_in, d_psi = ((d + bias, d + bias) if h == 0 else
                   (m + 1 + bias, 2 * m + 1 + bias))
    sizes += [sketches.polynomial_sketch_bit_count(p1, d_in, m),
              sketches.polynomial_sketch_bit_count(p0, d_in, m),
              sketches.tensor_srht_bit_count(d_psi, m + 1, m)]
    makers += [
        functools.partial(sketches.polynomial_sketch_params_from_bits,
                          degree=p1, dim=d_in, sketch_dim=m),
        functools.partial(sketches.polynomial_sketch_params_from_bits,
                          degree=p0, dim=d_in, sketch_dim=m),
        functools.partial(sketches.tensor_srht_params_from_bits, dim1=d_psi,
                          dim2=m + 1, out_dim=m)]
  parts = [make(bits) for make, bits in
           zip(makers, sketches.split_bits(key, sizes))]
  return [dict(kappa1=parts[3 * h], kappa0=parts[3 * h + 1],
               ntk=parts[3 * h + 2]) for h in range(num_layers)]


@functools.partial(jax.jit, static_argnames=('config',))
def relu_ntk_rows(x: Array, params: list[dict], config: tuple
                  ) -> tuple[Array, Array]:
  """`(nngp_feat, ntk_feat)` rows of input feature rows `x` `(R, d)`
  (`x / sqrt(d)` of the raw inputs; see the module docstring)."""
  _, _, root1, root0, w_std, b_std = config
  rows = x.shape[0]
  with_bias = lambda a: (a if b_std == 0 else jnp.concatenate(
      [a, jnp.full((rows, 1), b_std, x.dtype)], axis=1))
  ones = jnp.ones((rows, 1), x.dtype)
  coefficients = lambda root: jnp.broadcast_to(
      jnp.asarray(root, x.dtype)[None, :], (rows, len(root)))
  nngp = with_bias(w_std * x)  # The first dense layer's `F^(1)`.
  ntk = nngp
  for layer in params:
    unit, norm = sketches.unit_rows(nngp)
    kappa1 = sketches.with_row_norms(
        sketches.polynomial_sketch(coefficients(root1), unit,
                                   layer['kappa1']), ones)
    kappa0 = sketches.with_row_norms(
        sketches.polynomial_sketch(coefficients(root0), unit,
                                   layer['kappa0']), ones)
    nngp = with_bias(w_std / math.sqrt(2) * norm * kappa1)
    ntk = jnp.concatenate(
        [w_std / math.sqrt(2) * sketches.tensor_srht(ntk, kappa0,
                                                     layer['ntk']), nngp],
        axis=1)
  # Zero rows (zero inputs without bias) have zero features.
  return nngp, ntk
