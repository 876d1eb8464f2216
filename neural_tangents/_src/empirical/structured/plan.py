"""Plans: where each parameter enters a network, and how its NTK is contracted.

For a parameter `W` entering a network only through `y = dot_general(x, W)`,
the Jacobian of the outputs `F` is `dF/dW = (dF/dy) (dy/dW)`, and `dy/dW` is
structured: `x` times an identity. So

    Theta_W(x1, x2) = sum_ab [G1 X1]_ab [G2 X2]_ab,    G = dF/dy, X = x,

is one einsum of the cotangents `G` (sized like the layer's output, not like
`W`) and the inputs `X` of the layer on each side, which an einsum optimizer
may contract as `(G1 G2^T) * (X1 X2^T)` without ever forming a Jacobian.

`make_plan` reads `f` as a flat program (`program.py`) and, with the
per-primitive records of `rules/`:

1. follows each parameter leaf through *chains* of linear operations on it
   alone (transposes, reshapes, broadcasts, scalings, ...);
2. finds its *sites*, the equations where a chain value meets other values,
   and writes each site's Jacobian as an einsum *form* of the cotangent of
   the site's output and of the site's other inputs;
3. decides, per leaf, how to contract (`contraction.py`): a leaf with one
   site and a chain of letter-preserving operations is contracted lazily
   (sites with the same cotangent and a separable form share `G1 G2^T`,
   e.g. a dense layer's weight and bias, in a *group*); other leaves get
   their Jacobian materialized; and which cotangents are written as einsum
   factors of the network's *tail* (`tails.py`).

Three modes, by how examples are separated:

* `EXAMPLE`: the program is one example's (`vmap_axes` given), and all values
  are computed per example under `jax.vmap`;
* `SEPARABLE`: the program is the whole batch's, proven batch-separable by
  `separability.py`; per-example cotangents come from one reverse pass per
  output entry with the cotangent broadcast over the batch;
* `WHOLE`: the program is the whole batch's and examples may interact.
"""
import dataclasses
import enum
import itertools
from typing import Optional, Sequence, Union

import jax.numpy as jnp

from neural_tangents._src.empirical.einsum import Letter
from neural_tangents._src.empirical.einsum import Letters
from neural_tangents._src.empirical.einsum import mask
from neural_tangents._src.empirical.structured import ir
from neural_tangents._src.empirical.structured import rules
from neural_tangents._src.empirical.structured import tails as tails_lib
from neural_tangents._src.empirical.structured.factor import Factor
from neural_tangents._src.utils.typing import Array


class Mode(enum.Enum):
  EXAMPLE = 'example'
  SEPARABLE = 'separable'
  WHOLE = 'whole'


class Unsupported(Exception):
  """Raised when structured derivatives cannot handle a network."""


# ---------------------------------------------------------------------------
# Chains: values that are linear functions of one parameter leaf.
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class Chain:
  """A value computed from parameter leaf `leaf` by linear equations.

  Attributes:
    leaf: index of the parameter leaf among the program's inputs.
    eqns: the equations from the leaf to the value, in order.
    positions: for each equation, which of its inputs is the chain value
      (all its other inputs are constants).
  """
  leaf: int
  eqns: tuple[ir.Eqn, ...] = ()
  positions: tuple[int, ...] = ()

  def then(self, eqn: ir.Eqn, position: int) -> 'Chain':
    return Chain(self.leaf, self.eqns + (eqn,), self.positions + (position,))

  def apply(self, leaf_value: Array) -> Array:
    """Recomputes the chain value from the leaf's value."""
    value = leaf_value
    for eqn, k in zip(self.eqns, self.positions):
      ins = [a.value if isinstance(a, ir.Const) else None
             for a in eqn.inputs]
      ins[k] = value
      value, = ir.bind(eqn, ins)
    return value


def _is_chain_op(eqn: ir.Eqn, k: int) -> bool:
  """Whether `eqn` continues a chain through its input `k`."""
  rule = rules.rule(eqn.name)
  return (rule is not None and rule.linear_in is not None and
          rule.linear_in(eqn, k) and len(eqn.outputs) == 1 and
          rules.inexact(eqn.outputs[0]) and
          all(isinstance(a, ir.Const) for i, a in enumerate(eqn.inputs)
              if i != k))


@dataclasses.dataclass(frozen=True)
class LeafLetters:
  """How a site's chain value covers its parameter leaf.

  Attributes:
    letters: letters of the leaf's dimensions (or of `region`'s), such that
      `value = scale * P(leaf)` with `P` moving entries without mixing them.
    scale: the constant scaling.
    region: `(start, limit)` of the slice of the leaf the chain starts with,
      or None if it uses the whole leaf.
  """
  letters: tuple[Letter, ...]
  scale: float
  region: Optional[tuple[tuple[int, ...], tuple[int, ...]]]


