"""Global self-attention and its infinite-width NNGP / NTK.

Following Hron, Bahri, Sohl-Dickstein & Novak (2020), "Infinite attention:
NNGP and NTK for deep attention networks". See `GlobalSelfAttention` for the
finite network and the kernels, and the notes below for how the two scalings
of the attention logits differ.

Notation (per example, spatial positions flattened to `L`): `Kx(l, m)` is the
input covariance, `R(l, m)` the positional-embedding covariance, `Kk` / `Kv`
the covariances of the key and value inputs (inputs combined with positional
embeddings), `Tk` / `Tv` their NTKs, and `s = W_query_std^2 W_key_std^2`.
"""
import dataclasses
import enum
import functools
import math
from typing import Any, Callable, Optional

import jax
from jax import random
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.stax import kernel_maps
from neural_tangents._src.stax import masking
from neural_tangents._src.stax.layout import check_layout
from neural_tangents._src.stax.layout import ensure_full_spatial
from neural_tangents._src.stax.layout import flatten_pairs
from neural_tangents._src.stax.layout import from_standard
from neural_tangents._src.stax.layout import to_standard
from neural_tangents._src.stax.layout import unflatten_pairs
from neural_tangents._src.stax.masking import supports_masking
from neural_tangents._src.stax.protocol import Bool
from neural_tangents._src.stax.protocol import Diagonal
from neural_tangents._src.stax.requirements import layer
from neural_tangents._src.stax.requirements import requires
from neural_tangents._src.utils import arguments
from neural_tangents._src.utils import kernel as kernel_lib
from neural_tangents._src.utils.kernel import Kernel
from neural_tangents._src.utils.typing import Layer

Array = jax.Array


class AttentionMechanism(enum.Enum):
  """How attention weights are computed from the logits `A`.

  Attributes:
    SOFTMAX: `softmax(A)` over the keys (masked keys excluded).
    IDENTITY: `A` itself.
    ABS: `|A|`.
    RELU: `max(A, 0)`.
  """
  SOFTMAX = 'SOFTMAX'
  IDENTITY = 'IDENTITY'
  ABS = 'ABS'
  RELU = 'RELU'


class PositionalEmbedding(enum.Enum):
  """How positional embeddings enter the keys and queries (and values).

  Attributes:
    NONE: no positional embeddings.
    SUM: added to the inputs (needs as many channels as the inputs).
    CONCAT: concatenated to the inputs along the channel axis.
  """
  NONE = 'NONE'
  SUM = 'SUM'
  CONCAT = 'CONCAT'


# -----------------------------------------------------------------------------
# Positional embedding covariance.


@functools.lru_cache(maxsize=64)
def _pos_emb_covariance_np(spatial_shape: tuple[int, ...], p_norm: float,
                           decay_fn: Optional[Callable]) -> tuple[np.ndarray,
                                                                  np.ndarray]:
  """`(R, R^{1/2})` over flattened positions; see `pos_emb_covariance`."""
  n = math.prod(spatial_shape)
  if decay_fn is None:
    eye = np.eye(n)
    return eye, eye
  pos = np.indices(spatial_shape).reshape(len(spatial_shape), -1).T
  dist = np.sum(np.abs(pos[:, None, :] - pos[None, :, :])**p_norm, axis=-1)
  r = np.asarray(decay_fn(dist), dtype=np.float64)
  if r.shape != (n, n):
    raise ValueError(
        f'`pos_emb_decay_fn` must map an array of distances elementwise; got '
        f'shape {r.shape} for distances of shape {(n, n)}. Pass an elementwise '
        'function, e.g. `lambda d: jnp.exp(-d)`.')
  eig, vec = np.linalg.eigh((r + r.T) / 2)
  if (not np.allclose(r, r.T) or
      eig.min() < -1e-6 * max(1., float(np.abs(eig).max()))):
    raise ValueError(
        '`pos_emb_decay_fn` must define a covariance (a symmetric positive '
        'semi-definite matrix of `decay_fn(distance)`); got a matrix with '
        f'smallest eigenvalue {eig.min():.3g}. Use a positive-definite decay, '
        'e.g. `lambda d: jnp.exp(-d)` with `pos_emb_p_norm` 1 or 2.')
  sqrt = (vec * np.sqrt(np.maximum(eig, 0))) @ vec.T
  return r, sqrt


