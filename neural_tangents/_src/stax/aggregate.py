"""Graph aggregation: `Aggregate` sums node features over graph neighbors.

For each example (graph) `n`, with nodes indexed by the positions along the
`aggregate_axis` spatial axes, the layer computes

  out[n, j] = sum_i pattern[n, i, j] x[n, i]

for every channel (and every position along the other spatial axes):
`pattern[n, i, j]` weighs the edge from node `i` to node `j`, and each node
sums over its incoming edges (the first node axis of `pattern` is summed
over, as in Neural Tangents). This is a fixed, example-dependent linear map
of positions, so the kernel is its two-point map (Du et al. 2019, "Graph
neural tangent kernel"):

  nngp'(x_n, x'_m) = P_n^T nngp(x_n, x'_m) P'_m

(the same for `ntk`, `cov1`, `cov2`), which needs the full spatial kernel.
"""
import enum
import math
from typing import Any, Callable, Optional, Sequence, Union

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.stax import masking
from neural_tangents._src.stax.layout import check_layout
from neural_tangents._src.stax.layout import ensure_full_spatial
from neural_tangents._src.stax.masking import supports_masking
from neural_tangents._src.stax.protocol import Bool
from neural_tangents._src.stax.protocol import Diagonal
from neural_tangents._src.stax.requirements import layer
from neural_tangents._src.stax.requirements import requires
from neural_tangents._src.utils import arguments
from neural_tangents._src.utils.kernel import Kernel
from neural_tangents._src.utils.typing import Layer

Array = jax.Array


class AggregateImplementation(enum.Enum):
  """How `Aggregate` takes its `pattern`.

  Attributes:
    DENSE: `pattern` is a dense `(N, *S, *S)` array of weights (after
      `to_dense`); `pattern[n, i, j]` weighs node `i`'s features in node `j`'s
      output.
    SPARSE: `pattern` is an integer `(N, n_edges, 2)` array of edges
      `(sender i, receiver j)`, each adding `x[i]` to `out[j]` (weight 1,
      duplicates add up), i.e. the nonzero indices of the dense pattern; for
      `K > 1` aggregate axes, `(N, n_edges, 2, K)` of multi-indices. Edges
      with a negative index are padding and ignored.
  """
  DENSE = 'DENSE'
  SPARSE = 'SPARSE'


def _aggregate_axes(aggregate_axis: Optional[Union[int, Sequence[int]]],
                    ndim: int, batch_axis: int,
                    channel_axis: int) -> list[int]:
  """The aggregated axes, non-negative, in increasing order."""
  b, c = batch_axis % ndim, channel_axis % ndim
  if aggregate_axis is None:
    return [i for i in range(ndim) if i not in (b, c)]
  axes = ([aggregate_axis] if isinstance(aggregate_axis, int) else
          list(aggregate_axis))
  out = []
  for a in axes:
    if not -ndim <= a < ndim or a % ndim in (b, c):
      raise ValueError(
          f'`aggregate_axis`={aggregate_axis} must list spatial axes of the '
          f'inputs of rank {ndim} (not the batch axis {b} or channel axis '
          f'{c}). Pass e.g. `aggregate_axis=1` for (N, nodes, C) inputs.')
    out.append(a % ndim)
  if len(set(out)) != len(out):
    raise ValueError(f'`aggregate_axis`={aggregate_axis} repeats an axis.')
  return sorted(out)


def _dense_pattern(pattern: Array, n: int, node_shape: tuple[int, ...],
                   name: str) -> Array:
  """Validates a dense pattern and returns it as `(N or 1, V, V)`, indexed
  `[n, sender, receiver]`."""
  pattern = jnp.asarray(pattern)
  expected = node_shape + node_shape
  if pattern.ndim != 1 + len(expected) or tuple(
      pattern.shape[1:]) != expected or pattern.shape[0] not in (1, n):
    raise ValueError(
        f'`{name}` of shape {tuple(pattern.shape)} does not match inputs with '
        f'{n} examples and nodes of shape {node_shape}: a dense pattern must '
        f'have shape {(n,) + expected} (batch, sender nodes, receiver nodes), '
        'or batch size 1 to share it. Pass `to_dense=` to convert another '
        'format, or `implementation="SPARSE"` for edge lists.')
  v = math.prod(node_shape)
  return pattern.reshape(pattern.shape[0], v, v)


