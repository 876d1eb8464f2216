"""Axis layouts of activations and covariances, and moves between them.

Activations have a batch axis, a channel axis and spatial axes, anywhere; a
layer is built with its `batch_axis` and `channel_axis`, which must be those
of its input kernel (`check_layout`). The *standard layout* of activations
is `(N, S_1, ..., S_d, C)` (`to_standard` / `from_standard`).

Covariances in a `Kernel` have leading batch axes (`(N1, N2)`, or `(N,)` for
batch-diagonal `cov1` / `cov2`) and then, per spatial dimension `j`, an
interleaved pair of axes `(S_j, S_j')` (or one axis `S_j` when only the
spatial diagonal is kept). `flatten_pairs` turns the pairs into one
`(L, L')` pair of flattened positions; `permute_spatial` reorders spatial
dimensions; `map_covariances` applies a map to every covariance of a kernel
and `ensure_full_spatial` embeds spatial diagonals in full covariances.
"""
import math
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.utils import arguments
from neural_tangents._src.utils.kernel import Kernel

Array = jax.Array


def check_layout(k: Kernel, batch_axis: int, channel_axis: int,
                 layer_name: str, fix: str = (
                     'Pass the same axes to every layer, or the axes of the '
                     'first layer to this one.')) -> None:
  """Raises a `ValueError` if a layer's axes differ from its input kernel's.

  Args:
    k: the input kernel.
    batch_axis, channel_axis: the axes the layer was built with.
    layer_name: the layer, for the message.
    fix: what to do instead, for the message.

  Example:
    >>> import jax.numpy as jnp
    >>> from neural_tangents._src.stax.inputs import inputs_to_kernel
    >>> k = inputs_to_kernel(jnp.ones((2, 3)), None, diagonal_batch=True,
    ...                      diagonal_spatial=False, compute_ntk=True)
    >>> check_layout(k, 0, -1, 'Dense')  # Matches: no error.
  """
  ndim = len(k.shape1)
  if (batch_axis % ndim != k.batch_axis % ndim or
      channel_axis % ndim != k.channel_axis % ndim):
    raise ValueError(
        f'`{layer_name}(batch_axis={batch_axis}, channel_axis={channel_axis})` '
        f'does not match the layout of its inputs (batch_axis={k.batch_axis}, '
        f'channel_axis={k.channel_axis}). {fix}')


def map_covariances(k: Kernel,
                    fn: Callable[[Array, int], Array]) -> Kernel:
  """Applies `fn(array, n_batch_axes)` to `nngp`, `ntk`, `cov1`, `cov2`."""
  n_cov_batch = 1 if k.diagonal_batch else 2
  return k.replace(
      nngp=fn(k.nngp, 2),
      ntk=None if k.ntk is None else fn(k.ntk, 2),
      cov1=fn(k.cov1, n_cov_batch),
      cov2=None if k.cov2 is None else fn(k.cov2, n_cov_batch))


def embed_spatial_diagonal(x: Array, n_batch: int) -> Array:
  """Inverse of `kernel.spatial_diagonal`, with zeros off the diagonal.

  Example:
    >>> embed_spatial_diagonal(jnp.ones((2, 3)), 1)[0]
    Array([[1., 0., 0.],
           [0., 1., 0.],
           [0., 0., 1.]], dtype=float32)
  """
  n_spatial = x.ndim - n_batch
  for i in range(n_spatial):
    axis = n_batch + 2 * i
    size = x.shape[axis]
    eye = jnp.eye(size, dtype=x.dtype)
    x = jnp.expand_dims(x, axis + 1)
    shape = [1] * x.ndim
    shape[axis], shape[axis + 1] = size, size
    x = x * eye.reshape(shape)
  return x


def ensure_full_spatial(k: Kernel) -> Kernel:
  """The full spatial representation of `k`, for layers that need it.

  Requirement resolution only hands a spatially diagonal kernel to a layer
  declaring `Diagonal(input=Bool.NO)` after a layer declaring
  `Diagonal(output=Bool.YES)`, whose off-diagonal entries are zero, so
  embedding the diagonal is exact.
  """
  if not k.diagonal_spatial or k.n_spatial == 0:
    return k
  return map_covariances(k, embed_spatial_diagonal).replace(
      diagonal_spatial=False)


def interleave_pairs(x: Array, n_batch: int, n_spatial: int) -> Array:
  """`(B..., S_1..S_d, S'_1..S'_d)` -> `(B..., S_1, S'_1, ..., S_d, S'_d)`."""
  order = list(range(n_batch))
  for i in range(n_spatial):
    order += [n_batch + i, n_batch + n_spatial + i]
  return jnp.transpose(x, order)


