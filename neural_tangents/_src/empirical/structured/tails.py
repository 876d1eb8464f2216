"""Cotangents of network tails as einsum factors.

The cotangent `G_u = dF/du` of a value `u` can be written as an einsum when
the rest of the network after `u` (its *tail*) is simple: elementwise
functions (a diagonal factor, their derivative), reductions and broadcasts
(letters), and at most one product with another value (a factor). Each
step is a primitive's `tail_step` in `rules/`. For a CNN ending in
`relu -> mean over space -> dense`, the last convolution's cotangent is
`relu'(y)[h, w, c] W[c, o] / HW`, and contracting these factors, instead of
a materialized `G[o, h, w, c]`, saves the product over `o` of a
spatially-sized tensor.
"""
import dataclasses
from typing import Any, Optional

import jax
import numpy as np

from neural_tangents._src.empirical.einsum import Letter
from neural_tangents._src.empirical.einsum import Letters
from neural_tangents._src.empirical.einsum import mask
from neural_tangents._src.empirical.structured import ir
from neural_tangents._src.empirical.structured import rules
from neural_tangents._src.empirical.structured.factor import Factor


@dataclasses.dataclass(frozen=True, eq=False)
class Tail:
  """`G_u[o, y] = coefficient * einsum(*factors -> o, y)` for one output.

  Attributes:
    output: the program output `u` reaches (its cotangent is zero for the
      others).
    y: letters of `u`'s dimensions.
    out: letters of the output's dimensions.
    factors: the factors.
    coefficient: a constant scaling.
  """
  output: int
  y: tuple[Letter, ...]
  out: tuple[Letter, ...]
  factors: tuple[Factor, ...]
  coefficient: float


# Most products with other values a tail may contain: each adds a factor
# that makes the contraction's path search larger, and a longer tail is
# rarely cheaper than its materialized cotangent.
_MAX_PRODUCTS = 1


def cotangent_tail(target: Any, program: ir.Program,
                   consumers: dict[ir.Var, list],
                   batch_axis: Optional[int] = None) -> Optional[Tail]:
  """The cotangent of `target` as einsum factors, if its tail is simple.

  Args:
    target: a `Var`, or a program output index (whose cotangent is the
      identity).
    program: the program.
    consumers: `Var -> [(eqn, input position)]` for every use in `eqns`.
    batch_axis: in a batch-separable program, the target's batch axis: the
      output's batch axis (0) then keeps the target's batch letter instead
      of an identity factor, so that examples stay separate.

  Returns:
    The tail, or None if the target is used more than once downstream, or
    passes through an operation without a rule here.
  """
  fresh = Letters()
  var = program.outputs[target] if isinstance(target, int) else target
  if not isinstance(var, ir.Var):
    return None
  y = mask(fresh.many(len(var.shape)), var.shape)
  letters, factors, coefficient, products = list(y), [], 1., 0
  if isinstance(target, int):
    return _finish(target, y, letters, factors, coefficient, var, fresh,
                   batch_axis)
  while True:
    outputs = [i for i, a in enumerate(program.outputs) if a is var]
    uses = consumers.get(var, [])
    if len(outputs) + len(uses) != 1:
      return None
    if outputs:
      return _finish(outputs[0], y, letters, factors, coefficient, var, fresh,
                     batch_axis)
    eqn, k = uses[0]
    step = _tail_step(eqn, k, letters, fresh)
    if step is None:
      return None
    letters, more, scale, product = step
    products += product
    if products > _MAX_PRODUCTS:
      return None
    factors += more
    coefficient *= scale
    var = eqn.outputs[0]


def _finish(output: int, y, letters, factors, coefficient, var, fresh,
            batch_axis) -> Optional[Tail]:
  """Ends a tail at a program output.

  An output dimension whose letter is one of the target's gets a fresh
  letter and an identity factor `eye[o, letter]`, so that `G[o, y]` keeps both
  (e.g. when the output is the target itself); others keep their letter.
  """
  out, eyes = [], []
  for d, (letter, size) in enumerate(zip(letters, var.shape)):
    if d == 0 and batch_axis is not None:
      # A batch-separable program: the output's batch axis keeps the
      # target's batch letter, which becomes the example letter.
      if letter is None or letter != y[batch_axis]:
        return None
      out.append(letter)
    elif letter is None or letter not in y:
      out.append(letter)
    else:
      o = fresh.new()
      out.append(o)
      eye = np.eye(size, dtype=var.dtype)
      eyes.append(Factor(ir.Const(eye, jax.ShapeDtypeStruct(eye.shape,
                                                              eye.dtype)),
                         (o, letter)))
  if len(set(letter for letter in out if letter is not None)) < len(
      [letter for letter in out if letter is not None]):
    return None  # An output diagonal (e.g. `x @ x.T`); not written here.
  return Tail(output, tuple(y), tuple(out), tuple(factors) + tuple(eyes),
              coefficient)


def _tail_step(eqn: ir.Eqn, k: int, letters: list,
               fresh: Letters) -> Optional[rules.TailStep]:
  """`(output letters, factors, scale, products)` of one tail equation."""
  if len(eqn.outputs) != 1 or not rules.inexact(eqn.outputs[0]):
    return None
  rule = rules.rule(eqn.name)
  if rule is None or rule.tail_step is None:
    return None
  return rule.tail_step(eqn, k, letters, fresh)
