"""The implementations of the empirical NTK, in one registry.

Each `Implementation` record names an `NtkImplementation` member, its kernel
function `kernel_fn(problem, params, data1, data2) -> kernels`, the modes of
structured derivatives it can be planned in, and the weight AUTO gives its
estimated cost (`speedup`: the cost is divided by it). `api.py` runs the
member a user asks for (`implementation(member).kernel_fn`); `auto.py`
compares the candidates of every record (`REGISTRY`), one per record, or one
per mode for a record with modes, named by `candidate_name`.

Adding an implementation: a member of `NtkImplementation`, a module with its
kernel function, and one record in `REGISTRY`.

Example:
  >>> implementation(NtkImplementation.STRUCTURED_DERIVATIVES).candidate_name(
  ...     structured.Mode.SEPARABLE)
  'structured_separable'
"""
import dataclasses
import enum
import functools
from typing import Callable, Mapping, Optional

from neural_tangents._src.empirical import jacobian_contraction as jacobian_lib
from neural_tangents._src.empirical import problem as problem_lib
from neural_tangents._src.empirical import structured
from neural_tangents._src.empirical import structured_derivatives
from neural_tangents._src.empirical import vector_products as vector_products_lib


class NtkImplementation(enum.IntEnum):
  """How `empirical_ntk_fn` computes the NTK (all give the same answer).

  Attributes:
    AUTO: estimate the cost of each implementation (FLOPs and bytes of the
      traced candidates at these input shapes, as XLA's cost analysis counts
      them) and use the cheapest.
    JACOBIAN_CONTRACTION: materialize Jacobians and contract them.
    NTK_VECTOR_PRODUCTS: apply `J(x1) J(x2)^T` to a basis by VJPs and JVPs.
    STRUCTURED_DERIVATIVES: contract layer inputs and output cotangents
      using the structure of each layer's Jacobian.
  """
  AUTO = 0
  JACOBIAN_CONTRACTION = 1
  NTK_VECTOR_PRODUCTS = 2
  STRUCTURED_DERIVATIVES = 3


# `kernel_fn(problem, params, data1, data2)`: the kernel of each output leaf.
KernelFn = Callable[[problem_lib.Problem, list, list, list], list]
# `planned(problem, params, data1, data2, mode)`: a `KernelFn` planned in
# `mode` at these shapes; raises `structured.Unsupported` where it cannot.
PlannedFn = Callable[[problem_lib.Problem, list, list, list, structured.Mode],
                     KernelFn]


# Structured derivatives spend their FLOPs in a few large matrix products,
# which run several times faster per FLOP than the per-example convolution
# transposes and small backward passes of the other implementations; their
# estimated cost is divided by this. At equal vmap_axes they are the fastest
# measured cell every time, e.g. (RESULTS.md, Empirical NTK)
#   "| cnn | STRUCTURED_DERIVATIVES | 0 | 40.06x | 40.66x | 42.29x |"
#   "| cnn | JACOBIAN_CONTRACTION | 0 | 7.08x | 5.88x | 6.93x |"
# so the factor only breaks near-ties of the estimate in their favour.
STRUCTURED_SPEEDUP = 2.

# Per-example structured derivatives (under `vmap`) against the same
# contractions on the whole batch (`SEPARABLE`), at about equal estimated
# cost: near-ties go to the per-example ones. Set from quiet-machine runs of
# `entk_bench.py` (per-example 1.06-1.33x faster on fcn_full, 1.23-1.53x on
# cnn); the in-repository measurement is below its noise (RESULTS.md,
# Formulation switching):
#   "| resnet | 0.03135 | 0.04036 |"  (structured_separable, _example)
#   "| fcn_repeat | 0.00108 | 0.00109 |"
# so the factor stays small: it only breaks near-ties.
EXAMPLE_SPEEDUP = 1.1


@dataclasses.dataclass(frozen=True)
class Implementation:
  """One way to compute the empirical NTK.

  Attributes:
    member: its `NtkImplementation`.
    name: its name among AUTO's candidates (with `_<mode>` per mode).
    kernel_fn: computes the kernels (planning itself, if it plans).
    planned: for a record with `modes`, plans `kernel_fn` in one mode.
    modes: the modes it can be planned in, each with the further speedup
      AUTO credits it with in that mode; empty for no modes.
    speedup: AUTO divides the estimated cost of its candidates by this.
  """
  member: NtkImplementation
  name: str
  kernel_fn: KernelFn
  planned: Optional[PlannedFn] = None
  modes: Mapping[structured.Mode, float] = dataclasses.field(
      default_factory=dict)
  speedup: float = 1.

  def candidate_name(self, mode: Optional[structured.Mode] = None) -> str:
    """AUTO's name for this implementation, planned in `mode` if given."""
    return self.name if mode is None else f'{self.name}_{mode.value}'

  def candidate_speedups(self) -> dict[str, float]:
    """The cost divisor of each of its candidates, by candidate name."""
    if not self.modes:
      return {self.candidate_name(): self.speedup}
    return {self.candidate_name(mode): self.speedup * extra
            for mode, extra in self.modes.items()}


def _planned_structured(problem: problem_lib.Problem, params: list,
                        data1: list, data2: list,
                        mode: structured.Mode) -> KernelFn:
  plan, _ = structured_derivatives.plan_structured(problem, params, data1,
                                                   data2, mode)
  return functools.partial(structured_derivatives.planned_structured, plan,
                           mode)


REGISTRY: tuple[Implementation, ...] = (
    Implementation(NtkImplementation.JACOBIAN_CONTRACTION,
                   'jacobian_contraction', jacobian_lib.jacobian_contraction),
    Implementation(NtkImplementation.NTK_VECTOR_PRODUCTS,
                   'ntk_vector_products', vector_products_lib.vector_products),
    Implementation(NtkImplementation.STRUCTURED_DERIVATIVES, 'structured',
                   structured_derivatives.structured_derivatives,
                   planned=_planned_structured,
                   modes={structured.Mode.WHOLE: 1.,
                          structured.Mode.SEPARABLE: 1.,
                          structured.Mode.EXAMPLE: EXAMPLE_SPEEDUP},
                   speedup=STRUCTURED_SPEEDUP),
)

# The cost divisor of every AUTO candidate, by candidate name.
CANDIDATE_SPEEDUPS: dict[str, float] = {
    name: speedup for record in REGISTRY
    for name, speedup in record.candidate_speedups().items()}


def implementation(member: NtkImplementation) -> Implementation:
  """The record of `member` (any member but `AUTO`, which picks one).

  Raises:
    ValueError: for `AUTO` or a member without a record.
  """
  for record in REGISTRY:
    if record.member == member:
      return record
  raise ValueError(
      f'implementation={member!r} has no kernel function of its own; pass '
      f'one of {[r.member.name for r in REGISTRY]}, or AUTO to '
      '`empirical_ntk_fn`, which picks one of them.')
