"""Layer machinery: the `@layer`, `@requires` and `@supports_masking` decorators.

A stax layer is a triple `(init_fn, apply_fn, kernel_fn)`. Layer authors
write `kernel_fn` as a *kernel op*, a function `Kernel -> Kernel` (or lists of
kernels for branching layers), and decorate it with `@requires(...)` to
declare which representations of its input it can work with. `@layer` then
turns the op into the public `kernel_fn(x1, x2=None, get=None, **kwargs)`
that users call, which:

1. validates `get` and the inputs;
2. resolves, across the whole network, the cheapest representation of the
   input kernel that every layer allows (batch-diagonal `cov1`/`cov2`,
   spatially diagonal covariances), by propagating requirements backwards from
   the representation asked for at the output;
3. builds the input `Kernel`, skipping the NTK when `get` does not need it;
4. runs the ops and returns what `get` asks for.

A layer written by hand, `(init_fn, apply_fn, kernel_fn)` with a plain
`kernel_fn(k, **kwargs)` (no `@requires`, no `@layer`), works in `serial` and
`parallel` and is treated as a local layer, as if decorated with
`@requires()` (the published release's default): with `kernel_fn`'s defaults
it receives batch-diagonal covariances (`cov1` of shape `(N1,)`,
`diagonal_batch=True`) and full spatial ones. `serial` raises a `ValueError`
when a layer gives only spatial diagonals to one that needs the full
covariance.

Representation requirements are stated per axis kind (`diagonal_batch`,
`diagonal_spatial`) with a `Diagonal(input, output)`, with the values and the
composition (`>>`, `<<`) of the published release. Resolution runs backwards
from the network's output with a level `s` (`YES` where a diagonal output is
asked for, else `NO`): a layer with `Diagonal(i, o)` passes on `i` if
`o == YES` or `s + o >= 2`, else `NO` (`protocol.transfer`); the input kernel
is diagonal where the level reaching it is `YES`. So:

* `Diagonal()`, i.e. `(input=YES, output=NO)`: a local layer (`Dense`,
  nonlinearities, convolutions): it computes from a diagonal input iff what
  follows allows a diagonal.
* `input=Bool.NO`: it needs the full input (global pooling, attention).
* `(input=YES, output=YES)`: whatever follows is computed from the diagonal
  (the output has no off-diagonal entries left, as `Flatten`'s has no spatial
  axes), so its input may always be diagonal.
* `MAYBE` is an intermediate level: an `input=MAYBE` is passed on only by
  layers whose `output` is `MAYBE` or `YES`, and never makes the network's
  input diagonal by itself.

What a layer declares is one `KernelSpec` on its kernel op, read with
`kernel_spec(kernel_fn)` (see `protocol`).

Example:
  >>> @layer
  ... def Scale(c: float):
  ...   init_fn = lambda rng, input_shape: (input_shape, ())
  ...   apply_fn = lambda params, x, **kwargs: c * x
  ...   @requires(diagonal_batch=Diagonal(), diagonal_spatial=Diagonal())
  ...   def kernel_fn(k, **kwargs):
  ...     scale = lambda x: None if x is None else c**2 * x
  ...     return k.replace(nngp=scale(k.nngp), ntk=scale(k.ntk),
  ...                      cov1=scale(k.cov1), cov2=scale(k.cov2))
  ...   return init_fn, apply_fn, kernel_fn
  >>> _, _, kernel_fn = Scale(2.)
  >>> kernel_fn(x1, x2, 'nngp').shape
  (3, 2)
"""
import dataclasses
import functools
from typing import Any, Callable, Optional

import jax
from jax import lax
import jax.numpy as jnp

from neural_tangents._src.stax import masking
from neural_tangents._src.stax import protocol
# Covariance layouts; `ensure_full_spatial` and `map_covariances` are
# importable from here too.
from neural_tangents._src.stax.layout import embed_spatial_diagonal
from neural_tangents._src.stax.layout import ensure_full_spatial
from neural_tangents._src.stax.layout import interleave_pairs
from neural_tangents._src.stax.layout import map_covariances
# `supports_masking` is defined with the rest of masking; re-exported here.
from neural_tangents._src.stax.masking import supports_masking  # pylint: disable=unused-import
# The protocol's names, re-exported for layer modules.
from neural_tangents._src.stax.protocol import Allowed
from neural_tangents._src.stax.protocol import Bool
from neural_tangents._src.stax.protocol import conjunction
from neural_tangents._src.stax.protocol import Diagonal
from neural_tangents._src.stax.protocol import kernel_op_of
from neural_tangents._src.stax.protocol import kernel_spec
from neural_tangents._src.stax.protocol import KernelSpec
from neural_tangents._src.stax.protocol import Requirements
from neural_tangents._src.stax.protocol import undeclared_kernel_op
from neural_tangents._src.utils import arguments
from neural_tangents._src.utils import kernel as kernel_lib
from neural_tangents._src.utils import scaling
from neural_tangents._src.utils import utils
from neural_tangents._src.utils.kernel import Kernel

