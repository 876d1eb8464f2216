"""The `Kernel`: the covariances of a network's outputs, passed layer to layer.

Layout. For inputs `x1` of shape `(N1, S_1, ..., S_d, C)` (any positions of
the batch and channel axes, recorded in `batch_axis` / `channel_axis`) and
`x2` of shape `(N2, S_1, ..., S_d, C)`, with `d` spatial dimensions:

* `nngp` and `ntk` have shape `(N1, N2, S_1, S_1, ..., S_d, S_d)`: a pair of
  axes for each spatial dimension, `x1`'s position then `x2`'s, interleaved.
  With `diagonal_spatial=True` only the diagonal of each pair is kept:
  `(N1, N2, S_1, ..., S_d)`.
* `cov1` is the same for `x1` against itself, with `diagonal_batch=True`
  keeping only the batch diagonal: `(N1, S_1, S_1, ...)` (or `(N1, S_1, ...)`
  with `diagonal_spatial`); with `diagonal_batch=False` it is
  `(N1, N1, S_1, S_1, ...)`. `cov2` is the same for `x2`, and `None` when
  `x2` is `x1` (`x1_is_x2`).

Entries are covariances normalized by the number of channels (the mean over
channels of products of activations), so they stay finite as width grows.
"""
from typing import Any, Optional

import jax
import jax.numpy as jnp

from neural_tangents._src.utils import dataclasses

Array = jax.Array


@dataclasses.dataclass
class Kernel:
  """Covariances of a (possibly infinitely wide) network's outputs.

  Attributes:
    nngp: covariance of outputs on `x1` with outputs on `x2` (see module
      docstring for the layout).
    ntk: the neural tangent kernel, same layout as `nngp`; `None` when not
      asked for.
    cov1: covariance of outputs on `x1` with themselves.
    cov2: covariance of outputs on `x2` with themselves; `None` when `x2` is
      `x1`.
    x1_is_x2: whether the kernel was computed with `x2=None`.
    is_gaussian: whether the outputs are jointly Gaussian (true after an affine
      layer, false after a nonlinearity).
    is_reversed: whether the spatial axes are stored in reverse order. Always
      `False` in this implementation; kept so that code inspecting it works.
    is_input: whether this is the kernel of the raw inputs.
    diagonal_batch: whether `cov1` / `cov2` keep only the batch diagonal.
    diagonal_spatial: whether only the spatial diagonal is stored.
    shape1: shape of the activations on `x1`.
    shape2: shape of the activations on `x2`.
    batch_axis: batch axis of the activations.
    channel_axis: channel axis of the activations.
    mask1: boolean mask of `x1` (`True` = masked out), or `None`.
    mask2: boolean mask of `x2`, or `None`.

  Example:
    >>> from neural_tangents import stax
    >>> _, _, kernel_fn = stax.serial(stax.Dense(1), stax.Relu(),
    ...                               stax.Dense(1))
    >>> k = kernel_fn(jnp.ones((3, 4)), None)
    >>> k.nngp.shape, k.cov1.shape
    ((3, 3), (3,))
  """
  nngp: Array
  ntk: Optional[Array]
  cov1: Array
  cov2: Optional[Array]
  mask1: Optional[Array] = None
  mask2: Optional[Array] = None
  x1_is_x2: bool = dataclasses.field(pytree_node=False, default=False)
  is_gaussian: bool = dataclasses.field(pytree_node=False, default=False)
  is_reversed: bool = dataclasses.field(pytree_node=False, default=False)
  is_input: bool = dataclasses.field(pytree_node=False, default=False)
  diagonal_batch: bool = dataclasses.field(pytree_node=False, default=True)
  diagonal_spatial: bool = dataclasses.field(pytree_node=False, default=False)
  shape1: tuple[int, ...] = dataclasses.field(pytree_node=False, default=())
  shape2: tuple[int, ...] = dataclasses.field(pytree_node=False, default=())
  batch_axis: int = dataclasses.field(pytree_node=False, default=0)
  channel_axis: int = dataclasses.field(pytree_node=False, default=-1)

  def replace(self, **changes: Any) -> 'Kernel':  # set by `dataclass`.
    raise NotImplementedError

  @property
  def n_spatial(self) -> int:
    """Number of spatial dimensions of the activations."""
    return len(self.shape1) - 2

  @property
  def spatial_shape1(self) -> tuple[int, ...]:
    return spatial_shape(self.shape1, self.batch_axis, self.channel_axis)

  @property
  def spatial_shape2(self) -> tuple[int, ...]:
    return spatial_shape(self.shape2, self.batch_axis, self.channel_axis)

  @property
  def channels(self) -> int:
    """Number of channels of the activations (finite proxy when infinite)."""
    return self.shape1[self.channel_axis]

  def __add__(self, other: 'Kernel') -> 'Kernel':
    add = lambda a, b: None if a is None or b is None else a + b
    return self.replace(nngp=add(self.nngp, other.nngp),
                        ntk=add(self.ntk, other.ntk),
                        cov1=add(self.cov1, other.cov1),
                        cov2=add(self.cov2, other.cov2))


