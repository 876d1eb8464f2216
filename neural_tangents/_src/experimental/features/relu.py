"""Features of the ReLU's NNGP and NTK: `ReluFeatures`.

`stax.Relu` maps the kernels, with `q`, `q'` the variances, `rho` the
correlation and the normalized arc-cosine kernels `kappa_0`, `kappa_1` (see
`arccos_polynomials`), as

  nngp'(x, x') = sqrt(q q') kappa_1(rho) / 2 = E[relu(w.f) relu(w.f')]
  ntk'(x, x')  = kappa_0(rho) / 2 * ntk(x, x') = E[step(w.f) step(w.f')] ntk

for `w ~ N(0, I)` and `f`, `f'` the NNGP features (`<f, f'> = nngp`, so
`w.f` has variance `q`). Features of a product of kernels are tensor
products of features, so

  nngp_feat' = phi_1(nngp_feat)
  ntk_feat'  = T(ntk_feat, phi_0(nngp_feat))

with `<phi_1(f), phi_1(f')> ~ nngp'`, `<phi_0(f), phi_0(f')> ~ kappa_0 / 2`
and `T` a tensor sketch (`sketches.tensor_srht`) of the row-wise tensor
products. The methods differ in `phi_0`, `phi_1` and `T`:

* 'RANDFEAT' (arc-cosine random features; Cho & Saul 2009, Zandieh et al.
  2021 "NTKRF"): with one Gaussian `W` of `max(feature_dim0, feature_dim1)`
  columns, `phi_1(f) = relu(f W[:, :m_1]) / sqrt(m_1)` and
  `phi_0(f) = step(f W[:, :m_0]) / sqrt(m_0)` (unbiased before the
  rescaling of rows below); relative error `O(1 / sqrt(m))`.
* 'POLYSKETCH' (Zandieh et al. 2021 "NTKSketch"; Han et al. 2022): the duals
  replaced by polynomials `sum_j c_j rho^j` with non-negative `c_j`
  (`arccos_polynomials`, degree `poly_degree`), of the unit rows
  `f / |f|`, and sketched by `sketches.polynomial_sketch` into
  `poly_sketch_dim + 1` features; the norms scale `phi_1` back:
  `phi_1(f) = |f| PolySketch(sqrt(c^(1) / 2); f / |f|)`,
  `phi_0(f) = PolySketch(sqrt(c^(0) / 2); f / |f|)`. Biased by the
  polynomial fit (small for `kappa_1`, a few percent for `kappa_0` near
  `rho = 1`).
* 'PSRF' (PolySketch and random features): `phi_1` of 'POLYSKETCH' (the
  smooth `kappa_1` is well fit by polynomials) and `phi_0` of 'RANDFEAT'
  (`kappa_0` has a cusp at `rho = 1`, which polynomials fit slowly).
* 'POLY': the polynomial fits of 'POLYSKETCH' without a sketch: the kernel
  matrices of the batch, `sqrt(q q') P_1(rho) / 2` and `P_0(rho) / 2 *
  ntk` with the fits `P_1`, `P_0` in place of the duals, factored as for
  'EXACT' (below): features of the whole batch, as many channels as rows,
  exact for the polynomial kernels (the meaning of 'POLY' in the sketching
  code proposed to Neural Tangents in 2022, which took a Cholesky factor).
* 'POLY_EXPLICIT': the same polynomial kernels as explicit tensor powers of
  dimension `1 + d + ... + d^p` (and `T` the exact Kronecker product):
  deterministic and batch-independent, for small `d` only (raises beyond
  2^22 channels).
* 'EXACT': the exact kernel matrices of the batch (rows are examples and
  positions), from `stax`'s own kernel map, factored by eigendecomposition
  (`gram`): `<feat, feat'>` equals `stax`'s kernel up to rounding, but the
  features depend on the whole batch (compute those of all inputs at once)
  and have as many channels as rows.

The tensor sketch `T` has `sketch_dim` coordinates. Before the first dense
layer the NTK is 0 (features with 0 channels), and stays so.

Memory per row: 'RANDFEAT' `O(m_0 + m_1 + sketch_dim)` plus the `d x m`
float32 matrix `W` (shared by all rows; `generate_rand_mtx=False` draws it
inside `feature_fn` from the key instead of storing it in the params);
'POLYSKETCH' `O(p (poly_sketch_dim + d))`, with params of
`O(p (d + poly_sketch_dim))` signs and indices. Time per row: `O(d m)` for
random features, `O(p (poly_sketch_dim log poly_sketch_dim + d log d))` for
the sketches.

Every random feature map and sketch rescales its rows to their exact norms
(`|f| / sqrt(2)` for `phi_1`, `1 / sqrt(2)` for `phi_0`, `|a| |b|` for
`T(a, b)`; `sketches.with_row_norms`): the kernel's diagonal is then exact
and errors do not compound through the norms of deep networks (a ratio
estimator: consistent, biased by `O(1 / m)`, with much less variance for
nearly parallel rows; it halved to thirded the NTK error of 4-layer networks
at `m = 4096`).
"""
import dataclasses
import enum
import functools
import math

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
from neural_tangents._src.experimental.features.feature_type import rows_of
from neural_tangents._src.experimental.features.gram import gram
from neural_tangents._src.experimental.features.gram import gram_features
from neural_tangents._src.stax.kernel_maps import relu_kernel_map
from neural_tangents._src.utils import arguments

