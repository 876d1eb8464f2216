"""Features of any elementwise nonlinearity: `ElementwiseFeatures`.

By the Hermite expansion of the activation (`hermite`), with `f`, `f'` the
NNGP features of two inputs, `sigma = |f|` (the pre-activation's standard
deviation) and `rho = <f, f'> / (|f| |f'|)`,

  nngp'(x, x') = E[phi(u) phi(v)]   = sum_k a_k(sigma) a_k(sigma') rho^k
  ntk'(x, x')  = E[phi'(u) phi'(v)] ntk(x, x')
               = sum_k b_k(sigma) b_k(sigma') rho^k ntk(x, x')

(Han et al. 2022, arXiv 2209.04121), truncated at degree `poly_degree`.
Each series is the kernel of the features `sketches.polynomial_sketch(A,
f / |f|)` (per-row coefficients `A_k = a_k(sigma)`, of any sign), and the
NTK's product a tensor sketch, as in `relu`. The norms of the inputs are
handled exactly (the coefficients are computed at each row's `sigma`), so
inputs need not be normalized; the only approximations are the truncation
(geometric in the degree for smooth activations such as `erf` or `gelu`,
slow for kinks: prefer `ReluFeatures` for the ReLU), the quadrature, and the
sketches.
"""
import enum
import functools
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.experimental.features import sketches
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
from neural_tangents._src.experimental.features.hermite import derivative_coefficients
from neural_tangents._src.experimental.features.hermite import hermite_coefficients
from neural_tangents._src.utils import arguments

Array = jax.Array


class ElementwiseFeaturesImplementation(str, enum.Enum):
  """How `ElementwiseFeatures` forms the truncated Hermite series.

  * `POLYSKETCH`: sketched tensor powers (`poly_sketch_dim + 1` channels).
  * `POLY`: the truncated series evaluated on the batch's kernel matrix and
    factored (as many channels as rows), as the sketching code proposed to
    Neural Tangents in 2022 meant by 'POLY'; the same features as `EXACT`.
  * `POLY_EXPLICIT`: explicit tensor powers (`1 + d + ... + d^p` channels;
    small `d`).
  * `EXACT`: the truncated series evaluated on the batch's kernel matrix and
    factored (as many channels as rows; exact up to the truncation).

  Example:
    >>> ElementwiseFeaturesImplementation('POLYSKETCH')
    <ElementwiseFeaturesImplementation.POLYSKETCH: 'POLYSKETCH'>
  """
  POLYSKETCH = 'POLYSKETCH'
  POLY = 'POLY'
  POLY_EXPLICIT = 'POLY_EXPLICIT'
  EXACT = 'EXACT'


def series_matrix(left: Array, right: Array, rho: Array) -> Array:
  """`sum_k left[:, k] right[:, k]^T * rho^k` (elementwise powers).

  Args:
    left, right: `(R, p + 1)` coefficients.
    rho: `(R, R)` correlations.
  """
  degree = left.shape[1] - 1
  out = left[:, degree:] @ right[:, degree:].T
  for k in reversed(range(degree)):
    out = left[:, k:k + 1] @ right[:, k:k + 1].T + rho * out
  return out