def pos_emb_covariance(spatial_shape: tuple[int, ...], p_norm: float,
                       decay_fn: Optional[Callable]) -> np.ndarray:
  """Covariance `R(l, m) = decay_fn(sum_i |l_i - m_i|^p_norm)` of positions.

  Positions `l`, `m` are multi-indices over `spatial_shape`, flattened in
  C order; `decay_fn=None` gives the identity (independent positions).
  """
  return _pos_emb_covariance_np(tuple(spatial_shape), p_norm, decay_fn)[0]


# -----------------------------------------------------------------------------
# Attention weights.


def _masked_softmax(logits: Array, keep: Optional[Array]) -> Array:
  """Softmax over the last axis, over kept entries only (zero if none)."""
  if keep is None:
    return jax.nn.softmax(logits, axis=-1)
  logits = jnp.where(keep, logits, -jnp.inf)
  top = jnp.max(logits, axis=-1, keepdims=True)
  top = jnp.where(jnp.isfinite(top), top, 0)
  e = jnp.where(keep, jnp.exp(logits - top), 0)
  total = jnp.sum(e, axis=-1, keepdims=True)
  return e / jnp.where(total > 0, total, 1)


def _attention_weights(logits: Array, mechanism: AttentionMechanism,
                       keep: Optional[Array]) -> Array:
  """`mechanism(logits)` over keys (last axis); masked keys get weight 0."""
  if mechanism == AttentionMechanism.SOFTMAX:
    return _masked_softmax(logits, keep)
  weights = {AttentionMechanism.IDENTITY: lambda a: a,
             AttentionMechanism.ABS: jnp.abs,
             AttentionMechanism.RELU: jax.nn.relu}[mechanism](logits)
  return weights if keep is None else jnp.where(keep, weights, 0)


def _abs_kernel_map(q1, q2, c, compute_dot):
  """`E|u||v| = sqrt(q1 q2) / pi (2 sin t + (pi - 2 t) rho)` and
  `E[sign u sign v] = 1 - 2 t / pi`, `t = arccos(rho)`."""
  norm, rho = kernel_maps.correlation(q1, q2, c)
  theta, sin = kernel_maps.arccos_angle(rho)
  nngp = norm / np.pi * (2 * sin + (np.pi - 2 * theta) * rho)
  dot = 1 - 2 * theta / np.pi if compute_dot else None
  return nngp, dot


# -----------------------------------------------------------------------------
# The kernel of one (pair of sets of) examples.


def _batch_sum(x: Array) -> Array:
  """Sum over the last two (key) axes, kept as size-1 axes."""
  return jnp.sum(x, axis=(-2, -1), keepdims=True)


def _linear_scaling_pair(kv, tv, g_a, g_b):
  """`(G_a Kv G_b^T, G_a (Kv + Tv) G_b^T)`: deterministic attention weights."""
  nngp = jnp.einsum('...lj,...jk,...mk->...lm', g_a, kv, g_b)
  ntk = None
  if tv is not None:
    ntk = jnp.einsum('...lj,...jk,...mk->...lm', g_a, kv + tv, g_b)
  return nngp, ntk


