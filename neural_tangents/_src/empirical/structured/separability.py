"""Proving from a program that its batch items do not interact.

A network `f(params, x)` of a whole batch `x` is *batch-separable* if the
output of example `n` depends on `x` only through `x[n]`. Most networks are,
but only batch-norm-like layers (statistics over the batch) are not, and a
user who does not pass `vmap_axes` has not promised either.

`batch_axes` proves it, conservatively, by following the batch axis through
every equation: each value either does not depend on `x` (its batch axis is
`None`) or has one axis such that its slice `n` depends on `x` only through
`x[n]`. A primitive without a rule below, or one that mixes slices (a
reduction over the batch axis, a gather, a loop), ends the proof, and the
caller falls back to whole-batch derivatives. The proof reads the traced
program, so Python-level shape logic in `f` cannot fool it.
"""
import math
from typing import Any, Optional, Sequence

from neural_tangents._src.empirical.structured import program as prog

BatchAxis = Optional[int]

ELEMENTWISE = frozenset("""
    abs acos acosh add add_any and asin asinh atan atan2 atanh bessel_i0e
    bessel_i1e cbrt ceil clamp clz complex conj convert_element_type copy
    copy_p cos cosh digamma div eq erf erf_inv erfc exp exp2 expm1 floor ge gt
    igamma igammac imag integer_pow is_finite le lgamma log log1p logistic lt
    max min mul ne neg nextafter not or polygamma population_count pow real
    reduce_precision rem round rsqrt select_n shift_left shift_right_arithmetic
    shift_right_logical sign sin sinh sqrt square sub tan tanh xor zeta
    """.split())

_REDUCTIONS = frozenset("""
    reduce_sum reduce_max reduce_min reduce_prod reduce_and reduce_or
    reduce_xor argmax argmin
    """.split())

_CUMULATIVE = frozenset('cumsum cumprod cummax cummin cumlogsumexp'.split())

_REDUCE_WINDOWS = frozenset("""
    reduce_window_sum reduce_window_max reduce_window_min reduce_window
    """.split())

# Primitives whose values depend on their output's shape (positions, random
# bits): made at the batch size from shared inputs, slice `n` of the whole
# batch's value differs from the value made for a batch of one.
_SHAPE_DEPENDENT = frozenset("""
    iota random_bits rng_bit_generator rng_uniform
    """.split())

_CUSTOM_CALLS = frozenset({'custom_jvp_call', 'custom_vjp_call',
                           'custom_vjp_call_jaxpr'})


class NotSeparable(Exception):
  """Raised when the batch items of a program may interact."""


def batch_axes(program: prog.Program,
               input_axes: Sequence[BatchAxis]) -> dict[prog.Var, BatchAxis]:
  """The batch axis of every value of `program`, given those of its inputs.

  Args:
    program: the program of a whole batch.
    input_axes: the batch axis of each input, `None` for inputs shared by
      all examples (params, and keyword arguments).

  Returns:
    `Var -> batch axis` for all values (`None`: independent of the batch).

  Raises:
    NotSeparable: if the proof fails.

  Example:
    >>> # p = trace_program(lambda w, x: [x[0] @ w[0]], [w_aval], [x_aval])
    >>> # batch_axes(p, [None, 0])[p.outputs[0]]  -> 0
  """
  axes: dict[prog.Var, BatchAxis] = dict(zip(program.inputs, input_axes))
  sizes = {v.shape[a] for v, a in zip(program.inputs, input_axes)
           if a is not None}
  _run(program.eqns, axes, sizes)
  return axes


def outputs_batched_at(program: prog.Program, axes: dict[prog.Var, BatchAxis],
                       axis: int) -> bool:
  """Whether every program output has its batch axis at `axis`."""
  return all(isinstance(a, prog.Var) and axes.get(a) == axis
             for a in program.outputs)


def _axis(axes: dict[prog.Var, BatchAxis], a: prog.Atom) -> BatchAxis:
  return axes.get(a) if isinstance(a, prog.Var) else None


