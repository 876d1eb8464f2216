"""Records of elementwise primitives: functions, sums and `select_n`.

An elementwise function `f` of one input `v` (the others constants) enters a
cotangent tail as a diagonal factor `f'(v)` (`elementwise_tail`, `diagonal`).
A sum `a +- b` is linear in each input with coefficient `+-1`; `select_n(p,
x_0, x_1, ...)` is linear in its cases, with Jacobian `(p == j)` in `x_j`.

Example:
  >>> [r.name for r in SUM_RULES]
  ['add', 'add_any', 'sub']
"""
import functools
from typing import Optional

import jax
import jax.numpy as jnp

from neural_tangents._src.empirical.einsum import Letters
from neural_tangents._src.empirical.einsum import mask
from neural_tangents._src.empirical.structured import ir
from neural_tangents._src.empirical.structured.factor import Factor
from neural_tangents._src.empirical.structured.rules import common
from neural_tangents._src.empirical.structured.rules.record import FormParts
from neural_tangents._src.empirical.structured.rules.record import Rule
from neural_tangents._src.utils.typing import Array

# ---------------------------------------------------------------------------
# Elementwise functions: a diagonal factor f'(v) in cotangent tails.
# ---------------------------------------------------------------------------


def elementwise_tail(eqn, k, letters, new):
  """An elementwise `f` of input `k` alone: a diagonal factor `f'(v)`.

  The tail step of a primitive whose record says `elementwise`; its other
  inputs must be constants.
  """
  del new
  others = [a for i, a in enumerate(eqn.inputs) if i != k]
  if not (common.same_shape(eqn, k) and
          all(isinstance(a, ir.Const) for a in others)):
    return None
  return diagonal_tail(eqn, k, letters)


def diagonal_tail(eqn: ir.Eqn, k: int, letters: list):
  """The tail step `f'(v)` of an elementwise `f` of input `k`."""
  derivative = functools.partial(diagonal, eqn, k)
  return letters, [Factor(eqn.inputs[k], tuple(letters), derivative)], 1., 0


def diagonal(eqn: ir.Eqn, k: int, value: Array) -> Array:
  """`f'(v)` of an elementwise `f`: its JVP along a tangent of ones."""
  ins = [a.value if isinstance(a, ir.Const) else None for a in eqn.inputs]

  def f(a: Array) -> Array:
    ins[k] = a
    return ir.bind(eqn, ins)[0]

  return jax.jvp(f, (value,), (jnp.ones_like(value),))[1]


_ELEMENTWISE = dict(tail_step=elementwise_tail,
                    batch_axis=common.elementwise_axis, elementwise=True)

# Elementwise primitives with nothing more to them than `_ELEMENTWISE`.
_PLAIN_ELEMENTWISE = """
    abs acos acosh and asin asinh atan atan2 atanh bessel_i0e bessel_i1e cbrt
    ceil clamp clz complex cos cosh digamma eq erf erf_inv erfc exp exp2 expm1
    floor ge gt igamma igammac integer_pow is_finite le lgamma log log1p
    logistic lt max min ne nextafter not or polygamma population_count pow
    reduce_precision rem round rsqrt shift_left shift_right_arithmetic
    shift_right_logical sign sin sinh sqrt square tan tanh xor zeta
    """.split()


def _identity_back(scale: float):
  return lambda eqn, k, out: (out, scale)


def _identity_tail(eqn, k, letters, new):
  del new
  if not common.same_shape(eqn, k):
    return None
  return letters, [], -1. if eqn.name == 'neg' else 1., 0


ELEMENTWISE_RULES = (
    *(Rule(name, **_ELEMENTWISE) for name in _PLAIN_ELEMENTWISE),
    Rule('neg', linear_in=common.linear_in_any,
         leaf_letters=_identity_back(-1.),
         passes_cotangent=lambda eqn, k: -1., tail_step=_identity_tail,
         batch_axis=common.elementwise_axis, elementwise=True),
    *(Rule(name, linear_in=common.linear_in_any,
           leaf_letters=_identity_back(1.), tail_step=_identity_tail,
           batch_axis=common.elementwise_axis, elementwise=True)
      for name in ('convert_element_type', 'copy')),
    *(Rule(name, linear_in=common.linear_in_any,
           batch_axis=common.elementwise_axis, tail_step=elementwise_tail,
           elementwise=True)
      for name in ('real', 'imag', 'conj')),
)

# ---------------------------------------------------------------------------
# Sums: add, add_any, sub.
# ---------------------------------------------------------------------------


def _sum_sign(eqn: ir.Eqn, k: int) -> float:
  """`d(a - b)/db = -1`; every other input of a sum enters with `+1`."""
  return -1. if eqn.name == 'sub' and k == 1 else 1.


def _sum_back(eqn, k, out):
  """`v = in +- c` with a scalar constant `c`."""
  c = common.scalar_value(eqn.inputs[1 - k])
  if eqn.inputs[k].shape != eqn.outputs[0].shape or c is None:
    return None
  return out, _sum_sign(eqn, k)


def _sum_form(eqn: ir.Eqn, k: int, letters: Letters) -> FormParts:
  y = letters.many(len(eqn.outputs[0].shape))
  return y, (), common.broadcast_letters(eqn, y)[k], _sum_sign(eqn, k)


def _sum_tail(eqn, k, letters, new):
  del new
  if not common.same_shape(eqn, k):
    return None
  return letters, [], _sum_sign(eqn, k), 0


SUM_RULES = tuple(
    Rule(name, linear_in=common.linear_in_any, leaf_letters=_sum_back,
         jacobian_form=_sum_form, passes_cotangent=_sum_sign,
         tail_step=_sum_tail, batch_axis=common.elementwise_axis,
         elementwise=True)
    for name in ('add', 'add_any', 'sub'))

# ---------------------------------------------------------------------------
# select_n: linear in its cases, not in its predicate.
# ---------------------------------------------------------------------------


def _linear_in_cases(eqn: ir.Eqn, k: int) -> bool:
  """`select_n`: linear in its cases, not in its predicate."""
  del eqn
  return k >= 1


def _select_form(eqn: ir.Eqn, k: int, letters: Letters) -> Optional[FormParts]:
  """`d select_n(p, x_0, x_1, ...)/d x_j = (p == j)` (elementwise)."""
  if k < 1:
    return None
  y = letters.many(len(eqn.outputs[0].shape))
  ins = common.broadcast_letters(eqn, y)
  pred = eqn.inputs[0]
  dtype = eqn.outputs[0].dtype
  picks = lambda x: (x == (k - 1)).astype(dtype)
  return y, (Factor(pred, mask(ins[0], pred.shape), picks,
                    mask(ins[0], pred.shape)),), ins[k], 1.


SELECT_RULES = (
    Rule('select_n', linear_in=_linear_in_cases, jacobian_form=_select_form,
         tail_step=elementwise_tail, batch_axis=common.elementwise_axis,
         elementwise=True),
)