def _gaussian_logits_pair(kk, kv, tk, tv, q_a, q_b, s, mechanism):
  """Value-side terms of the kernel with Gaussian logits (`1/sqrt` scaling).

  The logits `A(l, l')` of `x_a` and `A'(m, m')` of `x_b` are jointly Gaussian
  with `E[A A'] = s Kk(l, m) Kk(l', m')` and variances
  `s Kk_aa(l, l) Kk_aa(l', l')`; with `E_phi = E[phi(A) phi(A')]` and
  `E_dphi = E[phi'(A) phi'(A')]`:

    nngp(l, m) = sum_{l', m'} E_phi Kv(l', m')
    ntk(l, m)  = sum_{l', m'} E_phi (Kv + Tv)(l', m')
                 + s (Kk + Tk)(l, m) sum_{l', m'} E_dphi Kk(l', m') Kv(l', m')
                 + s Kk(l, m) sum_{l', m'} E_dphi (Kk + Tk)(l', m') Kv(l', m')

  Args:
    kk, kv: key / value input covariances `(B..., L, M)` between the sets.
    tk, tv: their NTKs, or `None`.
    q_a, q_b: per-position key input variances `(B..., L)`, `(B..., M)`.
    s: `W_query_std^2 * W_key_std^2`.
    mechanism: the attention mechanism (not `SOFTMAX`).

  Returns:
    `(nngp, ntk)` before the output projection; `ntk` is `None` if `tk` is.
  """
  compute_ntk = tk is not None
  if mechanism == AttentionMechanism.IDENTITY:
    # E_phi = s Kk(l, m) Kk(l', m') and E_dphi = 1: everything factorizes.
    nngp = s * kk * _batch_sum(kk * kv)
    ntk = None
    if compute_ntk:
      ntk = s * (kk * _batch_sum(kk * (kv + tv)) +
                 (kk + tk) * _batch_sum(kk * kv) +
                 kk * _batch_sum((kk + tk) * kv))
    return nngp, ntk

  kernel_map = {AttentionMechanism.RELU: kernel_maps.relu_kernel_map,
                AttentionMechanism.ABS: _abs_kernel_map}[mechanism]
  # Axes (B..., l, l', m, m').
  cov = s * kk[..., :, None, :, None] * kk[..., None, :, None, :]
  var_a = s * q_a[..., :, None] * q_a[..., None, :]
  var_b = s * q_b[..., :, None] * q_b[..., None, :]
  e_phi, e_dphi = kernel_map(var_a[..., :, :, None, None],
                             var_b[..., None, None, :, :], cov, compute_ntk)
  nngp = jnp.einsum('...ajbk,...jk->...ab', e_phi, kv)
  ntk = None
  if compute_ntk:
    ntk = (jnp.einsum('...ajbk,...jk->...ab', e_phi, kv + tv) +
           s * (kk + tk) * jnp.einsum('...ajbk,...jk->...ab', e_dphi, kk * kv) +
           s * kk * jnp.einsum('...ajbk,...jk->...ab', e_dphi, (kk + tk) * kv))
  return nngp, ntk


# -----------------------------------------------------------------------------
# The layer: a spec of its arguments, and its functions.


@dataclasses.dataclass(frozen=True)
class _AttentionSpec:
  """Validated arguments of `GlobalSelfAttention` (see its docstring)."""
  n_chan_out: int
  n_chan_key: int
  n_chan_val: int
  n_heads: int
  linear_scaling: bool
  W_key_std: float
  W_value_std: float
  W_query_std: float
  W_out_std: float
  b_std: Optional[float]
  mechanism: AttentionMechanism
  pos_emb_kind: PositionalEmbedding
  pos_emb_p_norm: float
  pos_emb_decay_fn: Optional[Callable[[Array], Array]]
  n_chan_pos_emb: Optional[int]
  W_pos_emb_std: float
  val_pos_emb: bool
  batch_axis: int
  channel_axis: int

  @property
  def has_pos_emb(self) -> bool:
    return self.pos_emb_kind != PositionalEmbedding.NONE

  def pos_emb_channels(self, n_chan_in: int) -> int:
    """`C_pe`, the channels of the positional embeddings."""
    c_pe = n_chan_in if self.n_chan_pos_emb is None else self.n_chan_pos_emb
    if self.pos_emb_kind == PositionalEmbedding.SUM and c_pe != n_chan_in:
      raise ValueError(
          f'`pos_emb_type="SUM"` adds embeddings to inputs of {n_chan_in} '
          f'channels, so `n_chan_pos_emb` must be None or {n_chan_in}; got '
          f'{self.n_chan_pos_emb}. Use `pos_emb_type="CONCAT"` for a '
          'different number of channels.')
    return c_pe

  def key_val_channels(self, n_chan_in: int) -> tuple[int, int]:
    """`(C_k, C_v)`, the input channels of the keys and of the values."""
    if self.pos_emb_kind != PositionalEmbedding.CONCAT:
      if self.has_pos_emb:
        self.pos_emb_channels(n_chan_in)
      return n_chan_in, n_chan_in
    c_k = n_chan_in + self.pos_emb_channels(n_chan_in)
    return c_k, (c_k if self.val_pos_emb else n_chan_in)

  def mixing_weights(self, n_chan_in: int) -> tuple[float, float]:
    """`(w_x, w_p)`: `Kk = w_x Kx + w_p R`."""
    if self.pos_emb_kind == PositionalEmbedding.CONCAT:
      c_pe = self.pos_emb_channels(n_chan_in)
      return (n_chan_in / (n_chan_in + c_pe),
              self.W_pos_emb_std**2 * c_pe / (n_chan_in + c_pe))
    return 1., self.W_pos_emb_std**2