def _sparse_edges(pattern: Array, n: int, node_shape: tuple[int, ...],
                  name: str) -> tuple[Array, Array]:
  """Validates edge lists; returns flat `(receivers, senders)`, each
  `(N, n_edges)`, with padding edges set to the out-of-range index `V`."""
  pattern = jnp.asarray(pattern)
  n_axes = len(node_shape)
  expected_ndim = 3 if n_axes == 1 else 4
  if (pattern.ndim != expected_ndim or pattern.shape[0] != n or
      pattern.shape[2] != 2 or (n_axes > 1 and pattern.shape[3] != n_axes) or
      not jnp.issubdtype(pattern.dtype, jnp.integer)):
    shape = f'({n}, n_edges, 2)' if n_axes == 1 else (
        f'({n}, n_edges, 2, {n_axes})')
    raise ValueError(
        f'`{name}` of shape {tuple(pattern.shape)} and dtype {pattern.dtype} '
        f'is not a sparse edge list for {n} examples and nodes of shape '
        f'{node_shape}: pass an integer array of shape {shape} of (sender, '
        'receiver) node indices, padded with -1.')
  if n_axes == 1:
    pattern = pattern[..., None]
  if not isinstance(pattern, jax.core.Tracer):
    # Edges to or from a node that does not exist would be dropped silently
    # (`segment_sum` ignores out-of-range indices); -1 pads.
    values = np.asarray(pattern)
    padded = np.any(values < 0, axis=(-2, -1))
    too_big = (values >= np.asarray(node_shape)) & ~padded[..., None, None]
    if np.any(too_big):
      edge = tuple(int(i) for i in np.argwhere(too_big)[0][:2])
      nodes = values[edge].tolist()
      if n_axes == 1:
        nodes = [node[0] for node in nodes]
      raise ValueError(
          f'`{name}` has an edge {nodes} (example {edge[0]}, edge {edge[1]}) '
          f'to or from a node beyond the {node_shape} nodes of the inputs. '
          f'Pass node indices below {node_shape}, padded with -1.')
  valid = jnp.all(pattern >= 0, axis=(-2, -1))
  v = math.prod(node_shape)
  strides = np.cumprod((1,) + node_shape[::-1][:-1])[::-1]
  flat = jnp.tensordot(pattern, jnp.asarray(strides, pattern.dtype),
                       axes=([-1], [0]))
  # Edge `(i, j)` is `pattern[i, j]` of the dense form: from `i` to `j`.
  receivers = jnp.where(valid, flat[..., 1], v)
  senders = jnp.where(valid, flat[..., 0], 0)
  return receivers, senders


def _edges_to_dense(receivers: Array, senders: Array, v: int,
                    dtype: Any) -> Array:
  """`(N, V, V)` adjacency counts `[n, receiver, sender]` of edge lists
  (padding edges dropped)."""
  def one(r, s):
    return jnp.zeros((v + 1, v), dtype).at[r, s].add(1)[:v]
  return jax.vmap(one)(receivers, senders)


def _same_pattern(p1: Any, p2: Any) -> bool:
  """Whether two patterns are the same array (or equal concrete arrays);
  traced ones cannot be compared and are taken as the same."""
  if p1 is p2:
    return True
  if p1 is None or p2 is None:
    return False
  if isinstance(p1, jax.core.Tracer) or isinstance(p2, jax.core.Tracer):
    return True
  return (np.shape(p1) == np.shape(p2) and
          bool(np.array_equal(np.asarray(p1), np.asarray(p2))))


