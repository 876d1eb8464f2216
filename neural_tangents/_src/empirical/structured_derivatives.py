"""STRUCTURED_DERIVATIVES as an implementation: plans the `structured`
engine for a `Problem`, runs it, and falls back to Jacobian contraction
(with a one-time warning saying why) where the engine cannot read `f`.

Three modes (`structured.Mode`): `EXAMPLE` (per-example programs, with
`vmap_axes`), `WHOLE` (the whole batch as one example) and `SEPARABLE` (the
whole-batch program, with per-example cotangents, once the jaxpr proves
that batch items do not interact; AUTO's candidate without `vmap_axes`).
"""
import functools
from typing import Optional
import warnings

from neural_tangents._src.empirical import jacobian_contraction as jacobian_lib
from neural_tangents._src.empirical import layout as layout_lib
from neural_tangents._src.empirical import problem as problem_lib
from neural_tangents._src.empirical import structured
from neural_tangents._src.utils.typing import Array


class StructuredFallbackWarning(UserWarning):
  """STRUCTURED_DERIVATIVES was asked for but Jacobians were contracted."""


# The reasons already warned about in this process (one warning per reason).
_WARNED_REASONS: set[str] = set()


def structured_derivatives(problem: problem_lib.Problem, params: list,
                           data1: list, data2: list,
                           mode: Optional[structured.Mode] = None,
                           warn_on_fallback: bool = True) -> list[Array]:
  """Structured derivatives; falls back to Jacobians where unsupported.

  Args:
    problem: the problem (`problem_lib.setup`).
    params: its differentiable parameter leaves.
    data1: x1's data leaves.
    data2: x2's data leaves.
    mode: the `structured.Mode`; by default `EXAMPLE` for a per-example
      problem, else `WHOLE`.
    warn_on_fallback: whether to warn (once per process and reason) when
      falling back to Jacobian contraction.

  Returns:
    The kernel of each output leaf.

  Example:
    >>> problem, params, data1, data2 = problem_lib.setup(
    ...     lambda p, x: jnp.tanh(x @ p), x1, x2, jnp.ones((4, 2)), {}, (-1,),
    ...     (), None)
    >>> [kernel.shape for kernel in structured_derivatives(
    ...     problem, params, data1, data2)]
    [(3, 2)]
  """
  try:
    plan, mode = plan_structured(problem, params, data1, data2, mode)
  except structured.Unsupported as e:
    if warn_on_fallback:
      _warn_once(str(e))
    return jacobian_lib.jacobian_contraction(problem, params, data1, data2)
  return planned_structured(plan, mode, problem, params, data1, data2)


def _warn_once(reason: str) -> None:
  if reason in _WARNED_REASONS:
    return
  _WARNED_REASONS.add(reason)
  warnings.warn(
      'implementation=STRUCTURED_DERIVATIVES cannot read `f` as a program of '
      f'supported primitives ({reason}), so the NTK is computed by '
      'JACOBIAN_CONTRACTION instead (same values, usually slower). Pass '
      '`implementation=NtkImplementation.AUTO` to pick the fastest supported '
      'implementation without this warning.', StructuredFallbackWarning,
      stacklevel=3)


def plan_structured(problem: problem_lib.Problem, params: list, data1: list,
                    data2: list, mode: Optional[structured.Mode]
                    ) -> tuple[structured.Plan, structured.Mode]:
  """Traces both sides' programs and plans structured derivatives.

  Raises:
    structured.Unsupported: where the engine cannot plan `f` in this mode.
  """
  if mode is None:
    mode = (structured.Mode.EXAMPLE if problem.per_example else
            structured.Mode.WHOLE)
  per_example = mode == structured.Mode.EXAMPLE
  param_avals = [problem_lib.abstract(p) for p in params]
  programs, avals = [], []
  for side, data in zip(problem.sides, (data1, data2)):
    side_avals = problem_lib.example_avals(
        data, side.data_axes if per_example else None)
    same = (avals and problem.same_calls and
            problem_lib.same_avals(side_avals, avals[0]))
    programs.append(
        programs[0] if same or (problem.symmetric and programs) else
        structured.trace_program(side.call(per_example), param_avals,
                                 side_avals))
    avals.append(side_avals)
  batch_axes = (None, None)
  if mode == structured.Mode.SEPARABLE:
    if min(side.n for side in problem.sides) < 2:
      raise structured.Unsupported('a batch of one example')
    batch_axes = tuple(_separable_axes(program, len(params), side.n_x)
                       for program, side in zip(programs, problem.sides))
  plan = structured.make_plan(tuple(programs), len(params), mode, batch_axes)
  return plan, mode


