"""One-pass sketch of a deep ReLU network's NTK: `ReluNTKFeatures`.

The NTKSketch of Zandieh et al. (2021, arXiv 2106.07880, section 4). For
inputs on the unit sphere with correlation `rho`, the NNGP `K^(h)` and NTK
`Theta^(h)` of `h` ReLU layers follow the arc-cosine duals (`kappa_0`,
`kappa_1` of `arccos_polynomials`):

  K^(0) = Theta^(0) = rho
  K^(h) = kappa_1(K^(h-1))
  Theta^(h) = Theta^(h-1) kappa_0(K^(h-1)) + K^(h)

These are the kernels of the `stax` network

  serial(*[Dense(1, W_std=sqrt(2)), Relu()] * num_layers, Dense(1))

(He-scaled hidden layers, readout `W_std=1`, no biases): for inputs `x`,
`x'` of `d` channels its NNGP is `|x| |x'| / d * K^(L)(rho)` and its NTK
`|x| |x'| / d * Theta^(L)(rho)`, with `rho = <x, x'> / (|x| |x'|)`
(`Dense(W_std=sqrt(2))` doubles the variance that `Relu` halves, so every
layer's correlation is the dual of the previous one).

The sketch replaces `kappa_1` and `kappa_0` by the polynomial fits
`P_1`, `P_0` of degree `poly_degree` with non-negative coefficients and
sketches them with `sketches.polynomial_sketch` (PolySketch) of
`poly_sketch_dim` coordinates, from the unit input rows `u`:

  phi^(0) = psi^(0) = u
  phi^(h) = PolySketch(P_1; phi^(h-1))
  psi^(h) = [TensorSRHT(psi^(h-1), PolySketch(P_0; phi^(h-1))), phi^(h)]

so that `<phi^(L), phi'^(L)> ~ K^(L)` and `<psi^(L), psi'^(L)> ~
Theta^(L)`, and the features are `|x| / sqrt(d)` times them. Every sketch
is rescaled to the exact norm of the kernel's diagonal (`K^(h)(1) =
kappa_0(1) = 1`, `Theta^(h)(1) = h + 1`), as in `relu`. Unlike a chain of
`DenseFeatures` and `ReluFeatures`, the NTK features do not grow with the
readout layers' concatenations: `2 poly_sketch_dim + 1` channels throughout.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.experimental.features import sketches
from neural_tangents._src.experimental.features.arccos_polynomials import arccos_coefficients
from neural_tangents._src.experimental.features.feature_type import as_features
from neural_tangents._src.experimental.features.feature_type import channel_rows
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
                    channel_axis: int = -1) -> FeatureLayer:
  """Sketched NNGP and NTK features of a whole deep ReLU network, in one layer.

  The network is `stax.serial(*[stax.Dense(1, W_std=sqrt(2)), stax.Relu()] *
  num_layers, stax.Dense(1))` (no biases; see the module docstring for its
  kernels and the sketch). The layer takes raw inputs (or their
  `Features` before any dense layer, with an empty NTK) and returns features
  of `poly_sketch_dim + 1` (NNGP) and `2 poly_sketch_dim + 1` (NTK)
  channels. Time per row `O(L p (m log m + d log d))`, params
  `O(L p (d + m))` signs and indices (`L = num_layers`, `p = poly_degree`,
  `m = poly_sketch_dim`, `d` the input channels). The relative Frobenius
  error falls as `m^(-1/2)` down to the polynomial fits' bias (see
  `docs/features.md`).

  Args:
    num_layers: the number `L >= 1` of hidden ReLU layers.
    poly_degree: the degree of the polynomial fits of the arc-cosine duals.
    poly_sketch_dim: the coordinates `m` of each sketch.
    batch_axis: batch axis of the inputs.
    channel_axis: channel axis of the inputs.

  Returns:
    `(init_fn, feature_fn)`.

  Example:
    >>> from neural_tangents.experimental import features as ft
    >>> init_fn, feature_fn = ft.ReluNTKFeatures(2, poly_sketch_dim=4096)
    >>> _, params = init_fn(random.PRNGKey(0), x1.shape)
    >>> f = feature_fn(x1, params)
    >>> f.ntk_feat.shape
    (3, 8193)
    >>> _, _, kernel_fn = stax.serial(
    ...     *[stax.Dense(1, W_std=2**0.5), stax.Relu()] * 2, stax.Dense(1))
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
  root1 = tuple(np.sqrt(trimmed(arccos_coefficients(1, poly_degree))))
  root0 = tuple(np.sqrt(trimmed(arccos_coefficients(0, poly_degree))))
  config = (num_layers, poly_sketch_dim, root1, root0)

  def init_fn(key, input_shape):
    nngp_shape, ntk_shape = feature_shapes(input_shape, channel_axis)
    c = arguments.canonicalize_axis(channel_axis, len(nngp_shape),
                                    'channel_axis')
    _check_no_ntk(ntk_shape[c])
    m = poly_sketch_dim
    shapes = (replace_channels(nngp_shape, c, m + 1),
              replace_channels(nngp_shape, c, 2 * m + 1))
    key = arguments.prng_key(key, 'key')
    return shapes, draw_relu_ntk_params(key, config=config, d=nngp_shape[c])

  def feature_fn(f, params, **kwargs) -> Features:
    del kwargs
    f = as_features(f, batch_axis, channel_axis, 'ReluNTKFeatures')
    c = arguments.canonicalize_axis(channel_axis, f.ntk_feat.ndim,
                                    'channel_axis')
    _check_no_ntk(f.ntk_feat.shape[c])
    x, restore = channel_rows(f.nngp_feat, channel_axis)
    nngp, ntk = relu_ntk_rows(x, params, config=config)
    return f.replace(nngp_feat=restore(nngp), ntk_feat=restore(ntk))

  return init_fn, feature_fn


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
  num_layers, m, root1, root0 = config
  p1, p0 = len(root1) - 1, len(root0) - 1
  sizes, makers = [], []
  for h in range(num_layers):
    d_in, d_psi = (d, d) if h == 0 else (m + 1, 2 * m + 1)
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
  """`(nngp_feat, ntk_feat)` rows of input rows `x` `(R, d)`."""
  _, _, root1, root0 = config
  rows = x.shape[0]
  phi, norm = sketches.unit_rows(x)
  psi = phi
  ones = jnp.ones((rows, 1), x.dtype)
  coefficients = lambda root: jnp.broadcast_to(
      jnp.asarray(root, x.dtype)[None, :], (rows, len(root)))
  for layer in params:
    kappa0 = sketches.with_row_norms(
        sketches.polynomial_sketch(coefficients(root0), phi, layer['kappa0']),
        ones)
    new_phi = sketches.with_row_norms(
        sketches.polynomial_sketch(coefficients(root1), phi, layer['kappa1']),
        ones)
    psi = jnp.concatenate([sketches.tensor_srht(psi, kappa0, layer['ntk']),
                           new_phi], axis=1)
    phi = new_phi
  # Zero inputs have zero features (`unit_rows` keeps them zero).
  return norm * phi, norm * psi