def _attention_spec(n_chan_out, n_chan_key, n_chan_val, n_heads,
                    linear_scaling, W_key_std, W_value_std, W_query_std,
                    W_out_std, b_std, attention_mechanism, pos_emb_type,
                    pos_emb_p_norm, pos_emb_decay_fn, n_chan_pos_emb,
                    W_pos_emb_std, val_pos_emb, batch_axis,
                    channel_axis) -> _AttentionSpec:
  for value, name in ((n_chan_out, 'n_chan_out'), (n_chan_key, 'n_chan_key'),
                      (n_chan_val, 'n_chan_val'), (n_heads, 'n_heads')):
    arguments.positive_int(value, name, f'Pass e.g. {name}=1.',
                           layer_name='GlobalSelfAttention')
  if n_chan_pos_emb is not None:
    arguments.positive_int(n_chan_pos_emb, 'n_chan_pos_emb',
                           'Pass None (the same as `n_chan_key`) or e.g. 1.',
                           layer_name='GlobalSelfAttention')
  return _AttentionSpec(
      n_chan_out=n_chan_out, n_chan_key=n_chan_key, n_chan_val=n_chan_val,
      n_heads=n_heads, linear_scaling=linear_scaling, W_key_std=W_key_std,
      W_value_std=W_value_std, W_query_std=W_query_std, W_out_std=W_out_std,
      b_std=b_std,
      mechanism=arguments.parse_enum(attention_mechanism, AttentionMechanism,
                                     'attention_mechanism'),
      pos_emb_kind=arguments.parse_enum(pos_emb_type, PositionalEmbedding,
                                        'pos_emb_type'),
      pos_emb_p_norm=pos_emb_p_norm, pos_emb_decay_fn=pos_emb_decay_fn,
      n_chan_pos_emb=n_chan_pos_emb, W_pos_emb_std=W_pos_emb_std,
      val_pos_emb=val_pos_emb, batch_axis=batch_axis,
      channel_axis=channel_axis)


def _attention_init(spec: _AttentionSpec, rng: Array,
                    input_shape: tuple[int, ...]) -> tuple[tuple[int, ...],
                                                           tuple[Any, ...]]:
  """`init_fn`: the output shape and `(query_W, key_W, val_W, out_W, b,
  pos_emb)`."""
  ndim = len(input_shape)
  c_axis = spec.channel_axis % ndim
  n_chan_in = input_shape[c_axis]
  c_k, c_v = spec.key_val_channels(n_chan_in)
  rng_q, rng_k, rng_v, rng_o, rng_b, rng_pe = random.split(rng, 6)
  heads, n_key = spec.n_heads, spec.n_chan_key
  query_W = (None if spec.linear_scaling else
             random.normal(rng_q, (heads, c_k, n_key)))
  key_W = random.normal(rng_k, (heads, c_k, n_key))
  val_W = random.normal(rng_v, (heads, c_v, spec.n_chan_val))
  out_W = random.normal(rng_o, (heads * spec.n_chan_val, spec.n_chan_out))
  b = None
  if spec.b_std is not None:
    b_shape = [1] * ndim
    b_shape[c_axis] = spec.n_chan_out
    b = random.normal(rng_b, b_shape)
  pos_emb = None
  if spec.has_pos_emb:
    pe_shape = list(input_shape)
    pe_shape[spec.batch_axis % ndim] = 1
    pe_shape[c_axis] = spec.pos_emb_channels(n_chan_in)
    pos_emb = random.normal(rng_pe, pe_shape)
  output_shape = list(input_shape)
  output_shape[c_axis] = spec.n_chan_out
  return tuple(output_shape), (query_W, key_W, val_W, out_W, b, pos_emb)


def _embeddings(spec: _AttentionSpec, pos_emb: Array,
                spatial: tuple[int, ...]) -> Array:
  """`W_pos_emb_std R^{1/2} Z`, `(1, L, C_pe)`."""
  z = to_standard(pos_emb, spec.batch_axis, spec.channel_axis, flatten=True)
  if spec.pos_emb_decay_fn is not None:
    sqrt = _pos_emb_covariance_np(tuple(spatial), spec.pos_emb_p_norm,
                                  spec.pos_emb_decay_fn)[1]
    z = jnp.einsum('lm,nmc->nlc', jnp.asarray(sqrt, z.dtype), z)
  return spec.W_pos_emb_std * z