def _leaf_letters(chain: Chain,
                  letters: Sequence[Letter]) -> Optional[LeafLetters]:
  """Letters of the leaf's dimensions, given those of the chain value.

  A chain of transposes, broadcasts, unit reshapes and scalings maps each
  entry of the leaf to entries of the value with the same letters (a
  broadcast dimension's letter is summed over). A chain may also start with
  a contiguous slice of the leaf (a step of an unrolled `scan` reading its
  parameters): its letters are then the slice's. Returns None for any other
  chain.
  """
  scale = 1.
  out = list(letters)
  region = None
  for i, (eqn, k) in reversed(list(enumerate(zip(chain.eqns,
                                                 chain.positions)))):
    rule = rules.rule(eqn.name)
    if i == 0 and rule.leaf_region is not None:
      region = rule.leaf_region(eqn)
      if region is not None:
        break
    step = (None if rule.leaf_letters is None else
            rule.leaf_letters(eqn, k, out))
    if step is None:
      return None
    out, step_scale = step
    scale *= step_scale
  return LeafLetters(tuple(out), scale, region)


def _disjoint(regions: Sequence[Optional[tuple]]) -> bool:
  """Whether slices of a leaf do not overlap (then their kernels add up)."""
  if any(r is None for r in regions):
    return False
  for (s1, l1), (s2, l2) in itertools.combinations(regions, 2):
    if all(a < d and c < b for a, b, c, d in zip(s1, l1, s2, l2)):
      return False
  return True


# ---------------------------------------------------------------------------
# Sites and their forms.
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class Site:
  """Where a chain value is used: input `position` of `eqn`, or (if `eqn` is
  None) program output `position`."""
  chain: Chain
  eqn: Optional[ir.Eqn]
  position: int


# A perturbation point: an equation output, or a program output (by index).
Target = Union[ir.Var, int]


@dataclasses.dataclass(frozen=True, eq=False)
class Form:
  """`J_v[o, v] = coefficient * einsum(G_target[o, y], *factors -> v)`.

  `G_target[o]` is the cotangent of the target for output entry `o`, and `v`
  the chain value at the site.
  """
  target: Target
  coefficient: float
  y: tuple[Letter, ...]
  factors: tuple[Factor, ...]
  v: tuple[Letter, ...]
  v_shape: tuple[int, ...]


def _form(site: Site, program: ir.Program, consumers: dict[ir.Var, list],
          uses: dict[ir.Var, int]) -> Optional[Form]:
  """The site's form, or None if only the generic rule applies."""
  letters = Letters()
  if site.eqn is None:
    out = program.outputs[site.position]
    y = mask(letters.many(len(out.shape)), out.shape)
    return Form(site.position, 1., y, (), y, out.shape)
  rule = rules.rule(site.eqn.name)
  found = (rule.jacobian_form(site.eqn, site.position, letters)
           if rule is not None and rule.jacobian_form is not None else None)
  if found is None:
    return None
  y, factors, v, coefficient = found
  out = site.eqn.outputs[0]
  operand = site.eqn.inputs[site.position]
  target, coefficient = _forward(out, coefficient, program, consumers, uses)
  return Form(target, coefficient, mask(y, out.shape), factors,
              mask(v, operand.shape), operand.shape)


def _forward(var: ir.Var, coefficient: float, program: ir.Program,
             consumers: dict[ir.Var, list], uses: dict[ir.Var, int]
             ) -> tuple[ir.Var, float]:
  """Moves a target through sums it alone feeds: `d(y + b)/dy = I`.

  A dense layer's `x W` then shares its cotangent with its bias `+ b`, so
  that their kernels share `G1 G2^T`.
  """
  while uses.get(var, 0) == 1 and len(consumers.get(var, ())) == 1:
    eqn, k = consumers[var][0]
    out = eqn.outputs[0]
    if out.shape != var.shape or out.dtype != var.dtype:
      break
    rule = rules.rule(eqn.name)
    factor = (None if rule is None or rule.passes_cotangent is None else
              rule.passes_cotangent(eqn, k))
    if factor is None:
      break
    coefficient *= factor
    var = out
  return var, coefficient


