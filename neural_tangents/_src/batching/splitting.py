"""Splitting one call of a batched kernel function into blocks.

The inputs are cut into blocks of examples along their batch axes (`Grid`,
padded by repeating the last example), keyword arguments are classified as
split with the blocks or shared by all of them (`classify_kwarg`, the rule
`batch`'s docstring states), and the rest of the call is split into its
static part and its arrays (`partition_static`) so that one jitted function
computes every block.

Example:
  >>> static, arrays = partition_static(((1, 'ntk'), {'w': jnp.ones(2)}))
  >>> merge_static(static, arrays)
  ((1, 'ntk'), {'w': Array([1., 1.], dtype=float32)})
"""
import dataclasses
import enum
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

# Keyword arguments that are never split with the blocks: a random key is
# shared by every block, as by the unbatched call.
_SHARED_KWARGS = frozenset({'rng'})

# Keyword arguments that describe the representation asked for; they are
# static (Python bools / strings) and never split.
_REPRESENTATION_KWARGS = frozenset({'get', 'diagonal_batch',
                                    'diagonal_spatial'})


# -----------------------------------------------------------------------------
# Splitting arguments into static and dynamic (array) parts, for `jax.jit`.


def is_array(x: Any) -> bool:
  """Whether `x` is an array (JAX, numpy or traced)."""
  return isinstance(x, (jax.Array, np.ndarray, jax.core.Tracer))


def _is_key(x: Any) -> bool:
  return is_array(x) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


@dataclasses.dataclass(frozen=True)
class Static:
  """The non-array part of a pytree: hashable, so a `jit` static argument."""
  treedef: Any
  is_array: tuple[bool, ...]
  values: tuple[Any, ...]


def partition_static(tree: Any) -> tuple[Static, list[Any]]:
  """Splits a pytree into its static part and its list of array leaves.

  Args:
    tree: any pytree (e.g. `(args, kwargs)` of a call).

  Returns:
    `(static, arrays)`, with `merge_static(static, arrays) == tree`.

  Raises:
    TypeError: if a non-array leaf is not hashable.
  """
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  array_leaves = tuple(is_array(x) for x in leaves)
  values = tuple(None if a else x for a, x in zip(array_leaves, leaves))
  try:
    hash(values)
  except TypeError:
    bad = [x for x in values if not _hashable(x)]
    raise TypeError(
        'Arguments of a batched or Monte Carlo kernel function must be arrays '
        f'or hashable values; got {type(bad[0]).__name__} {bad[0]!r}. Pass it '
        'as an array or a tuple.') from None
  return (Static(treedef, array_leaves, values),
          [x for a, x in zip(array_leaves, leaves) if a])


def merge_static(static: Static, arrays: Sequence[Any]) -> Any:
  """Inverse of `partition_static`."""
  arrays = iter(arrays)
  leaves = [next(arrays) if a else v
            for a, v in zip(static.is_array, static.values)]
  return jax.tree_util.tree_unflatten(static.treedef, leaves)


def _hashable(x: Any) -> bool:
  try:
    hash(x)
    return True
  except TypeError:
    return False


# -----------------------------------------------------------------------------
# Which keyword arguments are split with the blocks.


class Split(enum.Enum):
  SHARED = 0
  SINGLE = 1  # One array per example of both inputs.
  PAIR = 2  # `(per example of x1, per example of x2)`.


def _leading_dim_is(x: Any, n: int) -> bool:
  return (is_array(x) and not _is_key(x) and np.ndim(x) >= 1 and
          x.shape[0] == n)


def classify_kwarg(name: str, value: Any, n1: int, n2: int,
                   symmetric: bool) -> Split:
  """How keyword argument `name` is split (see `batch`'s docstring)."""
  if name in _SHARED_KWARGS or name in _REPRESENTATION_KWARGS:
    return Split.SHARED
  if isinstance(value, (tuple, list)) and len(value) == 2:
    a1, a2 = value
    if ((a1 is not None or a2 is not None) and
        (a1 is None or _leading_dim_is(a1, n1)) and
        (a2 is None or _leading_dim_is(a2, n2))):
      return Split.PAIR
  if _leading_dim_is(value, n1) and (symmetric or n1 == n2):
    return Split.SINGLE
  return Split.SHARED


# -----------------------------------------------------------------------------
# The block grid.


@dataclasses.dataclass(frozen=True)
class Grid:
  """Blocks of `n1` x `n2` examples, `b1` x `b2` at a time.

  `symmetric` is `x2=None`: then `n2 == n1`, `b2 == b1`.
  """
  n1: int
  n2: int
  b1: int
  b2: int
  symmetric: bool

  @property
  def nb1(self) -> int:
    return math.ceil(self.n1 / self.b1)

  @property
  def nb2(self) -> int:
    return math.ceil(self.n2 / self.b2)

  def rows(self, i: int, side: int) -> tuple[int, int]:
    """`(start, stop)` of block `i` of side 1 (`x1`) or 2 (`x2`), unpadded."""
    n, b = (self.n1, self.b1) if side == 1 else (self.n2, self.b2)
    return i * b, min((i + 1) * b, n)

  def indices(self, i: int, side: int) -> np.ndarray:
    """Example indices of block `i`, padded by repeating the last example."""
    n, b = (self.n1, self.b1) if side == 1 else (self.n2, self.b2)
    return np.minimum(np.arange(i * b, (i + 1) * b), n - 1)


@dataclasses.dataclass(frozen=True)
class Task:
  """Block `(i, j)`; `diagonal` blocks of symmetric grids get `x2=None`."""
  i: int
  j: int
  diagonal: bool


# -----------------------------------------------------------------------------
# Slicing and stacking blocks.


def take(x: Any, indices: np.ndarray, axis: int) -> Any:
  """`x[indices]` along `axis` (numpy stays numpy)."""
  if isinstance(x, np.ndarray):
    return np.take(x, indices, axis=axis)
  return jnp.take(x, indices, axis=axis)


def stack(trees: Sequence[Any]) -> Any:
  """Stacks pytrees of the same structure leaf by leaf (numpy stays numpy)."""
  def stack_leaves(*xs):
    if all(isinstance(x, np.ndarray) for x in xs):
      return np.stack(xs)
    return jnp.stack(xs)
  return jax.tree_util.tree_map(stack_leaves, *trees)


def leaves_with_axes(x: Any, axes: Any) -> list[tuple[Any, int]]:
  """`(leaf, batch axis)` for every leaf of inputs `x`."""
  out = []
  jax.tree_util.tree_map(
      lambda a, xi: out.extend((l, a) for l in jax.tree_util.tree_leaves(xi)),
      axes, x)
  return out
