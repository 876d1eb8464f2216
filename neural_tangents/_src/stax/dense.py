"""Linear layers: `Dense`, `Identity`, `Flatten`.

Every layer is `(init_fn, apply_fn, kernel_fn)`; the kernel function sits next
to the finite-width `apply_fn` it is the infinite-width limit of. (Also
importable from `neural_tangents._src.stax.linear`, the published path.)
"""
import math
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
from jax import random

from neural_tangents._src.stax.layout import check_layout
from neural_tangents._src.stax.layout import reduce_spatial
from neural_tangents._src.stax.masking import supports_masking
from neural_tangents._src.stax.parameterization import Parameterization
from neural_tangents._src.stax.protocol import Bool
from neural_tangents._src.stax.protocol import Diagonal
from neural_tangents._src.stax.requirements import layer
from neural_tangents._src.stax.requirements import requires
from neural_tangents._src.utils import arguments
from neural_tangents._src.utils import kernel as kernel_lib
from neural_tangents._src.utils.arguments import canonicalize_axis
from neural_tangents._src.utils.kernel import Kernel
from neural_tangents._src.utils.typing import Layer


def _affine(x: Optional[jax.Array], W_std: float,
            b_var: Optional[Any]) -> Optional[jax.Array]:
  """The covariance map of `W x + b`: `W_std^2 * x + b_var`, with `b_var`
  the stored `b_std^2` (`kernel_lib.stored_constant`)."""
  if x is None:
    return None
  out = W_std**2 * x
  return out if b_var is None else out + b_var


