"""A network's computation as a flat list of primitive equations.

Structured derivatives need to see where each parameter enters a network, and
which primitive it enters. `trace_program` records `f` with `jax.make_jaxpr`
and flattens it into a `Program` (`ir.py`): an equation whose primitive's
record in `rules/` has an `expand` (calls that only group equations:
`jit`, `closed_call`, `remat2`; a `scan` of a few steps, e.g. `stax.repeat`)
is replaced by the equations it expands to, so that a parameter used inside
a jitted layer or a scanned step is seen where it is used. Primitives with
their own derivative rules (`custom_jvp_call`, `custom_vjp_call`) stay whole,
so that evaluating the program differentiates exactly as `f` does.

Only public JAX APIs are used: `jax.make_jaxpr`, the `jax.extend.core` types
and `Primitive.bind`.
"""
from typing import Any, Callable, Optional, Sequence

import jax
from jax.extend import core as jex_core

from neural_tangents._src.empirical.structured import rules
from neural_tangents._src.empirical.structured.ir import Atom
from neural_tangents._src.empirical.structured.ir import bind
from neural_tangents._src.empirical.structured.ir import Const
from neural_tangents._src.empirical.structured.ir import Eqn
from neural_tangents._src.empirical.structured.ir import Program
from neural_tangents._src.empirical.structured.ir import Var


def trace_program(fn: Callable[..., Sequence[Any]],
                  *avals: Sequence[Any]) -> Program:
  """Traces `fn(*args)` (each arg a list of arrays) into a flat `Program`.

  Args:
    fn: a function of lists of arrays returning a list of arrays.
    *avals: for each argument, a list of `jax.ShapeDtypeStruct`s.

  Returns:
    The program, whose `inputs` are the leaves of all arguments in order.

  Example:
    >>> p = trace_program(lambda a: [a[0] * 2.], [jax.ShapeDtypeStruct((3,),
    ...                                                 np.float32)])
    >>> [e.name for e in p.eqns]
    ['mul']
  """
  closed = jax.make_jaxpr(lambda *args: list(fn(*args)))(*avals)
  return program_from_jaxpr(closed)


def program_from_jaxpr(closed: Any) -> Program:
  """Flattens a `ClosedJaxpr` into a `Program` with fresh `Var`s."""
  inputs = tuple(Var(v.aval) for v in closed.jaxpr.invars)
  eqns: list[Eqn] = []
  outputs = inline_jaxpr(closed.jaxpr, closed.consts, inputs, eqns)
  return Program(inputs, tuple(outputs), tuple(eqns))


def inline_jaxpr(jaxpr: Any, consts: Sequence[Any],
                 in_atoms: Sequence[Atom], eqns: list[Eqn]) -> list[Atom]:
  """Appends `jaxpr`'s equations on `in_atoms` to `eqns`; returns its outputs.

  Fresh `Var`s are made for every equation, so that a sub-jaxpr called twice
  (the same jitted layer used twice) gives two distinct sets of values. An
  equation whose rule can `expand` it is replaced by its expansion.
  """
  env: dict[Any, Atom] = {}

  def read(a: Any) -> Atom:
    if isinstance(a, jex_core.Literal):
      return Const(a.val, a.aval)
    return env[a]

  def inline(body: Any, body_consts: Sequence[Any],
             atoms: Sequence[Atom]) -> list[Atom]:
    return inline_jaxpr(body, body_consts, atoms, eqns)

  for v, c in zip(jaxpr.constvars, consts):
    env[v] = Const(c, v.aval)
  for v, a in zip(jaxpr.invars, in_atoms):
    env[v] = a
  for eqn in jaxpr.eqns:
    ins = [read(a) for a in eqn.invars]
    rule = rules.rule(eqn.primitive.name)
    outs = (None if rule is None or rule.expand is None else
            rule.expand(eqn.params, ins, inline))
    if outs is None:
      outs = [Var(v.aval) for v in eqn.outvars]
      eqns.append(Eqn(eqn.primitive, tuple(ins), tuple(outs),
                      dict(eqn.params)))
    for v, o in zip(eqn.outvars, outs):
      if not isinstance(v, jex_core.DropVar):
        env[v] = o
  return [read(a) for a in jaxpr.outvars]


def evaluate(program: Program,
             inputs: Sequence[Any],
             perturb: Optional[dict[Var, Any]] = None,
             perturb_outputs: Optional[dict[int, Any]] = None,
             ) -> tuple[list[Any], Callable[[Atom], Any]]:
  """Runs `program`, adding perturbations to some of its values.

  Args:
    program: the program.
    inputs: a value for each of `program.inputs`.
    perturb: `Var -> array` added to the `Var`'s value where it is computed,
      so that every use of it sees the sum.
    perturb_outputs: `output index -> array` added to that program output
      only (other uses of the same value do not see it).

  Returns:
    `(outputs, read)` where `read(atom)` gives any value of the run.
  """
  perturb = perturb or {}
  perturb_outputs = perturb_outputs or {}
  env: dict[Var, Any] = {}

  def read(a: Atom) -> Any:
    return a.value if isinstance(a, Const) else env[a]

  def write(v: Var, value: Any) -> None:
    env[v] = value + perturb[v] if v in perturb else value

  for v, value in zip(program.inputs, inputs):
    write(v, value)
  for eqn in program.eqns:
    for v, value in zip(eqn.outputs, bind(eqn, [read(a) for a in eqn.inputs])):
      write(v, value)
  outputs = [read(a) for a in program.outputs]
  for i, eps in perturb_outputs.items():
    outputs[i] = outputs[i] + eps
  return outputs, read
