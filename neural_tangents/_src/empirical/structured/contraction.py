"""Contraction: the NTK of a planned network from each side's values.

`side_values` runs one side's program (`x1` or `x2`) and returns what the
plan needs of it: the cotangents `G` of site outputs (one reverse pass per
output entry), the factors `X` of lazy sites' forms, the factors of
cotangent tails, and the materialized Jacobians `J` of the other leaves.
`contract` pairs both sides into each output's kernel, one einsum per term:

    Theta = sum_groups (G1 G2^T) * sum_sites (X1 X2^T)
          + sum_lazy sites einsum(G1, X1, G2, X2)
          + sum_materialized leaves J1 J2^T,

with a cotangent written as its tail's factors where that is cheaper.
"""
import dataclasses
import math
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.empirical import layout as layout_lib
from neural_tangents._src.empirical.einsum import einsum
from neural_tangents._src.empirical.einsum import einsum_cost
from neural_tangents._src.empirical.einsum import einsum_into
from neural_tangents._src.empirical.einsum import Letter
from neural_tangents._src.empirical.einsum import Letters
from neural_tangents._src.empirical.einsum import squeeze_units
from neural_tangents._src.empirical.structured import ir
from neural_tangents._src.empirical.structured import program as prog
from neural_tangents._src.empirical.structured import rules
from neural_tangents._src.empirical.structured import tails as tails_lib
from neural_tangents._src.empirical.structured.plan import Chain
from neural_tangents._src.empirical.structured.plan import Form
from neural_tangents._src.empirical.structured.plan import Group
from neural_tangents._src.empirical.structured.plan import LazySite
from neural_tangents._src.empirical.structured.plan import Mode
from neural_tangents._src.empirical.structured.plan import Plan
from neural_tangents._src.empirical.structured.plan import SidePlan
from neural_tangents._src.empirical.structured.plan import Site
from neural_tangents._src.empirical.structured.plan import Target
from neural_tangents._src.utils.typing import Array

# ---------------------------------------------------------------------------
# One side's values: cotangents, factors, and materialized Jacobians.
# ---------------------------------------------------------------------------


def _lazy_sites(plan: Plan) -> list[int]:
  """The sites contracted lazily, in groups or alone."""
  return [m.site for g in plan.groups for m in g.members] + [
      s.site for s in plan.lazy]


def _needed(plan: Plan, side: int):
  """Targets and recorded atoms a side needs, in a fixed order."""
  side_plan = plan.sides[side]
  targets: list[Target] = []
  lazy_sites = _lazy_sites(plan)
  mat_sites = [i for _, ids in plan.materialized for i in ids]

  def add(t: Target):
    if not any(t is u for u in targets):
      targets.append(t)

  for i in lazy_sites + mat_sites:
    form = side_plan.forms[i]
    if form is not None:
      add(form.target)
    else:
      for v in side_plan.sites[i].eqn.outputs:
        if rules.inexact(v):
          add(v)
  return targets, lazy_sites, mat_sites