def ElementwiseFeatures(fn: Callable[[Array], Array],
                        method: str = 'POLYSKETCH',
                        poly_degree: int = 16,
                        poly_sketch_dim: int = 1024,
                        sketch_dim: int = 1024,
                        n_quadrature: int = 200,
                        generate_rand_mtx: bool = True,
                        batch_axis: int = 0,
                        channel_axis: int = -1,
                        *,
                        derivative_fn: Optional[Callable[[Array], Array]] = None
                        ) -> FeatureLayer:
  """Features of the NNGP and NTK of an elementwise `fn` (see the module).

  Output channels: `poly_sketch_dim + 1` NNGP and `sketch_dim` NTK features
  for 'POLYSKETCH'; `1 + d + ... + d^p` and `d_g` times that for
  'POLY_EXPLICIT'; the number of rows (examples times positions) for
  'EXACT' and 'POLY'. The NTK keeps 0
  channels before the first dense layer.

  Args:
    fn: the activation, a JAX function applied elementwise (e.g.
      `jax.scipy.special.erf`, `jax.nn.gelu`, `jnp.sin`).
    method: an `ElementwiseFeaturesImplementation` or its name.
    poly_degree: the degree at which the Hermite series are truncated.
    poly_sketch_dim: coordinates of each tensor power's sketch.
    sketch_dim: coordinates of the NTK's tensor sketch.
    n_quadrature: Gauss-Hermite nodes of the coefficients.
    generate_rand_mtx: draw the sketches in `init_fn` (True) or from the key
      in each `feature_fn` call (False), as `ReluFeatures`.
    batch_axis: batch axis of the features.
    channel_axis: channel axis of the features.
    derivative_fn: the derivative whose dual the NTK uses (keyword only).
      None: `fn`'s, from its Hermite coefficients (the derivative in the
      sense of distributions: a jump of `fn` is a delta, whose series
      diverges). `stax.Sign` and `stax.RectifiedMonomial(0)` take the
      derivative of their steps as 0 (that of a finite network's gradient
      almost everywhere): pass `jnp.zeros_like`, as `from_stax` does.

  Returns:
    `(init_fn, feature_fn)`.

  Example:
    >>> from neural_tangents.experimental import features as ft
    >>> init_fn, feature_fn = ft.serial(
    ...     ft.DenseFeatures(1),
    ...     ft.ElementwiseFeatures(jax.scipy.special.erf, 'EXACT', 24))
    >>> _, params = init_fn(random.PRNGKey(0), x1.shape)
    >>> f = feature_fn(x1, params)
    >>> _, _, kernel_fn = stax.serial(stax.Dense(1), stax.Erf())
    >>> bool(jnp.allclose(f.nngp_feat @ f.nngp_feat.T,
    ...                   kernel_fn(x1, None, 'nngp'), atol=1e-3))
    True
  """
  arguments.callable_arg(fn, 'fn', 'Pass an activation, e.g. '
                         '`ElementwiseFeatures(jax.nn.gelu)`.')
  method = arguments.parse_enum(method, ElementwiseFeaturesImplementation,
                                'method')
  for name, value in (('poly_degree', poly_degree),
                      ('poly_sketch_dim', poly_sketch_dim),
                      ('sketch_dim', sketch_dim),
                      ('n_quadrature', n_quadrature)):
    arguments.positive_int(value, name, f'Pass e.g. {name}=16.',
                           layer_name='ElementwiseFeatures')
  if n_quadrature < poly_degree + 2:
    raise ValueError(
        f'`n_quadrature={n_quadrature}` of `ElementwiseFeatures` is too few '
        f'nodes for `poly_degree={poly_degree}`. Pass at least '
        f'n_quadrature={poly_degree + 2} (e.g. 200).')
  if derivative_fn is not None:
    arguments.callable_arg(derivative_fn, 'derivative_fn', 'Pass the '
                           "activation's derivative, e.g. `jnp.zeros_like` "
                           'for a step, or None.')
  if not isinstance(generate_rand_mtx, (bool, np.bool_)):
    raise TypeError(f'`generate_rand_mtx` of `ElementwiseFeatures` must be a '
                    f'bool; got {generate_rand_mtx!r}. Pass True or False.')
  p, m = poly_degree, poly_sketch_dim

  def dims(d: int, d_g: int, rows: int) -> tuple[int, int]:
    if method == ElementwiseFeaturesImplementation.POLYSKETCH:
      out = m + 1, sketch_dim
    elif method == ElementwiseFeaturesImplementation.POLY_EXPLICIT:
      explicit = sketches.explicit_polynomial_dim(d, p)
      out = explicit, d_g * explicit
      if max(out) > 1 << 22:
        raise ValueError(
            f"`ElementwiseFeatures(method='POLY_EXPLICIT', poly_degree={p})` "
            f'on features of {d} channels would form {max(out)} channels of '
            "explicit tensor powers. Use method='POLY' (the same series "
            "factored on the batch), 'POLYSKETCH', or a smaller "
            '`poly_degree` or input.')
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
    if method != ElementwiseFeaturesImplementation.POLYSKETCH:
      return shapes, ()
    key = arguments.prng_key(key, 'key')
    if not generate_rand_mtx:
      return shapes, key
    return shapes, draw_elementwise_params(key, degree=p, sketch_dim=m,
                                           ntk_sketch_dim=sketch_dim, d=d,
                                           d_g=d_g)

  def feature_fn(f, params, **kwargs) -> Features:
    del kwargs
    f = as_features(f, batch_axis, channel_axis, 'ElementwiseFeatures')
    x, restore = channel_rows(f.nngp_feat, channel_axis)
    g, _ = channel_rows(f.ntk_feat.astype(x.dtype), channel_axis)
    if method != ElementwiseFeaturesImplementation.POLYSKETCH:
      params = {}
    elif not isinstance(params, dict):
      params = draw_elementwise_params(
          arguments.prng_key(params, 'params'), degree=p, sketch_dim=m,
          ntk_sketch_dim=sketch_dim, d=x.shape[1], d_g=g.shape[1])
    else:
      check_params(params, jax.eval_shape(functools.partial(
          draw_elementwise_params, degree=p, sketch_dim=m,
          ntk_sketch_dim=sketch_dim, d=x.shape[1], d_g=g.shape[1]),
                                          KEY_SHAPE), 'ElementwiseFeatures')
    nngp, ntk = elementwise_feature_rows(x, g, params, fn=fn, method=method,
                                         degree=p, n_quadrature=n_quadrature,
                                         derivative_fn=derivative_fn)
    return f.replace(nngp_feat=restore(nngp), ntk_feat=restore(ntk))

  return init_fn, feature_fn


