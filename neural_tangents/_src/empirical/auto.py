"""AUTO: the cost model that picks an implementation, and its constants.

Each candidate (Jacobian contraction, NTK-vector products, structured
derivatives in every mode that can be planned) is traced at the call's
shapes, and its FLOPs and bytes accessed are counted on the jaxpr as XLA's
cost analysis of its lowering would count them (`program_cost`: lowering
and analysing took most of the time of choosing; counting the jaxprs
instead cut AUTO's first call on the CNN of `benchmarks/first_call.py` by
0.07-0.1 s, RESULTS.md, First calls); the cost `FLOPs + FLOPS_PER_BYTE *
bytes`, divided by the measured speedup in each implementation's record
(`implementations.REGISTRY`), picks the winner, cached per shapes and
static keyword arguments.

Tracing a candidate costs a good part of compiling the winner, so AUTO
traces as few as it can without changing its choice (a branch and bound):
structured derivatives first (usually the cheapest), then a candidate only
if a lower bound on its cost, from shapes and the FLOPs of `f`'s products
with a parameter factor (`cost_lower_bound`, `parameter_product_flops`), is
below the best cost found. And where the per-example formulation's
structured derivatives can be planned, the whole-batch formulation's
candidates are not traced: each does the same or more work (see
`choose`). The winner is then called as it was traced for its cost, so the
call reuses that trace. Measured in one sitting (RESULTS.md, First calls):
on the README's FCN this cut AUTO's first call from 3.9x to 1.45x the
fastest single implementation's, and the bounds and the reused trace cut
the CNN's from 1.70 s to 1.45 s.

The formulation can switch too (`other_formulation`): with `vmap_axes=0`
the whole-batch formulation gives the same kernel, and without `vmap_axes`
the per-example one does once the jaxpr proves that examples do not
interact and `f` is the same program at every batch size
(`batch_size_independence`). Measured in `benchmarks/RESULTS.md`
("Formulation switching"): without it, AUTO with `vmap_axes=None` ran
25-66x slower on the stax networks of `benchmarks/empirical_ntk.py`.
"""
import math
from typing import Callable, Optional, Sequence

import jax
from jax import tree_util
from jax.extend import core as jex_core
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.empirical import batch_size_independence
from neural_tangents._src.empirical import implementations
from neural_tangents._src.empirical import layout as layout_lib
from neural_tangents._src.empirical import problem as problem_lib
from neural_tangents._src.empirical import program_cost
from neural_tangents._src.empirical import structured
from neural_tangents._src.empirical import structured_derivatives

# `program_cost` counts FLOPs and bytes accessed; a byte costs about as
# much time as this many FLOPs. The measured peaks bound it from above:
#   "peaks measured in the same process: 400.8 GFLOP/s float32 matmul, 6.9
#   GB/s copy bandwidth" (RESULTS.md, Roofline): 58 matmul FLOPs per byte;
# the non-matmul FLOPs that dominate the other candidates run several times
# below the matmul peak, hence the smaller weight. Not tuned by a benchmark
# of its own.
FLOPS_PER_BYTE = 8.

# The weights of the implementations (structured derivatives' measured
# speedups) are in their records, `implementations.REGISTRY`.

_STRUCTURED = implementations.implementation(
    implementations.NtkImplementation.STRUCTURED_DERIVATIVES)
SEPARABLE = _STRUCTURED.candidate_name(structured.Mode.SEPARABLE)
EXAMPLE = _STRUCTURED.candidate_name(structured.Mode.EXAMPLE)


def structured_modes(problem: problem_lib.Problem) -> list[structured.Mode]:
  """The modes of structured derivatives AUTO tries for `problem`."""
  if problem.per_example:
    return [structured.Mode.EXAMPLE]
  if any(layout.kinds[0] != layout_lib.PAIR for layout in problem.layouts):
    # SEPARABLE makes axis 0, the batch axis, the (paired) example axes.
    return [structured.Mode.WHOLE]
  return [structured.Mode.WHOLE, structured.Mode.SEPARABLE]