@layer
@supports_masking(remask_kernel=True)
def Dense(out_dim: int,
          W_std: float = 1.,
          b_std: Optional[float] = None,
          batch_axis: int = 0,
          channel_axis: int = -1,
          parameterization: str = 'ntk',
          s: tuple[int, int] = (1, 1)) -> Layer:
  r"""Fully connected layer acting on the channel axis.

  NTK parameterization: `y = W_std / sqrt(fan_in) * x @ W + b_std * b` with
  `W ~ N(0, 1)` of shape `(fan_in, out_dim)` and `b ~ N(0, 1)` of shape
  `(1, ..., out_dim, ..., 1)` (out_dim on the channel axis; `None` when
  `b_std is None`). Kernels (Neal 1996; Jacot et al. 2018):

    nngp' = W_std^2 * nngp + b_std^2
    ntk'  = nngp' + W_std^2 * ntk

  Standard parameterization (Sohl-Dickstein et al. 2020), with width
  multipliers `s = (s0, s1)`: the layer has `s1 * out_dim` output channels
  and the nominal fan-in `fan_in / s0` (`fan_in` the actual number of input
  channels, i.e. the input is `s0` times wider than nominal);
  `y = x @ W / sqrt(s0) + b` with the stored `W ~ N(0, W_std^2 / (fan_in /
  s0))` of shape `(fan_in, s1 * out_dim)` and `b ~ N(0, b_std^2)` of size
  `s1 * out_dim`. The NNGP is as above, and the NTK is that of the stored
  params:

    ntk' = (fan_in / s0) * nngp + W_std^2 * ntk + [b_std is not None]

  (the gradient w.r.t. `W` gives `x . x' / s0`, the one w.r.t. `b` gives 1).
  `s` is ignored in the NTK parameterization.

  Masked inputs (see `masking`): an output position is masked iff all its
  input channels are; masked outputs (and their covariances) are zero.

  Args:
    out_dim: number of output channels, positive.
    W_std: weight standard deviation.
    b_std: bias standard deviation; `None` for no bias.
    batch_axis: batch axis of the inputs.
    channel_axis: channel axis of the inputs (the one contracted).
    parameterization: 'ntk' or 'standard'.
    s: width multipliers `(s0, s1)` of the input and the output for the
      standard parameterization (see above); ignored for 'ntk'.

  Returns:
    `(init_fn, apply_fn, kernel_fn)`.

  Example:
    >>> from jax import random
    >>> from neural_tangents import stax
    >>> init_fn, apply_fn, kernel_fn = stax.Dense(512, W_std=1.5, b_std=0.1)
    >>> _, (W, b) = init_fn(random.PRNGKey(0), (-1, 784))
    >>> W.shape, b.shape
    ((784, 512), (1, 512))
  """
  arguments.positive_int(out_dim, 'out_dim', 'Pass the number of output '
                         'channels, e.g. `Dense(512)`.')
  arguments.real_number(W_std, 'W_std', 'Pass e.g. `W_std=1.5`.',
                        layer_name='Dense')
  arguments.real_number(b_std, 'b_std', 'Pass e.g. `b_std=0.05`, or None for '
                        'no bias.', layer_name='Dense', allow_none=True)
  param = arguments.parse_enum(parameterization, Parameterization,
                               'parameterization')
  s = arguments.positive_int_tuple(s, 's', 'Pass e.g. s=(1, 1).', length=2,
                                  length_of='width multiplier (input, output)')
  standard = param == Parameterization.STANDARD
  s_in, s_out = s if standard else (1, 1)
  width = s_out * out_dim  # The actual number of output channels.

  def init_fn(rng, input_shape):
    ndim = len(input_shape)
    c_axis = canonicalize_axis(channel_axis, ndim, 'channel_axis')
    fan_in = input_shape[c_axis]
    if fan_in == 0:  # `W_std / sqrt(fan_in)` is undefined.
      raise ValueError(
          f'`Dense` needs at least one input channel; got input_shape='
          f'{tuple(input_shape)}, with 0 channels on axis {channel_axis}. '
          'Pass inputs with channels (e.g. `x.reshape(-1, 1)` for one '
          'scalar feature per example).')
    output_shape = tuple(input_shape[:c_axis]) + (width,) + tuple(
        input_shape[c_axis + 1:])
    k1, k2 = random.split(rng)
    W = random.normal(k1, (fan_in, width))
    b_shape = [1] * ndim
    b_shape[c_axis] = width
    b = None if b_std is None else random.normal(k2, b_shape)
    if standard:
      W = W_std / math.sqrt(fan_in / s_in) * W
      b = None if b is None else b_std * b
    return output_shape, (W, b)

  def apply_fn(params, inputs, **kwargs):
    W, b = params
    c_axis = canonicalize_axis(channel_axis, inputs.ndim, 'channel_axis')
    if inputs.shape[c_axis] != W.shape[0]:
      raise ValueError(
          f'`Dense` expects {W.shape[0]} channels on axis {channel_axis} of its '
          f'inputs (the first axis of `W`, of shape {W.shape}); got inputs of '
          f'shape {inputs.shape}. Pass inputs matching the `input_shape` '
          'given to `init_fn`, and the params `(W, b)` it returned (`W` of '
          'shape (in_channels, out_channels), not transposed).')
    if W.ndim != 2 or W.shape[1] != width or (
        b is not None and jnp.size(b) != width) or (
            (b is None) != (b_std is None)):
      # Params of another network (e.g. `Dense(3)` for `Dense(8)`) would run
      # and give outputs of the wrong width.
      raise ValueError(
          f'The params of `Dense({out_dim})` must be `(W, b)` with `W` of '
          f'shape (in_channels, {width}) and `b` '
          f'{"None" if b_std is None else f"of {width} entries"}; got `W` of '
          f'shape {jnp.shape(W)} and `b` '
          f'{"None" if b is None else f"of shape {jnp.shape(b)}"}. Pass the '
          "params this network's `init_fn` returned.")
    out = jnp.moveaxis(jnp.tensordot(inputs, W, (c_axis, 0)), -1, c_axis)
    if standard:
      out = out / math.sqrt(s_in)
      return out if b is None else out + b
    out = W_std / math.sqrt(W.shape[0]) * out
    return out if b is None else out + b_std * b

  @requires(batch_axis=batch_axis, channel_axis=channel_axis,
            diagonal_batch=Diagonal(), diagonal_spatial=Diagonal(),
            accepts_scaled=True)
  def kernel_fn(k: Kernel, **kwargs) -> Kernel:
    check_layout(k, batch_axis, channel_axis, 'Dense')

    def bias(field, value):
      if b_std is None:
        return None if value else 0.
      return kernel_lib.stored_constant(k, field, b_std**2 if value else 1.)

    nngp = _affine(k.nngp, W_std, bias('nngp', True))
    ntk = k.ntk
    if ntk is not None:
      if standard:
        nominal_fan_in = k.channels / s_in
        ntk = (nominal_fan_in * k.nngp + W_std**2 * ntk +
               bias('nngp', False))
      else:
        ntk = nngp + W_std**2 * ntk
    c_axis = k.channel_axis % len(k.shape1)
    return k.replace(
        nngp=nngp,
        ntk=ntk,
        cov1=_affine(k.cov1, W_std, bias('cov1', True)),
        cov2=_affine(k.cov2, W_std, bias('cov2', True)),
        is_gaussian=True,
        is_input=False,
        shape1=_replace_at(k.shape1, c_axis, width),
        shape2=_replace_at(k.shape2, c_axis, width))

  def mask_fn(mask, input_shape):
    # Channels are mixed: a position is masked iff all its channels are.
    return jnp.all(mask, axis=channel_axis, keepdims=True)

  return init_fn, apply_fn, kernel_fn, mask_fn


