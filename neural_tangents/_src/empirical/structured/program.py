"""A network's computation as a flat list of primitive equations.

Structured derivatives need to see where each parameter enters a network, and
which primitive it enters. `trace_program` records `f` with `jax.make_jaxpr`
and flattens it: calls that only group equations (`jit`, `closed_call`,
`remat2`) are inlined, so that a parameter used inside a jitted layer is
seen where it is used. Primitives with their own derivative rules
(`custom_jvp_call`, `custom_vjp_call`) stay whole, so that evaluating the
program differentiates exactly as `f` does.

A `scan` of a few steps (e.g. `stax.repeat`) is unrolled, so that each step's
use of its slice of the stacked parameters is seen like a layer's.

Only public JAX APIs are used: `jax.make_jaxpr`, the `jax.extend.core` types
and `Primitive.bind`.
"""
import dataclasses
from typing import Any, Callable, Optional, Sequence, Union

import jax
from jax import lax
from jax.extend import core as jex_core
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.empirical.structured import params as params_lib


# Longest `scan` unrolled: longer loops stay whole (a generic equation).
MAX_UNROLLED_SCAN = 32


class Var:
  """A value computed by a `Program`; two `Var`s are equal only if identical."""
  __slots__ = ('aval',)

  def __init__(self, aval: Any):
    self.aval = aval

  @property
  def shape(self) -> tuple[int, ...]:
    return tuple(self.aval.shape)

  @property
  def dtype(self) -> Any:
    return self.aval.dtype

  def __repr__(self) -> str:
    return f'Var{self.shape}@{id(self) % 10000}'


class Const:
  """A value known when the program is traced (a literal or a constant)."""
  __slots__ = ('value', 'aval')

  def __init__(self, value: Any, aval: Any):
    self.value = value
    self.aval = aval

  @property
  def shape(self) -> tuple[int, ...]:
    return tuple(np.shape(self.value))

  @property
  def dtype(self) -> Any:
    return self.aval.dtype

  def __repr__(self) -> str:
    return f'Const{self.shape}'


Atom = Union[Var, Const]


@dataclasses.dataclass(frozen=True, eq=False)
class Eqn:
  """`outputs = primitive.bind(*inputs, **params)`."""
  primitive: Any
  inputs: tuple[Atom, ...]
  outputs: tuple[Var, ...]
  params: dict[str, Any]

  @property
  def name(self) -> str:
    return self.primitive.name


@dataclasses.dataclass(frozen=True, eq=False)
class Program:
  """A flat program: `outputs` computed from `inputs` by `eqns`, in order."""
  inputs: tuple[Var, ...]
  outputs: tuple[Atom, ...]
  eqns: tuple[Eqn, ...]

  def uses(self) -> dict[Var, int]:
    """How many times each `Var` is read (program outputs included)."""
    count: dict[Var, int] = {}
    for eqn in self.eqns:
      for a in eqn.inputs:
        if isinstance(a, Var):
          count[a] = count.get(a, 0) + 1
    for a in self.outputs:
      if isinstance(a, Var):
        count[a] = count.get(a, 0) + 1
    return count


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
  (the same jitted layer used twice) gives two distinct sets of values.
  """
  env: dict[Any, Atom] = {}

  def read(a: Any) -> Atom:
    if isinstance(a, jex_core.Literal):
      return Const(a.val, a.aval)
    return env[a]

  for v, c in zip(jaxpr.constvars, consts):
    env[v] = Const(c, v.aval)
  for v, a in zip(jaxpr.invars, in_atoms):
    env[v] = a
  for eqn in jaxpr.eqns:
    ins = [read(a) for a in eqn.invars]
    body = (params_lib.call_body(eqn.params) if _is_inlined_call(eqn.primitive.name)
            else None)
    if body is not None and len(body[0].invars) == len(ins):
      outs = inline_jaxpr(body[0], body[1], ins, eqns)
    elif (eqn.primitive.name == 'scan' and
          0 < params_lib.scan(eqn.params).length <= MAX_UNROLLED_SCAN):
      outs = _unroll_scan(eqn.params, ins, eqns)
    else:
      outs = [Var(v.aval) for v in eqn.outvars]
      eqns.append(Eqn(eqn.primitive, tuple(ins), tuple(outs),
                      dict(eqn.params)))
    for v, o in zip(eqn.outvars, outs):
      if not isinstance(v, jex_core.DropVar):
        env[v] = o
  return [read(a) for a in jaxpr.outvars]


def _is_inlined_call(name: str) -> bool:
  """Whether a primitive only calls a sub-jaxpr (`jit`, `remat`, ...), whose
  derivative is then the sub-jaxpr's (its record in `rules.py`)."""
  # Imported here: the rules read programs, so `rules` imports this module.
  from neural_tangents._src.empirical.structured import rules  # pylint: disable=g-import-not-at-top
  return rules.is_call(name, rules.INLINED)


def _unroll_scan(eqn_params: dict[str, Any], ins: Sequence[Atom],
                 eqns: list[Eqn]) -> list[Atom]:
  """Appends a `scan`'s steps, one inlined body per step; returns its outputs.

  `scan` carries `carry` through `length` steps, each reading slice `t` of
  the stacked inputs `xs` and writing slice `t` of the stacked outputs.
  """
  scan = params_lib.scan(eqn_params)
  n_consts, n_carry, length, body = (scan.num_consts, scan.num_carry,
                                     scan.length, scan.body)
  consts = list(ins[:n_consts])
  carry = list(ins[n_consts:n_consts + n_carry])
  xs = ins[n_consts + n_carry:]
  steps = range(length)
  ys: dict[int, list[Atom]] = {}
  for t in (reversed(steps) if scan.reverse else steps):
    x_t = [_traced(lambda a, t=t: lax.index_in_dim(a, t, keepdims=False),
                   [x], eqns) for x in xs]
    outs = inline_jaxpr(body.jaxpr, body.consts, consts + carry + x_t, eqns)
    carry, ys[t] = outs[:n_carry], outs[n_carry:]
  stacked = [_traced(lambda *a: jnp.stack(a), [ys[t][k] for t in steps], eqns)
             for k in range(len(body.jaxpr.outvars) - n_carry)]
  return carry + stacked


def _traced(fn: Callable[..., Any], atoms: Sequence[Atom],
            eqns: list[Eqn]) -> Atom:
  """Appends the equations of `fn(*atoms)` (one output) to `eqns`."""
  avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in atoms]
  closed = jax.make_jaxpr(fn)(*avals)
  out, = inline_jaxpr(closed.jaxpr, closed.consts, atoms, eqns)
  return out


def bind(eqn: Eqn, values: Sequence[Any]) -> list[Any]:
  """Applies `eqn`'s primitive to `values`; always returns a list."""
  bind_params = eqn.primitive.get_bind_params(eqn.params)
  subfuns: Sequence[Any] = ()
  if isinstance(bind_params, tuple):  # older JAX: `(subfuns, params)`
    subfuns, bind_params = bind_params
  out = eqn.primitive.bind(*subfuns, *values, **bind_params)
  return list(out) if eqn.primitive.multiple_results else [out]


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
