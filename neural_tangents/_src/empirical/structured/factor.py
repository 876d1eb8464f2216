"""`Factor`: a value of the network as it enters an einsum.

Jacobian forms (`rules/`), cotangent tails (`tails.py`) and contractions
(`contraction.py`) are einsums of factors: program values (`ir.Atom`),
possibly transformed (a reciprocal, an elementwise derivative, the windows of
a convolution's input), with the letters of `empirical/einsum.py`.
"""
import dataclasses
from typing import Callable, Optional

from neural_tangents._src.empirical.einsum import Letter
from neural_tangents._src.empirical.structured import ir
from neural_tangents._src.utils.typing import Array


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
  atom: ir.Atom
  letters: tuple[Letter, ...]
  transform: Optional[Callable[[Array], Array]] = None
  atom_letters: Optional[tuple[Letter, ...]] = None

  def value(self, atom_value: Array) -> Array:
    return (atom_value if self.transform is None else
            self.transform(atom_value))