# ---------------------------------------------------------------------------
# Plans: what to compute on each side, and how to contract.
# ---------------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class SidePlan:
  """One side's program, its sites and their forms (`None`: generic)."""
  program: ir.Program
  sites: list[Site]
  forms: list[Optional[Form]]
  site_keys: list[tuple]
  # For each site with a form: how its chain covers the leaf, or None if its
  # chain does not preserve letters.
  leaf_letters: list[Optional[LeafLetters]]
  # Letter of the example axis in each form (SEPARABLE mode only).
  example_letters: list[Letter]
  eqn_index: dict[ir.Eqn, int]
  consumers: dict[ir.Var, list]
  batch_axes: Optional[dict[ir.Var, Optional[int]]]
  n_params: int
  output_keys: dict[ir.Var, tuple]

  def shared(self, atom: ir.Atom) -> bool:
    """Whether a value is the same for all examples (a constant or param)."""
    return isinstance(atom, ir.Const) or any(
        atom is v for v in self.program.inputs[:self.n_params])

  def target_var(self, target: Target) -> ir.Atom:
    return self.program.outputs[target] if isinstance(target, int) else target

  def key(self, target: Target) -> tuple:
    """A name for a target that is the same in both sides' programs."""
    if isinstance(target, int):
      return ('output', target)
    return self.output_keys[target]


def _plan_side(program: ir.Program, n_params: int, mode: Mode,
               batch_axes: Optional[dict[ir.Var, Optional[int]]]
               ) -> SidePlan:
  if any(_is_complex(v) for e in program.eqns for v in e.outputs):
    # The structure rules assume real derivatives (`J J^T`, no conjugates).
    raise Unsupported('f computes with complex numbers')
  chains: dict[ir.Var, Chain] = {}
  for i in range(n_params):
    v = program.inputs[i]
    if rules.inexact(v):
      chains[v] = Chain(i)
  consumers: dict[ir.Var, list] = {}
  sites: list[Site] = []
  for eqn in program.eqns:
    for k, a in enumerate(eqn.inputs):
      if isinstance(a, ir.Var):
        consumers.setdefault(a, []).append((eqn, k))
    in_chain = [k for k, a in enumerate(eqn.inputs)
                if isinstance(a, ir.Var) and a in chains]
    if not in_chain:
      continue
    if len(in_chain) == 1 and _is_chain_op(eqn, in_chain[0]):
      k = in_chain[0]
      chains[eqn.outputs[0]] = chains[eqn.inputs[k]].then(eqn, k)
    elif any(rules.inexact(v) for v in eqn.outputs):
      sites += [Site(chains[eqn.inputs[k]], eqn, k) for k in in_chain]
  for i, a in enumerate(program.outputs):
    if isinstance(a, ir.Var) and a in chains:
      sites.append(Site(chains[a], None, i))

  uses = program.uses()
  eqn_index = {e: i for i, e in enumerate(program.eqns)}
  forms = [_form(s, program, consumers, uses) for s in sites]
  leaf_letters = [None if f is None else _leaf_letters(s.chain, f.v)
                  for s, f in zip(sites, forms)]
  site_keys = [(s.chain.leaf, -1 if s.eqn is None else eqn_index[s.eqn],
                s.position) for s in sites]
  example_letters: list[Letter] = [None] * len(sites)
  if mode == Mode.SEPARABLE:
    example_letters = [_example_letter(s, f, program, batch_axes)
                       for s, f in zip(sites, forms)]
  output_keys = {v: ('eqn', i, j) for i, e in enumerate(program.eqns)
                 for j, v in enumerate(e.outputs)}
  return SidePlan(program, sites, forms, site_keys, leaf_letters,
                  example_letters, eqn_index, consumers, batch_axes, n_params,
                  output_keys)


def _is_complex(v: ir.Atom) -> bool:
  return jnp.issubdtype(v.dtype, jnp.complexfloating)


def _example_letter(site: Site, form: Optional[Form], program: ir.Program,
                    axes: dict[ir.Var, Optional[int]]) -> int:
  """The form's letter for the example axis, checking it is well placed."""
  if form is None:
    raise Unsupported(f'no structure rule for {site.eqn.name}')
  target_var = (program.outputs[form.target] if isinstance(form.target, int)
                else form.target)
  axis = axes.get(target_var) if isinstance(target_var, ir.Var) else None
  if axis is None or form.y[axis] is None:
    raise Unsupported('a site output does not depend on the batch')
  e = form.y[axis]
  if e in form.v:
    raise Unsupported('a parameter has a batch axis')
  for factor in form.factors:
    a = axes.get(factor.atom) if isinstance(factor.atom, ir.Var) else None
    if a is not None and (factor.atom_letters is None or
                          factor.atom_letters[a] != e):
      raise Unsupported('a site input is batched along another axis')
  return e


@dataclasses.dataclass(frozen=True)
class LazySite:
  """A leaf whose kernel is one einsum of its single site's form."""
  leaf: int
  site: int


@dataclasses.dataclass(frozen=True)
class Group:
  """Lazy sites whose forms share one cotangent `G`.

  Each is separable as `J = G (x) X`, so that their kernels sum to
  `Theta = (G1 G2^T) * sum_sites (X1 X2^T)`.
  """
  target: tuple
  members: tuple[LazySite, ...]