@layer
@supports_masking(remask_kernel=True)
def Aggregate(aggregate_axis: Optional[Union[int, Sequence[int]]] = None,
              batch_axis: int = 0,
              channel_axis: int = -1,
              to_dense: Optional[Callable[[Array], Array]] = lambda p: p,
              implementation: str = 'DENSE') -> Layer:
  r"""Aggregates node features over a graph: `out[j] = sum_i P[i, j] x[i]`.

  Nodes are the positions along the `aggregate_axis` spatial axes (all
  spatial axes by default); other spatial axes are carried along. The
  pattern is passed at call time: `apply_fn(params, x, pattern=p)` and
  `kernel_fn(x1, x2, pattern=(p1, p2))` (`p2` may be `None` when `x2` is
  `None`). `pattern=None` (or a `None` entry) means the identity (no
  aggregation). Shapes (`S` the sizes of the aggregate axes, `N` the batch):

  * `implementation='DENSE'`: `to_dense(pattern)` of shape `(N, *S, *S)`
    (or `(1, *S, *S)`, shared by all examples); `to_dense` converts e.g. a
    sparse-matrix format (identity by default); `P[n, i, j]` weighs the edge
    from node `i` to node `j`.
  * `implementation='SPARSE'`: integer edge lists `(N, n_edges, 2)`
    (`(N, n_edges, 2, K)` for `K` aggregate axes) of `(sender, receiver)`
    pairs (the indices of the nonzero entries of `P`), padded with negative
    indices; `apply_fn` uses a segment sum and
    `kernel_fn` the equivalent dense counts (`to_dense` is not used).

  Kernel: for examples `n` of `x1` and `m` of `x2`,
  `nngp'[n, m] = P1[n]^T nngp[n, m] P2[m]` over the node axes (both positions
  of each aggregated spatial pair), and the same for `ntk`, `cov1`, `cov2`.

  A pattern of the wrong shape raises `ValueError`. With masked inputs,
  masked nodes contribute nothing and stay masked (a node is masked iff all
  its channels are).

  Args:
    aggregate_axis: spatial axis or axes holding the nodes; `None` for all.
    batch_axis: batch axis of the inputs.
    channel_axis: channel axis of the inputs.
    to_dense: maps a `DENSE` pattern to a dense array.
    implementation: 'DENSE' or 'SPARSE' (or `AggregateImplementation`).

  Returns:
    `(init_fn, apply_fn, kernel_fn)`.

  Example:
    >>> # Two graphs of 3 nodes with 4 features; a graph convolution:
    >>> _, apply_fn, kernel_fn = stax.serial(stax.Dense(512), stax.Relu(),
    ...                                      stax.Aggregate(), stax.Dense(1))
    >>> x = jnp.ones((2, 3, 4))
    >>> adjacency = jnp.ones((2, 3, 3))
    >>> kernel_fn(x, None, 'ntk', pattern=(adjacency, None)).shape
    (2, 2, 3, 3)
  """
  impl = arguments.parse_enum(implementation, AggregateImplementation,
                              'implementation')
  if to_dense is None:
    to_dense = lambda p: p

  def layout(ndim):
    b, c = batch_axis % ndim, channel_axis % ndim
    agg = _aggregate_axes(aggregate_axis, ndim, b, c)
    rest = [i for i in range(ndim) if i not in agg and i not in (b, c)]
    return b, c, agg, rest

  def init_fn(rng, input_shape):
    layout(len(input_shape))  # Validates `aggregate_axis`.
    return tuple(input_shape), ()

  def apply_fn(params, inputs, *, pattern=None, **kwargs):
    if pattern is None:
      return inputs
    ndim = inputs.ndim
    b, c, agg, rest = layout(ndim)
    node_shape = tuple(inputs.shape[a] for a in agg)
    n, v = inputs.shape[b], math.prod(node_shape)
    order = [b] + agg + rest + [c]
    x = jnp.transpose(inputs, order)
    moved_shape = x.shape
    x = x.reshape((n, v) + x.shape[1 + len(agg):])
    if impl == AggregateImplementation.DENSE:
      p = _dense_pattern(to_dense(pattern), n, node_shape, 'pattern')
      out = jnp.einsum('nij,ni...->nj...', p.astype(x.dtype), x,
                       precision=lax.Precision.HIGHEST)
    else:
      receivers, senders = _sparse_edges(pattern, n, node_shape, 'pattern')
      out = jax.vmap(lambda xi, r, s: jax.ops.segment_sum(
          xi[s], r, num_segments=v))(x, receivers, senders)
    return jnp.transpose(out.reshape(moved_shape), np.argsort(order))

  def dense_of(pattern, n, node_shape, dtype, name):
    """The pattern as `(N or 1, V, V)` weights `[n, receiver, sender]`."""
    if impl == AggregateImplementation.DENSE:
      p = _dense_pattern(to_dense(pattern), n, node_shape, name)
      return jnp.swapaxes(p, 1, 2).astype(dtype)
    receivers, senders = _sparse_edges(pattern, n, node_shape, name)
    return _edges_to_dense(receivers, senders, math.prod(node_shape), dtype)

  @requires(batch_axis=batch_axis, channel_axis=channel_axis,
            diagonal_batch=Diagonal(), diagonal_spatial=Diagonal(
                input=Bool.NO))
  def kernel_fn(k: Kernel, *, pattern=(None, None), **kwargs) -> Kernel:
    ndim = len(k.shape1)
    check_layout(k, batch_axis, channel_axis, 'Aggregate')
    p1, p2 = _kernel_patterns(pattern, k.x1_is_x2)
    if p1 is None and p2 is None:
      return k
    k = ensure_full_spatial(k)
    b, c, agg, rest = layout(ndim)
    spatial = [i for i in range(ndim) if i not in (b, c)]
    agg_sp = [spatial.index(a) for a in agg]  # Spatial dims aggregated.
    rest_sp = [spatial.index(a) for a in rest]
    node_shape = tuple(k.shape1[a] for a in agg)
    v = math.prod(node_shape)
    n1 = k.shape1[b]
    n2 = k.shape2[b]
    dtype = k.nngp.dtype
    eye = lambda n: jnp.broadcast_to(jnp.eye(v, dtype=dtype), (n, v, v))
    d1 = eye(n1) if p1 is None else dense_of(p1, n1, node_shape, dtype,
                                             'pattern[0]')
    d2 = eye(n2) if p2 is None else dense_of(p2, n2, node_shape, dtype,
                                             'pattern[1]')
    d1 = jnp.broadcast_to(d1, (n1, v, v))
    d2 = jnp.broadcast_to(d2, (n2, v, v))

    def two_sided(x, n_batch, left, right):
      return _aggregate_pairs(x, n_batch, left, right, agg_sp, rest_sp)

    cov_batch = 1 if k.diagonal_batch else 2
    return k.replace(
        nngp=two_sided(k.nngp, 2, d1, d2),
        ntk=two_sided(k.ntk, 2, d1, d2),
        cov1=two_sided(k.cov1, cov_batch, d1, d1),
        cov2=two_sided(k.cov2, cov_batch, d2, d2))

  def mask_fn(mask, input_shape):
    return masking.mask_all_channels(mask, channel_axis)

  return init_fn, apply_fn, kernel_fn, mask_fn


