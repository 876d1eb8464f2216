"""The input kernel: covariances of raw inputs, the `Kernel` a network starts
from.

`kernel_fn(x1, x2, get)` first turns its input arrays into a `Kernel`
(`inputs_to_kernel`): the inputs are checked (`check_input`), moved to the
standard layout `(N, S_1, ..., S_d, C)` (`layout.to_standard`), scaled per
example by a power of two so that products cannot overflow
(`scale_examples`), and their channel-averaged covariances computed
(`covariance`),

    nngp[i, j, s, s'] = (1 / C) sum_c x1[i, s, c] x2[j, s', c],

with `cov1` / `cov2` the same of `x1` / `x2` with themselves (only the batch
diagonal `i == j` where `diagonal_batch`, only `s == s'` where
`diagonal_spatial`). The NTK of raw inputs is zero.

Which layout each input array is in is declared by the network's first layers
(`protocol.InputAxes`); `input_axes` spreads it over a (nested list/tuple of)
input arrays, and `input_batch_axes` gives their batch axes (for `nt.batch`).

Example:
  >>> import jax.numpy as jnp
  >>> from neural_tangents._src.stax.inputs import inputs_to_kernel
  >>> x = jnp.array([[1., 2.], [3., 4.], [5., 6.]])
  >>> k = inputs_to_kernel(x, None, diagonal_batch=True,
  ...                      diagonal_spatial=False, compute_ntk=True)
  >>> k.nngp[0, 1], k.cov1  # (1*3 + 2*4) / 2, and |x_i|^2 / 2.
  (Array(5.5, dtype=float32), Array([ 2.5, 12.5, 30.5], dtype=float32))
"""
from typing import Any, Callable, Optional

import jax
from jax import lax
import jax.numpy as jnp

from neural_tangents._src.stax import layout
from neural_tangents._src.stax import masking
from neural_tangents._src.stax.protocol import InputAxes
from neural_tangents._src.stax.protocol import kernel_spec
from neural_tangents._src.utils import scaling
from neural_tangents._src.utils.kernel import Kernel

# Up to this many channels, `covariance` of spatially diagonal kernels sums
# outer products directly instead of calling a matmul.
_MAX_UNROLLED_CHANNELS = 8


def covariance(x1: jax.Array, x2: jax.Array, batch_pair: bool,
               diagonal_spatial: bool) -> jax.Array:
  """Channel-averaged covariance of activations in `(N, S..., C)` layout.

  Args:
    x1: `(N1, S_1, ..., S_d, C)` activations.
    x2: `(N2, S_1, ..., S_d, C)` activations (`N2 == N1` if not `batch_pair`).
    batch_pair: whether to pair every example of `x1` with every example of
      `x2` (`(N1, N2, ...)`), or only example `i` with example `i`
      (`(N, ...)`).
    diagonal_spatial: whether to keep only equal positions.

  Returns:
    The covariance in the `Kernel` layout: `(N1, N2, S_1, S_1', ...)` (or
    `(N, ...)` without `batch_pair`; one axis `S_j` per spatial dimension
    with `diagonal_spatial`).

  Example:
    >>> import jax.numpy as jnp
    >>> x = jnp.ones((2, 3, 4))  # 2 examples, 3 positions, 4 channels.
    >>> covariance(x, x, True, False).shape
    (2, 2, 3, 3)
  """
  n_spatial = x1.ndim - 2
  hi = lax.Precision.HIGHEST
  c = x1.shape[-1]
  if diagonal_spatial:
    if batch_pair and c <= _MAX_UNROLLED_CHANNELS:
      # A few channels (e.g. RGB images): an unrolled sum of outer products
      # is written once in the `Kernel` layout, where a batched matmul with
      # the spatial axes as batch would run a tiny contraction per position
      # and then transpose the whole `(N1, N2, S...)` result.
      out = x1[:, None, ..., 0] * x2[None, :, ..., 0]
      for i in range(1, c):
        out = out + x1[:, None, ..., i] * x2[None, :, ..., i]
      return out / c
    spec = 'n...c,m...c->nm...' if batch_pair else 'n...c,n...c->n...'
    return jnp.einsum(spec, x1, x2, precision=hi) / c
  if batch_pair:
    out = jnp.tensordot(x1, x2, axes=(-1, -1), precision=hi) / c
    # (N1, S..., N2, S'...) -> (N1, N2, S..., S'...)
    out = jnp.moveaxis(out, 1 + n_spatial, 1)
    return layout.interleave_pairs(out, 2, n_spatial)
  out = jax.vmap(lambda a, b: jnp.tensordot(a, b, axes=(-1, -1),
                                            precision=hi))(x1, x2) / c
  return layout.interleave_pairs(out, 1, n_spatial)