Array = jax.Array

# The most channels 'POLY_EXPLICIT' forms.
MAX_EXPLICIT_CHANNELS = 1 << 22


class ReluFeaturesImplementation(str, enum.Enum):
  """How `ReluFeatures` approximates the arc-cosine kernels.

  Example:
    >>> ReluFeaturesImplementation('EXACT')
    <ReluFeaturesImplementation.EXACT: 'EXACT'>
  """
  RANDFEAT = 'RANDFEAT'
  POLYSKETCH = 'POLYSKETCH'
  PSRF = 'PSRF'
  POLY = 'POLY'
  POLY_EXPLICIT = 'POLY_EXPLICIT'
  EXACT = 'EXACT'


def trimmed(coefficients: np.ndarray) -> np.ndarray:
  """The coefficients up to the last nonzero one (at least one)."""
  nonzero = np.flatnonzero(coefficients)
  last = nonzero[-1] if nonzero.size else 0
  return coefficients[:last + 1]


def _check_dims(**dims) -> None:
  for name, value in dims.items():
    arguments.positive_int(value, name, f'Pass e.g. {name}=1024.',
                           layer_name='ReluFeatures')


def ReluFeatures(method: str = 'RANDFEAT',
                 feature_dim0: int = 1,
                 feature_dim1: int = 1,
                 sketch_dim: int = 1,
                 poly_degree: int = 8,
                 poly_sketch_dim: int = 1,
                 generate_rand_mtx: bool = True,
                 batch_axis: int = 0,
                 channel_axis: int = -1) -> FeatureLayer:
  """Features of `stax.Relu`'s NNGP and NTK (see the module docstring).

  Channels of the outputs (`d` the input's NNGP channels, `d_g` its NTK
  channels, `R` the rows: examples times positions):

    method          nngp_feat             ntk_feat
    RANDFEAT        feature_dim1          sketch_dim
    POLYSKETCH      poly_sketch_dim + 1   sketch_dim
    PSRF            poly_sketch_dim + 1   sketch_dim
    POLY            R                     R
    POLY_EXPLICIT   1 + d + ... + d^p     d_g (1 + d + ... + d^p)
    EXACT           R                     R

  (`ntk_feat` keeps 0 channels if it had 0: before the first dense layer.)
  `feature_dim0` is the number of random features of the derivative's dual
  (RANDFEAT, PSRF).

  Args:
    method: a `ReluFeaturesImplementation` or its name (any case).
    feature_dim0: random features of `kappa_0` (RANDFEAT, PSRF).
    feature_dim1: random features of `kappa_1` (RANDFEAT).
    sketch_dim: coordinates of the NTK's tensor sketch (RANDFEAT,
      POLYSKETCH, PSRF).
    poly_degree: degree of the polynomial fits (POLYSKETCH, PSRF, POLY,
      POLY_EXPLICIT).
    poly_sketch_dim: coordinates of each tensor power's sketch (POLYSKETCH,
      PSRF).
    generate_rand_mtx: True to draw the random matrices in `init_fn` and
      keep them in the params; False to keep only the key in the params and
      draw them in each `feature_fn` call (the same matrices: less memory
      held, more time).
    batch_axis: batch axis of the features.
    channel_axis: channel axis of the features.

  Returns:
    `(init_fn, feature_fn)`.

  Example:
    >>> from neural_tangents.experimental import features as ft
    >>> init_fn, feature_fn = ft.serial(
    ...     ft.DenseFeatures(1), ft.ReluFeatures('RANDFEAT', 256, 256, 256))
    >>> shapes, params = init_fn(random.PRNGKey(0), (-1, 4))
    >>> shapes
    ((-1, 256), (-1, 256))
    >>> feature_fn(jnp.ones((3, 4)), params).ntk_feat.shape
    (3, 256)
  """
  method = arguments.parse_enum(method, ReluFeaturesImplementation, 'method')
  _check_dims(feature_dim0=feature_dim0, feature_dim1=feature_dim1,
              sketch_dim=sketch_dim, poly_sketch_dim=poly_sketch_dim)
  arguments.positive_int(poly_degree, 'poly_degree', 'Pass e.g. '
                         'poly_degree=8.', layer_name='ReluFeatures')
  if not isinstance(generate_rand_mtx, (bool, np.bool_)):
    raise TypeError(f'`generate_rand_mtx` of `ReluFeatures` must be a bool; '
                    f'got {generate_rand_mtx!r}. Pass True or False.')
  c1 = trimmed(arccos_coefficients(1, poly_degree))
  c0 = trimmed(arccos_coefficients(0, poly_degree))
  # Coefficients of the kernels `kappa / 2`, as the features need them.
  config = ReluConfig(method, feature_dim0, feature_dim1, sketch_dim,
                      poly_sketch_dim, tuple(np.sqrt(c1 / 2)),
                      tuple(np.sqrt(c0 / 2)))
  p1, p0 = len(c1) - 1, len(c0) - 1

  def dims(d: int, d_g: int, rows: int) -> tuple[int, int]:
    """Channels of the output `(nngp_feat, ntk_feat)`."""
    if method == ReluFeaturesImplementation.RANDFEAT:
      out = feature_dim1, sketch_dim
    elif method in (ReluFeaturesImplementation.POLYSKETCH,
                    ReluFeaturesImplementation.PSRF):
      out = poly_sketch_dim + 1, sketch_dim
    elif method == ReluFeaturesImplementation.POLY_EXPLICIT:
      out = (sketches.explicit_polynomial_dim(d, p1),
             d_g * sketches.explicit_polynomial_dim(d, p0))
      if max(out) > MAX_EXPLICIT_CHANNELS:
        raise ValueError(
            f"`ReluFeatures(method='POLY_EXPLICIT', poly_degree="
            f'{poly_degree})` on features of {d} channels would form '
            f'{max(out)} channels of explicit tensor powers (more than '
            f"{MAX_EXPLICIT_CHANNELS}). Use method='POLY' (the same "
            "polynomial kernels factored on the batch), 'POLYSKETCH' "
            '(sketched powers), or a smaller `poly_degree` or input.')
    else:
      out = rows, rows
    return out[0], (out[1] if d_g else 0)

  def init_fn(key, input_shape):
    nngp_shape, ntk_shape = feature_shapes(input_shape, channel_axis)
    c = arguments.canonicalize_axis(channel_axis, len(nngp_shape),
                                    'channel_axis')
    d, d_g = nngp_shape[c], ntk_shape[c]
    out_nngp, out_ntk = dims(d, d_g, rows_of(nngp_shape, channel_axis))
    shapes = (replace_channels(nngp_shape, c, out_nngp),
              replace_channels(ntk_shape, c, out_ntk))
    if method not in RANDOM_METHODS:
      return shapes, ()
    key = arguments.prng_key(key, 'key')
    if not generate_rand_mtx:
      return shapes, key
    return shapes, draw_relu_params(key, config=config, d=d, d_g=d_g)

  def feature_fn(f, params, **kwargs) -> Features:
    del kwargs
    f = as_features(f, batch_axis, channel_axis, 'ReluFeatures')
    x, restore = channel_rows(f.nngp_feat, channel_axis)
    g, _ = channel_rows(f.ntk_feat.astype(x.dtype), channel_axis)
    if method not in RANDOM_METHODS:
      params = {}
    elif not isinstance(params, dict):
      params = draw_relu_params(arguments.prng_key(params, 'params'),
                                config=config, d=x.shape[1], d_g=g.shape[1])
    else:
      check_params(params, jax.eval_shape(
          functools.partial(draw_relu_params, config=config, d=x.shape[1],
                            d_g=g.shape[1]), KEY_SHAPE), 'ReluFeatures')
    nngp, ntk = relu_feature_rows(x, g, params, config=config)
    return f.replace(nngp_feat=restore(nngp), ntk_feat=restore(ntk))

  return init_fn, feature_fn