@dataclasses.dataclass(frozen=True)
class Plan:
  """How to compute the NTK of one network on two sides."""
  mode: Mode
  sides: tuple[SidePlan, SidePlan]
  groups: tuple[Group, ...]
  lazy: tuple[LazySite, ...]
  materialized: tuple[tuple[int, tuple[int, ...]], ...]  # (leaf, sites)
  # Targets (by key) whose cotangents are einsum factors, on each side.
  tails: dict[tuple, tuple[tails_lib.Tail, tails_lib.Tail]]


def make_plan(programs: tuple[ir.Program, ir.Program], n_params: int,
              mode: Mode,
              batch_axes: Sequence[Optional[dict]] = (None, None)) -> Plan:
  """Plans structured derivatives for two (structurally equal) programs.

  Args:
    programs: the programs of `f` on x1 and on x2 (may be the same object).
    n_params: the first `n_params` program inputs are parameter leaves.
    mode: how examples are separated.
    batch_axes: in SEPARABLE mode, each program's batch axes.

  Returns:
    The plan.

  Raises:
    Unsupported: if the programs differ in structure, or SEPARABLE mode is
      asked for but a site cannot be separated by example.
  """
  p1 = _plan_side(programs[0], n_params, mode, batch_axes[0])
  p2 = p1 if programs[1] is programs[0] else _plan_side(
      programs[1], n_params, mode, batch_axes[1])
  if p1 is not p2:
    names = lambda p: [e.name for e in p.program.eqns]
    if p1.site_keys != p2.site_keys or names(p1) != names(p2):
      raise Unsupported('f traces to different programs on x1 and x2')

  by_leaf: dict[int, list[int]] = {}
  for i, s in enumerate(p1.sites):
    by_leaf.setdefault(s.chain.leaf, []).append(i)

  lazy, materialized = [], []
  groups: dict[tuple, list[LazySite]] = {}
  for leaf, site_ids in sorted(by_leaf.items()):
    ok = all(p.forms[i] is not None and p.leaf_letters[i] is not None and
             (mode != Mode.SEPARABLE or p.example_letters[i] not in
              p.leaf_letters[i].letters)
             for p in (p1, p2) for i in site_ids)
    # Sites reading disjoint slices of a leaf (the steps of an unrolled
    # `scan`) have Jacobians with disjoint supports: their kernels add up.
    if ok and len(site_ids) > 1:
      ok = all(_disjoint([p.leaf_letters[i].region for i in site_ids])
               for p in (p1, p2))
    if not ok:
      materialized.append((leaf, tuple(site_ids)))
      continue
    for i in site_ids:
      key = p1.key(p1.forms[i].target)
      if (all(_separable(p, i) for p in (p1, p2)) and
          key == p2.key(p2.forms[i].target) and
          _target_dims(p1, i) == _target_dims(p2, i)):
        groups.setdefault(key, []).append(LazySite(leaf, i))
      else:
        lazy.append(LazySite(leaf, i))
  lazy_sites = [s.site for s in lazy] + [m.site for ms in groups.values()
                                         for m in ms]
  return Plan(mode, (p1, p2),
              tuple(Group(k, tuple(m)) for k, m in groups.items()),
              tuple(lazy), tuple(materialized),
              _choose_tails(p1, p2, lazy_sites))


def _choose_tails(p1: SidePlan, p2: SidePlan, lazy_sites: Sequence[int]
                  ) -> dict[tuple, tuple[tails_lib.Tail, tails_lib.Tail]]:
  """Cotangent tails of lazy sites' targets, where both sides have one."""
  tails = {}
  for i in lazy_sites:
    key = p1.key(p1.forms[i].target)
    if key in tails:
      continue
    pair = []
    for p in (p1, p2):
      target = p.forms[i].target
      axis = None
      if p.batch_axes is not None:
        axis = p.batch_axes.get(p.target_var(target))
      pair.append(tails_lib.cotangent_tail(target, p.program, p.consumers,
                                           axis))
    if None not in pair and pair[0].output == pair[1].output:
      tails[key] = tuple(pair)
  return tails


def _target_dims(plan: SidePlan, i: int) -> tuple:
  """The target's shape, without its example axis (SEPARABLE mode)."""
  form = plan.forms[i]
  e = plan.example_letters[i]
  var = (plan.program.outputs[form.target] if isinstance(form.target, int)
         else form.target)
  return tuple(s for s, letter in zip(var.shape, form.y)
               if e is None or letter != e)


def _separable(plan: SidePlan, i: int) -> bool:
  """Whether site `i`'s Jacobian is an outer product `G (x) X`."""
  form = plan.forms[i]
  e = plan.example_letters[i]
  p = set(plan.leaf_letters[i].letters) - {None}
  y = set(form.y) - {None, e}
  x = set(letter for f in form.factors for letter in f.letters) - {None, e}
  return y <= p and not y & x and len(y) == len([letter for letter in form.y
                                                 if letter not in (None, e)])