def side_values(plan: Plan, side: int, inputs: Sequence[Array],
                out_row_ndims: Sequence[int]) -> dict[str, Any]:
  """Computes one side's cotangents, factors and materialized Jacobians.

  Args:
    plan: the plan.
    side: 0 for x1, 1 for x2.
    inputs: values of the program's inputs (params first).
    out_row_ndims: for each program output, the number of leading axes
      that index output entries in the Jacobians (its ndim, or in SEPARABLE
      mode its ndim - 1 since the batch axis is shared with the values).

  Returns:
    A pytree: `'G'` cotangents (per target, per output), `'X'` factors (per
    lazy site), `'J'` materialized Jacobians (per leaf, per output).
  """
  side_plan = plan.sides[side]
  program = side_plan.program
  targets, lazy_sites, _ = _needed(plan, side)
  var_targets = [t for t in targets if not isinstance(t, int)]
  out_targets = [t for t in targets if isinstance(t, int)]
  factor_atoms = [f.atom for i in lazy_sites
                  for f in side_plan.forms[i].factors]
  factor_atoms += [f.atom for tails in plan.tails.values()
                   for f in tails[side].factors]
  mat_atoms = _materialization_atoms(plan, side)

  def run(eps):
    eps_vars, eps_outs = eps
    outs, read = prog.evaluate(program, inputs,
                               dict(zip(var_targets, eps_vars)),
                               dict(zip(out_targets, eps_outs)))
    return outs, ([read(a) for a in factor_atoms],
                  [read(a) for a in mat_atoms])

  eps = ([jnp.zeros(t.shape, t.dtype) for t in var_targets],
         [jnp.zeros(program.outputs[i].shape, program.outputs[i].dtype)
          for i in out_targets])
  g_vars, g_outs, (factor_values, mat_values) = _cotangents(
      run, eps, out_row_ndims, plan.mode == Mode.SEPARABLE)

  def g_of(t: Target) -> list[Array]:
    if isinstance(t, int):
      return g_outs[out_targets.index(t)]
    return g_vars[next(i for i, u in enumerate(var_targets) if u is t)]

  values: dict[str, Any] = {'G': {}, 'X': {}, 'J': {}, 'T': {}}
  it = iter(factor_values)
  for i in lazy_sites:
    form = side_plan.forms[i]
    values['X'][i] = [f.value(next(it)) for f in form.factors]
    # Both the cotangents and (below) their tail factors: the contraction
    # uses the cheaper, and XLA drops the computation of the other.
    values['G'][side_plan.key(form.target)] = g_of(form.target)
  for key, tails in plan.tails.items():
    values['T'][key] = [f.value(next(it)) for f in tails[side].factors]
  mat_env = dict(zip([id(a) for a in mat_atoms], mat_values))
  for leaf, ids in plan.materialized:
    values['J'][leaf] = _materialize(plan, side, leaf, ids, g_of, mat_env,
                                     inputs[leaf], out_row_ndims)
  return values


def value_axes(plan: Plan, side: int) -> dict[str, Any]:
  """`vmap` out_axes of `side_values`: None for values shared by examples.

  A factor computed from parameters or constants alone (a weight in a
  cotangent tail, an identity) is the same for every example; keeping it
  unbatched lets the einsum contract it once rather than per example.
  """
  side_plan = plan.sides[side]
  lazy_sites = _lazy_sites(plan)
  axis = lambda f: None if side_plan.shared(f.atom) else 0
  return {'G': 0, 'J': 0,
          'X': {i: [axis(f) for f in side_plan.forms[i].factors]
                for i in lazy_sites},
          'T': {key: [axis(f) for f in tails[side].factors]
                for key, tails in plan.tails.items()}}


def _materialization_atoms(plan: Plan, side: int) -> list[ir.Atom]:
  side_plan = plan.sides[side]
  atoms = []
  for _, ids in plan.materialized:
    for i in ids:
      if side_plan.forms[i] is not None:
        atoms += [f.atom for f in side_plan.forms[i].factors]
      else:
        atoms += list(side_plan.sites[i].eqn.inputs)
  return atoms


def _cotangents(run, eps, out_row_ndims: Sequence[int], broadcast: bool):
  """`G[t][o]`: cotangent of each target for each output entry `o`.

  One reverse pass per output entry (vmapped). With `broadcast`, the
  cotangent of output entry `o` is set for every example at once; for a
  batch-separable program this gives each example's own cotangents.
  """
  if not eps[0] and not eps[1]:
    return [], [], run(eps)[1]
  outs, vjp_fn, aux = jax.vjp(run, eps, has_aux=True)
  row_shapes = [o.shape[o.ndim - n:] for o, n in zip(outs, out_row_ndims)]
  sizes = [math.prod(s) for s in row_shapes]
  total = sum(sizes)
  rows, start = [], 0
  for o, shape, size in zip(outs, row_shapes, sizes):
    basis = jnp.eye(total, size, -start, dtype=o.dtype).reshape(
        (total,) + shape)
    if broadcast:
      basis = jnp.broadcast_to(basis[:, None], (total,) + o.shape)
    rows.append(basis)
    start += size
  (g_vars, g_outs), = jax.vmap(vjp_fn)(rows)

  def split(g: Array) -> list[Array]:
    parts, start = [], 0
    for shape, size in zip(row_shapes, sizes):
      parts.append(g[start:start + size].reshape(shape + g.shape[1:]))
      start += size
    return parts

  return [split(g) for g in g_vars], [split(g) for g in g_outs], aux


