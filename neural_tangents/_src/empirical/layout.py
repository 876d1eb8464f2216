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
import math
from typing import Optional, Sequence

import jax.numpy as jnp

from neural_tangents._src.empirical.einsum import Letters
from neural_tangents._src.utils import arguments
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
  for a in axes:
    if isinstance(a, bool) or not isinstance(a, int):
      raise ValueError(f'`{name}={tuple(axes)}` has axis {a!r}, not an int; '
                       f'pass ints, e.g. `{name}=(-1,)`.')
  return arguments.canonicalize_axes(tuple(axes), ndim, name)


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