GET_VALUES = ('nngp', 'ntk', 'cov1', 'cov2')
# Any `Kernel` field is a valid `get` (e.g. `('ntk', 'shape1', 'shape2')`);
# `GET_VALUES` are the covariances, named first in messages.
GET_FIELDS = GET_VALUES + tuple(
    f.name for f in dataclasses.fields(Kernel) if f.name not in GET_VALUES)
# Keywords that the public `kernel_fn` itself reads.
KERNEL_FN_KEYWORDS = ('diagonal_batch', 'diagonal_spatial', 'mask_constant')


def requires(diagonal_batch: Diagonal = Diagonal(),
             diagonal_spatial: Diagonal = Diagonal(),
             batch_axis: Optional[int] = None,
             channel_axis: Optional[int] = None) -> Callable[[Callable],
                                                             Callable]:
  """Declares the input representations a kernel op can work with.

  Args:
    diagonal_batch: requirement on the batch diagonal of `cov1` / `cov2`.
    diagonal_spatial: requirement on the spatial diagonal.
    batch_axis: batch axis the layer expects of its inputs, if it has one.
    channel_axis: channel axis the layer expects of its inputs.

  Returns:
    A decorator attaching the `KernelSpec` of these requirements to the
    kernel op.
  """
  input_axes = (None if batch_axis is None and channel_axis is None
                else (0 if batch_axis is None else batch_axis,
                      -1 if channel_axis is None else channel_axis))
  spec = KernelSpec(Requirements(diagonal_batch, diagonal_spatial),
                    input_axes=input_axes)

  def decorator(kernel_op: Callable) -> Callable:
    return protocol.with_spec(kernel_op, dataclasses.replace(
        spec, keywords=protocol.read_keywords(kernel_op,
                                              var_keyword_reads_all=False)))
  return decorator


# -----------------------------------------------------------------------------
# The public `kernel_fn`.


def _parse_get_single(get: Any) -> tuple[Optional[tuple[str, ...]], bool]:
  """`(names or None, single)` of `get`, or raises `ValueError`."""
  try:
    return arguments.parse_get(get, GET_FIELDS)
  except ValueError as e:
    raise ValueError(
        f'`get` must be None, one of {GET_VALUES} (or another `Kernel` field '
        f'name: {GET_FIELDS[len(GET_VALUES):]}), or a tuple of them; got '
        f'{get!r}. Pass e.g. get="ntk" or get=("nngp", "ntk"). ({e})'
    ) from None


def _parse_get(get: Any) -> Optional[tuple[str, ...]]:
  """`get` as a tuple of names (or `None`), or raises `ValueError`."""
  return _parse_get_single(get)[0]


def _select(k: Any, get: Any) -> Any:
  """Extracts what `get` asks for from a kernel (or a pytree of kernels)."""
  names, single = _parse_get_single(get)
  if names is None:
    return k
  if isinstance(k, (list, tuple)):
    return type(k)(_select(ki, get) for ki in k)

  def field(name):
    if name == 'cov2' and k.cov2 is None:
      return k.cov1
    value = getattr(k, name)
    if value is None and name in GET_VALUES:
      raise ValueError(
          f'`get={get!r}` asks for {name!r}, which this kernel does not hold. '
          'Ask for it when calling `kernel_fn`, e.g. get=("nngp", "ntk").')
    return value

  if single:
    return field(names[0])
  return utils.get_namedtuple(names)(*(field(name) for name in names))