def _materialize(plan: Plan, side: int, leaf: int, site_ids: Sequence[int],
                 g_of, env: dict[int, Array], leaf_value: Array,
                 out_row_ndims: Sequence[int]) -> list[Array]:
  """`J_leaf[o, leaf]` for each output: the sum over the leaf's sites."""
  side_plan = plan.sides[side]
  total = None
  for i in site_ids:
    site, form = side_plan.sites[i], side_plan.forms[i]
    if form is not None:
      j_v = _form_jacobian(form, g_of(form.target),
                           [env[id(f.atom)] for f in form.factors],
                           side_plan.example_letters[i], out_row_ndims)
    else:
      j_v = _generic_jacobian(
          site,
          [g_of(v) if rules.inexact(v) else None for v in site.eqn.outputs],
          [env[id(a)] for a in site.eqn.inputs], out_row_ndims)
    j_leaf = [_pull_back(site.chain, leaf_value, j) for j in j_v]
    total = j_leaf if total is None else [a + b for a, b in zip(total, j_leaf)]
  return total


def _form_jacobian(form: Form, g: list[Array], atom_values: list[Array],
                   example_letter: Letter,
                   out_row_ndims: Sequence[int]) -> list[Array]:
  """`J_v[e?, o, v]` from the form, for each output (e: example axis)."""
  results = []
  for g_output, n in zip(g, out_row_ndims):
    letters = Letters()
    o = letters.many(n)
    to_local = _SideLetterMap({}, None, None, letters)
    operands = [(squeeze_units(g_output, form.y, n), o + to_local(form.y))]
    for f, value in zip(form.factors, atom_values):
      operands.append((squeeze_units(f.value(value), f.letters, 0),
                       to_local(f.letters)))
    e = [] if example_letter is None else to_local([example_letter])
    v_letters = to_local(form.v)
    j = einsum(*operands, result=e + o + v_letters)
    results.append(form.coefficient *
                   j.reshape(j.shape[:len(e) + n] + form.v_shape))
  return results


def _generic_jacobian(site: Site, g: list[Optional[list[Array]]],
                      in_values: list[Array],
                      out_row_ndims: Sequence[int]) -> list[Array]:
  """`J_v[o, v]` by the primitive's own VJP: correct for any primitive."""
  eqn, k = site.eqn, site.position

  def apply(a):
    ins = list(in_values)
    ins[k] = a
    return ir.bind(eqn, ins)

  _, pull = jax.vjp(apply, in_values[k])
  results = []
  for output, n in enumerate(out_row_ndims):
    lead = next(g_out[output].shape[:n] for g_out in g if g_out is not None)
    rows = math.prod(lead)
    cts = [np.zeros((rows,) + out.shape, jax.dtypes.float0) if g_out is None
           else g_out[output].reshape((rows,) + out.shape)
           for out, g_out in zip(eqn.outputs, g)]
    j, = jax.vmap(pull)(cts)
    results.append(j.reshape(lead + j.shape[1:]))
  return results


def _pull_back(chain: Chain, leaf_value: Array, j_v: Array) -> Array:
  """`J_leaf = J_v L` for the chain's linear map `L`, row by row."""
  if not chain.eqns:
    return j_v
  v_ndim = len(chain.eqns[-1].outputs[0].shape)
  lead = j_v.shape[:j_v.ndim - v_ndim]
  _, pull = jax.vjp(chain.apply, leaf_value)
  rows = j_v.reshape((-1,) + j_v.shape[len(lead):])
  j, = jax.vmap(pull)(rows)
  return j.reshape(lead + j.shape[1:])


# ---------------------------------------------------------------------------
# Contraction of two sides into kernels.
# ---------------------------------------------------------------------------