@functools.partial(jax.jit, static_argnames=('degree', 'sketch_dim',
                                             'ntk_sketch_dim', 'd', 'd_g'))
def draw_elementwise_params(key: Array, degree: int, sketch_dim: int,
                            ntk_sketch_dim: int, d: int, d_g: int) -> dict:
  """The sketches of 'POLYSKETCH' for `d` NNGP and `d_g` NTK channels."""
  poly_bits = sketches.polynomial_sketch_bit_count(degree, d, sketch_dim)
  ntk_bits = (sketches.tensor_srht_bit_count(d_g, sketch_dim + 1,
                                             ntk_sketch_dim) if d_g else 0)
  phi, dphi, ntk = sketches.split_bits(key, [poly_bits, poly_bits, ntk_bits])
  params = dict(
      phi=sketches.polynomial_sketch_params_from_bits(phi, degree, d,
                                                      sketch_dim),
      dphi=sketches.polynomial_sketch_params_from_bits(dphi, degree, d,
                                                       sketch_dim))
  if d_g:
    params['ntk'] = sketches.tensor_srht_params_from_bits(
        ntk, d_g, sketch_dim + 1, ntk_sketch_dim)
  return params


@functools.partial(jax.jit, static_argnames=('fn', 'method', 'degree',
                                             'n_quadrature', 'derivative_fn'))
def elementwise_feature_rows(
    x: Array, g: Array, params: dict, fn: Callable[[Array], Array],
    method: ElementwiseFeaturesImplementation, degree: int, n_quadrature: int,
    derivative_fn: Optional[Callable[[Array], Array]] = None
) -> tuple[Array, Array]:
  """`(nngp_feat', ntk_feat')` rows of NNGP rows `x` `(R, d)` and NTK rows
  `g` `(R, d_g)` (see the module docstring)."""
  unit, sigma = sketches.unit_rows(x)
  a = hermite_coefficients(fn, sigma, degree, n_quadrature)
  has_ntk = g.shape[1] > 0
  if not has_ntk:
    b = None
  elif derivative_fn is None:
    b = derivative_coefficients(fn, sigma, degree, n_quadrature)
  else:
    b = hermite_coefficients(derivative_fn, sigma, degree, n_quadrature)

  if method in (ElementwiseFeaturesImplementation.EXACT,
                ElementwiseFeaturesImplementation.POLY):
    rho = jnp.clip(gram(unit), -1, 1)
    nngp = gram_features(series_matrix(a, a, rho))
    ntk = (gram_features(series_matrix(b, b, rho) * gram(g)) if has_ntk
           else g)
    return nngp, ntk

  # 'POLY_EXPLICIT' has no params: `None` gives the exact tensor powers.
  nngp = sketches.polynomial_sketch(a, unit, params.get('phi'))
  if not has_ntk:
    return nngp, g
  dphi = sketches.polynomial_sketch(b, unit, params.get('dphi'))
  if method == ElementwiseFeaturesImplementation.POLY_EXPLICIT:
    return nngp, sketches.kron_rows(g, dphi)
  return nngp, sketches.tensor_srht(g, dphi, params['ntk'])