def candidates(problem: problem_lib.Problem, params: list, data1: list,
               data2: list) -> dict[str, Callable]:
  """The implementations AUTO compares, for this problem, by name.

  One candidate per record of `implementations.REGISTRY`, or, for a record
  with modes, one per mode of `structured_modes(problem)` it can be planned
  in.
  """
  found = {}
  for record in implementations.REGISTRY:
    if record.planned is None:
      found[record.candidate_name()] = record.kernel_fn
      continue
    for mode in structured_modes(problem):
      if mode not in record.modes:
        continue
      try:
        found[record.candidate_name(mode)] = record.planned(
            problem, params, data1, data2, mode)
      except structured.Unsupported:
        continue
  return found


def estimated_cost(fn: Callable, problem: problem_lib.Problem, params: list,
                   data1: list, data2: list) -> float:
  """FLOPs (plus bytes, weighted) of `fn` at these shapes, as XLA's cost
  analysis of its lowering counts them (`program_cost`)."""
  return _traced_cost(_jitted(fn, problem), params, data1, data2)


def _jitted(fn: Callable, problem: problem_lib.Problem) -> Callable:
  """`fn` at `problem`, jitted: a function of `(params, data1, data2)`."""
  return jax.jit(lambda p, d1, d2: fn(problem, p, d1, d2))


def _traced_cost(jitted: Callable, params: list, data1: list,
                 data2: list) -> float:
  """`estimated_cost` of a `_jitted` candidate.

  Traced at the arguments themselves (tracers, inside `ntk_fn`'s program),
  so that calling `jitted` with them again reuses this trace.
  """
  flops, nbytes = program_cost.program_cost(
      jitted.trace(params, data1, data2).jaxpr.jaxpr)
  return flops + FLOPS_PER_BYTE * nbytes


def _weighted_cost(name: str, cost: float) -> float:
  """The cost divided by the candidate's speedup (its record's weight)."""
  return cost / implementations.CANDIDATE_SPEEDUPS[name]


JACOBIAN = implementations.implementation(
    implementations.NtkImplementation.JACOBIAN_CONTRACTION).candidate_name()
VECTOR_PRODUCTS = implementations.implementation(
    implementations.NtkImplementation.NTK_VECTOR_PRODUCTS).candidate_name()


def _batch_paired(problem: problem_lib.Problem) -> bool:
  """Whether every kernel pairs each x1 example with each x2 example."""
  if problem.per_example:
    return all(kinds[axis] == layout_lib.PAIR
               for kinds, axis in problem.placements)
  return all(layout.kinds[0] == layout_lib.PAIR for layout in problem.layouts)


# Products whose FLOPs `parameter_product_flops` counts.
_PRODUCTS = ('dot_general', 'conv_general_dilated')
# Outputs taken as independent of the parameters: their derivatives are
# zero, or given by loops that this count does not look into (as calls with
# their own derivative rules, `custom_jvp_call` and the like, are not).
# Taking a dependent value as independent only lowers the count, so that it
# stays a lower bound.
_NOT_FOLLOWED = frozenset({
    'stop_gradient', 'floor', 'ceil', 'round', 'sign', 'is_finite', 'while',
    'cond'})


def _product_flops(eqn) -> float:
  """FLOPs (2 per multiply-add) of a `dot_general` or a convolution."""
  out = math.prod(eqn.outvars[0].aval.shape)
  if eqn.primitive.name == 'dot_general':
    (contracting, _), _ = eqn.params['dimension_numbers']
    lhs = eqn.invars[0].aval.shape
    return 2. * out * math.prod(lhs[d] for d in contracting)
  rhs = eqn.invars[1].aval.shape  # Each output sums over rhs / out features.
  out_features = rhs[eqn.params['dimension_numbers'].rhs_spec[0]]
  return 2. * out * math.prod(rhs) / out_features