def _move_to_standard_layout(x: jax.Array, batch_axis: int,
                             channel_axis: int) -> jax.Array:
  """Moves batch to the front and channels to the back: `(N, S..., C)`."""
  ndim = x.ndim
  batch_axis, channel_axis = batch_axis % ndim, channel_axis % ndim
  if batch_axis == channel_axis:
    raise ValueError(
        f'`batch_axis` ({batch_axis}) and `channel_axis` ({channel_axis}) must '
        'differ. Pass distinct axes to the first layer.')
  order = [batch_axis] + [i for i in range(ndim)
                          if i not in (batch_axis, channel_axis)]
  return jnp.transpose(x, order + [channel_axis])


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
    The covariance in the `Kernel` layout.
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
    return interleave_pairs(out, 2, n_spatial)
  out = jax.vmap(lambda a, b: jnp.tensordot(a, b, axes=(-1, -1),
                                            precision=hi))(x1, x2) / c
  return interleave_pairs(out, 1, n_spatial)


def _check_input(x: Any, name: str) -> jax.Array:
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


def _scale_examples(z: jax.Array) -> tuple[jax.Array, jax.Array]:
  """`(z / s, s)` for per-example powers of 2 `s` near `max |z_i|`.

  Products of input entries overflow (float32 inputs above about 1.8e19)
  where the covariance itself is representable; covariances of the scaled inputs are then
  multiplied back by `s_i s_j`. The scaling is exact, so in the normal range
  the covariance is bitwise the same as without it.
  """
  amax = jnp.max(jnp.abs(z), axis=tuple(range(1, z.ndim)))
  s = scaling.power_of_two(scaling.exponent_of(amax) - 1, z.dtype)
  return z / s.reshape((-1,) + (1,) * (z.ndim - 1)), s


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
  """
  x1, mask1 = masking.split(masking.get_masked_array(x1, mask_constant, 'x1'))
  x2, mask2 = masking.split(masking.get_masked_array(x2, mask_constant, 'x2'))
  if x2 is None:
    mask2 = mask1
  x1 = _check_input(x1, 'x1')
  if x2 is not None:
    x2 = _check_input(x2, 'x2')
    b = batch_axis % x1.ndim
    if (x1.ndim != x2.ndim or
        x1.shape[:b] + x1.shape[b + 1:] != x2.shape[:b] + x2.shape[b + 1:]):
      raise ValueError(
          f'`x1` and `x2` must have the same shape except along the batch axis '
          f'{batch_axis}; got x1.shape={x1.shape} and x2.shape={x2.shape}. '
          'Pass `x2` with the same features as `x1` (or `x2=None`).')
  z1 = _move_to_standard_layout(x1, batch_axis, channel_axis)
  z2 = z1 if x2 is None else _move_to_standard_layout(x2, batch_axis,
                                                        channel_axis)
  z1, s1 = _scale_examples(z1)
  z2, s2 = (z1, s1) if x2 is None else _scale_examples(z2)

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

  cov1 = self_cov(z1, s1)
  cov2 = None if x2 is None else self_cov(z2, s2)
  return Kernel(
      nngp=nngp,
      ntk=jnp.zeros_like(nngp) if compute_ntk else None,
      cov1=cov1,
      cov2=cov2,
      mask1=mask1,
      mask2=mask2,
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


def match_representation(k: Any, allowed: Any) -> Any:
  """Converts `k` to the representation `allowed` asks for, if it differs.

  A full kernel where a diagonal one is allowed is reduced to its diagonal
  when the allowance is what the caller requested; a diagonal kernel where a
  full one is needed is only produced by layers declaring
  `Diagonal(output=Bool.YES)` (nothing after them needs off-diagonal
  entries), and is embedded.
  """
  if isinstance(k, (list, tuple)):
    if isinstance(allowed, Allowed):
      allowed = [allowed] * len(k)
    return type(k)(match_representation(ki, a) for ki, a in zip(k, allowed))
  allowed = conjunction(allowed)
  if k.n_spatial == 0 or k.diagonal_spatial == allowed.diagonal_spatial:
    pass
  elif k.diagonal_spatial:
    k = map_covariances(k, embed_spatial_diagonal).replace(
        diagonal_spatial=False)
  else:
    k = map_covariances(k, kernel_lib.spatial_diagonal).replace(
        diagonal_spatial=True)
  if k.diagonal_batch != allowed.diagonal_batch and not k.diagonal_batch:
    k = k.replace(cov1=kernel_lib.batch_diagonal(k.cov1),
                  cov2=None if k.cov2 is None else
                  kernel_lib.batch_diagonal(k.cov2),
                  diagonal_batch=True)
  return k


def is_kernel_tree(x: Any) -> bool:
  """Whether `x` is a `Kernel` or a (nested) non-empty list/tuple of them."""
  if isinstance(x, Kernel):
    return True
  return (isinstance(x, (list, tuple)) and bool(x) and
          all(is_kernel_tree(xi) for xi in x))


def _map_inputs(fn: Callable, x1: Any, x2: Any) -> Any:
  """Maps `fn(x1_leaf, x2_leaf)` over (list/tuple) pytrees of inputs."""
  if isinstance(x1, (list, tuple)):
    if x2 is None:
      x2 = [None] * len(x1)
    if not isinstance(x2, (list, tuple)) or len(x2) != len(x1):
      raise ValueError(
          f'`x2` must have the same structure as `x1` ({len(x1)} inputs); got '
          f'{type(x2).__name__}. Pass one `x2` array per `x1` array, or None.')
    return type(x1)(_map_inputs(fn, a, b) for a, b in zip(x1, x2))
  return fn(x1, x2)


def _broadcast_allowed(allowed: Any, x1: Any) -> Any:
  if isinstance(x1, (list, tuple)):
    if isinstance(allowed, Allowed):
      allowed = [allowed] * len(x1)
    return type(x1)(_broadcast_allowed(a, x) for a, x in zip(allowed, x1))
  return conjunction(allowed)


def _first_axes(axes: Any) -> Any:
  """The first `(batch_axis, channel_axis)` declared in a pytree of them."""
  if axes is None or not isinstance(axes, list):
    return axes
  for a in axes:
    a = _first_axes(a)
    if a is not None:
      return a
  return None


def _broadcast_axes(axes: Any, x1: Any) -> Any:
  if not isinstance(x1, (list, tuple)):
    axes = _first_axes(axes)
  if isinstance(x1, (list, tuple)):
    if axes is None or (isinstance(axes, tuple) and len(axes) == 2 and
                        all(isinstance(a, int) for a in axes)):
      axes = [axes] * len(x1)
    return type(x1)(_broadcast_axes(a, x) for a, x in zip(axes, x1))
  return (0, -1) if axes is None else axes


def input_batch_axes(kernel_fn: Callable, x: Any) -> Any:
  """The batch axis of each input array of `x` that `kernel_fn` expects.

  Args:
    kernel_fn: a kernel function (a stax one declares its input axes; any
      other is taken to have batch axis 0).
    x: an input array or a (nested) list/tuple of them.

  Returns:
    An int per input array, in the structure of `x` (lists/tuples only).

  Example:
    >>> _, _, kernel_fn = stax.parallel(stax.Dense(1), stax.Dense(1))
    >>> input_batch_axes(kernel_fn, (jnp.ones((2, 3)), jnp.ones((2, 4))))
    (0, 0)
  """
  axes = _broadcast_axes(kernel_spec(kernel_fn).input_axes, x)
  return jax.tree_util.tree_map(
      lambda a: a[0], axes,
      is_leaf=lambda a: isinstance(a, tuple) and len(a) == 2 and isinstance(
          a[0], int))


def public_kernel_fn(kernel_op: Callable) -> Callable:
  """Wraps a kernel op into the user-facing `kernel_fn`."""

  def kernel_fn(x1_or_kernel: Any,
                x2: Any = None,
                get: Any = None,
                *,
                diagonal_batch: bool = True,
                diagonal_spatial: bool = False,
                **kwargs) -> Any:
    """Computes the NNGP / NTK of the network.

    Args:
      x1_or_kernel: inputs `(N1, ..., C)` (or a list/tuple of them for a
        network with several inputs), or a `Kernel` from a previous layer.
      x2: second inputs `(N2, ..., C)`, or `None` to use `x1`.
      get: `None` for the whole `Kernel`; a name among 'nngp', 'ntk', 'cov1',
        'cov2' for that array; or a tuple of names for a namedtuple.
      diagonal_batch: return `cov1`/`cov2` as the batch diagonal only.
      diagonal_spatial: return only the spatial diagonal of the covariances,
        `(N1, N2, S_1, ..., S_d)` instead of `(N1, N2, S_1, S_1, ...)`.
      **kwargs: `mask_constant=` (input entries equal to it are masked, see
        `masking`); the rest is passed to the layers (e.g. `pattern=` for
        `Aggregate`).

    Returns:
      What `get` asks for.
    """
    names = _parse_get(get)
    mask_constant = kwargs.pop('mask_constant', None)
    spec = kernel_spec(kernel_op)
    _check_keywords(spec, kwargs)
    if is_kernel_tree(x1_or_kernel):
      if jax.tree_util.tree_leaves(x2):
        raise ValueError(
            '`x2` must be None when `kernel_fn` is given a `Kernel`: a '
            'Kernel already holds both sides (its `nngp` is the x1-x2 '
            f'covariance); got x2 of type {type(x2).__name__}. Call '
            '`kernel_fn(kernel)`, or `kernel_fn(x1, x2)` with input arrays.')
      return _select(kernel_op(_unreversed(x1_or_kernel), **kwargs), get)

    compute_ntk = names is None or 'ntk' in names
    requested = Allowed(bool(diagonal_batch), bool(diagonal_spatial))
    allowed_in = _broadcast_allowed(spec.allowed_inputs(requested),
                                    x1_or_kernel)
    axes = _broadcast_axes(spec.input_axes, x1_or_kernel)

    def to_kernel(x1, x2, allowed, axes):
      return inputs_to_kernel(
          x1, x2,
          diagonal_batch=allowed.diagonal_batch,
          diagonal_spatial=allowed.diagonal_spatial,
          compute_ntk=compute_ntk,
          batch_axis=axes[0],
          channel_axis=axes[1],
          mask_constant=mask_constant)

    def build(x1, x2, allowed, axes):
      """Input kernels in the (nested list/tuple) structure of `x1`."""
      if isinstance(x1, (list, tuple)):
        return type(x1)(build(*leaves) for leaves in zip(x1, x2, allowed,
                                                         axes))
      k = to_kernel(x1, x2, allowed, axes)
      if requested.diagonal_spatial and k.n_spatial and not k.diagonal_spatial:
        full_inputs.append(k.shape1)
      return k

    def check_diagonal_spatial(out):
      """Refuses `diagonal_spatial=True` where nothing spatial is returned
      and a layer needed the full spatial covariance (as published); a
      spatial output is returned as its diagonal."""
      if full_inputs and not _spatially_shaped(out):
        raise ValueError(
            '`diagonal_spatial=True` cannot be honoured by this network: a '
            'layer in it (e.g. global pooling, attention, a non-nearest '
            'resize, `Aggregate`) needs the full spatial covariance of its '
            f'input, for inputs of shape {full_inputs[0]}. Pass '
            '`diagonal_spatial=False` (the default).')

    x2s = _map_inputs(lambda a, b: b, x1_or_kernel, x2)
    full_inputs = []
    k = build(x1_or_kernel, x2s, allowed_in, axes)
    out = kernel_op(k, **kwargs)
    check_diagonal_spatial(out)
    out = match_representation(out, requested)
    if not compute_ntk:
      out = _drop_ntk(out)
    return _select(out, get)

  kernel_fn.kernel_op = kernel_op  # Its `kernel_spec` is the layer's.
  return kernel_fn


def _spatially_shaped(k: Any) -> bool:
  """Whether any kernel of `k` has spatial axes."""
  if isinstance(k, (list, tuple)):
    return any(_spatially_shaped(ki) for ki in k)
  return k.n_spatial > 0


def _check_keywords(spec: KernelSpec, kwargs: dict[str, Any]) -> None:
  """Raises `TypeError` for keywords that no layer of the network reads."""
  if spec.keywords is None:  # A hand-written layer taking `**kwargs`.
    return
  unknown = sorted(set(kwargs) - spec.keywords)
  if unknown:
    accepted = sorted(set(KERNEL_FN_KEYWORDS) | spec.keywords)
    raise TypeError(
        f'`kernel_fn` got unexpected keyword argument(s) {unknown}: no layer '
        f'of this network reads them. Accepted keywords: {accepted}. Check '
        'the spelling (e.g. `diagonal_spatial`).')


def _unreversed(k: Any) -> Any:
  """Kernels with their spatial axes in order (`is_reversed=False`)."""
  if isinstance(k, (list, tuple)):
    return type(k)(_unreversed(ki) for ki in k)
  return k.reverse() if k.is_reversed else k


def _drop_ntk(k: Any) -> Any:
  if isinstance(k, (list, tuple)):
    return type(k)(_drop_ntk(ki) for ki in k)
  return k.replace(ntk=None)


def layer(layer_fn: Callable[..., tuple[Callable, Callable, Callable]]
          ) -> Callable[..., tuple[Callable, Callable, Callable]]:
  """Makes `layer_fn(...) -> (init_fn, apply_fn, kernel_op)` a stax layer.

  The kernel op is decorated with `@requires` (or is the `kernel_fn` of
  another layer); an undecorated one is given full covariances (see
  `undeclared_kernel_op`). The returned layer's `kernel_fn` is the public one
  (see `public_kernel_fn`), named after the layer.
  """

  @functools.wraps(layer_fn)
  def new_layer_fn(*args, **kwargs):
    init_fn, apply_fn, kernel_op = layer_fn(*args, **kwargs)
    kernel_op = kernel_op_of(kernel_op)
    spec = kernel_spec(kernel_op)
    if spec.name is None:
      protocol.with_spec(kernel_op,
                         dataclasses.replace(spec, name=layer_fn.__name__))
    # Every layer takes `mask_constant=`, and one that does not declare
    # `@supports_masking` refuses masked inputs instead of mishandling them.
    apply_fn = masking.check_apply_masking(apply_fn, spec.supports_masking,
                                           layer_fn.__name__)
    apply_fn = _rejecting_kernels(apply_fn, layer_fn.__name__)
    kernel_op = masking.check_kernel_masking(kernel_op, layer_fn.__name__)
    kernel_fn = public_kernel_fn(kernel_op)
    init_fn = _checked_init_fn(init_fn)
    for fn in (init_fn, apply_fn, kernel_fn):
      fn.__name__ = fn.__qualname__ = layer_fn.__name__
    return init_fn, apply_fn, kernel_fn

  return new_layer_fn


def _rejecting_kernels(apply_fn: Callable, name: str) -> Callable:
  """Wraps a layer's `apply_fn` to raise a `TypeError` for `Kernel` inputs."""

  @functools.wraps(apply_fn)
  def checked_apply_fn(params, inputs, **kwargs):
    arguments.reject_kernel(
        inputs, 'inputs',
        f'`apply_fn` of `{name}` computes the network on arrays: pass '
        '`apply_fn(params, x)`; to propagate a `Kernel`, call '
        '`kernel_fn(kernel)`.')
    return apply_fn(params, inputs, **kwargs)

  return checked_apply_fn


