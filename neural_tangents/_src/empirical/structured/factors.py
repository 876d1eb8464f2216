"""Einsum factors of structured Jacobians, and of cotangents of network tails.

Structured derivatives write Jacobians as einsums of *factors*: values of the
network (a layer's input, an activation's derivative, a weight) with integer
*letters* for their dimensions. A letter is `None` for a dimension of size 1,
which an einsum can drop.

This module also writes the cotangent `G_u = dF/du` of a value `u` as an
einsum when the rest of the network after `u` (its *tail*) is simple:
elementwise functions (a diagonal factor, their derivative), reductions and
broadcasts (letters), and at most one product with another value (a factor).
For a CNN ending in `relu -> mean over space -> dense`, the last
convolution's cotangent is `relu'(y)[h, w, c] W[c, o] / HW`, and contracting
these factors, instead of a materialized `G[o, h, w, c]`, saves the product
over `o` of a spatially-sized tensor.
"""
import dataclasses
import functools
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.empirical.structured import program as prog
from neural_tangents._src.empirical.structured import separability as sep
from neural_tangents._src.utils.typing import Array

Letter = Optional[int]  # `None` marks a dimension of size 1.


class Counter:
  """Hands out fresh letters: `new()` returns 0, 1, 2, ..."""

  def __init__(self):
    self.n = 0

  def __call__(self) -> int:
    self.n += 1
    return self.n - 1


def mask(letters: Sequence[Letter], shape: Sequence[int]) -> tuple[Letter, ...]:
  """Drops (to None) the letters of size-1 dimensions."""
  return tuple(None if s == 1 else l for l, s in zip(letters, shape))


def inexact(a: prog.Atom) -> bool:
  return jnp.issubdtype(a.dtype, jnp.inexact)


def scalar_value(a: prog.Atom) -> Optional[float]:
  """The value of a scalar constant, if it is a concrete number."""
  if not isinstance(a, prog.Const) or a.shape != ():
    return None
  try:
    return float(np.asarray(a.value))
  except Exception:  # pylint: disable=broad-except
    return None  # A constant closed over from an outer trace.


@dataclasses.dataclass(frozen=True, eq=False)
class Factor:
  """A value of the network as it enters an einsum.

  Attributes:
    atom: the program value it is computed from.
    letters: letters of the factor's dimensions (after `transform`).
    transform: applied to the atom's value to get the factor, or None.
    atom_letters: letters of the atom's own dimensions, where known (used to
      check that a batched atom has the example letter on its batch axis).
  """
  atom: prog.Atom
  letters: tuple[Letter, ...]
  transform: Optional[Callable[[Array], Array]] = None
  atom_letters: Optional[tuple[Letter, ...]] = None

  def value(self, atom_value: Array) -> Array:
    return (atom_value if self.transform is None else
            self.transform(atom_value))


def broadcast_letters(eqn: prog.Eqn, y: Sequence[Letter]
                      ) -> list[tuple[Letter, ...]]:
  """Letters of each input of an elementwise equation with output letters `y`.

  Inputs have the output's rank (size-1 dimensions broadcast) or are scalars.
  """
  out = eqn.outputs[0].shape
  return [() if a.shape == () else
          tuple(y[d] if a.shape[d] == out[d] else None
                for d in range(len(out))) for a in eqn.inputs]


def dot_general_letters(eqn: prog.Eqn, k: int, operand: Sequence[Letter],
                        new: Counter) -> tuple[list, list]:
  """Letters of the other input and of the output of a `dot_general`.

  Args:
    eqn: the `dot_general` equation.
    k: which input (0 or 1) has letters `operand`.
    operand: its letters.
    new: fresh letters for the other input's remaining dimensions.

  Returns:
    `(other_letters, output_letters)`.
  """
  (lc, rc), (lb, rb) = eqn.params['dimension_numbers']
  mine, theirs = ((lc, lb), (rc, rb)) if k == 0 else ((rc, rb), (lc, lb))
  other_atom = eqn.inputs[1 - k]
  unset = object()
  other: list[Any] = [unset] * len(other_atom.shape)
  for a, b in zip(mine[0] + mine[1], theirs[0] + theirs[1]):
    other[b] = operand[a]
  other = list(mask([new() if l is unset else l for l in other],
                    other_atom.shape))
  lhs, rhs = (operand, other) if k == 0 else (other, operand)
  free_l = [lhs[d] for d in range(len(lhs)) if d not in lc and d not in lb]
  free_r = [rhs[d] for d in range(len(rhs)) if d not in rc and d not in rb]
  return other, [lhs[d] for d in lb] + free_l + free_r


# ---------------------------------------------------------------------------
# Cotangents of tails.
# ---------------------------------------------------------------------------


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