RANDOM_METHODS = (ReluFeaturesImplementation.RANDFEAT,
                  ReluFeaturesImplementation.POLYSKETCH,
                  ReluFeaturesImplementation.PSRF)


@dataclasses.dataclass(frozen=True)
class ReluConfig:
  """The static configuration of a `ReluFeatures` layer (hashable, so that
  layers of the same configuration share compiled functions).

  `root1`, `root0`: square roots of the polynomial coefficients of
  `kappa_1 / 2` and `kappa_0 / 2`.
  """
  method: ReluFeaturesImplementation
  feature_dim0: int
  feature_dim1: int
  sketch_dim: int
  poly_sketch_dim: int
  root1: tuple[float, ...]
  root0: tuple[float, ...]


@functools.partial(jax.jit, static_argnames=('config', 'd', 'd_g'))
def draw_relu_params(key: Array, config: ReluConfig, d: int, d_g: int
                     ) -> dict:
  """The random matrices of `config`'s method for `d` NNGP and `d_g` NTK
  input channels (float32 Gaussians suffice for random directions, and
  halve memory and time)."""
  method, m = config.method, config.poly_sketch_dim
  p1, p0 = len(config.root1) - 1, len(config.root0) - 1
  # Sizes and constructors of each random array, drawn from one stream of
  # bits.
  parts = {}
  if method in (ReluFeaturesImplementation.RANDFEAT,
                ReluFeaturesImplementation.PSRF):
    width = (max(config.feature_dim0, config.feature_dim1)
             if method == ReluFeaturesImplementation.RANDFEAT else
             config.feature_dim0)
    parts['W'] = (d * width,
                  lambda b: sketches.normal_from_bits(b, (d, width)))
    kappa0_dim = config.feature_dim0
  else:
    parts['kappa0'] = (
        sketches.polynomial_sketch_bit_count(p0, d, m),
        lambda b: sketches.polynomial_sketch_params_from_bits(b, p0, d, m))
    kappa0_dim = m + 1
  if method != ReluFeaturesImplementation.RANDFEAT:
    parts['kappa1'] = (
        sketches.polynomial_sketch_bit_count(p1, d, m),
        lambda b: sketches.polynomial_sketch_params_from_bits(b, p1, d, m))
  if d_g:
    sketch_dim = config.sketch_dim
    parts['ntk'] = (
        sketches.tensor_srht_bit_count(d_g, kappa0_dim, sketch_dim),
        lambda b: sketches.tensor_srht_params_from_bits(b, d_g, kappa0_dim,
                                                        sketch_dim))
  bits = sketches.split_bits(key, [size for size, _ in parts.values()])
  return {name: make(b) for (name, (_, make)), b in zip(parts.items(), bits)}