def check_input(x: Any, name: str) -> jax.Array:
  """`x` as a real floating array with a batch and a channel axis.

  Bool and int inputs are cast to the default float dtype (their kernel is
  that of `x.astype(float)`); anything else raises, naming `name`.

  Example:
    >>> import jax.numpy as jnp
    >>> check_input(jnp.ones((2, 3), int), 'x1').dtype
    dtype('float32')
  """
  if not hasattr(x, 'shape') or not hasattr(x, 'dtype'):
    raise TypeError(f'`{name}` must be an array; got {type(x).__name__}. Pass '
                    'a `jnp.ndarray` of shape (batch, ..., channels).')
  if x.ndim < 2:
    raise ValueError(
        f'`{name}` must have a batch and a channel axis; got shape {x.shape}. '
        f'Reshape it, e.g. `{name}.reshape(-1, 1)` for scalar features.')
  x = jnp.asarray(x)
  if jnp.issubdtype(x.dtype, jnp.complexfloating):
    raise TypeError(
        f'`{name}` must be real; got dtype {x.dtype}. Kernels of complex '
        f'inputs are not defined here: pass e.g. `{name}.real`, or the real '
        f'and imaginary parts as channels, '
        f'`jnp.concatenate([{name}.real, {name}.imag], axis=-1)`.')
  if not jnp.issubdtype(x.dtype, jnp.floating):
    # Bool and int inputs: the kernel of `x.astype(float)`. (A bool
    # contraction would be a logical dot product.)
    x = x.astype(jnp.result_type(float))
  return x


def scale_examples(z: jax.Array) -> tuple[jax.Array, jax.Array]:
  """`(z / s, s)` for per-example powers of 2 `s` near `max |z_i|`.

  Products of input entries overflow (float32 inputs above about 1.8e19)
  where the covariance itself is representable; covariances of the scaled
  inputs are then multiplied back by `s_i s_j`. The scaling is exact, so in
  the normal range the covariance is bitwise the same as without it.

  Example:
    >>> import jax.numpy as jnp
    >>> z, s = scale_examples(jnp.array([[3., 1.], [0.5, 0.25]]))
    >>> s
    Array([2. , 0.5], dtype=float32)
  """
  amax = jnp.max(jnp.abs(z), axis=tuple(range(1, z.ndim)))
  s = scaling.power_of_two(scaling.exponent_of(amax) - 1, z.dtype)
  return z / s.reshape((-1,) + (1,) * (z.ndim - 1)), s