def examples_separable(problem: problem_lib.Problem, params: list,
                       data1: list, data2: list) -> bool:
  """Whether both sides' jaxprs prove that x's examples do not interact.

  For a whole-batch problem (no `vmap_axes`): the output of example `n`
  (axis 0 of every output) depends on x only through `x[n]` (axis 0 of
  every x leaf), keyword arguments and params being shared. Any doubt
  (a primitive without a batch rule, a failed trace) gives False.

  Example:
    >>> problem, params, data1, data2 = problem_lib.setup(
    ...     lambda p, x: jnp.tanh(x @ p), x1, x2, jnp.ones((4, 2)), {}, (-1,),
    ...     (), None)
    >>> examples_separable(problem, params, data1, data2)
    True
  """
  if problem.per_example or min(side.n for side in problem.sides) < 2:
    return False
  param_avals = [problem_lib.abstract(p) for p in params]
  for side, data in zip(problem.sides, (data1, data2)):
    try:
      program = structured.trace_program(
          side.fn, param_avals, [problem_lib.abstract(d) for d in data])
      _separable_axes(program, len(params), side.n_x)
    except Exception:  # pylint: disable=broad-except
      return False  # Unsupported, or e.g. `f` closes over a tracer.
  return True


def _separable_axes(program: structured.Program, n_params: int,
                    n_x: int) -> dict:
  """Batch axes proving x's examples do not interact, else Unsupported."""
  # Params and keyword arguments are shared; x leaves are batched at 0.
  n_other = len(program.inputs) - n_params - n_x
  input_axes = [None] * n_params + [0] * n_x + [None] * n_other
  try:
    axes = structured.batch_axes(program, input_axes)
  except structured.NotSeparable as e:
    raise structured.Unsupported(f'batch items may interact ({e})') from e
  if not structured.outputs_batched_at(program, axes, 0):
    raise structured.Unsupported('an output is not batched along axis 0')
  return axes


def planned_structured(plan: structured.Plan, mode: structured.Mode,
                       problem: problem_lib.Problem, params: list,
                       data1: list, data2: list) -> list[Array]:
  """The kernels of a problem by a plan of `plan_structured`."""
  per_example = mode == structured.Mode.EXAMPLE
  # The two sides are independent computations, which XLA runs concurrently
  # (one pass over both sides' examples at once would serialize them).
  values = []
  for index, (side, data) in enumerate(zip(problem.sides, (data1, data2))):
    if index == 1 and problem.symmetric:
      values.append(values[0])
      continue
    row_ndims = [len(shape) for shape in side.out_shapes]
    if mode == structured.Mode.SEPARABLE:
      row_ndims = [ndim - 1 for ndim in row_ndims]
    fn = functools.partial(_side_values, plan, index, row_ndims)
    values.append(side.over_examples(fn, per_example,
                                     structured.value_axes(plan, index))(
                                         params, data))
  out_shapes = problem.sides[0].out_shapes
  layouts = problem.layouts
  if mode == structured.Mode.SEPARABLE:
    # Axis 0 (paired, first) is the batch axis: it becomes the example axes.
    out_shapes = [shape[1:] for shape in out_shapes]
    layouts = [layout_lib.KernelLayout(layout.kinds[1:], True)
               for layout in layouts]
  return structured.contract(plan, tuple(values), layouts, out_shapes,
                             problem.result_shapes)


def _side_values(plan: structured.Plan, side: int, row_ndims: list,
                 params: list, data: list) -> dict:
  return structured.side_values(plan, side, list(params) + list(data),
                                row_ndims)