def _checked_init_fn(init_fn: Callable) -> Callable:
  """`init_fn` with its PRNG key and input shape checked (see `arguments`)."""
  def checked(rng, input_shape, *args, **kwargs):
    # `None` passes: a layer without parameters needs no key.
    return init_fn(arguments.prng_key(rng, allow_none=True),
                   arguments.input_shape(input_shape), *args, **kwargs)
  return checked


def _spatially_diagonal(k: Any) -> bool:
  if isinstance(k, (list, tuple)):
    return any(_spatially_diagonal(ki) for ki in k)
  return isinstance(k, Kernel) and k.diagonal_spatial and k.n_spatial > 0


def check_representation(producer: Optional[Callable], consumer: Callable,
                         k: Any) -> None:
  """Raises if `consumer` needs full spatial covariances `producer` lacks.

  A spatially diagonal kernel can only feed a layer needing the full
  covariance when the producer declares `Diagonal(output=Bool.YES)` (its
  off-diagonal entries are zero); otherwise the producer returned a diagonal
  where its declaration promised full covariances, and the kernel would be
  wrong.

  Args:
    producer: the op that produced `k` (`None` for the network's input).
    consumer: the op about to read `k`.
    k: the kernel (or list of kernels) passed between them.

  Raises:
    ValueError: naming both layers and the fix.
  """
  if producer is None or not _spatially_diagonal(k):
    return
  if kernel_spec(producer).output_diagonal == Bool.YES:
    return
  if not kernel_spec(consumer).needs_full_spatial:
    return
  p, c = protocol.layer_name(producer), protocol.layer_name(consumer)
  raise ValueError(
      f'Layers `{p}` and `{c}` cannot agree on a kernel representation: `{c}` '
      'needs the full spatial covariance of its input (diagonal_spatial='
      f'False), but `{p}` before it gives only its spatial diagonal. Declare '
      f'`{p}`\'s kernel_fn with `@requires(diagonal_spatial=Diagonal('
      'input=Bool.NO))` if it needs full covariances, make it return full '
      'covariances when given full ones (what `Diagonal()` declares), or '
      'declare `output=Bool.YES` if its off-diagonal entries are zero; or '
      f'remove `{c}` after it.')