def _attention_apply(spec: _AttentionSpec, params: Any, inputs: Array,
                     mask: Optional[Array]) -> Array:
  """`apply_fn` (see `GlobalSelfAttention`)."""
  query_W, key_W, val_W, out_W, b, pos_emb = params
  ndim = inputs.ndim
  b_axis, c_axis = spec.batch_axis % ndim, spec.channel_axis % ndim
  spatial = kernel_lib.spatial_shape(inputs.shape, b_axis, c_axis)
  x = to_standard(inputs, b_axis, c_axis, flatten=True)
  keys_in = vals_in = x
  if spec.has_pos_emb:
    e = jnp.broadcast_to(_embeddings(spec, pos_emb, spatial),
                         x.shape[:2] + (pos_emb.shape[c_axis],))
    keys_in = (x + e if spec.pos_emb_kind == PositionalEmbedding.SUM else
               jnp.concatenate([x, e], axis=-1))
    if spec.val_pos_emb:
      vals_in = keys_in
  hi = jax.lax.Precision.HIGHEST
  project = lambda z, w, std: std / math.sqrt(z.shape[-1]) * jnp.einsum(
      'nlc,hcd->nhld', z, w, precision=hi)
  keys = project(keys_in, key_W, spec.W_key_std)
  queries = (spec.W_query_std / spec.W_key_std * keys if query_W is None else
             project(keys_in, query_W, spec.W_query_std))
  values = project(vals_in, val_W, spec.W_value_std)
  scale = (spec.n_chan_key if spec.linear_scaling else
           math.sqrt(spec.n_chan_key))
  logits = jnp.einsum('nhld,nhmd->nhlm', queries, keys, precision=hi) / scale
  keep = None
  if mask is not None:
    keep = ~masking.position_mask(mask, inputs.shape, b_axis, c_axis)
    keep = keep.reshape(keep.shape[0], 1, 1, -1)
  weights = _attention_weights(logits, spec.mechanism, keep)
  heads = jnp.einsum('nhlm,nhmd->nlhd', weights, values, precision=hi)
  heads = heads.reshape(heads.shape[:2] + (-1,))
  out = spec.W_out_std / math.sqrt(heads.shape[-1]) * jnp.einsum(
      'nlc,co->nlo', heads, out_W, precision=hi)
  out = from_standard(out, inputs.shape, b_axis, c_axis)
  if b is not None:
    out = out + spec.b_std * b
  return out


