"""Typed accessors for the parameters of JAX primitives.

Rules read an equation's parameters only through these functions, so that a
renamed or restructured parameter in a new JAX release breaks here, in one
place, rather than in every rule that reads it.

Example:
  >>> from neural_tangents._src.empirical.structured import program
  >>> p = program.trace_program(lambda a: [a[0].sum(0)],
  ...                           [jax.ShapeDtypeStruct((3, 2), np.float32)])
  >>> reduction_axes(p.eqns[0])
  (0,)
"""
import dataclasses
from typing import Any, Optional, Sequence

from jax.extend import core as jex_core

from neural_tangents._src.empirical.structured import ir


@dataclasses.dataclass(frozen=True)
class DotDimensions:
  """The dimension numbers of a `dot_general`, by operand."""
  lhs_contracting: tuple[int, ...]
  rhs_contracting: tuple[int, ...]
  lhs_batch: tuple[int, ...]
  rhs_batch: tuple[int, ...]

  def of(self, k: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """`(contracting, batch)` dimensions of operand `k` (0: lhs, 1: rhs)."""
    return ((self.lhs_contracting, self.lhs_batch) if k == 0 else
            (self.rhs_contracting, self.rhs_batch))


def dot_general_dimensions(eqn: ir.Eqn) -> DotDimensions:
  (lc, rc), (lb, rb) = eqn.params['dimension_numbers']
  return DotDimensions(tuple(lc), tuple(rc), tuple(lb), tuple(rb))


@dataclasses.dataclass(frozen=True)
class Convolution:
  """The parameters of a `conv_general_dilated`.

  Attributes:
    lhs_spec, rhs_spec, out_spec: the dimension of the input, kernel and
      output for (batch or output feature, feature, spatial...) each.
  """
  lhs_spec: tuple[int, ...]
  rhs_spec: tuple[int, ...]
  out_spec: tuple[int, ...]
  window_strides: tuple[int, ...]
  padding: tuple[tuple[int, int], ...]
  lhs_dilation: tuple[int, ...]
  rhs_dilation: tuple[int, ...]
  feature_group_count: int
  batch_group_count: int


def convolution(eqn: ir.Eqn) -> Convolution:
  p = eqn.params
  dn = p['dimension_numbers']
  return Convolution(
      tuple(dn.lhs_spec), tuple(dn.rhs_spec), tuple(dn.out_spec),
      tuple(p['window_strides']), tuple(tuple(q) for q in p['padding']),
      tuple(p['lhs_dilation']), tuple(p['rhs_dilation']),
      p['feature_group_count'], p['batch_group_count'])


@dataclasses.dataclass(frozen=True)
class ReduceWindow:
  """The window parameters of a `reduce_window*`, one entry per dimension."""
  window_dimensions: tuple[int, ...]
  window_strides: tuple[int, ...]
  padding: tuple[tuple[int, int], ...]
  base_dilation: tuple[int, ...]
  window_dilation: tuple[int, ...]


def reduce_window(eqn: ir.Eqn) -> ReduceWindow:
  p = eqn.params
  ones = (1,) * len(p['window_dimensions'])
  return ReduceWindow(tuple(p['window_dimensions']), tuple(p['window_strides']),
                      tuple(tuple(q) for q in p['padding']),
                      tuple(p.get('base_dilation', ones)),
                      tuple(p.get('window_dilation', ones)))


@dataclasses.dataclass(frozen=True)
class Slice:
  """A `slice`: `start_indices`, `limit_indices`, `strides` (None: ones)."""
  start: tuple[int, ...]
  limit: tuple[int, ...]
  strides: Optional[tuple[int, ...]]

  def unit_strides(self) -> bool:
    return all(s in (None, 1) for s in (self.strides or ()))


def slice_bounds(eqn: ir.Eqn) -> Slice:
  p = eqn.params
  strides = p['strides']
  return Slice(tuple(p['start_indices']), tuple(p['limit_indices']),
               None if strides is None else tuple(strides))


@dataclasses.dataclass(frozen=True)
class Scan:
  """A `scan`'s layout of inputs (`consts, carry, xs`) and its body."""
  num_consts: int
  num_carry: int
  length: int
  reverse: bool
  body: Any  # A ClosedJaxpr.


def scan(eqn_params: dict[str, Any]) -> Scan:
  p = eqn_params
  return Scan(p['num_consts'], p['num_carry'], p['length'], p['reverse'],
              p['jaxpr'])


def broadcast_dimensions(eqn: ir.Eqn) -> tuple[int, ...]:
  """Of `broadcast_in_dim`: the output dimension of each input dimension."""
  return tuple(eqn.params['broadcast_dimensions'])


def transpose_permutation(eqn: ir.Eqn) -> tuple[int, ...]:
  """Of `transpose`: output dimension `j` is input dimension `perm[j]`."""
  return tuple(eqn.params['permutation'])


def reduction_axes(eqn: ir.Eqn) -> tuple[int, ...]:
  """Of `reduce_sum`, `reduce_max`, `argmax`, ...: the reduced axes."""
  return tuple(eqn.params['axes'])


def squeezed_dimensions(eqn: ir.Eqn) -> tuple[int, ...]:
  return tuple(eqn.params['dimensions'])


def reshape_dimensions(eqn: ir.Eqn) -> Optional[tuple[int, ...]]:
  """Of `reshape`: the transpose applied first, None for none."""
  dims = eqn.params.get('dimensions')
  return None if dims is None else tuple(dims)


def reversed_dimensions(eqn: ir.Eqn) -> tuple[int, ...]:
  """Of `rev`."""
  return tuple(eqn.params['dimensions'])


def padding_config(eqn: ir.Eqn) -> tuple[tuple[int, int, int], ...]:
  """Of `pad`: `(low, high, interior)` per dimension."""
  return tuple(tuple(c) for c in eqn.params['padding_config'])


def concatenate_dimension(eqn: ir.Eqn) -> int:
  return eqn.params['dimension']


def axis(eqn: ir.Eqn) -> int:
  """Of `cumsum` (and other cumulative ones), `stack` and `splitting`."""
  return eqn.params['axis']


def call_body(eqn_params: dict[str, Any]) -> Optional[tuple[Any, Sequence[Any]]]:
  """`(jaxpr, consts)` of a call primitive's body, if it has exactly one."""
  for key in ('jaxpr', 'call_jaxpr', 'fun_jaxpr'):
    j = eqn_params.get(key)
    if isinstance(j, jex_core.ClosedJaxpr):
      return j.jaxpr, j.consts
    if isinstance(j, jex_core.Jaxpr):
      return j, ()
  return None