def contract(plan: Plan, values: tuple[dict, dict],
             layouts: Sequence['layout_lib.KernelLayout'],
             out_shapes: Sequence[tuple[int, ...]],
             result_shapes: Sequence[tuple[int, ...]]) -> list[Array]:
  """The NTK of each output from both sides' values.

  Args:
    plan: the plan.
    values: `side_values` of x1 and x2 (with a leading example axis in
      EXAMPLE mode, except for shared values).
    layouts: the kernel layout of each output.
    out_shapes: the shape of one call's output (one example's, except in
      WHOLE mode), for the normalization of traced axes.
    result_shapes: the shape of each kernel.

  Returns:
    The kernel of each output.
  """
  kernels = []
  for output, (layout, out_shape, shape) in enumerate(
      zip(layouts, out_shapes, result_shapes)):
    letters = Letters()
    context = _KernelContext(plan, values, output,
                             layout_lib.kernel_letters(layout, letters),
                             letters, tuple(shape), _dtype(values))
    terms = [_group_kernel(context, group) for group in plan.groups]
    terms += [_lazy_kernel(context, lazy) for lazy in plan.lazy]
    for leaf, _ in plan.materialized:
      terms.append(_jacobian_kernel(context, values[0]['J'][leaf][output],
                                    values[1]['J'][leaf][output]))
    terms = [t for t in terms if t is not None]
    kernel = sum(terms) if terms else jnp.zeros(shape, context.dtype)
    kernels.append(kernel / layout_lib.trace_size(layout, out_shape))
  return kernels


@dataclasses.dataclass(frozen=True)
class _KernelContext:
  """What every term of one output's kernel is contracted with.

  Attributes:
    plan: the plan.
    values: `side_values` of x1 and x2.
    output: the index of the program output whose kernel this is.
    kernel_letters: the letters of the kernel's two sides and result.
    letters: the allocator of all other letters of its einsums.
    shape: the kernel's shape.
    dtype: the kernel's dtype.
  """
  plan: Plan
  values: tuple[dict, dict]
  output: int
  kernel_letters: 'layout_lib.KernelLetters'
  letters: Letters
  shape: tuple[int, ...]
  dtype: Any


class _SideLetterMap:
  """Maps one side's form (and tail) letters to an einsum's letters.

  Letters of the leaf (`shared`) are common to both sides; the example
  letter becomes the side's example letter; other letters are the side's
  own (fresh ones from `letters`).
  """

  def __init__(self, shared: dict[int, int], example: Letter,
               example_global: Any, letters: Letters):
    self.shared, self.example = shared, example
    self.example_global, self.letters = example_global, letters
    self.local: dict[int, int] = {}

  def __call__(self, side_letters: Sequence[Letter]) -> list[int]:
    out = []
    for letter in side_letters:
      if letter is None:
        continue
      if self.example is not None and letter == self.example:
        out.append(self.example_global)
      elif letter in self.shared:
        out.append(self.shared[letter])
      else:
        out.append(self.local.setdefault(letter, self.letters.new()))
    return out


def _form_operands(context: _KernelContext, side: int, site: int,
                   shared: dict[int, int], cotangent: bool = True,
                   inputs: bool = True,
                   tail: bool = False) -> Optional[tuple[list, float]]:
  """Einsum operands of one side of a site's form, and their scaling.

  Args:
    context: the kernel being contracted.
    side: 0 for x1, 1 for x2.
    site: the site's index.
    shared: global letters of the form's letters common to both sides.
    cotangent: whether to include the cotangent's operands.
    inputs: whether to include the site's other inputs (its factors).
    tail: whether the cotangent is written as its tail's factors.

  Returns:
    `(operands, scale)`, or None if the site's cotangent is zero for the
    context's output.
  """
  plan, values = context.plan, context.values[side]
  side_plan = plan.sides[side]
  form = side_plan.forms[site]
  example_global, out = context.kernel_letters.side(side + 1)
  per_example = plan.mode == Mode.EXAMPLE
  to_global = _SideLetterMap(shared, side_plan.example_letters[site],
                             example_global, context.letters)
  operands, scale = [], 1.
  if cotangent:
    key = side_plan.key(form.target)
    if tail:
      factors = plan.tails[key][side]
      if factors.output != context.output:
        return None
      operands += _tail_operands(plan, side_plan, factors, form,
                                 values['T'][key], to_global, list(out),
                                 example_global)
      scale = factors.coefficient
    else:
      lead = ([example_global] if per_example else []) + list(out)
      g = values['G'][key][context.output]
      operands.append((squeeze_units(g, form.y, len(lead)),
                       lead + to_global(form.y)))
  if inputs:
    for f, value in zip(form.factors, values['X'][site]):
      ex = ([example_global] if per_example and not side_plan.shared(f.atom)
            else [])
      operands.append((squeeze_units(value, f.letters, len(ex)),
                       ex + to_global(f.letters)))
  return operands, scale