def _attention_kernel(spec: _AttentionSpec, k: Kernel) -> Kernel:
  """`kernel_fn` (see `GlobalSelfAttention`)."""
  check_layout(k, spec.batch_axis, spec.channel_axis, 'GlobalSelfAttention')
  mechanism = spec.mechanism
  if not spec.linear_scaling and mechanism == AttentionMechanism.SOFTMAX:
    raise NotImplementedError(
        'The infinite-width kernel of softmax attention with '
        '`linear_scaling=False` (logits scaled by 1/sqrt(n_chan_key), hence '
        'Gaussian) has no known closed form. Use `linear_scaling=True`, or '
        '`attention_mechanism` "IDENTITY", "RELU" or "ABS".')
  k = ensure_full_spatial(k)
  n_spatial = k.n_spatial
  spatial, spatial2 = k.spatial_shape1, k.spatial_shape2
  w_x, w_p = spec.mixing_weights(k.channels)
  r = None
  if spec.has_pos_emb and spatial != spatial2:
    raise ValueError(
        f'`x1` and `x2` have different spatial shapes ({spatial} and '
        f'{spatial2}), but `GlobalSelfAttention(pos_emb_type='
        f'{spec.pos_emb_kind.name!r})` adds positional embeddings of one spatial '
        'shape. Pass inputs of the same spatial shape, or '
        "`pos_emb_type='NONE'`.")
  if spec.has_pos_emb:
    spec.pos_emb_channels(k.channels)  # Validates `n_chan_pos_emb`.
    r = jnp.asarray(pos_emb_covariance(spatial, spec.pos_emb_p_norm,
                                       spec.pos_emb_decay_fn), k.nngp.dtype)

  def with_pos(x, use):
    if x is None or r is None or not use:
      return x
    # `r` is `(L, L)`; `x` has leading batch axes `(B..., L, L)`.
    return w_x * x + w_p * jnp.reshape(r, (1,) * (x.ndim - 2) + r.shape)

  flat = lambda x, n_batch: None if x is None else flatten_pairs(
      x, n_batch, n_spatial)

  def keep_of(mask, shape):
    pm = masking.position_mask(mask, shape, k.batch_axis, k.channel_axis)
    n_pos = math.prod(kernel_lib.spatial_shape(shape, k.batch_axis,
                                               k.channel_axis))
    return None if pm is None else ~pm.reshape(pm.shape[0], n_pos)

  keep1 = keep_of(k.mask1, k.shape1)
  keep2 = keep1 if k.cov2 is None else keep_of(k.mask2, k.shape2)
  var1 = flat(k.cov1 if k.diagonal_batch else kernel_lib.batch_diagonal(
      k.cov1), 1)
  var2 = var1 if k.cov2 is None else flat(
      k.cov2 if k.diagonal_batch else kernel_lib.batch_diagonal(k.cov2), 1)
  kk1, kk2 = with_pos(var1, True), with_pos(var2, True)

  if spec.linear_scaling:
    sqrt_s = spec.W_query_std * spec.W_key_std
    g1 = _attention_weights(sqrt_s * kk1, mechanism,
                            None if keep1 is None else keep1[:, None, :])
    g2 = g1 if k.cov2 is None else _attention_weights(
        sqrt_s * kk2, mechanism, None if keep2 is None else keep2[:, None, :])
    side1, side2 = g1, g2
  else:
    side1 = jnp.diagonal(kk1, axis1=-2, axis2=-1)
    side2 = jnp.diagonal(kk2, axis1=-2, axis2=-1)
  scale = spec.W_out_std**2 * spec.W_value_std**2

  def pair(kx, tx, side_a, side_b, keep_a, keep_b):
    """Output (nngp, ntk) between two sets (leading batch axes aligned)."""
    kv, tv = with_pos(kx, spec.val_pos_emb), with_pos(tx, spec.val_pos_emb)
    if keep_a is not None or keep_b is not None:
      # Masked keys carry no value (nor attention weight).
      ka = 1. if keep_a is None else keep_a[..., :, None]
      kb = 1. if keep_b is None else keep_b[..., None, :]
      kv = kv * ka * kb
      tv = None if tv is None else tv * ka * kb
    if spec.linear_scaling:
      nngp, ntk = _linear_scaling_pair(kv, tv, side_a, side_b)
    else:
      kk, tk = with_pos(kx, True), with_pos(tx, True)
      nngp, ntk = _gaussian_logits_pair(
          kk, kv, tk, tv, side_a, side_b,
          (spec.W_query_std * spec.W_key_std)**2, mechanism)
    nngp = scale * nngp
    if spec.b_std is not None:
      nngp = nngp + spec.b_std**2
    if ntk is not None:
      ntk = nngp + scale * ntk
    return nngp, ntk

  ex = lambda x, axis: None if x is None else jnp.expand_dims(x, axis)
  nngp, ntk = pair(flat(k.nngp, 2), flat(k.ntk, 2), ex(side1, 1),
                   ex(side2, 0), ex(keep1, 1), ex(keep2, 0))

  def self_cov(cov, side, keep):
    if cov is None:
      return None
    if k.diagonal_batch:
      return pair(flat(cov, 1), None, side, side, keep, keep)[0]
    return pair(flat(cov, 2), None, ex(side, 1), ex(side, 0), ex(keep, 1),
                ex(keep, 0))[0]

  cov1 = self_cov(k.cov1, side1, keep1)
  cov2 = self_cov(k.cov2, side2, keep2)
  n_cov_batch = 1 if k.diagonal_batch else 2
  unflat = lambda x, n_batch, s1, s2: None if x is None else unflatten_pairs(
      x, n_batch, s1, s2)
  c_axis = k.channel_axis % len(k.shape1)
  shape1, shape2 = list(k.shape1), list(k.shape2)
  shape1[c_axis] = shape2[c_axis] = spec.n_chan_out
  return k.replace(
      nngp=unflat(nngp, 2, spatial, spatial2),
      ntk=unflat(ntk, 2, spatial, spatial2),
      cov1=unflat(cov1, n_cov_batch, spatial, spatial),
      cov2=unflat(cov2, n_cov_batch, spatial2, spatial2),
      is_gaussian=True,
      is_input=False,
      shape1=tuple(shape1),
      shape2=tuple(shape2))


