"""The program representation of structured derivatives: its types.

A `Program` is a network's computation as a flat list of primitive equations
(`Eqn`), each reading atoms (`Var`: a value computed by the program; `Const`:
a value known when it was traced) and writing `Var`s. `program.py` builds
programs from jaxprs and runs them; `rules/` reads their equations. This
module imports nothing else of the package, so that both can use it.

Example:
  >>> import jax
  >>> v = Var(jax.ShapeDtypeStruct((3,), np.float32))
  >>> v.shape
  (3,)
"""
import dataclasses
from typing import Any, Sequence, Union

import numpy as np


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


def bind(eqn: Eqn, values: Sequence[Any]) -> list[Any]:
  """Applies `eqn`'s primitive to `values`; always returns a list."""
  bind_params = eqn.primitive.get_bind_params(eqn.params)
  subfuns: Sequence[Any] = ()
  if isinstance(bind_params, tuple):  # older JAX: `(subfuns, params)`
    subfuns, bind_params = bind_params
  out = eqn.primitive.bind(*subfuns, *values, **bind_params)
  return list(out) if eqn.primitive.multiple_results else [out]
