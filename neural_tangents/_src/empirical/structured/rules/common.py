"""Helpers the primitive families share: constants, letters, linearity, and
batch axes.

The linearity predicates are `Rule.linear_in` functions; the batch-axis
helpers build `Rule.batch_axis` functions, which call `require` for every
condition under which examples stay apart (it raises `NotSeparable`).

Example:
  >>> only_axis([None, 2])
  2
  >>> dropping_axis((0,), 2)
  1
"""
from typing import Callable, Optional, Sequence

import jax.numpy as jnp
import numpy as np

from neural_tangents._src.empirical.einsum import Letter
from neural_tangents._src.empirical.structured import ir
from neural_tangents._src.empirical.structured import params
from neural_tangents._src.empirical.structured.rules.record import BatchAxis
from neural_tangents._src.empirical.structured.rules.record import NotSeparable

# ---------------------------------------------------------------------------
# Constants and letters.
# ---------------------------------------------------------------------------


def inexact(a: ir.Atom) -> bool:
  return jnp.issubdtype(a.dtype, jnp.inexact)


def scalar_value(a: ir.Atom) -> Optional[float]:
  """The value of a scalar constant, if it is a concrete number."""
  if not isinstance(a, ir.Const) or a.shape != ():
    return None
  try:
    return float(np.asarray(a.value))
  except Exception:  # pylint: disable=broad-except
    return None  # A constant closed over from an outer trace.


def broadcast_letters(eqn: ir.Eqn, y: Sequence[Letter]
                      ) -> list[tuple[Letter, ...]]:
  """Letters of each input of an elementwise equation with output letters `y`.

  Inputs have the output's rank (size-1 dimensions broadcast) or are scalars.
  """
  out = eqn.outputs[0].shape
  return [() if a.shape == () else
          tuple(y[d] if a.shape[d] == out[d] else None
                for d in range(len(out))) for a in eqn.inputs]


def same_shape(eqn: ir.Eqn, k: int) -> bool:
  return tuple(eqn.inputs[k].shape) == tuple(eqn.outputs[0].shape)


# ---------------------------------------------------------------------------
# Linearity (`Rule.linear_in`).
# ---------------------------------------------------------------------------


def linear_in_any(eqn: ir.Eqn, k: int) -> bool:
  del eqn, k
  return True


def linear_in_first(eqn: ir.Eqn, k: int) -> bool:
  del eqn
  return k == 0


def linear_in_only_input(eqn: ir.Eqn, k: int) -> bool:
  del k
  return len(eqn.inputs) == 1


# ---------------------------------------------------------------------------
# Batch axes (`Rule.batch_axis`).
# ---------------------------------------------------------------------------


def require(condition: bool) -> None:
  if not condition:
    raise NotSeparable()


def batched(in_axes: list[BatchAxis]) -> list[tuple[int, int]]:
  return [(i, a) for i, a in enumerate(in_axes) if a is not None]


def only_axis(in_axes: list[BatchAxis]) -> int:
  (_, a), = batched(in_axes)
  return a


def common_axis(in_axes: list[BatchAxis]) -> int:
  axes = {a for _, a in batched(in_axes)}
  require(len(axes) == 1)
  return axes.pop()


def elementwise_axis(eqn, in_axes):
  # Operands have the output's rank (with size-1 broadcasting) or are
  # scalars; a batched operand must not be broadcast along its batch axis.
  a = common_axis(in_axes)
  out = eqn.outputs[0].shape
  for i, _ in batched(in_axes):
    shape = eqn.inputs[i].shape
    require(len(shape) == len(out) and shape[a] == out[a])
  return [a]


def dropping_axis(dims: Sequence[int], a: int) -> int:
  """Axis `a` after dropping `dims` (which must not contain it)."""
  require(a not in dims)
  return a - sum(d < a for d in dims)


def keeps_axis(operated_on: Callable[[ir.Eqn], Sequence[int]],
               find: Optional[Callable[[list], int]] = None):
  """The batch-axis rule of a primitive acting along `operated_on(eqn)`.

  The batch axis (found by `find`: the only batched input's by default) must
  be another axis, and every output keeps it.
  """
  find = find or only_axis

  def batch_axis(eqn, in_axes):
    a = find(in_axes)
    require(a not in operated_on(eqn))
    return [a] * len(eqn.outputs)

  return batch_axis


# `cumsum`, ..., `split`: the batch axis is not their `axis`.
not_along_axis_param = keeps_axis(lambda eqn: (params.axis(eqn),))