@layer
@supports_masking(remask_kernel=True)
def GlobalSelfAttention(n_chan_out: int,
                        n_chan_key: int,
                        n_chan_val: int,
                        n_heads: int,
                        linear_scaling: bool = True,
                        W_key_std: float = 1.0,
                        W_value_std: float = 1.0,
                        W_query_std: float = 1.0,
                        W_out_std: float = 1.0,
                        b_std: Optional[float] = None,
                        attention_mechanism: str = 'SOFTMAX',
                        pos_emb_type: str = 'NONE',
                        pos_emb_p_norm: float = 2,
                        pos_emb_decay_fn: Optional[Callable[[Array],
                                                            Array]] = None,
                        n_chan_pos_emb: Optional[int] = None,
                        W_pos_emb_std: float = 1.0,
                        val_pos_emb: bool = False,
                        batch_axis: int = 0,
                        channel_axis: int = -1) -> Layer:
  r"""Multi-head self-attention over all spatial positions (Hron et al. 2020).

  Finite network (NTK parameterization), per example, positions flattened to
  `L` and `C` input channels. Positional embeddings `E = W_pos_emb_std *
  R^{1/2} Z` (`Z` the `pos_emb` param, `N(0, 1)`, `R` below) enter the key /
  query inputs `xk` (and the value inputs `xv` if `val_pos_emb`, else
  `xv = x`): `xk = x + E` (`SUM`) or `[x, E]` along channels (`CONCAT`). For
  each head `h`:

    K_h = W_key_std / sqrt(C_k) xk @ key_W[h]           (L, n_chan_key)
    Q_h = W_query_std / sqrt(C_k) xk @ query_W[h]       (L, n_chan_key)
    V_h = W_value_std / sqrt(C_v) xv @ val_W[h]         (L, n_chan_val)
    A_h = Q_h K_h^T / n_chan_key   (linear_scaling)  or / sqrt(n_chan_key)
    O_h = mechanism(A_h) V_h       (mechanism over keys; masked keys excluded)
    out = W_out_std / sqrt(n_heads n_chan_val) [O_1, ..., O_H] @ out_W
          + b_std * b

  With `linear_scaling=True` the queries share the key weights
  (`query_W is None`, `Q_h = W_query_std / W_key_std * K_h`): with independent
  query and key weights the `1 / n_chan_key`-scaled logits would vanish as
  `n_chan_key -> inf` and every mechanism would degenerate (uniform averaging
  for softmax, zero output otherwise). Shared weights make the logits
  converge to deterministic values, `A = W_query_std W_key_std Kk(x, x)`.

  Infinite-width kernels (`Kx` the input covariance, `R` the positional
  covariance, `Kk`, `Kv` the key / value input covariances, `Tx`, `Tk`,
  `Tv` the NTKs, `s = W_query_std^2 W_key_std^2`, `w_x`, `w_p` the mixing
  weights: `(1, W_pos_emb_std^2)` for `SUM`,
  `(C, C_pe W_pos_emb_std^2) / (C + C_pe)` for `CONCAT`):

    Kk = w_x Kx + w_p R,  Tk = w_x Tx + w_p R   (the embedding is trained)

  * `linear_scaling=True` (any mechanism): `G(x) = mechanism(A(x))` is
    deterministic; the gradients through the logits vanish, so

      nngp' = W_out_std^2 W_value_std^2 G(x) Kv(x, x') G(x')^T + b_std^2
      ntk'  = nngp' + W_out_std^2 W_value_std^2 G(x) (Kv + Tv) G(x')^T

  * `linear_scaling=False`: the logits are a Gaussian process with
    `E[A(l, l') A'(m, m')] = s Kk(l, m) Kk(l', m')`. `IDENTITY`, `RELU` and
    `ABS` have closed forms (see `_gaussian_logits_pair`; `IDENTITY`:
    `nngp' = W_out_std^2 W_value_std^2 s Kk(l, m) sum_{l'm'} Kk Kv + b_std^2`;
    `RELU` / `ABS` cost `O(L^4)` per pair of examples). `SOFTMAX` has none:
    `kernel_fn` raises `NotImplementedError` (`apply_fn` works). These
    limits also need `n_heads -> inf` for the output to be Gaussian (Hron et
    al. 2020): the NNGP of this layer is exact for any `n_heads`, but layers
    after it see a mixture of Gaussians when `n_heads` is finite.

  Positional embedding covariance: positions `l`, `m` are multi-indices over
  the spatial axes, `R(l, m) = pos_emb_decay_fn(sum_i |l_i - m_i|^p)` with
  `p = pos_emb_p_norm`, or the identity when `pos_emb_decay_fn` is `None`. It
  must be positive semi-definite (`ValueError` otherwise).

  Masking: masked positions are excluded as keys and masked in the output
  (a position is masked iff all its channels are).

  Params: `(query_W, key_W, val_W, out_W, b, pos_emb)` with shapes
  `(n_heads, C_k, n_chan_key)` (`None` when `linear_scaling`),
  `(n_heads, C_k, n_chan_key)`, `(n_heads, C_v, n_chan_val)`,
  `(n_heads * n_chan_val, n_chan_out)`, `(1, ..., n_chan_out, ..., 1)` (or
  `None` without `b_std`), and the input shape with batch size 1 and
  `C_pe = n_chan_pos_emb` (default `C`) channels (`None` without positional
  embeddings); `C_k = C + C_pe` for `CONCAT` else `C`, and `C_v` likewise
  with `val_pos_emb`.

  Args:
    n_chan_out: number of output channels.
    n_chan_key: number of key (and query) channels per head.
    n_chan_val: number of value channels per head.
    n_heads: number of heads.
    linear_scaling: scale logits by `1 / n_chan_key` (`True`) or
      `1 / sqrt(n_chan_key)` (`False`).
    W_key_std: key weights' standard deviation.
    W_value_std: value weights' standard deviation.
    W_query_std: query weights' standard deviation.
    W_out_std: output weights' standard deviation.
    b_std: output bias' standard deviation; `None` for no bias.
    attention_mechanism: an `AttentionMechanism` or its name.
    pos_emb_type: a `PositionalEmbedding` or its name.
    pos_emb_p_norm: exponent `p` of the distance between positions.
    pos_emb_decay_fn: elementwise function of the distance giving the
      embeddings' covariance; `None` for independent positions.
    n_chan_pos_emb: channels of the embeddings; `None` for as many as the
      inputs (required for `SUM`).
    W_pos_emb_std: embeddings' standard deviation.
    val_pos_emb: whether the values get positional embeddings too.
    batch_axis: batch axis of the inputs.
    channel_axis: channel axis of the inputs.

  Returns:
    `(init_fn, apply_fn, kernel_fn)`.

  Example:
    >>> init_fn, apply_fn, kernel_fn = stax.serial(
    ...     stax.Dense(512), stax.GlobalSelfAttention(512, 512, 512, 4),
    ...     stax.Relu(), stax.GlobalAvgPool(), stax.Dense(1))
    >>> kernel_fn(jnp.ones((2, 8, 3)), None, 'ntk').shape
    (2, 2)
  """
  spec = _attention_spec(
      n_chan_out, n_chan_key, n_chan_val, n_heads, linear_scaling, W_key_std,
      W_value_std, W_query_std, W_out_std, b_std, attention_mechanism,
      pos_emb_type, pos_emb_p_norm, pos_emb_decay_fn, n_chan_pos_emb,
      W_pos_emb_std, val_pos_emb, batch_axis, channel_axis)

  def init_fn(rng, input_shape):
    return _attention_init(spec, rng, input_shape)

  def apply_fn(params, inputs, *, mask=None, **kwargs):
    return _attention_apply(spec, params, inputs, mask)

  @requires(batch_axis=batch_axis, channel_axis=channel_axis,
            diagonal_batch=Diagonal(),
            diagonal_spatial=Diagonal(input=Bool.NO))
  def kernel_fn(k: Kernel, **kwargs) -> Kernel:
    return _attention_kernel(spec, k)

  def mask_fn(mask, input_shape):
    return masking.mask_all_channels(mask, channel_axis)

  return init_fn, apply_fn, kernel_fn, mask_fn