def spatial_shape(shape: tuple[int, ...], batch_axis: int,
                  channel_axis: int) -> tuple[int, ...]:
  """The spatial dimensions of an activation `shape`, in order."""
  ndim = len(shape)
  skip = {batch_axis % ndim, channel_axis % ndim}
  return tuple(s for i, s in enumerate(shape) if i not in skip)


def spatial_diagonal(x: Array, n_batch: int) -> Array:
  """Keeps the diagonal of each interleaved spatial pair of axes.

  Args:
    x: array of shape `(B_1, ..., B_n_batch, S_1, S_1, ..., S_d, S_d)`.
    n_batch: number of leading (batch) axes.

  Returns:
    Array of shape `(B_1, ..., B_n_batch, S_1, ..., S_d)`.
  """
  n_spatial = (x.ndim - n_batch) // 2
  for i in range(n_spatial):
    # After `i` diagonals the next pair sits at `n_batch + i`, `n_batch + i + 1`
    # and `jnp.diagonal` moves the result to the end; cycle it back in order.
    x = jnp.diagonal(x, axis1=n_batch + i, axis2=n_batch + i + 1)
    x = jnp.moveaxis(x, -1, n_batch + i)
  return x


def batch_diagonal(cov: Array) -> Array:
  """`(N, N, ...)` -> `(N, ...)`: the covariance of each example with itself."""
  return jnp.moveaxis(jnp.diagonal(cov, axis1=0, axis2=1), -1, 0)


def variances(cov: Array, diagonal_batch: bool,
              diagonal_spatial: bool) -> Array:
  """Per-example, per-position variances `(N, S_1, ..., S_d)` of a `cov`."""
  if not diagonal_batch:
    cov = batch_diagonal(cov)
  if not diagonal_spatial:
    cov = spatial_diagonal(cov, 1)
  return cov


def outer_variances(var1: Array, var2: Array, batch_pair: bool,
                    diagonal_spatial: bool) -> tuple[Array, Array]:
  """Broadcasts variances to the layout of a covariance between two inputs.

  Args:
    var1: `(N1, S_1, ..., S_d)` variances of the left input.
    var2: `(N2, S_1, ..., S_d)` variances of the right input.
    batch_pair: whether the covariance has a pair of batch axes
      (`(N1, N2, ...)`), or a single one (a batch-diagonal `cov1`).
    diagonal_spatial: whether the covariance keeps only spatial diagonals.

  Returns:
    `(v1, v2)`, each broadcastable against the covariance, holding the variance
    of the left (resp. right) entry of every covariance entry.
  """
  n_spatial = var1.ndim - 1
  if batch_pair:
    var1 = jnp.expand_dims(var1, 1)
    var2 = jnp.expand_dims(var2, 0)
  if diagonal_spatial:
    return var1, var2
  n_batch = 2 if batch_pair else 1
  for i in range(n_spatial):
    var1 = jnp.expand_dims(var1, n_batch + 2 * i + 1)
    var2 = jnp.expand_dims(var2, n_batch + 2 * i)
  return var1, var2


def covariance_variances(k: Kernel) -> dict[str, tuple[Array, Array]]:
  """For each of `cov1`, `nngp`, `cov2`, the pair of variances of its entries.

  This is what every elementwise nonlinearity needs: the covariance `c` of a
  pair of (jointly Gaussian) pre-activations together with their variances
  `q1`, `q2`.
  """
  var1 = variances(k.cov1, k.diagonal_batch, k.diagonal_spatial)
  var2 = (var1 if k.cov2 is None else
          variances(k.cov2, k.diagonal_batch, k.diagonal_spatial))
  out = {
      'nngp': outer_variances(var1, var2, True, k.diagonal_spatial),
      'cov1': outer_variances(var1, var1, not k.diagonal_batch,
                              k.diagonal_spatial),
  }
  if k.cov2 is not None:
    out['cov2'] = outer_variances(var2, var2, not k.diagonal_batch,
                                  k.diagonal_spatial)
  return out