def _run(eqns: Sequence[prog.Eqn], axes: dict[prog.Var, BatchAxis],
         batch_sizes: set[int]) -> None:
  for eqn in eqns:
    in_axes = [_axis(axes, a) for a in eqn.inputs]
    if all(a is None for a in in_axes):
      if _makes_batch_sized(eqn.name, [o.shape for o in eqn.outputs],
                            eqn.params, batch_sizes):
        raise NotSeparable(f'{eqn.name} makes batch-sized positions or '
                           'random bits')
      out_axes: list[BatchAxis] = [None] * len(eqn.outputs)
    else:
      out_axes = _rule(eqn, in_axes, batch_sizes)
    for v, a in zip(eqn.outputs, out_axes):
      axes[v] = a


def _makes_batch_sized(name: str, out_shapes: Sequence[tuple[int, ...]],
                       params: dict, batch_sizes: set[int]) -> bool:
  """Whether a `_SHAPE_DEPENDENT` primitive (here or in a sub-jaxpr of
  `params`) has an output with a dimension of a batch size."""
  if name in _SHAPE_DEPENDENT and any(d in batch_sizes for shape in out_shapes
                                      for d in shape):
    return True
  for value in params.values():
    for sub in value if isinstance(value, (tuple, list)) else (value,):
      jaxpr = getattr(sub, 'jaxpr', sub)  # A ClosedJaxpr's jaxpr.
      for inner in getattr(jaxpr, 'eqns', ()):
        if _makes_batch_sized(
            inner.primitive.name,
            [tuple(getattr(v.aval, 'shape', ())) for v in inner.outvars],
            inner.params, batch_sizes):
          return True
  return False


def _rule(eqn: prog.Eqn, in_axes: list[BatchAxis],
          batch_sizes: set[int]) -> list[BatchAxis]:
  """The batch axes of `eqn`'s outputs; raises `NotSeparable` if unknown."""
  name, p = eqn.name, eqn.params
  ins = eqn.inputs
  batched = [(i, a) for i, a in enumerate(in_axes) if a is not None]
  if name in ELEMENTWISE:
    return [_elementwise(eqn, batched)]
  if name == 'broadcast_in_dim' and len(ins) == 1:
    (_, a), = batched
    b = p['broadcast_dimensions'][a]
    _require(ins[0].shape[a] == eqn.outputs[0].shape[b])
    return [b]
  if name == 'reshape' and p.get('dimensions') is None:
    return [_reshape_axis(ins[0].shape, eqn.outputs[0].shape, batched[0][1])]
  if name == 'transpose':
    return [list(p['permutation']).index(batched[0][1])]
  if name == 'squeeze':
    a = batched[0][1]
    _require(a not in p['dimensions'])
    return [a - sum(d < a for d in p['dimensions'])]
  if name == 'dot_general':
    return [_dot_general_axis(eqn, in_axes)]
  if name == 'conv_general_dilated':
    dn = p['dimension_numbers']
    _require(in_axes[1] is None and in_axes[0] == dn.lhs_spec[0] and
             p['batch_group_count'] == 1)
    return [dn.out_spec[0]]
  if name in _REDUCTIONS:
    (_, a), = batched
    _require(a not in p['axes'])
    return [a - sum(d < a for d in p['axes'])] * len(eqn.outputs)
  if name in _CUMULATIVE:
    (_, a), = batched
    _require(p['axis'] != a)
    return [a]
  if name == 'rev':
    (_, a), = batched
    _require(a not in p['dimensions'])
    return [a]
  if name == 'slice':
    (_, a), = batched
    strides = p['strides']
    _require(p['start_indices'][a] == 0 and
             p['limit_indices'][a] == ins[0].shape[a] and
             (strides is None or strides[a] == 1))
    return [a]
  if name == 'pad':
    _require(in_axes[1] is None)
    a = in_axes[0]
    _require(tuple(p['padding_config'][a]) == (0, 0, 0))
    return [a]
  if name == 'concatenate':
    a = _common_axis(batched)
    _require(p['dimension'] != a)
    return [a]
  if name == 'stack':
    a = _common_axis(batched)
    return [a + 1 if p['axis'] <= a else a]
  if name == 'split':
    (_, a), = batched
    _require(p['axis'] != a)
    return [a] * len(eqn.outputs)
  if name in _REDUCE_WINDOWS:
    return [_reduce_window_axis(eqn, batched)] * len(eqn.outputs)
  if name == 'optimization_barrier':
    return list(in_axes)
  if name in _CUSTOM_CALLS or name in prog.INLINED_CALLS:
    return _call_axes(eqn, in_axes, batch_sizes)
  raise NotSeparable(name)


