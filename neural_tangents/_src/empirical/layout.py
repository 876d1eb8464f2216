"""How the output axes of a network appear in its empirical kernel.

An empirical kernel pairs the outputs of two calls, `f(x1)` and `f(x2)`. Each
output axis is either

* traced: averaged over its diagonal (`trace_axes`), so it disappears;
* diagonal: only its diagonal is kept (`diagonal_axes`), so it appears once;
* paired: kept for both calls, so it appears twice, as `(O_1, O_2)`.

The kernel of an output leaf has the kept axes in their order, each paired
axis as two adjacent axes; the batch axis is one of them (the published
layout), so it may be traced or diagonal too. Per-example implementations
compute the example axes `(N1, N2)` first and then move them to the batch
axis's place (`place_example_axes`).

Every implementation writes its kernel as one `einsum` whose integer letters
come from a `KernelLayout`; this module is the single place that knows the
order of the result's axes and the normalization of traced axes.
"""
import dataclasses
import functools
import math
from typing import Callable, Optional, Sequence

from jax import lax
import jax.numpy as jnp
import opt_einsum

from neural_tangents._src.utils.typing import Array

TRACE = 'trace'
DIAGONAL = 'diagonal'
PAIR = 'pair'


def normalize_axes(axes: Sequence[int], ndim: int, name: str) -> tuple[int, ...]:
  """Maps `axes` (negative ones counted from the end) into `[0, ndim)`.

  Args:
    axes: output axes, as given by the user.
    ndim: number of axes of the output they refer to.
    name: the argument's name, for the error message.

  Returns:
    The sorted, non-negative axes.

  Raises:
    ValueError: if an axis is out of range.

  Example:
    >>> normalize_axes((-1,), 3, 'trace_axes')
    (2,)
  """
  out = set()
  for a in axes:
    if not isinstance(a, int) or not -ndim <= a < ndim:
      raise ValueError(
          f'`{name}={tuple(axes)}` has axis {a!r}, out of range for an output '
          f'with {ndim} axes; pass axes in [-{ndim}, {ndim}), e.g. '
          f'`{name}=(-1,)`.')
    out.add(a % ndim)
  return tuple(sorted(out))


@dataclasses.dataclass(frozen=True)
class KernelLayout:
  """The role of each axis of one output leaf in the kernel.

  Attributes:
    kinds: for each axis of a call's output (one example's output when
      `per_example`, else the whole batch's), `TRACE`, `DIAGONAL` or `PAIR`.
    per_example: whether the kernel is built from per-example outputs, so
      that the example axes `(N1, N2)` are separate letters in front.
  """
  kinds: tuple[str, ...]
  per_example: bool

  @classmethod
  def build(cls, ndim: int, batch_axis: int, trace_axes: Sequence[int],
            diagonal_axes: Sequence[int], per_example: bool) -> 'KernelLayout':
    """The layout of an output with `ndim` axes and a batch axis.

    Args:
      ndim: number of axes of the whole-batch output leaf.
      batch_axis: its batch axis (non-negative).
      trace_axes: axes averaged over (may be negative).
      diagonal_axes: axes of which only the diagonal is kept (may be
        negative). An axis in both is traced.
      per_example: whether the batch axis is dropped from `kinds` because
        the kernel is built from per-example outputs.

    Returns:
      The layout.

    Raises:
      ValueError: if an axis is out of range.

    Example:
      >>> KernelLayout.build(2, 0, (-1,), (), per_example=True).kinds
      ('trace',)
    """
    kinds = axis_kinds(ndim, trace_axes, diagonal_axes)
    if per_example:
      kinds = kinds[:batch_axis] + kinds[batch_axis + 1:]
    return cls(kinds, per_example)


def axis_kinds(ndim: int, trace_axes: Sequence[int],
               diagonal_axes: Sequence[int]) -> tuple[str, ...]:
  """`TRACE`, `DIAGONAL` or `PAIR` for each axis of an output with `ndim` axes.

  An axis in both `trace_axes` and `diagonal_axes` is traced. The batch axis
  is an axis like any other (the published layout).

  Example:
    >>> axis_kinds(3, (0,), (-1,))
    ('trace', 'pair', 'diagonal')
  """
  trace = normalize_axes(trace_axes, ndim, 'trace_axes')
  diagonal = normalize_axes(diagonal_axes, ndim, 'diagonal_axes')
  return tuple(TRACE if axis in trace else DIAGONAL if axis in diagonal else
               PAIR for axis in range(ndim))


