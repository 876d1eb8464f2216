"""STRUCTURED_DERIVATIVES as an implementation: plans the `structured`
engine for a `Problem`, runs it, and falls back to Jacobian contraction
(with a one-time warning saying why) where the engine cannot read `f`.

Three modes (`structured.Mode`): `EXAMPLE` (per-example programs, with
`vmap_axes`), `WHOLE` (the whole batch as one example) and `SEPARABLE` (the
whole-batch program, with per-example cotangents, once the jaxpr proves
that batch items do not interact; AUTO's candidate without `vmap_axes`).
"""
import functools
from typing import Any, Callable, Optional
import warnings

import jax
from jax import lax
from jax.extend import core as jex_core
import jax.numpy as jnp

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


# `_equal_blocks`: blocks of the larger side at most, and examples per block
# at most. Measured on `first_call.py`'s CNN (RESULTS.md, "One program for
# both sides"): in two blocks the structured NTK compiles up to 0.1 s faster
# (20 x 10 to 200 x 100 examples), in three or four no faster (each block is
# one more copy of the program, and all but the kernels' compilation grows
# with copies); blocks of 10-100 examples run as fast or up to 35% faster,
# blocks of 200 12-20% slower.
EQUAL_BLOCKS_MAX = 2
EQUAL_BLOCKS_MAX_EXAMPLES = 128


def planned_structured(plan: structured.Plan, mode: structured.Mode,
                       problem: problem_lib.Problem, params: list,
                       data1: list, data2: list) -> list[Array]:
  """The kernels of a problem by a plan of `plan_structured`.

  Where x1 and x2 trace to one per-example program (`_one_program`), both
  sides' values are one function, traced once. And where one side has a
  multiple of the other's examples (`_equal_blocks`), the larger side is
  computed in blocks of the smaller side's size, and the kernel in blocks
  of the pairs: every block is then the same program as the smaller side,
  at the same shapes, which XLA compiles once for all of them (it compiles
  the fused loops of two batch sizes apart). The structured NTK of
  `benchmarks/first_call.py`'s CNN, x1 of 20 examples and x2 of 10,
  compiled in 0.30-0.38 s, in blocks of 10 in 0.25-0.28 s, and runs as
  fast (RESULTS.md, "One program for both sides").
  """
  data = (data1, data2)
  # The two sides (and blocks) are independent computations, which XLA runs
  # concurrently (one pass over both sides' examples at once would serialize
  # them).
  side_fns = _values_fns(plan, mode, problem, params, data1)
  if not _equal_blocks(plan, mode, problem):
    values = [side_fns[0](params, data1)]
    values.append(values[0] if problem.symmetric else
                  side_fns[1](params, data2))
    return _contract(plan, mode, problem, values, problem.result_shapes)
  # `big` is the side in blocks, `small` the other.
  big, small = (0, 1) if problem.sides[0].n > problem.sides[1].n else (1, 0)
  small_values = side_fns[small](params, data[small])
  size = problem.sides[small].n
  axes = problem.sides[big].data_axes
  # Per example, each kernel's axes 0 and 1 are x1's and x2's examples.
  shapes = [shape[:big] + (size,) + shape[big + 1:]
            for shape in problem.result_shapes]
  blocks = []
  for start in range(0, problem.sides[big].n, size):
    block = [d if a is None else lax.slice_in_dim(d, start, start + size,
                                                   axis=a)
             for d, a in zip(data[big], axes)]
    values = [None, None]
    values[big], values[small] = side_fns[big](params, block), small_values
    blocks.append(values)
  # One trace of the contraction for every block.
  contract_block = _traced_once(
      lambda pair: _contract(plan, mode, problem, pair, shapes), blocks[0])
  kernel_blocks = [contract_block(pair) for pair in blocks]
  return [jnp.concatenate(kernels, axis=big)
          for kernels in zip(*kernel_blocks)]