def spatial_axes(ndim: int, batch_axis: int, channel_axis: int,
                 layer_name: str) -> list[int]:
  """The axes of rank-`ndim` activations that are neither batch nor channel.

  Raises:
    ValueError: an axis is out of range, or the two axes are the same.

  Example:
    >>> spatial_axes(4, 0, -1, 'AvgPool')
    [1, 2]
  """
  b = arguments.canonicalize_axis(batch_axis, ndim,
                                  f'batch_axis` of `{layer_name}')
  c = arguments.canonicalize_axis(channel_axis, ndim,
                                  f'channel_axis` of `{layer_name}')
  if b == c:
    raise ValueError(f'`batch_axis` and `channel_axis` of `{layer_name}` must '
                     f'differ; both are axis {b}. Pass distinct axes.')
  return [i for i in range(ndim) if i not in (b, c)]


def standard_order(ndim: int, batch_axis: int, channel_axis: int) -> list[int]:
  """Axes of rank-`ndim` activations in the order `(N, S_1, ..., S_d, C)`.

  Example:
    >>> standard_order(4, 0, 1)
    [0, 2, 3, 1]
  """
  b, c = batch_axis % ndim, channel_axis % ndim
  return [b] + [i for i in range(ndim) if i not in (b, c)] + [c]


def to_standard(x: Array, batch_axis: int, channel_axis: int,
                flatten: bool = False) -> Array:
  """Activations -> `(N, S_1, ..., S_d, C)`, or `(N, L, C)` if `flatten`.

  Example:
    >>> to_standard(jnp.ones((2, 3, 4, 5)), 0, 1, flatten=True).shape
    (2, 20, 3)
  """
  x = jnp.transpose(x, standard_order(x.ndim, batch_axis, channel_axis))
  return x.reshape(x.shape[0], -1, x.shape[-1]) if flatten else x


def from_standard(x: Array, shape: Sequence[int], batch_axis: int,
                  channel_axis: int) -> Array:
  """Inverse of `to_standard` for activations of `shape`.

  `x` is `(N', S_1, ..., S_d, C')` or `(N', L, C')`; batch and channel sizes
  may differ from `shape`'s.

  Example:
    >>> from_standard(jnp.ones((2, 20, 3)), (2, 3, 4, 5), 0, 1).shape
    (2, 3, 4, 5)
  """
  order = standard_order(len(shape), batch_axis, channel_axis)
  standard_shape = ((x.shape[0],) + tuple(shape[i] for i in order[1:-1]) +
                    (x.shape[-1],))
  return jnp.transpose(x.reshape(standard_shape), np.argsort(order))


def flatten_pairs(x: Array, n_batch: int, n_spatial: int) -> Array:
  """`(B..., S_1, S_1', ..., S_d, S_d')` -> `(B..., L, L')`.

  Example:
    >>> flatten_pairs(jnp.ones((2, 3, 3, 4, 4)), 1, 2).shape
    (2, 12, 12)
  """
  order = (list(range(n_batch)) +
           [n_batch + 2 * i for i in range(n_spatial)] +
           [n_batch + 2 * i + 1 for i in range(n_spatial)])
  x = jnp.transpose(x, order)
  batch = x.shape[:n_batch]
  n = math.prod(x.shape[n_batch:n_batch + n_spatial])
  n_prime = math.prod(x.shape[n_batch + n_spatial:])
  return x.reshape(batch + (n, n_prime))


def unflatten_pairs(x: Array, n_batch: int, spatial: tuple[int, ...],
                    spatial2: Optional[tuple[int, ...]] = None) -> Array:
  """Inverse of `flatten_pairs` for the spatial shapes `spatial` (of the
  first side) and `spatial2` (of the second; `spatial` if `None`)."""
  spatial2 = spatial if spatial2 is None else tuple(spatial2)
  x = x.reshape(x.shape[:n_batch] + tuple(spatial) + spatial2)
  return interleave_pairs(x, n_batch, len(spatial))


def permute_spatial(x: Array, n_batch: int, perm: Sequence[int],
                    diagonal_spatial: bool) -> Array:
  """Reorders spatial dimensions: new dimension `j` is old `perm[j]`.

  Example:
    >>> permute_spatial(jnp.ones((2, 3, 3, 4, 4)), 1, (1, 0), False).shape
    (2, 4, 4, 3, 3)
  """
  if list(perm) == sorted(perm):
    return x
  order = list(range(n_batch))
  for p in perm:
    order += ([n_batch + p] if diagonal_spatial else
              [n_batch + 2 * p, n_batch + 2 * p + 1])
  return jnp.transpose(x, order)


def reduce_spatial(k: Kernel, reduce: Callable[[Array, int], Array],
                   output_shape: Callable[[Sequence[int]], tuple[int, ...]],
                   batch_axis: int, channel_axis: int) -> Kernel:
  """The kernel of a layer that reduces away every spatial axis.

  Args:
    k: the input kernel.
    reduce: `reduce(covariance, n_batch_axes)`, applied to every covariance;
      it leaves only the batch axes.
    output_shape: the layer's output shape for an input shape.
    batch_axis, channel_axis: the axes of the (rank-2) outputs.

  Returns:
    The output kernel, without spatial dimensions.
  """
  return map_covariances(k, reduce).replace(
      is_input=False,
      diagonal_spatial=False,
      shape1=output_shape(k.shape1),
      shape2=output_shape(k.shape2),
      batch_axis=batch_axis,
      channel_axis=channel_axis)