@functools.partial(jax.jit, static_argnames=('config',))
def relu_feature_rows(x: Array, g: Array, params: dict, config: ReluConfig
                      ) -> tuple[Array, Array]:
  """`(nngp_feat', ntk_feat')` rows of NNGP rows `x` `(R, d)` and NTK rows
  `g` `(R, d_g)` (see the module docstring)."""
  method = config.method
  rows = x.shape[0]
  if method in (ReluFeaturesImplementation.EXACT,
                ReluFeaturesImplementation.POLY):
    k = gram(x)
    q = jnp.diagonal(k)
    if method == ReluFeaturesImplementation.EXACT:
      nngp, dot = relu_kernel_map(q[:, None], q[None, :], k, True)
    else:
      nngp, dot = polynomial_relu_kernels(k, q, config)
    return (gram_features(nngp),
            gram_features(dot * gram(g)) if g.shape[1] else g)

  if method in (ReluFeaturesImplementation.RANDFEAT,
                ReluFeaturesImplementation.PSRF):
    projection = x @ params['W'].astype(x.dtype)
    positive = projection > 0
    # Random features rescaled to the exact norms of the kernel's diagonal
    # (`kappa_0(1) / 2 = 1/2`, `|x|^2 / 2`): a ratio estimator whose errors
    # do not compound through the norms of deep networks.
    kappa0 = sketches.with_row_norms(
        positive[:, :config.feature_dim0].astype(x.dtype),
        jnp.full((rows, 1), math.sqrt(0.5), x.dtype))
  if method == ReluFeaturesImplementation.RANDFEAT:
    nngp = sketches.with_row_norms(
        jax.nn.relu(projection[:, :config.feature_dim1]),
                                   sketches.row_norms(x) / math.sqrt(2))
  else:
    unit, norm = sketches.unit_rows(x)
    # 'POLY_EXPLICIT' has no params: `None` gives the exact tensor powers.
    nngp = sketches.polynomial_sketch(
        jnp.asarray(config.root1, x.dtype)[None, :] * norm, unit,
        params.get('kappa1'))
    if method != ReluFeaturesImplementation.PSRF:
      kappa0 = sketches.polynomial_sketch(
          jnp.broadcast_to(jnp.asarray(config.root0, x.dtype)[None, :],
                           (rows, len(config.root0))), unit,
          params.get('kappa0'))
  if not g.shape[1]:
    ntk = g
  elif method == ReluFeaturesImplementation.POLY_EXPLICIT:
    ntk = sketches.kron_rows(g, kappa0)
  else:
    ntk = sketches.tensor_srht(g, kappa0, params['ntk'])
  return nngp, ntk


def polynomial_relu_kernels(k: Array, q: Array, config: ReluConfig
                            ) -> tuple[Array, Array]:
  """The ReLU's NNGP `sqrt(q q') P_1(rho) / 2` and derivative kernel
  `P_0(rho) / 2` of the `(R, R)` NNGP `k` with diagonal `q`, the polynomial
  fits `P` in place of the arc-cosine duals (rows of zero variance have
  `rho = 0`)."""
  norm = jnp.sqrt(jnp.maximum(q, 0))
  scale = norm[:, None] * norm[None, :]
  positive = scale > 0
  rho = jnp.clip(k / jnp.where(positive, scale, 1), -1, 1)
  rho = jnp.where(positive, rho, 0)

  def half_polynomial(root):  # `sum_j root_j^2 rho^j = P(rho) / 2`.
    out = jnp.zeros_like(rho)
    for r in reversed(root):
      out = out * rho + r**2
    return out

  return (scale * half_polynomial(config.root1),
          half_polynomial(config.root0))