# A cotangent tail is used when its contraction costs less than this
# fraction of the one with the materialized cotangent: at equal FLOPs the
# latter wins, its factors being formed by fewer elementwise operations.
_TAIL_ADVANTAGE = 0.8


def _cheapest_operands(context: _KernelContext, site: int,
                       shared: tuple[dict, dict], inputs: bool,
                       result: Sequence[int]) -> Optional[tuple[list, float]]:
  """Both sides' operands, with the cotangent materialized or as factors."""
  plan = context.plan
  key = plan.sides[0].key(plan.sides[0].forms[site].target)
  options = [False] + ([True] if key in plan.tails else [])
  best, best_cost = None, None
  for tail in options:
    sides = [_form_operands(context, s, site, shared[s], inputs=inputs,
                            tail=tail) for s in (0, 1)]
    if sides[0] is None or sides[1] is None:
      if tail:
        return None  # The tail proves the cotangent is zero here.
      continue
    operands = sides[0][0] + sides[1][0]
    scale = sides[0][1] * sides[1][1]
    present = set(letter for _, letters in operands for letter in letters)
    cost = einsum_cost(*operands, result=[
        r for r in result if r in present]) if operands else 0.
    if tail:
      cost /= _TAIL_ADVANTAGE
    if best is None or cost < best_cost:
      best, best_cost = (operands, scale), cost
  return best


def _tail_operands(plan: Plan, side_plan: SidePlan, tail: tails_lib.Tail,
                   form: Form, tail_values: list, to_global: _SideLetterMap,
                   out: list, example_global: Any) -> list:
  """Operands of a cotangent tail.

  Its letters for the target's dimensions are the form's, those for the
  output's are the kernel's, and the others its own.
  """
  to_form = {t: f for t, f in zip(tail.y, form.y) if t is not None}
  out_dims = list(tail.out)
  if plan.mode == Mode.SEPARABLE:
    out_dims = out_dims[1:]  # Dimension 0 is the batch: the example letter.
  to_kernel = {t: o for t, o in zip(out_dims, out) if t is not None}
  private = _SideLetterMap({}, None, None, to_global.letters)
  operands = []
  for f, value in zip(tail.factors, tail_values):
    letters = []
    for t in f.letters:
      if t is None:
        continue
      if t in to_form:
        letters += to_global([to_form[t]])
      elif t in to_kernel:
        letters.append(to_kernel[t])
      else:
        letters += private([t])
    ex = [example_global] if plan.mode == Mode.EXAMPLE and not side_plan.shared(
        f.atom) else []
    operands.append((squeeze_units(value, f.letters, len(ex)), ex + letters))
  return operands


def _dtype(values: tuple[dict, dict]) -> Any:
  """The floating dtype of the values (that of the network)."""
  leaves = [x for x in jax.tree_util.tree_leaves(values)
            if jnp.issubdtype(x.dtype, jnp.inexact)]
  return jnp.result_type(*leaves) if leaves else jnp.float32