def stored_scales(s: jax.Array) -> tuple[jax.Array, jax.Array]:
  """`(s / 2^a, a)` for per-example powers of 2 `s` (`scale_examples`), with
  `a >= 0` the exponents by which the input `Kernel` stores covariances
  (`Kernel.scale_exponents`): 0 unless `s` exceeds `2^(maxexp / 4)` (`2^32`
  in float32), so that stored covariances stay below about `2^(maxexp / 2)`
  and products of two of them, and of the weights of a few layers, fit the
  dtype. Bitwise the plain covariance wherever `a = 0`.

  Example:
    >>> import jax.numpy as jnp
    >>> stored_scales(jnp.array([2., 2.**40]))
    (Array([2.0000000e+00, 4.2949673e+09], dtype=float32), Array([0, 8], dtype=int32))
  """
  info = jnp.finfo(s.dtype)
  a = jnp.maximum(scaling.power_of_two_exponent(s) - info.maxexp // 4, 0)
  return s / scaling.power_of_two(a, s.dtype), a


def _to_standard(x: jax.Array, batch_axis: int, channel_axis: int
                 ) -> jax.Array:
  """`x` in `(N, S..., C)` layout, its axes checked (`layout.spatial_axes`)."""
  layout.spatial_axes(x.ndim, batch_axis, channel_axis, 'kernel_fn')
  return layout.to_standard(x, batch_axis, channel_axis)


def inputs_to_kernel(x1: jax.Array, x2: Optional[jax.Array], *,
                     diagonal_batch: bool, diagonal_spatial: bool,
                     compute_ntk: bool, batch_axis: int = 0,
                     channel_axis: int = -1,
                     mask_constant: Optional[float] = None) -> Kernel:
  """The `Kernel` of raw inputs (the covariance a `Dense` layer sees).

  Masked inputs (`MaskedArray`s, or entries equal to `mask_constant`) are
  zeroed before computing covariances, and their masks stored in `mask1` /
  `mask2` (see `masking`).

  Args:
    x1: inputs, `(N1, ..., C)` with batch and channel axes as given, or a
      `MaskedArray`.
    x2: inputs or `None` for `x1`.
    diagonal_batch: keep only the batch diagonal of `cov1` / `cov2`.
    diagonal_spatial: keep only the spatial diagonal.
    compute_ntk: whether to track the NTK (starts at zero).
    batch_axis: batch axis of the inputs.
    channel_axis: channel axis of the inputs.
    mask_constant: if not `None`, input entries equal to it are masked.

  Returns:
    The input `Kernel`.

  Example:
    >>> import jax.numpy as jnp
    >>> k = inputs_to_kernel(jnp.ones((2, 5, 3)), jnp.ones((4, 5, 3)),
    ...                      diagonal_batch=True, diagonal_spatial=True,
    ...                      compute_ntk=False)
    >>> k.nngp.shape, k.cov1.shape, k.ntk is None
    ((2, 4, 5), (2, 5), True)
  """
  x1, mask1 = masking.split(masking.get_masked_array(x1, mask_constant, 'x1'))
  x2, mask2 = masking.split(masking.get_masked_array(x2, mask_constant, 'x2'))
  if x2 is None:
    mask2 = mask1
  x1 = check_input(x1, 'x1')
  _check_not_empty(x1, 'x1', batch_axis, channel_axis)
  if x2 is not None:
    x2 = check_input(x2, 'x2')
    _check_not_empty(x2, 'x2', batch_axis, channel_axis)
    b = batch_axis % x1.ndim
    c = channel_axis % x1.ndim
    if (x1.ndim == x2.ndim and x1.shape[c] == x2.shape[c] and
        x1.shape[:b] + x1.shape[b + 1:] != x2.shape[:b] + x2.shape[b + 1:]):
      # Different spatial shapes: a cross-covariance of all position pairs
      # exists; positions compared one to one (a spatial diagonal) do not.
      if diagonal_spatial:
        raise ValueError(
            f'`x1` and `x2` have different spatial shapes (x1.shape='
            f'{x1.shape}, x2.shape={x2.shape}), but this network compares '
            'their positions one to one (e.g. `Flatten`, or `Dense` read out '
            'on spatial inputs, or `diagonal_spatial=True`). Pass `x2` of '
            'the same spatial shape as `x1`, or read the network out with '
            'global pooling (`GlobalAvgPool`), which accepts any sizes.')
    elif (x1.ndim != x2.ndim or
          x1.shape[:b] + x1.shape[b + 1:] != x2.shape[:b] + x2.shape[b + 1:]):
      raise ValueError(
          f'`x1` and `x2` must have the same shape except along the batch axis '
          f'{batch_axis}; got x1.shape={x1.shape} and x2.shape={x2.shape}. '
          'Pass `x2` with the same features as `x1` (or `x2=None`).')
  z1 = _to_standard(x1, batch_axis, channel_axis)
  z2 = None if x2 is None else _to_standard(x2, batch_axis, channel_axis)
  # Per-example work (scales, variances) on `x1` and `x2` of the same shape
  # and dtype runs on their concatenation: the same entries, in half the XLA
  # loops to compile.
  joint = (z2 is not None and z1.shape[1:] == z2.shape[1:] and
           z1.dtype == z2.dtype)

  def scaled(z):
    z, s = scale_examples(z)
    return (z, *stored_scales(s))

  n1 = z1.shape[0]
  if joint:
    z, s, a = scaled(jnp.concatenate([z1, z2]))
    z1, z2, s1, s2, a1, a2 = z[:n1], z[n1:], s[:n1], s[n1:], a[:n1], a[n1:]
  else:
    z1, s1, a1 = scaled(z1)
    z2, s2, a2 = (z1, s1, a1) if z2 is None else scaled(z2)

  def scaled_cov(za, sa, zb, sb, batch_pair):
    out = covariance(za, zb, batch_pair, diagonal_spatial)
    lead = 2 if batch_pair else 1
    sa = sa.reshape((-1,) + (1,) * (out.ndim - 1))
    sb = sb.reshape((1,) * (lead - 1) + (-1,) + (1,) * (out.ndim - lead))
    # Not `sa * sb` first: that can overflow where the kernel does not.
    return out * sa * sb

  nngp = scaled_cov(z1, s1, z2, s2, True)

  def self_cov(z, s):
    return scaled_cov(z, s, z, s, not diagonal_batch)

  if x2 is None:
    cov1, cov2 = self_cov(z1, s1), None
  elif joint and diagonal_batch:
    cov = self_cov(z, s)
    cov1, cov2 = cov[:n1], cov[n1:]
  else:
    cov1, cov2 = self_cov(z1, s1), self_cov(z2, s2)
  return Kernel(
      nngp=nngp,
      ntk=jnp.zeros_like(nngp) if compute_ntk else None,
      cov1=cov1,
      cov2=cov2,
      mask1=mask1,
      mask2=mask2,
      scale_exponents=(a1, a2),
      x1_is_x2=x2 is None,
      is_gaussian=False,
      is_reversed=False,
      is_input=True,
      diagonal_batch=diagonal_batch,
      diagonal_spatial=diagonal_spatial,
      shape1=tuple(x1.shape),
      shape2=tuple(x1.shape if x2 is None else x2.shape),
      batch_axis=batch_axis,
      channel_axis=channel_axis)


def _check_not_empty(x: jax.Array, name: str, batch_axis: int,
                     channel_axis: int) -> None:
  """Raises if a channel or spatial axis of `x` has size 0: the kernel is
  a mean over channels (and, after pooling, positions), undefined over none.
  """
  b, c = batch_axis % x.ndim, channel_axis % x.ndim
  empty = [a for a in range(x.ndim) if a != b and x.shape[a] == 0]
  if empty:
    what = 'channel' if empty[0] == c else 'spatial'
    raise ValueError(
        f'`{name}` has shape {x.shape}, with no entries on its {what} axis '
        f'{empty[0]}: the kernel averages products over channels (and '
        'positions), which is undefined over none. Pass inputs with at least '
        'one channel and position (e.g. `x.reshape(-1, 1)` for one scalar '
        'feature per example).')


def pair_inputs(x1: Any, x2: Any) -> Any:
  """`x2` in the (nested list/tuple) structure of `x1`: `None` leaves where
  `x2` is `None`.

  Raises:
    ValueError: `x2` does not have the structure of `x1`.

  Example:
    >>> pair_inputs(('a', ['b', 'c']), None)
    (None, [None, None])
  """
  if not isinstance(x1, (list, tuple)):
    return x2
  if x2 is None:
    x2 = [None] * len(x1)
  if not isinstance(x2, (list, tuple)) or len(x2) != len(x1):
    raise ValueError(
        f'`x2` must have the same structure as `x1` ({len(x1)} inputs); got '
        f'{type(x2).__name__}. Pass one `x2` array per `x1` array, or None.')
  return type(x1)(pair_inputs(a, b) for a, b in zip(x1, x2))


def input_axes(kernel_fn: Callable, x: Any) -> Any:
  """The `InputAxes` (batch and channel axis) `kernel_fn` expects of each
  input array of `x`, in the (nested list/tuple) structure of `x`.

  Example:
    >>> import jax.numpy as jnp
    >>> from neural_tangents import stax
    >>> _, _, kernel_fn = stax.Dense(1, batch_axis=1, channel_axis=0)
    >>> input_axes(kernel_fn, jnp.ones((3, 2)))
    InputAxes(batch_axis=1, channel_axis=0, per_input=None)
  """
  return kernel_spec(kernel_fn).input_axes.for_inputs(x)


def input_batch_axes(kernel_fn: Callable, x: Any) -> Any:
  """The batch axis of each input array of `x` that `kernel_fn` expects.

  Args:
    kernel_fn: a kernel function (a stax one declares its input axes; any
      other is taken to have batch axis 0).
    x: an input array or a (nested) list/tuple of them.

  Returns:
    An int per input array, in the structure of `x` (lists/tuples only).

  Example:
    >>> import jax.numpy as jnp
    >>> from neural_tangents import stax
    >>> _, _, kernel_fn = stax.parallel(stax.Dense(1), stax.Dense(1))
    >>> input_batch_axes(kernel_fn, (jnp.ones((2, 3)), jnp.ones((2, 4))))
    (0, 0)
  """
  return jax.tree_util.tree_map(
      lambda a: a.batch_axis, input_axes(kernel_fn, x),
      is_leaf=lambda a: isinstance(a, InputAxes))
