"""Records of calls and loops: flattened (`jit`, short `scan`s) or kept whole
(`custom_jvp_call`, `custom_vjp_call`).

A call that only groups equations is replaced by its body when a program is
flattened (`Rule.expand`); a `scan` of at most `MAX_UNROLLED_SCAN` steps by
its steps. A call with its own derivative rules stays whole; it enters a
cotangent tail as a diagonal factor when its body is elementwise, which the
records of the body's primitives tell: `call_rules(lookup)` receives the
table's lookup (`rules.rule`), since the table holds these records too.

Example:
  >>> [r.name for r in call_rules(lambda name: None)][:3]
  ['jit', 'closed_call', 'remat2']
"""
import functools
from typing import Any, Callable, Optional, Sequence

import jax
from jax import lax
import jax.numpy as jnp

from neural_tangents._src.empirical.structured import ir
from neural_tangents._src.empirical.structured import params
from neural_tangents._src.empirical.structured.rules import common
from neural_tangents._src.empirical.structured.rules import elementwise
from neural_tangents._src.empirical.structured.rules.record import CUSTOM
from neural_tangents._src.empirical.structured.rules.record import INLINED
from neural_tangents._src.empirical.structured.rules.record import Inline
from neural_tangents._src.empirical.structured.rules.record import Rule

# The record of a primitive by name (`rules.rule`), or None.
Lookup = Callable[[str], Optional[Rule]]

# Longest `scan` unrolled: longer loops stay whole (a generic equation).
MAX_UNROLLED_SCAN = 32


def _inline_call(eqn_params: dict, ins: Sequence[ir.Atom],
                 inline: Inline) -> Optional[list[ir.Atom]]:
  """A call that only groups equations is replaced by its body."""
  body = params.call_body(eqn_params)
  if body is None or len(body[0].invars) != len(ins):
    return None
  return inline(body[0], body[1], ins)


def _unroll_scan(eqn_params: dict, ins: Sequence[ir.Atom],
                 inline: Inline) -> Optional[list[ir.Atom]]:
  """A short `scan`'s steps, one inlined body per step.

  `scan` carries `carry` through `length` steps, each reading slice `t` of
  the stacked inputs `xs` and writing slice `t` of the stacked outputs. Each
  step's use of its slice of stacked parameters (`stax.repeat`) is then seen
  like a layer's (a chain starting with a `slice`, `leaf_region`).
  """
  scan = params.scan(eqn_params)
  if not 0 < scan.length <= MAX_UNROLLED_SCAN:
    return None
  n_consts, n_carry, body = scan.num_consts, scan.num_carry, scan.body
  consts = list(ins[:n_consts])
  carry = list(ins[n_consts:n_consts + n_carry])
  xs = ins[n_consts + n_carry:]
  steps = range(scan.length)
  ys: dict[int, list[ir.Atom]] = {}
  for t in (reversed(steps) if scan.reverse else steps):
    x_t = [_traced(lambda a, t=t: lax.index_in_dim(a, t, keepdims=False),
                   [x], inline) for x in xs]
    outs = inline(body.jaxpr, body.consts, consts + carry + x_t)
    carry, ys[t] = outs[:n_carry], outs[n_carry:]
  stacked = [_traced(lambda *a: jnp.stack(a), [ys[t][k] for t in steps],
                     inline)
             for k in range(len(body.jaxpr.outvars) - n_carry)]
  return carry + stacked


def _traced(fn: Callable[..., Any], atoms: Sequence[ir.Atom],
            inline: Inline) -> ir.Atom:
  """Inlines the equations of `fn(*atoms)` (one output)."""
  avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in atoms]
  closed = jax.make_jaxpr(fn)(*avals)
  out, = inline(closed.jaxpr, closed.consts, atoms)
  return out


def _custom_call_tail(lookup: Lookup, eqn, k, letters, new):
  """A custom call of one input whose body is elementwise: `f'(v)`."""
  del new
  if not (common.same_shape(eqn, k) and len(eqn.inputs) == 1):
    return None
  body = params.call_body(eqn.params)
  if body is None or not elementwise_body(lookup, body[0],
                                          eqn.inputs[0].shape):
    return None
  return elementwise.diagonal_tail(eqn, k, letters)


def elementwise_body(lookup: Lookup, jaxpr: Any,
                     shape: tuple[int, ...]) -> bool:
  """Whether a call's body applies elementwise functions to its input.

  Args:
    lookup: the record of a primitive by name (`rules.rule`).
    jaxpr: the call's body.
    shape: the shape of its input.

  Returns:
    True if every equation of the body is an elementwise function (by its
    record) or a call whose body is, on values of `shape` or scalars.
  """
  for eqn in jaxpr.eqns:
    r = lookup(eqn.primitive.name)
    if r is not None and r.elementwise:
      ok = all(tuple(getattr(a.aval, 'shape', ())) in ((), shape)
               for a in eqn.invars)
    elif r is not None and r.call is not None:
      body = params.call_body(eqn.params)
      ok = body is not None and elementwise_body(lookup, body[0], shape)
    else:
      ok = False
    if not ok or any(tuple(v.aval.shape) != shape for v in eqn.outvars):
      return False
  return all(tuple(getattr(v.aval, 'shape', ())) == shape
             for v in jaxpr.outvars)


def _same_axes(eqn, in_axes):
  del eqn
  return list(in_axes)


def call_rules(lookup: Lookup) -> tuple[Rule, ...]:
  """The records of calls and loops; `lookup` reads the whole table."""
  custom_tail = functools.partial(_custom_call_tail, lookup)
  return (
      *(Rule(name, call=INLINED, expand=_inline_call)
        for name in ('jit', 'closed_call', 'remat2')),
      *(Rule(name, call=CUSTOM, tail_step=custom_tail)
        for name in ('custom_jvp_call', 'custom_vjp_call')),
      Rule('scan', expand=_unroll_scan),
      Rule('optimization_barrier', batch_axis=_same_axes),
  )