def _one_program(plan: structured.Plan, mode: structured.Mode,
                 problem: problem_lib.Problem) -> bool:
  """Whether x1 and x2 (not the same) trace to one per-example program.

  One `SidePlan` for both sides (their programs are equal), with the same
  example axes: each side's values are then those of the same function,
  down to the cotangent tails (`_choose_tails` builds both sides' from the
  same program).
  """
  return (mode == structured.Mode.EXAMPLE and not problem.symmetric and
          plan.sides[0] is plan.sides[1] and
          problem.sides[0].data_axes == problem.sides[1].data_axes)


def _equal_blocks(plan: structured.Plan, mode: structured.Mode,
                  problem: problem_lib.Problem) -> bool:
  """Whether to compute the larger side in blocks of the smaller's size.

  Where both sides are one program (`_one_program`) and one side has 2 to
  `EQUAL_BLOCKS_MAX` times as many examples as the other, which has at most
  `EQUAL_BLOCKS_MAX_EXAMPLES`. (With sides of different sizes every kernel
  pairs their examples: `problem_lib.setup` refuses traced or diagonal
  batch axes there.)
  """
  n1, n2 = problem.sides[0].n, problem.sides[1].n
  blocks, rest = divmod(max(n1, n2), min(n1, n2))
  return (_one_program(plan, mode, problem) and rest == 0 and
          2 <= blocks <= EQUAL_BLOCKS_MAX and
          min(n1, n2) <= EQUAL_BLOCKS_MAX_EXAMPLES)


def _values_fns(plan: structured.Plan, mode: structured.Mode,
                problem: problem_lib.Problem, params: list,
                data: list) -> list[Callable]:
  """`fn(params, data)` of each side: its values, of all its examples.

  Of one program (`_one_program`), both sides are one function of one
  example, traced once to a jaxpr (at `data`'s example shapes) and
  evaluated for each side and block: JAX traces the engine once, and the
  program is the same as with the function itself (a `jax.jit` instead
  would leave reshapes across its boundary that AUTO's cost counts).
  """
  per_example = mode == structured.Mode.EXAMPLE
  one_program = _one_program(plan, mode, problem)
  fns = []
  for index, side in enumerate(problem.sides):
    if one_program and index == 1:
      fns.append(fns[0])
      continue
    row_ndims = [len(shape) for shape in side.out_shapes]
    if mode == structured.Mode.SEPARABLE:
      row_ndims = [ndim - 1 for ndim in row_ndims]
    fn = functools.partial(_side_values, plan, index, row_ndims)
    if one_program:
      fn = _traced_once(fn, params, problem_lib.example_avals(
          data, side.data_axes))
    fns.append(side.over_examples(fn, per_example,
                                  structured.value_axes(plan, index)))
  return fns


def _traced_once(fn: Callable, *args: Any) -> Callable:
  """`fn`, traced now at the shapes of `args` and evaluated from its jaxpr.

  Unlike a `jax.jit` of `fn`, each call is inlined in the caller's program.
  """
  closed, out = jax.make_jaxpr(fn, return_shape=True)(
      *jax.tree_util.tree_map(problem_lib.abstract, args))
  out_tree = jax.tree_util.tree_structure(out)
  evaluate = jex_core.jaxpr_as_fun(closed)

  def traced(*args: Any) -> Any:
    return jax.tree_util.tree_unflatten(
        out_tree, evaluate(*jax.tree_util.tree_leaves(args)))

  return traced


def _contract(plan: structured.Plan, mode: structured.Mode,
              problem: problem_lib.Problem, values: list,
              result_shapes: list) -> list[Array]:
  """The kernels, of `result_shapes`, of both sides' values."""
  out_shapes = problem.sides[0].out_shapes
  layouts = problem.layouts
  if mode == structured.Mode.SEPARABLE:
    # Axis 0 (paired, first) is the batch axis: it becomes the example axes.
    out_shapes = [shape[1:] for shape in out_shapes]
    layouts = [layout_lib.KernelLayout(layout.kinds[1:], True)
               for layout in layouts]
  return structured.contract(plan, tuple(values), layouts, out_shapes,
                             result_shapes)


def _side_values(plan: structured.Plan, side: int, row_ndims: list,
                 params: list, data: list) -> dict:
  return structured.side_values(plan, side, list(params) + list(data),
                                row_ndims)