def place_example_axes(kernel: Array, kinds: Sequence[str],
                       batch_axis: int) -> Array:
  """A per-example kernel `(N1, N2, ...)` in the whole-batch output's layout.

  Per-example implementations put the example axes first; in the published
  layout they sit where the batch axis is among the output axes (each paired
  axis as two adjacent axes). A diagonal batch axis keeps the diagonal
  `N1 == N2` once; a traced one is averaged over, like other traced axes.

  Args:
    kernel: `(N1, N2)` followed by the layout of the other output axes.
    kinds: the kind of every axis of the whole-batch output (batch included).
    batch_axis: the batch axis among them.

  Returns:
    The kernel with the example axes at the batch axis's place.

  Example:
    >>> place_example_axes(jnp.ones((3, 3, 7, 7)), (PAIR, PAIR), 1).shape
    (7, 7, 3, 3)
  """
  position = sum({PAIR: 2, DIAGONAL: 1, TRACE: 0}[k]
                 for k in kinds[:batch_axis])
  kind = kinds[batch_axis]
  if kind == PAIR:
    return jnp.moveaxis(kernel, (0, 1), (position, position + 1))
  if kind == DIAGONAL:
    return jnp.moveaxis(jnp.diagonal(kernel, axis1=0, axis2=1), -1, position)
  return jnp.trace(kernel, axis1=0, axis2=1) / kernel.shape[0]


class Letters:
  """Hands out fresh integer einsum letters."""

  def __init__(self):
    self._next = 0

  def new(self) -> int:
    self._next += 1
    return self._next - 1

  def many(self, n: int) -> list[int]:
    return [self.new() for _ in range(n)]


@dataclasses.dataclass(frozen=True)
class KernelLetters:
  """The einsum letters of a kernel's two sides and of its result.

  Attributes:
    example1: letter of x1's example axis (None unless per-example).
    example2: letter of x2's example axis (None unless per-example).
    out1: a letter for each axis of a call's output, for x1.
    out2: the same for x2: traced and diagonal axes share x1's letter.
    result: the result's letters, in order.
  """
  example1: Optional[int]
  example2: Optional[int]
  out1: tuple[int, ...]
  out2: tuple[int, ...]
  result: tuple[int, ...]

  def side(self, i: int) -> tuple[Optional[int], tuple[int, ...]]:
    """`(example letter, output letters)` of side `i` (1 or 2)."""
    return ((self.example1, self.out1) if i == 1 else
            (self.example2, self.out2))


def kernel_letters(layout: KernelLayout, letters: Letters) -> KernelLetters:
  """Allocates the letters of a kernel with `layout`.

  Example:
    >>> kl = kernel_letters(KernelLayout(('pair',), True), Letters())
    >>> kl.result
    (0, 1, 2, 3)
  """
  e1 = letters.new() if layout.per_example else None
  e2 = letters.new() if layout.per_example else None
  out1, out2, result = [], [], [] if e1 is None else [e1, e2]
  for kind in layout.kinds:
    a = letters.new()
    out1.append(a)
    if kind == PAIR:
      b = letters.new()
      out2.append(b)
      result += [a, b]
    else:
      out2.append(a)
      if kind == DIAGONAL:
        result.append(a)
  return KernelLetters(e1, e2, tuple(out1), tuple(out2), tuple(result))


def trace_size(layout: KernelLayout, out_shape: Sequence[int]) -> int:
  """Number of entries averaged over: the product of the traced axes' sizes.

  Args:
    layout: the kernel's layout.
    out_shape: the shape of one call's output, matching `layout.kinds`.
  """
  return math.prod(s for s, k in zip(out_shape, layout.kinds) if k == TRACE)


def einsum(*operands_and_letters, result: Sequence[int]) -> Array:
  """An einsum over `(array, letters)` pairs, in the cheapest order.

  The pairwise order is opt_einsum's optimal path; each pair is contracted
  by one `lax.dot_general`, whose natural output layout (batch, then free
  dimensions) is kept until the end. (`jnp.einsum` instead transposes every
  intermediate to opt_einsum's letter order, which can cost more than the
  products themselves for the many-dimensional operands here.)

  Example:
    >>> einsum((jnp.ones((2, 3)), [0, 1]), (jnp.ones((4, 3)), [2, 1]),
    ...        result=[0, 2]).shape
    (2, 4)
  """
  arrays = [a for a, _ in operands_and_letters]
  letters = [list(l) for _, l in operands_and_letters]
  if any(len(set(l)) < len(l) for l in letters):
    # Repeated letters in an operand (diagonals): jnp.einsum handles them.
    args = []
    for a, l in zip(arrays, letters):
      args += [a, l]
    return jnp.einsum(*args, list(result))
  for a, l in zip(arrays, letters):
    if a.ndim != len(l):
      raise ValueError(f'An operand of shape {a.shape} has letters {l}.')
  path, _ = _contraction_path(tuple(tuple(l) for l in letters),
                              tuple(tuple(a.shape) for a in arrays),
                              tuple(result))
  for pair in path:
    picked = [(arrays[i], letters[i]) for i in pair]
    for i in sorted(pair, reverse=True):
      del arrays[i], letters[i]
    keep = set(result).union(*letters)
    if len(picked) == 1:
      (a, la), = picked
      a, la = _sum_out(a, la, keep)
    else:
      (a, la), (b, lb) = picked
      a, la = _contract_pair(a, la, b, lb, keep)
    arrays.append(a)
    letters.append(la)
  (a, la), = zip(arrays, letters)
  a, la = _sum_out(a, la, set(result))
  return jnp.transpose(a, [la.index(l) for l in result])


