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
import dataclasses as std_dataclasses
import string
from typing import Any, Optional, Sequence

import jax
from jax import lax
import jax.numpy as jnp

from neural_tangents._src.utils import dataclasses
from neural_tangents._src.utils import scaling

Array = jax.Array


# The fields of Neural Tangents 0.6.5's `Kernel`, in its positional order.
PUBLISHED_FIELDS = ('nngp', 'ntk', 'cov1', 'cov2', 'x1_is_x2', 'is_gaussian',
                    'is_reversed', 'is_input', 'diagonal_batch',
                    'diagonal_spatial', 'shape1', 'shape2', 'batch_axis',
                    'channel_axis', 'mask1', 'mask2')


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
    is_reversed: whether the spatial axes are stored in reverse order (see
      `reverse`). Layers compute on `is_reversed=False` kernels and restore
      that order when given a reversed one.
    is_input: whether this is the kernel of the raw inputs.
    diagonal_batch: whether `cov1` / `cov2` keep only the batch diagonal.
    diagonal_spatial: whether only the spatial diagonal is stored.
    shape1: shape of the activations on `x1`.
    shape2: shape of the activations on `x2`.
    batch_axis: batch axis of the activations.
    channel_axis: channel axis of the activations.
    mask1: boolean mask of `x1` (`True` = masked out), or `None`.
    mask2: boolean mask of `x2`, or `None`.
    scale_exponents: `None` (always, in a `Kernel` that a `kernel_fn`
      returns), or, between layers, per-example integer exponents `(a1, a2)`
      of shapes `(N1,)` and `(N2,)`: then every stored covariance is the
      kernel divided by `2^(a_i + a_j)` for its examples `i` (of `x1` for
      `nngp`, `ntk`, `cov1`) and `j` (of `x2` for `nngp`, `ntk`, `cov2`).
      Inputs so large that their covariances would overflow (float32 inputs
      above about 1e19) are carried this way from the input to the first
      layer that needs the kernel itself (see `unscaled`); layers declared
      with `@requires(accepts_scaled=True)` read them scaled.

  The positional field order is the one above (that of Neural Tangents
  0.6.5). Methods: `asdict`, `astuple`, `slice`, `reverse`, `transpose`,
  `mask`, `dot_general`, `replace`.

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
  mask1: Optional[Array] = None
  mask2: Optional[Array] = None
  scale_exponents: Optional[tuple[Array, Array]] = None

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

  def asdict(self) -> dict[str, Any]:
    """The fields as a `dict` `{name: value}`, in field order (no copies):
    those of Neural Tangents 0.6.5, of the kernel itself (`unscaled`)."""
    k = self.unscaled()
    return {name: getattr(k, name) for name in PUBLISHED_FIELDS}

  def astuple(self) -> tuple[Any, ...]:
    """The fields as a tuple, in the (positional) field order (see
    `asdict`)."""
    return tuple(self.asdict().values())

  def unscaled(self) -> 'Kernel':
    """This kernel with its covariances multiplied back by
    `2^(a_i + a_j)` (see `scale_exponents`): values that do not fit the
    dtype become `inf`, as they would have without the scaling.

    Example:
      >>> k = Kernel(nngp=jnp.ones((1, 2)), ntk=None, cov1=jnp.ones(1),
      ...            cov2=jnp.ones(2), x1_is_x2=False,
      ...            scale_exponents=(jnp.array([1]), jnp.array([0, 2])))
      >>> k.unscaled().nngp
      Array([[2., 8.]], dtype=float32)
    """
    if self.scale_exponents is None:
      return self
    pairs = exponent_pairs(self)
    scale = lambda x, e: (None if x is None else
                          scaling.times_powers_of_two(x, *e))
    return self.replace(nngp=scale(self.nngp, pairs['nngp']),
                        ntk=scale(self.ntk, pairs['nngp']),
                        cov1=scale(self.cov1, pairs['cov1']),
                        cov2=scale(self.cov2, pairs.get('cov2')),
                        scale_exponents=None)

  def slice(self, n1_slice: Any, n2_slice: Any) -> 'Kernel':
    """The kernel of `x1[n1_slice]` and `x2[n2_slice]`.

    Args:
      n1_slice: a `slice` (or index array) of the examples of `x1`.
      n2_slice: a `slice` (or index array) of the examples of `x2` (of `x1`
        when `x1_is_x2`).

    Returns:
      The kernel with `nngp` / `ntk` indexed as `[n1_slice, n2_slice]`, `cov1`
      (`cov2`) and `mask1` (`mask2`) restricted to the selected examples, and
      the batch sizes of `shape1` / `shape2` updated. A kernel with
      `x1_is_x2` stays so only if both slices are the same (an equal `slice`
      or the same index array object).

    Example:
      >>> _, _, kernel_fn = stax.Dense(1)
      >>> k = kernel_fn(x1, None)
      >>> jnp.allclose(k.slice(slice(0, 2), slice(1, 3)).nngp,
      ...              kernel_fn(x1[:2], x1[1:3]).nngp)
      Array(True, dtype=bool)
    """
    same = self.x1_is_x2 and (n1_slice is n2_slice or (
        isinstance(n1_slice, slice) and n1_slice == n2_slice))
    cov2 = self.cov1 if self.cov2 is None else self.cov2
    pair = lambda x, s1, s2: None if x is None else x[s1][:, s2]
    cov = lambda x, s: (None if x is None else
                        x[s] if self.diagonal_batch else x[s][:, s])
    nngp = self.nngp[n1_slice][:, n2_slice]
    return self.replace(
        nngp=nngp,
        ntk=pair(self.ntk, n1_slice, n2_slice),
        cov1=cov(self.cov1, n1_slice),
        cov2=None if same else cov(cov2, n2_slice),
        x1_is_x2=same,
        shape1=_with_batch_size(self.shape1, self.batch_axis, nngp.shape[0]),
        shape2=_with_batch_size(self.shape2, self.batch_axis, nngp.shape[1]),
        mask1=_slice_mask(self.mask1, n1_slice, self.batch_axis),
        mask2=_slice_mask(self.mask2, n2_slice, self.batch_axis),
        scale_exponents=None if self.scale_exponents is None else (
            self.scale_exponents[0][n1_slice],
            self.scale_exponents[1][n2_slice]))

  def reverse(self) -> 'Kernel':
    """The same kernel with its spatial dimensions stored in reverse order.

    `nngp` of layout `(N1, N2, S_1, S_1, ..., S_d, S_d)` becomes
    `(N1, N2, S_d, S_d, ..., S_1, S_1)` (and likewise for the other
    covariances), and `is_reversed` is flipped. Shapes and masks keep the
    activation layout. `k.reverse().reverse()` is `k`; layers of this library
    compute on `is_reversed=False` kernels and restore that order when given a
    reversed one.

    Example:
      >>> _, _, kernel_fn = stax.Identity()
      >>> k = kernel_fn(jnp.ones((2, 3, 4, 1)), None)  # nngp (2, 2, 3, 3, 4, 4)
      >>> k.reverse().nngp.shape
      (2, 2, 4, 4, 3, 3)
    """
    order = tuple(reversed(range(self.n_spatial)))
    return self._permute_storage(order).replace(
        is_reversed=not self.is_reversed)

  def transpose(self, axes: Optional[Sequence[int]] = None) -> 'Kernel':
    """The kernel of inputs whose spatial dimensions are permuted by `axes`.

    Follows `numpy.transpose`, on spatial dimensions only: spatial dimension
    `i` of the result is spatial dimension `axes[i]` of `self` (`None`
    reverses them). Batch and channel axes stay where they are. Covariances,
    `shape1` / `shape2` and the masks are permuted, so the result equals
    `kernel_fn` of the inputs with their spatial axes permuted.

    Args:
      axes: a permutation of `range(n_spatial)`, or `None`.

    Returns:
      The permuted kernel.

    Raises:
      ValueError: if `axes` is not such a permutation.

    Example:
      >>> _, _, kernel_fn = stax.Identity()
      >>> x = random.normal(random.PRNGKey(0), (2, 3, 4, 1))  # (N, H, W, C)
      >>> k = kernel_fn(x, None)
      >>> jnp.allclose(k.transpose((1, 0)).nngp,
      ...              kernel_fn(x.transpose(0, 2, 1, 3), None).nngp)
      Array(True, dtype=bool)
    """
    n = self.n_spatial
    axes = tuple(reversed(range(n))) if axes is None else tuple(axes)
    if sorted(int(a) % max(n, 1) for a in axes) != list(range(n)) or len(
        axes) != n:
      raise ValueError(
          f'`axes` must be a permutation of the {n} spatial dimensions '
          f'{tuple(range(n))}; got {axes}. Batch and channel axes are not '
          'permuted: pass only spatial dimensions, e.g. axes=(1, 0).')
    axes = tuple(int(a) % n for a in axes)
    if self.is_reversed:
      return self.reverse().transpose(axes).reverse()
    ndim = len(self.shape1)
    positions = [i for i in range(ndim) if i not in
                 (self.batch_axis % ndim, self.channel_axis % ndim)]
    activation_order = list(range(ndim))
    for i, a in enumerate(axes):
      activation_order[positions[i]] = positions[a]

    def permute_shape(shape):
      return tuple(shape[i] for i in activation_order)

    def permute_mask(mask):
      return None if mask is None else jnp.transpose(mask, activation_order)

    return self._permute_storage(axes).replace(
        shape1=permute_shape(self.shape1), shape2=permute_shape(self.shape2),
        mask1=permute_mask(self.mask1), mask2=permute_mask(self.mask2))

  def _permute_storage(self, axes: Sequence[int]) -> 'Kernel':
    """Permutes the stored spatial dimensions of every covariance."""
    def permute(x, n_batch):
      if x is None:
        return None
      order = list(range(n_batch))
      for a in axes:
        order += ([n_batch + a] if self.diagonal_spatial else
                  [n_batch + 2 * a, n_batch + 2 * a + 1])
      return jnp.transpose(x, order)

    n_cov = 1 if self.diagonal_batch else 2
    return self.replace(nngp=permute(self.nngp, 2), ntk=permute(self.ntk, 2),
                        cov1=permute(self.cov1, n_cov),
                        cov2=permute(self.cov2, n_cov))

  def mask(self, mask1: Optional[Array],
           mask2: Optional[Array]) -> 'Kernel':
    """Sets the masks and zeroes every covariance entry at a masked position.

    Args:
      mask1: boolean mask of `x1` (`True` = masked out) in the activation
        layout (`shape1`, broadcastable, e.g. size 1 on the channel axis), or
        `None`. A position is masked iff all its channels are.
      mask2: the same for `x2`; `None` with `x1_is_x2` means `mask1`.

    Returns:
      The kernel with `mask1` / `mask2` set, and `nngp`, `ntk`, `cov1`, `cov2`
      zero wherever the `x1` position or the `x2` position of an entry is
      masked.

    Example:
      >>> _, _, kernel_fn = stax.Identity()
      >>> k = kernel_fn(jnp.ones((2, 5, 1)), None)
      >>> m = jnp.zeros((2, 5, 1), bool).at[1, 3:].set(True)
      >>> k.mask(m, m).nngp[1, 1, 4, 4]
      Array(0., dtype=float32)
    """
    if mask2 is None and self.x1_is_x2:
      mask2 = mask1
    out = self.replace(mask1=mask1, mask2=mask2)
    if mask1 is None and mask2 is None:
      return out
    keep1 = self._keep(mask1, self.shape1)
    keep2 = self._keep(mask2, self.shape2)
    zero = lambda x, keep: None if x is None else jnp.where(
        keep, x, jnp.zeros((), x.dtype))
    pair_keep = _covariance_keep(keep1, keep2, True, self.diagonal_spatial)
    cov_pair = not self.diagonal_batch
    return out.replace(
        nngp=zero(self.nngp, pair_keep),
        ntk=zero(self.ntk, pair_keep),
        cov1=zero(self.cov1, _covariance_keep(keep1, keep1, cov_pair,
                                              self.diagonal_spatial)),
        cov2=zero(self.cov2, _covariance_keep(keep2, keep2, cov_pair,
                                              self.diagonal_spatial)))

  def _keep(self, mask: Optional[Array], shape: tuple[int, ...]) -> Array:
    """`(N, S_1, ..., S_d)` booleans: which positions are not masked."""
    pm = position_mask(mask, shape, self.batch_axis, self.channel_axis)
    if pm is not None:
      return ~pm
    ndim = len(shape)
    full = (shape[self.batch_axis % ndim],) + spatial_shape(
        shape, self.batch_axis, self.channel_axis)
    return jnp.ones(full, bool)

  def dot_general(self, other1: Optional[Array], other2: Optional[Array],
                  is_lhs: bool,
                  dimension_numbers: Any) -> 'Kernel':
    """The kernel of `lax.dot_general` of the activations with constants.

    With `y1 = lax.dot_general(x1, other1, dimension_numbers)` if `is_lhs`
    (`lax.dot_general(other1, x1, dimension_numbers)` otherwise), and `y2`
    the same of `x2` and `other2`, returns the kernel of `y1`, `y2`: since
    every channel is mapped by the same constants,
    `cov(y1[a], y2[b]) = sum_{s, t} other1[a, s] other2[b, t] cov(x1[s],
    x2[t])` over the positions `s`, `t` that `dot_general` contracts. The
    activations' batch (example) axis may be a `dot_general` batch dimension
    (per-example constants, of size `N1` in `other1` and `N2` in `other2`) or
    a free one; the channel axis must be free. Free axes of the constants
    become spatial axes. `shape1`, `shape2`, `batch_axis` and `channel_axis`
    are those of `y1`, `y2` (`dot_general` orders its output as batch
    dimensions, then free axes of the left operand, then of the right).

    Args:
      other1: constant paired with `x1`, or `None` (no change).
      other2: constant paired with `x2`; `None` means `other1`.
      is_lhs: whether the activations are the left operand.
      dimension_numbers: `((lhs_contracting, rhs_contracting), (lhs_batch,
        rhs_batch))`, as in `lax.dot_general`.

    Returns:
      The kernel of the outputs, with full spatial covariances.

    Raises:
      ValueError: if the channel axis or the batch axis is contracted, the
        channel axis is a batch dimension, the kernel is masked, or it only
        holds spatial diagonals while positions are mixed.

    Example:
      >>> _, _, kernel_fn = stax.Identity()
      >>> k = kernel_fn(jnp.ones((2, 8, 3)), None)  # nngp (2, 2, 8, 8)
      >>> pool = jnp.ones((1, 8)) / 8  # averages the 8 positions
      >>> k.dot_general(pool, None, False,
      ...               (((1,), (1,)), ((), ()))).nngp.shape
      (2, 2, 1, 1)
    """
    if other1 is None:
      if other2 is not None:
        raise ValueError(
            '`other1` is None but `other2` is not; pass the constant for `x1` '
            'as `other1` (and `other2=None` to use it for `x2` too).')
      return self
    if self.is_reversed:
      return self.reverse().dot_general(other1, other2, is_lhs,
                                        dimension_numbers)
    if self.mask1 is not None or self.mask2 is not None:
      raise ValueError(
          '`Kernel.dot_general` does not support masked kernels (`mask1` / '
          '`mask2` set). Pool or `Flatten` the masked positions first.')
    if self.diagonal_spatial and self.n_spatial > 0:
      raise ValueError(
          '`Kernel.dot_general` mixes positions, which needs the full spatial '
          'covariance; got a kernel with `diagonal_spatial=True`. Compute it '
          'with `diagonal_spatial=False`.')
    same_other = other2 is None or other2 is other1
    other1 = jnp.asarray(other1)
    other2 = other1 if same_other else jnp.asarray(other2)
    (c_lhs, c_rhs), (b_lhs, b_rhs) = dimension_numbers
    x_c, o_c = (c_lhs, c_rhs) if is_lhs else (c_rhs, c_lhs)
    x_b, o_b = (b_lhs, b_rhs) if is_lhs else (b_rhs, b_lhs)
    ndim = len(self.shape1)
    x_c = [int(a) % ndim for a in x_c]
    x_b = [int(a) % ndim for a in x_b]
    b, c = self.batch_axis % ndim, self.channel_axis % ndim
    for axis, name in ((b, 'batch'), (c, 'channel')):
      if axis in x_c or (name == 'channel' and axis in x_b):
        raise ValueError(
            f'`dimension_numbers`={dimension_numbers} contracts or batches '
            f'the {name} axis {axis} of the activations, which has no kernel. '
            'Only contract spatial axes (and, for per-example constants, '
            'batch the example axis).')
    dot = lambda x, o: (lax.dot_general(x, o, dimension_numbers) if is_lhs
                        else lax.dot_general(o, x, dimension_numbers))
    shape_of = lambda shape, o: tuple(jax.eval_shape(
        dot, jax.ShapeDtypeStruct(shape, o.dtype), o).shape)
    out_shape1 = shape_of(self.shape1, other1)
    out_shape2 = shape_of(self.shape2, other2)

    x_free = [a for a in range(ndim) if a not in x_c and a not in x_b]
    o_ndim = other1.ndim
    o_c = [int(a) % o_ndim for a in o_c]
    o_b = [int(a) % o_ndim for a in o_b]
    o_free = [a for a in range(o_ndim) if a not in o_c and a not in o_b]
    # Output axes, as (operand, axis): batch dims, then lhs free, rhs free.
    out_axes = [('x', a) for a in x_b]
    frees = [[('x', a) for a in x_free], [('o', a) for a in o_free]]
    out_axes += frees[0] + frees[1] if is_lhs else frees[1] + frees[0]
    out_b, out_c = out_axes.index(('x', b)), out_axes.index(('x', c))
    spatial = [a for a in range(ndim) if a not in (b, c)]
    out_spatial = [ax for i, ax in enumerate(out_axes)
                   if i not in (out_b, out_c)]

    def transform(cov, o1, o2, n_batch):
      """Maps both sides of a covariance with `n_batch` leading axes."""
      letters = iter(string.ascii_letters)

      def side():
        x = {a: next(letters) for a in range(ndim)}
        o = dict(zip(o_c + o_b, [x[a] for a in x_c + x_b]))
        o.update({a: next(letters) for a in o_free})
        return x, o

      (x1, l1), (x2, l2) = side(), side()
      if n_batch == 1:  # Batch-diagonal: both sides are the same example.
        rename = {x2[b]: x1[b]}
        x2 = {a: rename.get(l, l) for a, l in x2.items()}
        l2 = {a: rename.get(l, l) for a, l in l2.items()}
      letter = lambda xs, os, ax: xs[ax[1]] if ax[0] == 'x' else os[ax[1]]
      lead = [x1[b]] + ([x2[b]] if n_batch == 2 else [])
      ins = lead + [l for a in spatial for l in (x1[a], x2[a])]
      outs = lead + [l for ax in out_spatial
                     for l in (letter(x1, l1, ax), letter(x2, l2, ax))]
      spec = '{},{},{}->{}'.format(
          ''.join(ins), ''.join(l1[a] for a in range(o_ndim)),
          ''.join(l2[a] for a in range(o_ndim)), ''.join(outs))
      return jnp.einsum(spec, cov, o1, o2, precision=lax.Precision.HIGHEST)

    n_cov = 1 if self.diagonal_batch else 2
    if self.cov2 is not None:
      cov2 = transform(self.cov2, other2, other2, n_cov)
    elif same_other:
      cov2 = None
    else:
      cov2 = transform(self.cov1, other2, other2, n_cov)
    return self.replace(
        nngp=transform(self.nngp, other1, other2, 2),
        ntk=None if self.ntk is None else transform(self.ntk, other1, other2,
                                                    2),
        cov1=transform(self.cov1, other1, other1, n_cov),
        cov2=cov2,
        x1_is_x2=self.x1_is_x2 and same_other,
        diagonal_spatial=False,
        shape1=out_shape1,
        shape2=out_shape2,
        batch_axis=out_b,
        channel_axis=out_c)

  def __add__(self, other: 'Kernel') -> 'Kernel':
    add = lambda a, b: None if a is None or b is None else a + b
    left, right = self.unscaled(), other.unscaled()
    return left.replace(nngp=add(left.nngp, right.nngp),
                        ntk=add(left.ntk, right.ntk),
                        cov1=add(left.cov1, right.cov1),
                        cov2=add(left.cov2, right.cov2))


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

  Raises:
    ValueError: the two axes of a pair differ in size: the covariance of
      `x1` and `x2` of different spatial shapes has no diagonal.
  """
  n_spatial = (x.ndim - n_batch) // 2
  sizes = x.shape[n_batch:]
  if sizes[0::2] != sizes[1::2]:
    raise ValueError(
        'A layer compares the positions of `x1` and `x2` one to one (e.g. '
        '`Flatten`, `ConvLocal`, or `diagonal_spatial=True` on a spatial '
        'output), but their spatial shapes differ there: '
        f'{tuple(sizes[0::2])} and {tuple(sizes[1::2])}. Pass `x2` of the '
        "same spatial shape as `x1` (crop or resize it), or read the network "
        'out with global pooling (`GlobalAvgPool`), which accepts any sizes.')
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


def exponent_pairs(k: Kernel) -> dict[str, tuple[Array, Array]]:
  """For each of `nngp` (and `ntk`), `cov1`, `cov2` of a scaled `k`, the
  exponents `(a_i, a_j)` of its entries, broadcastable against it (as
  `covariance_variances` gives the variances)."""
  a1, a2 = k.scale_exponents
  n_spatial = len(k.shape1) - 2

  def pair(ea, eb, batch_pair):
    shape = lambda e: e.reshape(e.shape + (1,) * n_spatial)
    return outer_variances(shape(ea), shape(eb), batch_pair,
                           k.diagonal_spatial)

  out = {'nngp': pair(a1, a2, True),
         'cov1': pair(a1, a1, not k.diagonal_batch)}
  if k.cov2 is not None:
    out['cov2'] = pair(a2, a2, not k.diagonal_batch)
  return out


def stored_constant(k: Kernel, field: str, value: float) -> Any:
  """`value` added to `k`'s `field` ('nngp' also for 'ntk', 'cov1',
  'cov2') as that field stores it: `value` itself, or, in a scaled kernel
  (`scale_exponents`), `value / 2^(a_i + a_j)` broadcastable against it."""
  if (k.scale_exponents is None or getattr(k, field) is None or
      # A literal zero stays a Python zero; a traced `value` (a
      # hyperparameter under `jax.grad`/`jax.vmap`) is never compared.
      (isinstance(value, (int, float)) and value == 0)):
    return value
  ea, eb = exponent_pairs(k)[field]
  dtype = jnp.result_type(getattr(k, field))
  return scaling.times_powers_of_two(jnp.asarray(value, dtype), -ea, -eb)


def _with_batch_size(shape: tuple[int, ...], batch_axis: int,
                     n: int) -> tuple[int, ...]:
  if not shape:
    return shape
  shape = list(shape)
  shape[batch_axis % len(shape)] = n
  return tuple(shape)


def _slice_mask(mask: Optional[Array], n_slice: Any,
                batch_axis: int) -> Optional[Array]:
  """`mask` restricted to examples `n_slice` (unless broadcast over them)."""
  if mask is None:
    return None
  axis = batch_axis % mask.ndim
  if mask.shape[axis] == 1:
    return mask
  index = [slice(None)] * mask.ndim
  index[axis] = n_slice
  return mask[tuple(index)]


def position_mask(mask: Optional[Array], shape: Sequence[int],
                  batch_axis: int, channel_axis: int) -> Optional[Array]:
  """The mask of positions, `(N, S_1, ..., S_d)`, in the kernel's layout.

  A position counts as masked iff all its channels are.

  Args:
    mask: mask in the activation layout (broadcastable to `shape`), or None.
    shape: the activation shape (`Kernel.shape1` / `shape2`).
    batch_axis: batch axis of the activations.
    channel_axis: channel axis of the activations.

  Returns:
    A boolean `(N, S_1, ..., S_d)` array (batch first, spatial axes in order,
    broadcast to their full sizes), or `None` if `mask` is `None`.

  Example:
    >>> position_mask(jnp.zeros((2, 5, 1), bool), (2, 5, 3), 0, -1).shape
    (2, 5)
  """
  if mask is None:
    return None
  ndim = len(shape)
  b, c = batch_axis % ndim, channel_axis % ndim
  mask = jnp.all(mask, axis=c, keepdims=True)
  order = [b] + [i for i in range(ndim) if i not in (b, c)] + [c]
  mask = jnp.transpose(mask, order)[..., 0]
  full = (shape[b],) + spatial_shape(tuple(shape), b, c)
  return jnp.broadcast_to(mask, full)


def _covariance_keep(keep1: Array, keep2: Array, batch_pair: bool,
                     diagonal_spatial: bool) -> Array:
  """Which covariance entries pair two kept positions."""
  k1, k2 = outer_variances(keep1, keep2, batch_pair, diagonal_spatial)
  return jnp.logical_and(k1, k2)