def _dependent_flops(jaxpr, dependent: Sequence[bool]
                     ) -> tuple[float, list[bool]]:
  """FLOPs of the products with a factor that depends on the inputs marked
  `dependent`, and which outputs depend on them."""
  found = {v for v, d in zip(jaxpr.invars, dependent) if d}
  is_found = lambda v: not isinstance(v, jex_core.Literal) and v in found
  flops = 0.
  for eqn in jaxpr.eqns:
    inputs = [is_found(v) for v in eqn.invars]
    name = eqn.primitive.name
    if not any(inputs) or name in _NOT_FOLLOWED:
      continue
    outputs = [True] * len(eqn.outvars)
    body = structured.call_body(eqn.params)
    if name in _PRODUCTS:
      flops += _product_flops(eqn)
    elif body is not None:
      # A call that only groups equations (`jit`, `checkpoint`; the table of
      # structured derivatives knows them by every supported JAX's names) is
      # followed into; others (custom derivative rules, `scan`) are not.
      if not (structured.is_call(name, structured.INLINED) and
              len(body[0].invars) == len(inputs)):
        continue
      called_flops, outputs = _dependent_flops(body[0], inputs)
      flops += called_flops
    for v, d in zip(eqn.outvars, outputs):
      if d and jnp.issubdtype(v.aval.dtype, jnp.inexact):
        found.add(v)
  return flops, [is_found(v) for v in jaxpr.outvars]


def parameter_product_flops(problem: problem_lib.Problem, side: int,
                            params: list, data: list) -> float:
  """FLOPs of the products in one call of `f` on side `side`'s examples
  (all of them) that have a factor depending on the parameters.

  Each JVP and each VJP of `f` in the parameters does at least as many:
  the derivative of `z = x W` is `dx W + x dW`, and its transpose gives
  `dW = x^T dz` or `dx = dz W^T`, each with the FLOPs of `x W`. Dependence
  is followed through every primitive except those in `_NOT_FOLLOWED`, and
  into calls that only group equations (`jit`, `checkpoint`); a product
  inside a custom derivative rule, a loop or a conditional is not counted,
  and their outputs are taken as independent.
  """
  s = problem.sides[side]
  fn = s.call(problem.per_example)
  args = (params, problem_lib.example_avals(data, s.data_axes)
          if problem.per_example else data)
  closed = jax.make_jaxpr(fn)(*tree_util.tree_map(problem_lib.abstract, args))
  flops, _ = _dependent_flops(
      closed.jaxpr, [i < len(params) for i in range(len(closed.jaxpr.invars))])
  return flops * (s.n if problem.per_example else 1)


def cost_lower_bound(name: str, problem: problem_lib.Problem, params: list,
                     data1: list, data2: list,
                     flops: Optional[dict] = None) -> float:
  """A lower bound on candidate `name`'s weighted cost, without tracing it.

  With `P` parameters, `R` kernel entries, `N1 x N2` example pairs, `O1` and
  `O2` the output entries of one call of `f` on x1 or x2 (of one example
  under `vmap_axes`), and `F1`, `F2` the `parameter_product_flops` of `f` on
  all of x1 or x2:

  * Jacobian contraction sums, for each kernel entry, products over every
    parameter (and over traced axes): at least `2 P R` FLOPs. And it takes
    `min(O, P)` reverse (or forward) passes per call of `f` on each side
    (once if x2 is x1): at least `min(O1, P) F1 + min(O2, P) F2` more.
  * NTK-vector products take a JVP over all of x1 for each output entry of
    x2: at least `O2 N2 F1` FLOPs per example (`O2 F1` without
    `vmap_axes`). Where examples are paired, also at least `P N1 N2`: a
    JVP multiplies each parameter's tangent into the activations of each
    x1 example at least once (`x dW` in a dense or convolutional layer
    costs 2 FLOPs per weight, a bias's add 1; a parameter that `f` never
    uses breaks this bound, and AUTO would then merely skip tracing a
    candidate that might have been cheaper).

  Other candidates get 0 (no bound: always traced). The estimate counts
  the body of a loop once (a `lax.map` over 10 or 100 items: the same
  FLOPs), so where NTK-vector products map x2's examples in chunks (above
  `vector_products.VECTOR_PRODUCTS_MAX_BYTES` of VJPs) the bound can exceed
  that estimate, which undercounts the candidate; skipping it there is the
  better choice.

  Args:
    name: the candidate's name.
    problem: its problem.
    params: the differentiable parameter leaves.
    data1: x1's data leaves.
    data2: x2's data leaves.
    flops: a cache of `parameter_product_flops` per side, for this
      problem and these arguments.

  Returns:
    The bound, weighted like `_weighted_cost`.
  """
  if name not in (JACOBIAN, VECTOR_PRODUCTS):
    return 0.
  flops = {} if flops is None else flops

  def side_flops(side: int) -> float:
    if side not in flops:
      try:
        flops[side] = parameter_product_flops(problem, side, params,
                                              (data1, data2)[side])
      except Exception:  # pylint: disable=broad-except
        flops[side] = 0.  # e.g. `f` closes over tracers: no bound from it.
    return flops[side]

  n_params = float(sum(np.size(p) for p in params))
  outputs = [float(sum(math.prod(shape) for shape in side.out_shapes))
             for side in problem.sides]
  if name == JACOBIAN:
    entries = float(sum(math.prod(shape) for shape in problem.result_shapes))
    bound = 2. * n_params * entries + min(outputs[0], n_params) * side_flops(0)
    if not problem.symmetric:
      bound += min(outputs[1], n_params) * side_flops(1)
  else:
    x2_outputs = outputs[1] * (problem.sides[1].n if problem.per_example
                               else 1)
    bound = x2_outputs * side_flops(0)
    if _batch_paired(problem):
      bound = max(bound, n_params * problem.sides[0].n * problem.sides[1].n)
  return _weighted_cost(name, bound)