def cotangent_tail(target: Any, program: prog.Program,
                   consumers: dict[prog.Var, list],
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
  new = Counter()
  var = program.outputs[target] if isinstance(target, int) else target
  if not isinstance(var, prog.Var):
    return None
  y = mask([new() for _ in var.shape], var.shape)
  letters, factors, coefficient, products = list(y), [], 1., 0
  if isinstance(target, int):
    return _finish(target, y, letters, factors, coefficient, var, new,
                   batch_axis)
  while True:
    outputs = [i for i, a in enumerate(program.outputs) if a is var]
    uses = consumers.get(var, [])
    if len(outputs) + len(uses) != 1:
      return None
    if outputs:
      return _finish(outputs[0], y, letters, factors, coefficient, var, new,
                     batch_axis)
    eqn, k = uses[0]
    step = _tail_step(eqn, k, letters, new)
    if step is None:
      return None
    letters, more, scale, product = step
    products += product
    if products > _MAX_PRODUCTS:
      return None
    factors += more
    coefficient *= scale
    var = eqn.outputs[0]


def _finish(output: int, y, letters, factors, coefficient, var, new,
            batch_axis) -> Optional[Tail]:
  """Ends a tail at a program output.

  An output dimension whose letter is one of the target's gets a fresh
  letter and an identity factor `eye[o, l]`, so that `G[o, y]` keeps both
  (e.g. when the output is the target itself); others keep their letter.
  """
  out, eyes = [], []
  for d, (l, size) in enumerate(zip(letters, var.shape)):
    if d == 0 and batch_axis is not None:
      # A batch-separable program: the output's batch axis keeps the
      # target's batch letter, which becomes the example letter.
      if l is None or l != y[batch_axis]:
        return None
      out.append(l)
    elif l is None or l not in y:
      out.append(l)
    else:
      o = new()
      out.append(o)
      eye = np.eye(size, dtype=var.dtype)
      eyes.append(Factor(prog.Const(eye, jax.ShapeDtypeStruct(eye.shape,
                                                              eye.dtype)),
                         (o, l)))
  if len(set(l for l in out if l is not None)) < len(
      [l for l in out if l is not None]):
    return None  # An output diagonal (e.g. `x @ x.T`); not written here.
  return Tail(output, tuple(y), tuple(out), tuple(factors) + tuple(eyes),
              coefficient)


def _tail_step(eqn: prog.Eqn, k: int, letters: list, new: Counter):
  """`(output letters, factors, scale, is_product)` of one tail equation."""
  if len(eqn.outputs) != 1 or not inexact(eqn.outputs[0]):
    return None
  name, p = eqn.name, eqn.params
  v, w = eqn.inputs[k], eqn.outputs[0]
  same = tuple(v.shape) == tuple(w.shape)
  if name in ('add', 'add_any', 'sub') and same:
    return letters, [], -1. if name == 'sub' and k == 1 else 1., 0
  if name in ('neg', 'convert_element_type', 'copy', 'copy_p') and same:
    return letters, [], -1. if name == 'neg' else 1., 0
  if name in ('mul', 'div') and same and not (name == 'div' and k == 1):
    other = eqn.inputs[1 - k]
    c = scalar_value(other)
    if c is not None and c != 0:
      return letters, [], c if name == 'mul' else 1 / c, 0
    other_letters = broadcast_letters(eqn, letters)[1 - k]
    transform = None if name == 'mul' else jnp.reciprocal
    return letters, [Factor(other, other_letters, transform)], 1., 0
  if same and _is_elementwise(eqn, k):
    derivative = functools.partial(_diagonal, eqn, k)
    return letters, [Factor(v, tuple(letters), derivative)], 1., 0
  if name == 'reduce_sum':
    return [l for d, l in enumerate(letters) if d not in p['axes']], [], 1., 0
  if name == 'broadcast_in_dim' and len(eqn.inputs) == 1:
    out = list(mask([new() for _ in w.shape], w.shape))
    for i, b in enumerate(p['broadcast_dimensions']):
      if v.shape[i] == w.shape[b]:
        out[b] = letters[i]
    return out, [], 1., 0
  if name == 'transpose':
    return [letters[d] for d in p['permutation']], [], 1., 0
  if name in ('reshape', 'squeeze') and len(eqn.inputs) == 1:
    if [s for s in v.shape if s != 1] != [s for s in w.shape if s != 1]:
      return None
    kept = iter([l for l, s in zip(letters, v.shape) if s != 1])
    return [None if s == 1 else next(kept) for s in w.shape], [], 1., 0
  if name == 'dot_general':
    other, out = dot_general_letters(eqn, k, letters, new)
    return out, [Factor(eqn.inputs[1 - k], tuple(other))], 1., 1
  return None


def _is_elementwise(eqn: prog.Eqn, k: int) -> bool:
  """Whether `eqn` is an elementwise function of input `k` alone."""
  others = [a for i, a in enumerate(eqn.inputs) if i != k]
  if not all(isinstance(a, prog.Const) for a in others):
    return False
  if eqn.name in sep.ELEMENTWISE:
    return True
  if eqn.name in ('custom_jvp_call', 'custom_vjp_call') and not others:
    body = prog.sub_jaxpr(eqn.params)
    return body is not None and _elementwise_body(body[0], body[1],
                                                  eqn.inputs[0].shape)
  return False


def _elementwise_body(jaxpr: Any, consts: Sequence[Any],
                      shape: tuple[int, ...]) -> bool:
  """Whether a call's body applies elementwise functions to its input."""
  eqns: list[prog.Eqn] = []
  inputs = [prog.Var(v.aval) for v in jaxpr.invars]
  outputs = prog.inline_jaxpr(jaxpr, consts, inputs, eqns)
  for eqn in eqns:
    if eqn.name in sep.ELEMENTWISE:
      ok = all(a.shape in ((), shape) for a in eqn.inputs)
    elif eqn.name in ('custom_jvp_call', 'custom_vjp_call'):
      body = prog.sub_jaxpr(eqn.params)
      ok = body is not None and _elementwise_body(body[0], body[1], shape)
    else:
      ok = False
    if not ok or any(o.shape != shape for o in eqn.outputs):
      return False
  return all(o.shape == shape for o in outputs)


def _diagonal(eqn: prog.Eqn, k: int, value: Array) -> Array:
  """`f'(v)` of an elementwise `f`: its JVP along a tangent of ones."""
  ins = [a.value if isinstance(a, prog.Const) else None for a in eqn.inputs]

  def f(a: Array) -> Array:
    ins[k] = a
    return prog.bind(eqn, ins)[0]

  return jax.jvp(f, (value,), (jnp.ones_like(value),))[1]
