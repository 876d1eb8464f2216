"""The `Rule` record: what structured derivatives know of one JAX primitive.

Each family module (`elementwise.py`, `products.py`, `structural.py`,
`reductions.py`, `calls.py`) builds the records of its primitives; the
package (`rules/__init__.py`) collects them into the table `RULES`. The
fields are described in the package docstring; `Rule` gives their
signatures.

Example:
  >>> Rule('copy', elementwise=True).jacobian_form is None
  True
"""
import dataclasses
from typing import Any, Callable, Optional, Sequence

from neural_tangents._src.empirical.structured import ir

BatchAxis = Optional[int]

INLINED = 'inlined'  # A call that only groups equations: flattened.
CUSTOM = 'custom'  # A call with its own derivative rules: kept whole.


class NotSeparable(Exception):
  """Raised when the batch items of a program may interact."""


# A step of a cotangent tail: `(output letters, factors, scale, products)`.
TailStep = tuple[list, list, float, int]
# A Jacobian form: `(output letters y, factors, letters v of input k,
# coefficient)`: `J[y, v] = coefficient * einsum(factors)`.
FormParts = tuple[list, tuple, list, float]
# `inline(jaxpr, consts, atoms)`: appends a jaxpr's equations on `atoms` to
# the program being flattened and returns its outputs (`program.py`).
Inline = Callable[[Any, Sequence[Any], Sequence[ir.Atom]], list[ir.Atom]]


@dataclasses.dataclass(frozen=True)
class Rule:
  """What structured derivatives know about one primitive (package docstring).

  Signatures (`eqn` the equation, `k` the position of the input considered):
    linear_in(eqn, k) -> bool
    leaf_letters(eqn, k, output_letters) -> (input_letters, scale) or None
    leaf_region(eqn) -> (start, limit) or None: the chain starts with a
      contiguous slice of the leaf (a step of an unrolled `scan`).
    jacobian_form(eqn, k, letters) -> (y, factors, v, coefficient) or None
    passes_cotangent(eqn, k) -> scale or None
    tail_step(eqn, k, input_letters, letters) -> TailStep or None
    batch_axis(eqn, in_axes) -> output batch axes (raises NotSeparable)
    expand(eqn_params, inputs, inline) -> outputs, or None to keep it whole
  """
  name: str
  linear_in: Optional[Callable[[ir.Eqn, int], bool]] = None
  leaf_letters: Optional[Callable[..., Optional[tuple[list, float]]]] = None
  leaf_region: Optional[Callable[[ir.Eqn], Optional[tuple]]] = None
  jacobian_form: Optional[Callable[..., Optional[FormParts]]] = None
  passes_cotangent: Optional[Callable[[ir.Eqn, int], Optional[float]]] = None
  tail_step: Optional[Callable[..., Optional[TailStep]]] = None
  batch_axis: Optional[Callable[[ir.Eqn, list], list]] = None
  expand: Optional[Callable[[dict, Sequence[ir.Atom], Inline],
                            Optional[list[ir.Atom]]]] = None
  elementwise: bool = False
  shape_dependent: bool = False
  call: Optional[str] = None