def _kernel_patterns(pattern: Any, x1_is_x2: bool) -> tuple[Any, Any]:
  """`(pattern1, pattern2)` of `kernel_fn`'s `pattern` argument, or raises.

  `None` stands for `(None, None)`; when `x2` is None (`x1_is_x2`) the
  second pattern is the first.
  """
  if pattern is None:
    pattern = (None, None)
  if not isinstance(pattern, (tuple, list)) or len(pattern) != 2:
    raise ValueError(
        '`pattern` for `kernel_fn` must be a pair `(pattern1, pattern2)` '
        f'for `x1` and `x2`; got {type(pattern).__name__}. Pass e.g. '
        '`pattern=(p1, p2)`, or `pattern=(p1, None)` when `x2` is None.')
  p1, p2 = pattern
  if x1_is_x2:
    if p2 is not None and not _same_pattern(p1, p2):
      raise ValueError(
          '`pattern[1]` must be None (or equal to `pattern[0]`) when `x2` '
          'is None: the kernel pairs `x1` with itself, but the two patterns '
          'differ. Pass `pattern=(p1, None)`, or pass `x2` explicitly.')
    p2 = p1
  return p1, p2


def _aggregate_pairs(x: Optional[Array], n_batch: int, left: Array,
                     right: Array, agg_sp: Sequence[int],
                     rest_sp: Sequence[int]) -> Optional[Array]:
  """`left[n] x[n, m] right[m]^T` over node axes; `(N1, [N2,] ...)`.

  Args:
    x: a covariance in the interleaved layout, with `n_batch` leading batch
      axes, or None.
    n_batch: 2 for `(N1, N2, ...)`, 1 for `(N, ...)`.
    left: `(N1, V, V)` weights `[n, receiver, sender]` of `x1`'s nodes.
    right: the same for `x2`'s nodes (`(N2, V, V)`).
    agg_sp: the spatial dimensions aggregated, whose sizes multiply to `V`.
    rest_sp: the other spatial dimensions, carried along.

  Returns:
    The aggregated covariance, in the layout of `x`; None if `x` is None.
  """
  if x is None:
    return None
  v = left.shape[-1]
  first = [n_batch + 2 * i for i in agg_sp]
  second = [n_batch + 2 * i + 1 for i in agg_sp]
  others = [a for i in rest_sp for a in (n_batch + 2 * i,
                                         n_batch + 2 * i + 1)]
  order = list(range(n_batch)) + first + second + others
  y = jnp.transpose(x, order)
  moved = y.shape
  y = y.reshape(y.shape[:n_batch] + (v, v) + y.shape[n_batch + 2 * len(
      agg_sp):])
  if n_batch == 2:
    y = jnp.einsum('nij,nmjk...,mlk->nmil...', left, y, right,
                   precision=lax.Precision.HIGHEST)
  else:
    y = jnp.einsum('nij,njk...,nlk->nil...', left, y, right,
                   precision=lax.Precision.HIGHEST)
  return jnp.transpose(y.reshape(moved), np.argsort(order))