def _structured_first(found: dict[str, Callable]) -> list[tuple[str, Callable]]:
  """The candidates, structured derivatives (no lower bound) first."""
  return sorted(found.items(),
                key=lambda item: item[0] in (JACOBIAN, VECTOR_PRODUCTS))


def _fallback(problem: problem_lib.Problem, params: list, data1: list,
              data2: list) -> list:
  # AUTO only considered structured derivatives: no fallback warning.
  return structured_derivatives.structured_derivatives(
      problem, params, data1, data2, warn_on_fallback=False)


def choose(problem: problem_lib.Problem,
           other: Callable[..., Optional[problem_lib.Problem]], params: list,
           data1: list, data2: list, static_key: tuple, choices: dict,
           exhaustive: bool = False
           ) -> tuple[problem_lib.Problem, Callable]:
  """The cheapest implementation at these shapes (cached per shapes).

  If no candidate can be traced (e.g. `f` closes over traced values),
  structured derivatives are used. The candidates of
  `other(verify=True, separable=...)`, an equivalent formulation of the same
  kernel (see `other_formulation`), compete too, so that `vmap_axes=0` and
  `vmap_axes=None` choose among the same implementations whenever they are
  known to agree.

  Candidates whose `cost_lower_bound` is no lower than the best cost found
  are not traced. Once the per-example formulation's structured
  derivatives (`EXAMPLE`) are costed, the whole-batch formulation is
  skipped: its Jacobians and vector products are those of the whole batch
  (every per-example one and more: measured 1.2-7x the FLOPs on the FCN and
  CNN of `benchmarks/first_call.py`), its `WHOLE` structured derivatives
  take a reverse pass per output of the batch instead of per example's, and
  its `SEPARABLE` ones do `EXAMPLE`'s contractions (estimates within 1%
  there), whose near-ties go to `EXAMPLE` anyway
  (`implementations.EXAMPLE_SPEEDUP`).

  Args:
    problem: the problem as the user posed it.
    other: `other_formulation` of this call, partially applied.
    params: the differentiable parameter leaves.
    data1: x1's data leaves.
    data2: x2's data leaves.
    static_key: `problem_lib.static_kwargs_key` of the keyword arguments.
    choices: the cache, one per kernel function.
    exhaustive: trace every candidate (for tests: the choice must not
      change).

  Returns:
    `(problem, fn)`: the formulation and implementation to use. On the
    call that chose, `fn` calls the winner as it was jitted and traced for
    its cost (at the call's own arguments, inside `ntk_fn`'s program), so
    that JAX reuses that trace instead of tracing the winner again.
  """
  key = (tree_util.tree_structure((params, data1, data2)),
         tuple((np.shape(x), str(jnp.result_type(x)))
               for x in tree_util.tree_leaves((params, data1, data2))),
         problem.symmetric, problem.layouts, problem.per_example, static_key,
         exhaustive)
  if key in choices:
    index, _, fn = choices[key]
    # Whether the other formulation agrees was verified for these shapes.
    return (problem if index == 0 else other(verify=False)), fn
  own = candidates(problem, params, data1, data2)
  options = [(0, problem, own)]
  if exhaustive or not (problem.per_example and EXAMPLE in own):
    alternative = other(verify=True, separable=SEPARABLE in own)
    if alternative is not None:
      options.append((1, alternative, None))  # Planned when reached.
  # The per-example formulation first: it makes the other one redundant.
  options.sort(key=lambda option: not option[1].per_example)
  best, best_cost = (0, 'fallback', _fallback), math.inf
  best_problem, best_jitted = problem, None
  for index, option_problem, option_candidates in options:
    if option_candidates is None:
      option_candidates = candidates(option_problem, params, data1, data2)
    flops = {}  # `parameter_product_flops` of this formulation.
    for name, fn in _structured_first(option_candidates):
      if not exhaustive and cost_lower_bound(
          name, option_problem, params, data1, data2, flops) >= best_cost:
        continue
      jitted = _jitted(fn, option_problem)
      try:
        cost = _traced_cost(jitted, params, data1, data2)
      except Exception:  # pylint: disable=broad-except
        continue  # e.g. f closes over tracers; such a candidate is skipped.
      cost = _weighted_cost(name, cost)
      if cost < best_cost:
        best, best_cost = (index, name, fn), cost
        best_problem, best_jitted = option_problem, jitted
    if (not exhaustive and option_problem.per_example and
        EXAMPLE in option_candidates and best_cost < math.inf):
      break
  choices[key] = best
  if best_jitted is None:
    return best_problem, best[2]
  # This call runs the winner as costed: its trace is reused.
  return best_problem, lambda _, p, d1, d2: best_jitted(p, d1, d2)


