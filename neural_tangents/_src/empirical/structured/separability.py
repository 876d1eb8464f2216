"""Proving from a program that its batch items do not interact.

A network `f(params, x)` of a whole batch `x` is *batch-separable* if the
output of example `n` depends on `x` only through `x[n]`. Most networks are,
but only batch-norm-like layers (statistics over the batch) are not, and a
user who does not pass `vmap_axes` has not promised either.

`batch_axes` proves it, conservatively, by following the batch axis through
every equation: each value either does not depend on `x` (its batch axis is
`None`) or has one axis such that its slice `n` depends on `x` only through
`x[n]`. A primitive without a `batch_axis` in `rules/`, or one that
mixes slices (a reduction over the batch axis, a gather, a loop), ends the
proof, and the caller falls back to whole-batch derivatives. The proof reads
the traced program, so Python-level shape logic in `f` cannot fool it.
"""
from typing import Any, Sequence

from neural_tangents._src.empirical.structured import ir
from neural_tangents._src.empirical.structured import params as params_lib
from neural_tangents._src.empirical.structured import program as prog
from neural_tangents._src.empirical.structured import rules

BatchAxis = rules.BatchAxis
NotSeparable = rules.NotSeparable


def batch_axes(program: ir.Program,
               input_axes: Sequence[BatchAxis]) -> dict[ir.Var, BatchAxis]:
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
    >>> from neural_tangents._src.empirical.structured import program
    >>> aval = lambda *shape: jax.ShapeDtypeStruct(shape, np.float32)
    >>> p = program.trace_program(lambda w, x: [x[0] @ w[0]], [aval(4, 2)],
    ...                           [aval(3, 4)])
    >>> batch_axes(p, [None, 0])[p.outputs[0]]
    0
  """
  axes: dict[ir.Var, BatchAxis] = dict(zip(program.inputs, input_axes))
  sizes = {v.shape[a] for v, a in zip(program.inputs, input_axes)
           if a is not None}
  _run(program.eqns, axes, sizes)
  return axes


def outputs_batched_at(program: ir.Program, axes: dict[ir.Var, BatchAxis],
                       axis: int) -> bool:
  """Whether every program output has its batch axis at `axis`."""
  return all(isinstance(a, ir.Var) and axes.get(a) == axis
             for a in program.outputs)


def _axis(axes: dict[ir.Var, BatchAxis], a: ir.Atom) -> BatchAxis:
  return axes.get(a) if isinstance(a, ir.Var) else None


def _run(eqns: Sequence[ir.Eqn], axes: dict[ir.Var, BatchAxis],
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
  """Whether a shape-dependent primitive (positions, random bits; here or in
  a sub-jaxpr of `params`) has an output with a dimension of a batch size.

  Made at the batch size from shared inputs, slice `n` of the whole batch's
  value differs from the value made for a batch of one.
  """
  rule = rules.rule(name)
  if rule is not None and rule.shape_dependent and any(
      d in batch_sizes for shape in out_shapes for d in shape):
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


def _rule(eqn: ir.Eqn, in_axes: list[BatchAxis],
          batch_sizes: set[int]) -> list[BatchAxis]:
  """The batch axes of `eqn`'s outputs; raises `NotSeparable` if unknown."""
  rule = rules.rule(eqn.name)
  if rule is not None and rule.call is not None:
    return _call_axes(eqn, in_axes, batch_sizes)
  if rule is None or rule.batch_axis is None:
    raise NotSeparable(eqn.name)
  return rule.batch_axis(eqn, in_axes)


def _call_axes(eqn: ir.Eqn, in_axes: list[BatchAxis],
               batch_sizes: set[int]) -> list[BatchAxis]:
  """Batch axes through a call's body (for custom derivatives: its primal)."""
  body = params_lib.call_body(eqn.params)
  rules.require(body is not None and
                len(body[0].invars) == len(eqn.inputs))
  jaxpr, consts = body
  eqns: list[ir.Eqn] = []
  inputs = [ir.Var(v.aval) for v in jaxpr.invars]
  outputs = prog.inline_jaxpr(jaxpr, consts, inputs, eqns)
  inner: dict[ir.Var, Any] = dict(zip(inputs, in_axes))
  _run(eqns, inner, batch_sizes)
  return [_axis(inner, a) for a in outputs]