def einsum_cost(*operands_and_letters, result: Sequence[int]) -> float:
  """FLOPs of `einsum(*operands_and_letters, result=result)`'s best order.

  Example:
    >>> einsum_cost((jnp.ones((2, 3)), [0, 1]), (jnp.ones((4, 3)), [2, 1]),
    ...             result=[0, 2])
    48.0
  """
  letters = tuple(tuple(l) for _, l in operands_and_letters)
  shapes = tuple(tuple(a.shape) for a, _ in operands_and_letters)
  return _contraction_path(letters, shapes, tuple(result))[1]


@functools.lru_cache(maxsize=4096)
def _contraction_path(letters: tuple, shapes: tuple,
                      result: tuple) -> tuple[list[tuple[int, ...]], float]:
  """opt_einsum's contraction order, and its FLOPs."""
  if len(letters) == 1:
    return [(0,)], float(math.prod(shapes[0]))
  symbols = {l: opt_einsum.get_symbol(i)
             for i, l in enumerate(sorted(set(result).union(*letters)))}
  spec = (','.join(''.join(symbols[l] for l in ls) for ls in letters) + '->' +
          ''.join(symbols[l] for l in result))
  # 'optimal' searches all pairwise orders, cheap for a handful of operands,
  # and picks e.g. `(x1 x2^T) * (g1 g2^T)` over forming a Jacobian when
  # that is fewer FLOPs; dynamic programming scales to more operands.
  optimize = 'optimal' if len(letters) <= 5 else 'dp'
  path, info = opt_einsum.contract_path(spec, *shapes, shapes=True,
                                        optimize=optimize)
  return [tuple(p) for p in path], float(info.opt_cost)


def _sum_out(a: Array, letters: list[int],
             keep: set[int]) -> tuple[Array, list[int]]:
  """Sums over the dimensions whose letters are not in `keep`."""
  axes = tuple(i for i, l in enumerate(letters) if l not in keep)
  if axes:
    a = jnp.sum(a, axis=axes)
    letters = [l for l in letters if l in keep]
  return a, letters


def _contract_pair(a: Array, la: list[int], b: Array, lb: list[int],
                   keep: set[int]) -> tuple[Array, list[int]]:
  """Contracts two operands as one batched matrix product.

  Letters in both are batch dimensions if still needed (`keep`), else
  contracted; letters in one only are summed out first unless needed. The
  operands are reshaped to `(batch, M, K)` or `(batch, K, M)` matrices
  (whichever needs no transpose, if either): XLA's CPU backend runs these
  canonical forms as fast GEMMs, but may fall back to a slow loop for a
  batched product of many-dimensional, interleaved operands.
  """
  a, la = _sum_out(a, la, keep | set(lb))
  b, lb = _sum_out(b, lb, keep | set(la))
  shared = [l for l in la if l in lb]
  batch = [l for l in shared if l in keep]
  contract = [l for l in shared if l not in keep]
  free_a = [l for l in la if l not in shared]
  free_b = [l for l in lb if l not in shared]
  size = dict(zip(la, a.shape)) | dict(zip(lb, b.shape))
  prod = lambda ls: math.prod(size[l] for l in ls)
  a, a_contract_last = _as_matrices(a, la, batch, free_a, contract, prod)
  b, b_contract_last = _as_matrices(b, lb, batch, free_b, contract, prod)
  dims = (((2 if a_contract_last else 1,), (2 if b_contract_last else 1,)),
          ((0,), (0,)))
  out = lax.dot_general(a, b, dims)
  out = out.reshape([size[l] for l in batch + free_a + free_b])
  return out, batch + free_a + free_b


def _as_matrices(x: Array, letters: list[int], batch: list[int],
                 free: list[int], contract: list[int],
                 prod: Callable) -> tuple[Array, bool]:
  """`x` as `(batch, free, contract)` or `(batch, contract, free)` matrices.

  Returns the reshaped array and whether the contracted dimension is last.
  """
  contract_last = letters != batch + contract + free
  order = batch + free + contract if contract_last else letters
  if order != letters:
    x = jnp.transpose(x, [letters.index(l) for l in order])
  shape = ((prod(batch), prod(free), prod(contract)) if contract_last else
           (prod(batch), prod(contract), prod(free)))
  return x.reshape(shape), contract_last
