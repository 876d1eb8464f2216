"""Assembling the outputs of the blocks of a batched call into the full one.

Every leaf of a block's output has a role (`Role`): a kernel between `x1`
and `x2` (`nngp`, `ntk`: blocks tiled in the `(N1, N2, ...)` layout, the
blocks below the diagonal of a symmetric call being transposes of those
above), a covariance of `x1` or `x2` with itself (`cov1` / `cov2`:
concatenated), or a mask (concatenated along its batch axis). `leaf_specs`
reads the roles off a block's output; `Assembler` collects the blocks, on
host or on device, and builds each leaf.

Example:
  >>> block = jnp.arange(2 * 3 * 4 * 4.).reshape(2, 3, 4, 4)
  >>> transpose_pair(block, diagonal_spatial=False).shape
  (3, 2, 4, 4)
"""
import dataclasses
import enum
import functools
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.batching.splitting import Grid
from neural_tangents._src.batching.splitting import Task
from neural_tangents._src.utils.kernel import Kernel


# -----------------------------------------------------------------------------
# Roles of output leaves.


class Role(enum.Enum):
  PAIR = 0  # (N1, N2, ...): nngp, ntk and other kernels between x1 and x2.
  SELF1 = 1  # cov1
  SELF2 = 2  # cov2
  MASK1 = 3
  MASK2 = 4


@dataclasses.dataclass(frozen=True)
class LeafSpec:
  """How one output leaf is assembled from blocks.

  Attributes:
    path: the leaf's path in the output pytree.
    role: which examples the leaf is indexed by.
    transposable: (`PAIR`) whether the transpose of block `(i, j)` is known to
      be block `(j, i)` of a symmetric computation.
    diagonal_spatial: (`PAIR`) whether spatial axes are single (not pairs).
    diagonal_batch: (`SELF*`) whether the leaf is `(N, ...)`, not
      `(N, N, ...)`.
    axis: (`MASK*`) the batch axis of the mask.
  """
  path: str
  role: Role
  transposable: bool = True
  diagonal_spatial: bool = False
  diagonal_batch: bool = True
  axis: int = 0


_FIELD_ROLES = {'nngp': Role.PAIR, 'ntk': Role.PAIR, 'cov1': Role.SELF1,
                'cov2': Role.SELF2, 'mask1': Role.MASK1,
                'mask2': Role.MASK2}


def _key_name(key: Any) -> Optional[str]:
  return getattr(key, 'name', None)


def leaf_specs(out: Any, get: Any, kwargs: dict[str, Any],
               analytic: bool) -> list[LeafSpec]:
  """Specs of the leaves of a block's output, in `tree_leaves` order."""
  kernels = {
      path: k for path, k in jax.tree_util.tree_flatten_with_path(
          out, is_leaf=lambda x: isinstance(x, Kernel))[0]
      if isinstance(k, Kernel)}
  default_role = (_FIELD_ROLES.get(get, Role.PAIR) if isinstance(get, str)
                  else Role.PAIR)
  specs = []
  for path, leaf in jax.tree_util.tree_flatten_with_path(out)[0]:
    kernel = next((k for p, k in kernels.items()
                   if path[:len(p)] == p), None)
    name = next((_key_name(key) for key in reversed(path)
                 if _key_name(key) in _FIELD_ROLES), None)
    role = _FIELD_ROLES[name] if name is not None else default_role
    if kernel is not None:
      diagonal_batch = kernel.diagonal_batch
      diagonal_spatial = kernel.diagonal_spatial
      axis = kernel.batch_axis % max(np.ndim(leaf), 1)
      transposable = True
    else:
      diagonal_batch = bool(kwargs.get('diagonal_batch', True))
      diagonal_spatial = bool(kwargs.get('diagonal_spatial', False))
      axis = 0
      # Outside of the analytic layout, the transpose of a kernel with more
      # axes than the two batch axes is not known: compute those blocks.
      transposable = analytic or np.ndim(leaf) == 2
    specs.append(LeafSpec(jax.tree_util.keystr(path), role, transposable,
                          diagonal_spatial, diagonal_batch, axis))
  return specs


def blocks_transpose(specs: list[LeafSpec]) -> bool:
  """Whether block `(j, i)` of every kernel leaf is block `(i, j)` transposed.

  If not, a symmetric call computes the blocks below its diagonal too.
  """
  return all(s.transposable for s in specs if s.role == Role.PAIR)


def with_full_shapes(out: Any, grid: Grid) -> Any:
  """The `Kernel`s of `out` with the full batch sizes in `shape1`/`shape2`."""
  def fix(k):
    if not isinstance(k, Kernel):
      return k
    def full(shape, n):
      shape = list(shape)
      if shape:
        shape[k.batch_axis % len(shape)] = n
      return tuple(shape)
    return k.replace(shape1=full(k.shape1, grid.n1),
                     shape2=full(k.shape2, grid.n2))
  return jax.tree_util.tree_map(fix, out,
                                is_leaf=lambda x: isinstance(x, Kernel))