def _replace_at(shape: Sequence[int], axis: int, value: int) -> tuple[int, ...]:
  shape = list(shape)
  shape[axis] = value
  return tuple(shape)


@layer
@supports_masking(remask_kernel=False)
def Identity() -> Layer:
  """The identity layer: `apply_fn(params, x) = x`, kernel unchanged.

  Example:
    >>> import jax.numpy as jnp
    >>> from neural_tangents import stax
    >>> _, apply_fn, _ = stax.Identity()
    >>> apply_fn((), jnp.ones(3)).shape
    (3,)
  """
  init_fn = lambda rng, input_shape: (input_shape, ())
  apply_fn = lambda params, inputs, **kwargs: inputs

  @requires(diagonal_batch=Diagonal(), diagonal_spatial=Diagonal())
  def kernel_fn(k, **kwargs):
    return k

  return init_fn, apply_fn, kernel_fn


@layer
@supports_masking(remask_kernel=False)
def Flatten(batch_axis: int = 0, batch_axis_out: int = 0) -> Layer:
  """Flattens all non-batch axes into one channel axis.

  The output's channels are the input's (position, channel) pairs, so its
  kernel is the mean over positions of the input kernel's spatial diagonal
  (Novak et al. 2019): only the spatial diagonal is ever needed. Masked
  entries (see `masking`) are zero features of the output, masked there.

  Args:
    batch_axis: batch axis of the inputs.
    batch_axis_out: batch axis of the output, 0 or 1 (the channel axis is the
      other one; the kernel records it as -1 when it is last, as published).

  Returns:
    `(init_fn, apply_fn, kernel_fn)`.

  Example:
    >>> from neural_tangents import stax
    >>> init_fn, _, _ = stax.Flatten()
    >>> init_fn(None, (-1, 8, 8, 3))[0]
    (-1, 192)
  """
  if batch_axis_out not in (0, 1, -1, -2):
    raise ValueError(
        f'`batch_axis_out` of `Flatten` must be 0 or 1 (or -2, -1); got '
        f'{batch_axis_out!r}. Pass 0 for `(batch, features)` outputs (the '
        'default) or 1 for `(features, batch)`.')
  batch_axis_out %= 2
  # The published kernel metadata: channel axis -1 (the last) by default, 0
  # when the batch axis is last.
  channel_axis_out = -1 if batch_axis_out == 0 else 0

  def output_shape(input_shape):
    b = canonicalize_axis(batch_axis, len(input_shape), 'batch_axis')
    rest = math.prod(s for i, s in enumerate(input_shape) if i != b)
    return ((input_shape[b], rest) if batch_axis_out == 0 else
            (rest, input_shape[b]))

  def init_fn(rng, input_shape):
    return output_shape(input_shape), ()

  def apply_fn(params, inputs, **kwargs):
    b = canonicalize_axis(batch_axis, inputs.ndim, 'batch_axis')
    out = jnp.moveaxis(inputs, b, 0).reshape(inputs.shape[b], -1)
    return out if batch_axis_out == 0 else out.T

  @requires(batch_axis=batch_axis, diagonal_batch=Diagonal(),
            diagonal_spatial=Diagonal(input=Bool.YES,
                                              output=Bool.YES))
  def kernel_fn(k: Kernel, **kwargs) -> Kernel:
    def position_mean(x, n_batch):
      if x is None:
        return None
      if not k.diagonal_spatial:
        x = kernel_lib.spatial_diagonal(x, n_batch)
      return jnp.mean(x, axis=tuple(range(n_batch, x.ndim)))

    return reduce_spatial(k, position_mean, output_shape, batch_axis_out,
                          channel_axis_out)

  def mask_fn(mask, input_shape):
    # Masked entries are zeros among the flattened features, and stay masked
    # there (as published, `apply_fn` keeps returning a `MaskedArray`).
    b = canonicalize_axis(batch_axis, len(input_shape), 'batch_axis')
    shape = list(input_shape)
    shape[b] = mask.shape[b]
    out = jnp.moveaxis(jnp.broadcast_to(mask, shape), b, 0)
    out = out.reshape(out.shape[0], -1)
    return out if batch_axis_out == 0 else out.T

  return init_fn, apply_fn, kernel_fn, mask_fn