def other_formulation(setup: Callable[[problem_lib.VMapAxes], tuple],
                      vmap_axes: problem_lib.VMapAxes, params: list,
                      data1: list, data2: list, verify: bool = True,
                      separable: bool = False
                      ) -> Optional[problem_lib.Problem]:
  """The same kernel with `vmap_axes` 0 <-> None, where both provably agree.

  With `vmap_axes=0` the user promises that examples do not interact, and
  then the whole-batch formulation (`vmap_axes=None`) gives the same kernel.
  Without `vmap_axes`, the per-example formulation (`vmap_axes=0`) is used
  only if (a) the jaxpr proves that examples do not interact (`separable`:
  structured derivatives could be planned in `SEPARABLE` mode without
  `vmap_axes`), and (b) `f` on a batch of one is the same program as on the
  whole batch up to the batch size (`batch_size_independence`).
  `verify=False` skips (a) and (b), for shapes at which they were already
  verified.

  Args:
    setup: `setup(vmap_axes)` is `problem_lib.setup` of this call with
      those axes.
    vmap_axes: the user's `vmap_axes`.
    params: the differentiable parameter leaves of `setup(vmap_axes)`.
    data1: x1's data leaves of `setup(vmap_axes)`.
    data2: x2's data leaves of `setup(vmap_axes)`.
    verify: whether to check (a) and (b).
    separable: (a), when `vmap_axes` is None.

  Returns:
    The other formulation's problem, or None.
  """
  if problem_lib.is_int(vmap_axes) and vmap_axes == 0:
    return setup(None)[0]
  if vmap_axes is not None or (verify and not separable):
    return None
  try:
    per_example = setup(0)[0]
  except ValueError:
    return None
  if verify and not all(
      batch_size_independence.batch_of_one_agrees(side, params, data)
      for side, data in zip(per_example.sides, (data1, data2))):
    return None
  return per_example