def transpose_pair(block: Any, diagonal_spatial: bool) -> Any:
  """`K(x_j, x_i)` from `K(x_i, x_j)`: swaps batch axes and spatial pairs."""
  order = [1, 0]
  n_rest = block.ndim - 2
  if diagonal_spatial:
    order += list(range(2, block.ndim))
  else:
    for s in range(n_rest // 2):
      order += [3 + 2 * s, 2 + 2 * s]
  return block.transpose(order)


# -----------------------------------------------------------------------------
# Assembling blocks.


class Assembler:
  """Collects block outputs and assembles each leaf of the full output.

  On host, every leaf is a preallocated numpy array written block by block,
  so peak memory is the kernel plus one block. On device, blocks are kept
  and concatenated by one jitted function at the end.
  """

  def __init__(self, specs: list[LeafSpec], grid: Grid, on_host: bool,
               allocate: Optional[Callable[..., Any]] = None):
    """Assembles on host (`on_host`) or device.

    Args:
      specs: the specs of the output leaves.
      grid: the block grid.
      on_host: whether blocks are written into host arrays.
      allocate: `allocate(spec, shape, dtype, chunks)` returns the host
        array of a leaf (default `np.empty`), e.g. an on-disk array.
    """
    self.specs = specs
    self.grid = grid
    self.on_host = on_host
    self.allocate = allocate or (
        lambda spec, shape, dtype, chunks: np.empty(shape, dtype))
    self.transpose = True  # Fill blocks below the diagonal by transposing.
    self.host = [None] * len(specs)
    self.blocks = [dict() for _ in specs]
    # `(leaf path, chunk coordinates)` written on host since the last
    # `take_written()`, chunks being blocks.
    self.written = []

  def full_shape(self, spec: LeafSpec, block_shape: tuple[int, ...]
                 ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """`(shape, chunks)` of the assembled leaf whose blocks are `block_shape`."""
    g = self.grid
    if spec.role == Role.PAIR:
      return ((g.n1, g.n2) + tuple(block_shape[2:]),
              (g.b1, g.b2) + tuple(block_shape[2:]))
    side = 1 if spec.role == Role.SELF1 or g.symmetric else 2
    n, b = (g.n1, g.b1) if side == 1 else (g.n2, g.b2)
    return (n,) + tuple(block_shape[1:]), (b,) + tuple(block_shape[1:])

  def allocate_all(self, block_leaves: list[Any]) -> None:
    """Allocates every leaf now, from blocks' shapes (`.shape`, `.dtype`)."""
    for n, (spec, leaf) in enumerate(zip(self.specs, block_leaves)):
      shape, chunks = self.full_shape(spec, tuple(leaf.shape))
      self.host[n] = self.allocate(spec, shape, leaf.dtype, chunks)

  def take_written(self) -> list[tuple[str, tuple[int, ...]]]:
    written, self.written = self.written, []
    return written

  def add(self, task: Task, out: Any) -> None:
    leaves = dict((jax.tree_util.keystr(p), x) for p, x in
                  jax.tree_util.tree_flatten_with_path(out)[0])
    for n, spec in enumerate(self.specs):
      if spec.path not in leaves:
        continue
      block = leaves[spec.path]
      key = self._key(spec, task)
      if key is None:
        continue
      self._check_shape(spec, block)
      if self.on_host:
        self._write(n, spec, key, block)
      else:
        self.blocks[n][key] = block

  def _key(self, spec: LeafSpec, task: Task) -> Any:
    """Where `task`'s block of this leaf goes, or None if it is not needed."""
    g = self.grid
    if spec.role == Role.PAIR:
      return (task.i, task.j)
    if spec.role in (Role.SELF1, Role.SELF2) and not spec.diagonal_batch:
      return None  # Computed as the NNGP of the inputs with themselves.
    first = spec.role in (Role.SELF1, Role.MASK1)
    if g.symmetric:
      return task.i if task.diagonal else None
    if first:
      return task.i if task.j == 0 else None
    return task.j if task.i == 0 else None

  def _check_shape(self, spec: LeafSpec, block: Any) -> None:
    g = self.grid
    if spec.role == Role.PAIR:
      expected = (g.b1, g.b2)
      actual = tuple(np.shape(block)[:2])
    elif spec.role in (Role.MASK1, Role.MASK2):
      return
    else:
      expected = ((g.b1,) if spec.role == Role.SELF1 or g.symmetric
                  else (g.b2,))
      actual = tuple(np.shape(block)[:1])
    if actual != expected:
      raise ValueError(
          f'`batch` cannot assemble output {spec.path or "array"} of shape '
          f'{np.shape(block)} on a block of {g.b1} x {g.b2} examples: '
          f'expected leading dimensions {expected} ({spec.role.name.lower()} '
          'layout). Use batch_size=0 for kernel functions whose outputs are '
          'not indexed by examples.')

  def _mask_is_batched(self, spec: LeafSpec, block: Any) -> bool:
    b = self.grid.b1 if spec.role == Role.MASK1 or self.grid.symmetric else (
        self.grid.b2)
    return np.ndim(block) > spec.axis and np.shape(block)[spec.axis] == b

  def _write(self, n: int, spec: LeafSpec, key: Any, block: Any) -> None:
    g = self.grid
    block = np.asarray(block)
    if spec.role == Role.PAIR:
      i, j = key
      if self.host[n] is None:
        self.host[n] = self.allocate(
            spec, *self.full_shape(spec, block.shape)[:1], block.dtype,
            self.full_shape(spec, block.shape)[1])
      r0, r1 = g.rows(i, 1)
      c0, c1 = g.rows(j, 2)
      self.host[n][r0:r1, c0:c1] = block[:r1 - r0, :c1 - c0]
      rest = (0,) * (block.ndim - 2)
      self.written.append((spec.path, (i, j) + rest))
      if g.symmetric and i != j and self.transpose:
        self.host[n][c0:c1, r0:r1] = transpose_pair(
            block, spec.diagonal_spatial)[:c1 - c0, :r1 - r0]
        self.written.append((spec.path, (j, i) + rest))
      return
    side = 1 if spec.role in (Role.SELF1, Role.MASK1) or g.symmetric else 2
    n_examples = g.n1 if side == 1 else g.n2
    axis = spec.axis if spec.role in (Role.MASK1, Role.MASK2) else 0
    if spec.role in (Role.MASK1, Role.MASK2) and not self._mask_is_batched(
        spec, block):
      self.host[n] = block  # Broadcast over examples: the same in every block.
      return
    if self.host[n] is None:
      shape = list(block.shape)
      shape[axis] = n_examples
      chunks = list(block.shape)
      self.host[n] = self.allocate(spec, tuple(shape), block.dtype,
                                   tuple(chunks))
    r0, r1 = g.rows(key, side)
    target = [slice(None)] * block.ndim
    target[axis] = slice(r0, r1)
    source = [slice(None)] * block.ndim
    source[axis] = slice(0, r1 - r0)
    self.host[n][tuple(target)] = block[tuple(source)]
    coords = [0] * block.ndim
    coords[axis] = key
    self.written.append((spec.path, tuple(coords)))

  def finish(self) -> list[Any]:
    """The assembled leaves (`None` for full covariances, filled later)."""
    if self.on_host:
      return self.host
    if self.grid.nb1 == 1 and self.grid.nb2 == 1:
      # One unpadded block is the result: no copy.
      return [next(iter(blocks.values())) if blocks else None
              for blocks in self.blocks]
    blocks, layouts = zip(*(self._device_layout(spec, blocks)
                            for spec, blocks in zip(self.specs, self.blocks)))
    # One jitted function for all leaves: one compilation per call signature.
    return _assemble_on_device(list(blocks), layouts=tuple(layouts))

  def _device_layout(self, spec: LeafSpec,
                     blocks: dict[Any, Any]) -> tuple[Any, tuple[Any, ...]]:
    """`(blocks, static layout)` of one leaf for `_assemble_on_device`."""
    g = self.grid
    if not blocks:
      return None, ('none',)
    if spec.role == Role.PAIR:
      grid = [[blocks.get((i, j)) for j in range(g.nb2)]
              for i in range(g.nb1)]
      return grid, ('pair', g.n1, g.n2, g.symmetric and self.transpose,
                    spec.diagonal_spatial)
    side = 1 if spec.role in (Role.SELF1, Role.MASK1) or g.symmetric else 2
    ordered = [blocks[k] for k in sorted(blocks)]
    n = g.n1 if side == 1 else g.n2
    if spec.role in (Role.MASK1, Role.MASK2):
      if not self._mask_is_batched(spec, ordered[0]):
        return ordered[0], ('first',)
      return ordered, ('concatenate', spec.axis, n)
    return ordered, ('concatenate', 0, n)


@functools.partial(jax.jit, static_argnames=('layouts',))
def _assemble_on_device(blocks: list[Any],
                        layouts: tuple[tuple[Any, ...], ...]) -> list[Any]:
  """Assembles every leaf from its blocks, as `layouts` describe."""
  out = []
  for leaf_blocks, layout in zip(blocks, layouts):
    kind = layout[0]
    if kind == 'none':
      out.append(None)
    elif kind == 'first':
      out.append(leaf_blocks)
    elif kind == 'pair':
      _, n1, n2, transpose, diagonal_spatial = layout
      out.append(_concatenate_pairs(leaf_blocks, n1, n2, transpose,
                                    diagonal_spatial))
    else:
      _, axis, n = layout
      out.append(jax.lax.slice_in_dim(
          jnp.concatenate(leaf_blocks, axis=axis), 0, n, axis=axis))
  return out


def _concatenate_pairs(grid: list[list[Any]], n1: int, n2: int,
                       transpose: bool, diagonal_spatial: bool) -> jax.Array:
  """Tiles blocks `grid[i][j]` (`None` below the diagonal if `transpose`)."""
  rows = []
  for i, row in enumerate(grid):
    blocks = [
        transpose_pair(grid[j][i], diagonal_spatial)
        if block is None and transpose else block
        for j, block in enumerate(row)]
    rows.append(jnp.concatenate(blocks, axis=1))
  return jnp.concatenate(rows, axis=0)[:n1, :n2]