def _pair_letters(side_letters: tuple[Sequence[Letter], Sequence[Letter]],
                  letters: Letters,
                  skip: tuple[Letter, Letter] = (None, None)
                  ) -> tuple[dict, dict]:
  """One global letter per dimension of both sides (by position).

  Dimensions of size 1 on either side, and those with a `skip` letter (the
  example letters), get none.
  """
  s1, s2 = {}, {}
  for a, b in zip(*side_letters):
    if a is None or b is None or a == skip[0] or b == skip[1]:
      continue
    g = letters.new()
    s1[a], s2[b] = g, g
  return s1, s2


def _leaf_pair_letters(plan: Plan, site: int,
                       letters: Letters) -> tuple[dict, dict]:
  """Global letters for the leaf's letters, per side (by leaf dimension)."""
  return _pair_letters(tuple(p.leaf_letters[site].letters
                             for p in plan.sides), letters)


def _target_pair_letters(plan: Plan, site: int,
                         letters: Letters) -> tuple[dict, dict]:
  """Shared letters for the target's (non-example) dimensions."""
  return _pair_letters(tuple(p.forms[site].y for p in plan.sides), letters,
                       tuple(p.example_letters[site] for p in plan.sides))


def _leaf_scaling_product(plan: Plan, site: int) -> float:
  """The product of both sides' scalings of the leaf at a lazy site."""
  return math.prod(p.forms[site].coefficient * p.leaf_letters[site].scale
                   for p in plan.sides)


def _lazy_kernel(context: _KernelContext, lazy: LazySite) -> Optional[Array]:
  """The kernel of a lazy site: one einsum of both sides' forms."""
  shared = _leaf_pair_letters(context.plan, lazy.site, context.letters)
  result = context.kernel_letters.result
  found = _cheapest_operands(context, lazy.site, shared, True, result)
  if found is None:
    return None
  operands, scale = found
  return (_leaf_scaling_product(context.plan, lazy.site) * scale) * einsum_into(
      operands, result, context.shape, context.dtype)


def _group_kernel(context: _KernelContext, group: Group) -> Optional[Array]:
  """`(G1 G2^T) * sum_sites (X1 X2^T)` of a group sharing a cotangent."""
  plan, letters = context.plan, context.letters
  kernel_letters = context.kernel_letters
  first = group.members[0].site
  # `G1 G2^T`, contracted over all of the target's dimensions but examples.
  shared = _target_pair_letters(plan, first, letters)
  found = _cheapest_operands(context, first, shared, False,
                             kernel_letters.result)
  if found is None:
    return None
  operands, scale = found
  k_g = scale * einsum_into(operands, kernel_letters.result, context.shape,
                            context.dtype)
  examples = [e for e in (kernel_letters.example1, kernel_letters.example2)
              if e is not None]
  k_x = 0.
  for member in group.members:
    t1, t2 = _leaf_pair_letters(plan, member.site, letters)
    x_operands = (
        _form_operands(context, 0, member.site, t1, cotangent=False)[0] +
        _form_operands(context, 1, member.site, t2, cotangent=False)[0])
    scale = _leaf_scaling_product(plan, member.site)
    if not x_operands:
      k_x = k_x + scale
      continue
    x_shape = context.shape[:len(examples)]
    k_x = k_x + scale * einsum_into(x_operands, examples, x_shape,
                                    context.dtype)
  if isinstance(k_x, float) or getattr(k_x, 'ndim', 0) == 0:
    return k_g * k_x
  return k_g * k_x.reshape(k_x.shape + (1,) * (k_g.ndim - k_x.ndim))


def _jacobian_kernel(context: _KernelContext, j1: Array, j2: Array) -> Array:
  """`sum_p J1[.., p] J2[.., p]` for materialized Jacobians."""
  kernel_letters = context.kernel_letters
  whole = context.plan.mode == Mode.WHOLE
  lead1 = ([] if whole else [kernel_letters.example1]) + list(
      kernel_letters.out1)
  lead2 = ([] if whole else [kernel_letters.example2]) + list(
      kernel_letters.out2)
  p = context.letters.many(j1.ndim - len(lead1))
  return einsum((j1, lead1 + p), (j2, lead2 + p),
                result=kernel_letters.result)