def _require(condition: bool) -> None:
  if not condition:
    raise NotSeparable()


def _common_axis(batched: list[tuple[int, int]]) -> int:
  axes = {a for _, a in batched}
  _require(len(axes) == 1)
  return axes.pop()


def _elementwise(eqn: prog.Eqn, batched: list[tuple[int, int]]) -> int:
  # Operands have the output's rank (with size-1 broadcasting) or are
  # scalars; a batched operand must not be broadcast along its batch axis.
  a = _common_axis(batched)
  out = eqn.outputs[0].shape
  for i, _ in batched:
    shape = eqn.inputs[i].shape
    _require(len(shape) == len(out) and shape[a] == out[a])
  return a


def _reshape_axis(in_shape: Sequence[int], out_shape: Sequence[int],
                  a: int) -> int:
  # The batch axis survives a reshape if it stays a whole axis: the sizes
  # before it multiply to the same number, and it keeps its size.
  before = math.prod(in_shape[:a])
  for b, size in enumerate(out_shape):
    if math.prod(out_shape[:b]) == before and size == in_shape[a]:
      return b
  raise NotSeparable('reshape')


def _dot_general_axis(eqn: prog.Eqn, in_axes: list[BatchAxis]) -> int:
  (lc, rc), (lb, rb) = eqn.params['dimension_numbers']
  la, ra = in_axes
  lhs_free = [d for d in range(len(eqn.inputs[0].shape))
              if d not in lc and d not in lb]
  rhs_free = [d for d in range(len(eqn.inputs[1].shape))
              if d not in rc and d not in rb]
  if la is not None and ra is not None:
    # Both batched: only an elementwise pairing of examples is separable.
    _require(la in lb and ra in rb and list(lb).index(la) ==
             list(rb).index(ra))
    return list(lb).index(la)
  if la is not None:
    _require(la not in lc)
    return (list(lb).index(la) if la in lb else
            len(lb) + lhs_free.index(la))
  _require(ra not in rc)
  return (list(rb).index(ra) if ra in rb else
          len(lb) + len(lhs_free) + rhs_free.index(ra))


def _reduce_window_axis(eqn: prog.Eqn, batched: list[tuple[int, int]]) -> int:
  a = _common_axis(batched)
  p = eqn.params
  _require(p['window_dimensions'][a] == 1 and p['window_strides'][a] == 1 and
           tuple(p['padding'][a]) == (0, 0) and
           p.get('base_dilation', (1,) * (a + 1))[a] == 1 and
           p.get('window_dilation', (1,) * (a + 1))[a] == 1)
  # A generic `reduce_window` also takes init values, which must be shared.
  _require(all(i < len(eqn.outputs) for i, _ in batched))
  return a


def _call_axes(eqn: prog.Eqn, in_axes: list[BatchAxis],
               batch_sizes: set[int]) -> list[BatchAxis]:
  """Batch axes through a call's body (for custom derivatives: its primal)."""
  body = prog.sub_jaxpr(eqn.params)
  _require(body is not None and len(body[0].invars) == len(eqn.inputs))
  jaxpr, consts = body
  eqns: list[prog.Eqn] = []
  inputs = [prog.Var(v.aval) for v in jaxpr.invars]
  outputs = prog.inline_jaxpr(jaxpr, consts, inputs, eqns)
  inner: dict[prog.Var, Any] = dict(zip(inputs, in_axes))
  _run(eqns, inner, batch_sizes)
  return [_axis(inner, a) for a in outputs]
