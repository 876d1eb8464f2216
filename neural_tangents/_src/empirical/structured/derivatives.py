"""The empirical NTK from each layer's inputs and output cotangents.

For a parameter `W` entering a network only through `y = dot_general(x, W)`,
the Jacobian of the outputs `F` is `dF/dW = (dF/dy) (dy/dW)`, and `dy/dW` is
structured: `x` times an identity. So

    Theta_W(x1, x2) = sum_ab [G1 X1]_ab [G2 X2]_ab,    G = dF/dy, X = x,

is one einsum of the cotangents `G` (sized like the layer's output, not like
`W`) and the inputs `X` of the layer on each side, which an einsum optimizer
may contract as `(G1 G2^T) * (X1 X2^T)` without ever forming a Jacobian.

This module reads `f` as a flat program (`empirical_program`) and:

1. follows each parameter leaf through *chains* of linear operations on it
   alone (transposes, reshapes, broadcasts, scalings, ...);
2. finds its *sites*, the equations where a chain value meets other values,
   and writes each site's Jacobian as an einsum *form* of the cotangent of
   the site's output and of the site's other inputs (rules for
   `dot_general`, `conv_general_dilated` (through input patches), `mul`,
   `div`, `add`/`sub`, `select_n`, and program outputs);
3. gets the cotangents of the site outputs: as einsum factors where the
   rest of the network is simple (`structured_factors.cotangent_tail`),
   else all at once, by one reverse pass per output entry through the
   program with zero perturbations added at the site outputs;
4. contracts: a leaf with one site and a chain of letter-preserving
   operations is contracted lazily (sites with the same cotangent and a
   separable form share `G1 G2^T`, e.g. a dense layer's weight and bias);
   other leaves get their Jacobian materialized per site (by the form, or
   for any other primitive by its VJP, the always-correct generic rule),
   pulled back through the chain by its VJP, summed, and contracted.

Three modes, by how examples are separated:

* `EXAMPLE`: the program is one example's (`vmap_axes` given), and all values
  are computed per example under `jax.vmap`;
* `SEPARABLE`: the program is the whole batch's, proven batch-separable by
  `empirical_separability`; per-example cotangents come from one reverse
  pass per output entry with the cotangent broadcast over the batch;
* `WHOLE`: the program is the whole batch's and examples may interact.
"""
import dataclasses
import enum
import functools
import itertools
import math
from typing import Any, Callable, Optional, Sequence, Union

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.empirical import layout as layout_lib
from neural_tangents._src.empirical.structured import program as prog
from neural_tangents._src.empirical.structured import factors as sf
from neural_tangents._src.empirical.structured.factors import Factor
from neural_tangents._src.empirical.structured.factors import Letter
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
  eqns: tuple[prog.Eqn, ...] = ()
  positions: tuple[int, ...] = ()

  def then(self, eqn: prog.Eqn, position: int) -> 'Chain':
    return Chain(self.leaf, self.eqns + (eqn,), self.positions + (position,))

  def apply(self, leaf_value: Array) -> Array:
    """Recomputes the chain value from the leaf's value."""
    value = leaf_value
    for eqn, k in zip(self.eqns, self.positions):
      ins = [a.value if isinstance(a, prog.Const) else None
             for a in eqn.inputs]
      ins[k] = value
      value, = prog.bind(eqn, ins)
    return value


# Primitives that are linear (affine) in one input when all others are
# constants, with a predicate on that input's position.
_LINEAR_IN = {
    'transpose': lambda k, e: True,
    'broadcast_in_dim': lambda k, e: len(e.inputs) == 1,
    'reshape': lambda k, e: len(e.inputs) == 1,
    'squeeze': lambda k, e: True,
    'convert_element_type': lambda k, e: True,
    'copy': lambda k, e: True,
    'copy_p': lambda k, e: True,
    'neg': lambda k, e: True,
    'reduce_sum': lambda k, e: True,
    'slice': lambda k, e: True,
    'rev': lambda k, e: True,
    'cumsum': lambda k, e: True,
    'real': lambda k, e: True,
    'imag': lambda k, e: True,
    'conj': lambda k, e: True,
    'pad': lambda k, e: k == 0,
    'concatenate': lambda k, e: True,
    'dynamic_slice': lambda k, e: k == 0,
    'gather': lambda k, e: k == 0,
    'select_n': lambda k, e: k >= 1,
    'mul': lambda k, e: True,
    'div': lambda k, e: k == 0,
    'add': lambda k, e: True,
    'add_any': lambda k, e: True,
    'sub': lambda k, e: True,
    'dot_general': lambda k, e: True,
    'conv_general_dilated': lambda k, e: True,
    'reduce_window_sum': lambda k, e: len(e.inputs) == 1,
}


def _is_chain_op(eqn: prog.Eqn, k: int) -> bool:
  rule = _LINEAR_IN.get(eqn.name)
  return (rule is not None and rule(k, eqn) and len(eqn.outputs) == 1 and
          sf.inexact(eqn.outputs[0]) and
          all(isinstance(a, prog.Const) for i, a in enumerate(eqn.inputs)
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
    operand = eqn.inputs[k]
    shape, out_shape = operand.shape, eqn.outputs[0].shape
    name, p = eqn.name, eqn.params
    if name == 'slice' and i == 0 and all(
        s in (None, 1) for s in (p['strides'] or ())):
      region = (tuple(p['start_indices']), tuple(p['limit_indices']))
      break
    if name == 'transpose':
      new: list[Letter] = [None] * len(shape)
      for j, d in enumerate(p['permutation']):
        new[d] = out[j]
    elif name == 'broadcast_in_dim':
      new = [out[b] if shape[j] == out_shape[b] else None
             for j, b in enumerate(p['broadcast_dimensions'])]
    elif name in ('squeeze', 'reshape'):
      if [s for s in shape if s != 1] != [s for s in out_shape if s != 1]:
        return None
      kept = iter([l for l, s in zip(out, out_shape) if s != 1])
      new = [None if s == 1 else next(kept) for s in shape]
    elif name in ('convert_element_type', 'copy', 'copy_p', 'neg'):
      new = out
      scale *= -1. if name == 'neg' else 1.
    elif name in ('mul', 'div', 'add', 'add_any', 'sub'):
      c = sf.scalar_value(eqn.inputs[1 - k])
      if shape != out_shape or c is None or (name == 'div' and c == 0):
        return None
      new = out
      scale *= {'mul': c, 'div': 1 / c if c else 0.,
                'sub': -1. if k == 1 else 1.}.get(name, 1.)
    else:
      return None
    out = new
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
  eqn: Optional[prog.Eqn]
  position: int


# A perturbation point: an equation output, or a program output (by index).
Target = Union[prog.Var, int]


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


def _dot_general_form(eqn: prog.Eqn, k: int, new: sf.Counter):
  operand = eqn.inputs[k]
  v = list(sf.mask([new() for _ in operand.shape], operand.shape))
  other_letters, y = sf.dot_general_letters(eqn, k, v, new)
  other = eqn.inputs[1 - k]
  factor = Factor(other, tuple(other_letters),
                  atom_letters=tuple(other_letters))
  return y, (factor,), v


def _conv_form(eqn: prog.Eqn, k: int, new: sf.Counter):
  """`y = conv(x, W)` is `einsum(windows(x), W)` over the kernel's offsets."""
  p = eqn.params
  if k != 1 or p['feature_group_count'] != 1 or p['batch_group_count'] != 1:
    return None
  lhs, rhs = eqn.inputs
  out = eqn.outputs[0]
  dn = p['dimension_numbers']
  y = [new() for _ in out.shape]
  c = new()
  ks = [new() for _ in dn.rhs_spec[2:]]
  # Windows have the input's dimensions (spatial ones of the output's size),
  # then one dimension per kernel offset.
  x_letters = [None] * len(lhs.shape)
  x_letters[dn.lhs_spec[0]] = y[dn.out_spec[0]]
  x_letters[dn.lhs_spec[1]] = c
  for i, d in enumerate(dn.lhs_spec[2:]):
    x_letters[d] = y[dn.out_spec[2 + i]]
  x_letters += ks
  v: list[Any] = [None] * len(rhs.shape)
  v[dn.rhs_spec[0]], v[dn.rhs_spec[1]] = y[dn.out_spec[1]], c
  for i, d in enumerate(dn.rhs_spec[2:]):
    v[d] = ks[i]
  atom_letters = [new() for _ in lhs.shape]
  atom_letters[dn.lhs_spec[0]] = y[dn.out_spec[0]]
  filter_shape = tuple(rhs.shape[d] for d in dn.rhs_spec[2:])
  out_spatial = tuple(out.shape[d] for d in dn.out_spec[2:])
  x_shape = list(lhs.shape)
  for i, d in enumerate(dn.lhs_spec[2:]):
    x_shape[d] = out_spatial[i]
  x_shape += filter_shape
  windows = functools.partial(
      _conv_windows, filter_shape=filter_shape, out_spatial=out_spatial,
      strides=p['window_strides'], padding=p['padding'],
      lhs_dilation=p['lhs_dilation'], rhs_dilation=p['rhs_dilation'],
      spatial=tuple(dn.lhs_spec[2:]))
  factor = Factor(lhs, sf.mask(x_letters, x_shape), windows,
                  sf.mask(atom_letters, lhs.shape))
  return y, (factor,), v


def _conv_windows(x: Array, filter_shape: Sequence[int],
                  out_spatial: Sequence[int], strides: Sequence[int],
                  padding: Sequence[tuple[int, int]],
                  lhs_dilation: Sequence[int], rhs_dilation: Sequence[int],
                  spatial: Sequence[int]) -> Array:
  """The input window of each output position, per kernel offset.

  `out[s] = sum_k xp[s * stride + k * rhs_dilation] W[k]`, where `xp` is the
  input dilated by `lhs_dilation` and padded. Strided slices of `xp` copy
  the windows exactly and cost no FLOPs (unlike a patches convolution).
  """
  config = [(0, 0, 0)] * x.ndim
  for i, d in enumerate(spatial):
    config[d] = (padding[i][0], padding[i][1], lhs_dilation[i] - 1)
  xp = lax.pad(x, jnp.zeros((), x.dtype), config)
  windows = []
  for offset in itertools.product(*(range(f) for f in filter_shape)):
    start, limit, step = [0] * x.ndim, list(xp.shape), [1] * x.ndim
    for i, d in enumerate(spatial):
      start[d] = offset[i] * rhs_dilation[i]
      limit[d] = start[d] + (out_spatial[i] - 1) * strides[i] + 1
      step[d] = strides[i]
    windows.append(lax.slice(xp, start, limit, step))
  stacked = jnp.stack(windows, axis=-1)
  return stacked.reshape(stacked.shape[:-1] + tuple(filter_shape))


def _elementwise_form(eqn: prog.Eqn, k: int, new: sf.Counter):
  y = [new() for _ in eqn.outputs[0].shape]
  ins = sf.broadcast_letters(eqn, y)
  name = eqn.name
  if name in ('add', 'add_any', 'sub'):
    return y, (), ins[k]
  if name == 'mul':
    other = eqn.inputs[1 - k]
    return y, (Factor(other, sf.mask(ins[1 - k], other.shape),
                      atom_letters=sf.mask(ins[1 - k], other.shape)),), ins[k]
  if name == 'div' and k == 0:
    other = eqn.inputs[1]
    return y, (Factor(other, sf.mask(ins[1], other.shape), jnp.reciprocal,
                      sf.mask(ins[1], other.shape)),), ins[0]
  if name == 'select_n' and k >= 1:
    pred = eqn.inputs[0]
    dtype = eqn.outputs[0].dtype
    picks = lambda x: (x == (k - 1)).astype(dtype)
    return y, (Factor(pred, sf.mask(ins[0], pred.shape), picks,
                      sf.mask(ins[0], pred.shape)),), ins[k]
  return None


_FORM_RULES = {
    'dot_general': _dot_general_form,
    'conv_general_dilated': _conv_form,
    'add': _elementwise_form,
    'add_any': _elementwise_form,
    'sub': _elementwise_form,
    'mul': _elementwise_form,
    'div': _elementwise_form,
    'select_n': _elementwise_form,
}


def _form(site: Site, program: prog.Program, consumers: dict[prog.Var, list],
          uses: dict[prog.Var, int]) -> Optional[Form]:
  """The site's form, or None if only the generic rule applies."""
  new = sf.Counter()
  if site.eqn is None:
    out = program.outputs[site.position]
    y = sf.mask([new() for _ in out.shape], out.shape)
    return Form(site.position, 1., y, (), y, out.shape)
  rule = _FORM_RULES.get(site.eqn.name)
  found = rule(site.eqn, site.position, new) if rule else None
  if found is None:
    return None
  y, factors, v = found
  out = site.eqn.outputs[0]
  operand = site.eqn.inputs[site.position]
  coefficient = -1. if site.eqn.name == 'sub' and site.position == 1 else 1.
  target, coefficient = _forward(out, coefficient, program, consumers, uses)
  return Form(target, coefficient, sf.mask(y, out.shape), factors,
              sf.mask(v, operand.shape), operand.shape)


def _forward(var: prog.Var, coefficient: float, program: prog.Program,
             consumers: dict[prog.Var, list], uses: dict[prog.Var, int]
             ) -> tuple[prog.Var, float]:
  """Moves a target through sums it alone feeds: `d(y + b)/dy = I`.

  A dense layer's `x W` then shares its cotangent with its bias `+ b`, so
  that their kernels share `G1 G2^T`.
  """
  while uses.get(var, 0) == 1 and len(consumers.get(var, ())) == 1:
    eqn, k = consumers[var][0]
    out = eqn.outputs[0]
    if out.shape != var.shape or out.dtype != var.dtype:
      break
    if eqn.name in ('add', 'add_any', 'sub'):
      factor = -1. if eqn.name == 'sub' and k == 1 else 1.
    elif eqn.name == 'neg':
      factor = -1.
    elif eqn.name in ('mul', 'div') and sf.scalar_value(eqn.inputs[1 - k]):
      # A scaling by a constant (e.g. stax's `W_std / sqrt(fan_in)`).
      c = sf.scalar_value(eqn.inputs[1 - k])
      if eqn.name == 'div' and k == 1:
        break
      factor = c if eqn.name == 'mul' else 1 / c
    else:
      break
    coefficient *= factor
    var = out
  return var, coefficient


# ---------------------------------------------------------------------------
# Plans: what to compute on each side, and how to contract.
# ---------------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class _SidePlan:
  """One side's program, its sites and their forms (`None`: generic)."""
  program: prog.Program
  sites: list[Site]
  forms: list[Optional[Form]]
  site_keys: list[tuple]
  # For each site with a form: how its chain covers the leaf, or None if its
  # chain does not preserve letters.
  leaf_letters: list[Optional[LeafLetters]]
  # Letter of the example axis in each form (SEPARABLE mode only).
  example_letters: list[Letter]
  eqn_index: dict[prog.Eqn, int]
  consumers: dict[prog.Var, list]
  batch_axes: Optional[dict[prog.Var, Optional[int]]]
  n_params: int
  output_keys: dict[prog.Var, tuple]

  def shared(self, atom: prog.Atom) -> bool:
    """Whether a value is the same for all examples (a constant or param)."""
    return isinstance(atom, prog.Const) or any(
        atom is v for v in self.program.inputs[:self.n_params])

  def target_var(self, target: Target) -> prog.Atom:
    return self.program.outputs[target] if isinstance(target, int) else target

  def key(self, target: Target) -> tuple:
    """A name for a target that is the same in both sides' programs."""
    if isinstance(target, int):
      return ('output', target)
    return self.output_keys[target]


def _side_plan(program: prog.Program, n_params: int, mode: Mode,
               batch_axes: Optional[dict[prog.Var, Optional[int]]]
               ) -> _SidePlan:
  chains: dict[prog.Var, Chain] = {}
  for i in range(n_params):
    v = program.inputs[i]
    if sf.inexact(v):
      chains[v] = Chain(i)
  consumers: dict[prog.Var, list] = {}
  sites: list[Site] = []
  for eqn in program.eqns:
    for k, a in enumerate(eqn.inputs):
      if isinstance(a, prog.Var):
        consumers.setdefault(a, []).append((eqn, k))
    in_chain = [k for k, a in enumerate(eqn.inputs)
                if isinstance(a, prog.Var) and a in chains]
    if not in_chain:
      continue
    if len(in_chain) == 1 and _is_chain_op(eqn, in_chain[0]):
      k = in_chain[0]
      chains[eqn.outputs[0]] = chains[eqn.inputs[k]].then(eqn, k)
    elif any(sf.inexact(v) for v in eqn.outputs):
      sites += [Site(chains[eqn.inputs[k]], eqn, k) for k in in_chain]
  for i, a in enumerate(program.outputs):
    if isinstance(a, prog.Var) and a in chains:
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
  return _SidePlan(program, sites, forms, site_keys, leaf_letters,
                   example_letters, eqn_index, consumers, batch_axes, n_params,
                   output_keys)


def _example_letter(site: Site, form: Optional[Form], program: prog.Program,
                    axes: dict[prog.Var, Optional[int]]) -> int:
  """The form's letter for the example axis, checking it is well placed."""
  if form is None:
    raise Unsupported(f'no structure rule for {site.eqn.name}')
  target_var = (program.outputs[form.target] if isinstance(form.target, int)
                else form.target)
  axis = axes.get(target_var) if isinstance(target_var, prog.Var) else None
  if axis is None or form.y[axis] is None:
    raise Unsupported('a site output does not depend on the batch')
  e = form.y[axis]
  if e in form.v:
    raise Unsupported('a parameter has a batch axis')
  for factor in form.factors:
    a = axes.get(factor.atom) if isinstance(factor.atom, prog.Var) else None
    if a is not None and (factor.atom_letters is None or
                          factor.atom_letters[a] != e):
      raise Unsupported('a site input is batched along another axis')
  return e


def _target_key(plan: _SidePlan, target: Target) -> tuple:
  return plan.key(target)


@dataclasses.dataclass(frozen=True)
class _Lazy:
  """A leaf whose kernel is one einsum of its single site's form."""
  leaf: int
  site: int


@dataclasses.dataclass(frozen=True)
class _Group:
  """Leaves whose site forms share one cotangent `G`, each separable as
  `J = G (x) X`, so that `Theta = (G1 G2^T) * sum_leaves (X1 X2^T)`."""
  target: tuple
  members: tuple[_Lazy, ...]


@dataclasses.dataclass(frozen=True)
class Plan:
  """How to compute the NTK of one network on two sides."""
  mode: Mode
  sides: tuple[_SidePlan, _SidePlan]
  groups: tuple[_Group, ...]
  lazy: tuple[_Lazy, ...]
  materialized: tuple[tuple[int, tuple[int, ...]], ...]  # (leaf, sites)
  # Targets (by key) whose cotangents are einsum factors, on each side.
  tails: dict[tuple, tuple[sf.Tail, sf.Tail]]


def make_plan(programs: tuple[prog.Program, prog.Program], n_params: int,
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
  p1 = _side_plan(programs[0], n_params, mode, batch_axes[0])
  p2 = p1 if programs[1] is programs[0] else _side_plan(
      programs[1], n_params, mode, batch_axes[1])
  if p1 is not p2:
    names = lambda p: [e.name for e in p.program.eqns]
    if p1.site_keys != p2.site_keys or names(p1) != names(p2):
      raise Unsupported('f traces to different programs on x1 and x2')

  by_leaf: dict[int, list[int]] = {}
  for i, s in enumerate(p1.sites):
    by_leaf.setdefault(s.chain.leaf, []).append(i)

  lazy, materialized = [], []
  groups: dict[tuple, list[_Lazy]] = {}
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
      key = _target_key(p1, p1.forms[i].target)
      if (all(_separable(p, i) for p in (p1, p2)) and
          key == _target_key(p2, p2.forms[i].target) and
          _target_dims(p1, i) == _target_dims(p2, i)):
        groups.setdefault(key, []).append(_Lazy(leaf, i))
      else:
        lazy.append(_Lazy(leaf, i))
  lazy_sites = [l.site for l in lazy] + [m.site for ms in groups.values()
                                         for m in ms]
  return Plan(mode, (p1, p2),
              tuple(_Group(k, tuple(m)) for k, m in groups.items()),
              tuple(lazy), tuple(materialized), _tails(p1, p2, lazy_sites))


def _tails(p1: _SidePlan, p2: _SidePlan,
           lazy_sites: Sequence[int]) -> dict[tuple, tuple[sf.Tail, sf.Tail]]:
  """Cotangent tails of lazy sites' targets, where both sides have one."""
  tails = {}
  for i in lazy_sites:
    key = _target_key(p1, p1.forms[i].target)
    if key in tails:
      continue
    pair = []
    for p in (p1, p2):
      target = p.forms[i].target
      axis = None
      if p.batch_axes is not None:
        axis = p.batch_axes.get(p.target_var(target))
      pair.append(sf.cotangent_tail(target, p.program, p.consumers, axis))
    if None not in pair and pair[0].output == pair[1].output:
      tails[key] = tuple(pair)
  return tails


def _target_dims(plan: _SidePlan, i: int) -> tuple:
  """The target's shape, without its example axis (SEPARABLE mode)."""
  form = plan.forms[i]
  e = plan.example_letters[i]
  var = (plan.program.outputs[form.target] if isinstance(form.target, int)
         else form.target)
  return tuple(s for s, l in zip(var.shape, form.y) if e is None or l != e)


def _separable(plan: _SidePlan, i: int) -> bool:
  """Whether site `i`'s Jacobian is an outer product `G (x) X`."""
  form = plan.forms[i]
  e = plan.example_letters[i]
  p = set(plan.leaf_letters[i].letters) - {None}
  y = set(form.y) - {None, e}
  x = set(l for f in form.factors for l in f.letters) - {None, e}
  return y <= p and not y & x and len(y) == len([l for l in form.y
                                                 if l not in (None, e)])


# ---------------------------------------------------------------------------
# One side's values: cotangents, factors, and materialized Jacobians.
# ---------------------------------------------------------------------------


def _needed(plan: Plan, side: int):
  """Targets and recorded atoms a side needs, in a fixed order."""
  sp = plan.sides[side]
  targets: list[Target] = []
  lazy_sites = [m.site for g in plan.groups for m in g.members] + [
      l.site for l in plan.lazy]
  mat_sites = [i for _, ids in plan.materialized for i in ids]

  def add(t: Target):
    if not any(t is u for u in targets):
      targets.append(t)

  for i in lazy_sites + mat_sites:
    form = sp.forms[i]
    if form is not None:
      add(form.target)
    else:
      for v in sp.sites[i].eqn.outputs:
        if sf.inexact(v):
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
  sp = plan.sides[side]
  program = sp.program
  targets, lazy_sites, _ = _needed(plan, side)
  var_targets = [t for t in targets if not isinstance(t, int)]
  out_targets = [t for t in targets if isinstance(t, int)]
  factor_atoms = [f.atom for i in lazy_sites for f in sp.forms[i].factors]
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
    form = sp.forms[i]
    values['X'][i] = [f.value(next(it)) for f in form.factors]
    # Both the cotangents and (below) their tail factors: the contraction
    # uses the cheaper, and XLA drops the computation of the other.
    values['G'][_target_key(sp, form.target)] = g_of(form.target)
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
  sp = plan.sides[side]
  lazy_sites = [m.site for g in plan.groups for m in g.members] + [
      l.site for l in plan.lazy]
  axis = lambda f: None if sp.shared(f.atom) else 0
  return {'G': 0, 'J': 0,
          'X': {i: [axis(f) for f in sp.forms[i].factors] for i in lazy_sites},
          'T': {key: [axis(f) for f in tails[side].factors]
                for key, tails in plan.tails.items()}}


def _materialization_atoms(plan: Plan, side: int) -> list[prog.Atom]:
  sp = plan.sides[side]
  atoms = []
  for _, ids in plan.materialized:
    for i in ids:
      if sp.forms[i] is not None:
        atoms += [f.atom for f in sp.forms[i].factors]
      else:
        atoms += list(sp.sites[i].eqn.inputs)
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


def _squeeze_units(x: Array, letters: Sequence[Letter], lead: int) -> Array:
  """Drops the size-1 dimensions (letter None) after the first `lead`."""
  axes = tuple(lead + i for i, l in enumerate(letters) if l is None)
  return jnp.squeeze(x, axes) if axes else x


def _materialize(plan: Plan, side: int, leaf: int, site_ids: Sequence[int],
                 g_of, env: dict[int, Array], leaf_value: Array,
                 out_row_ndims: Sequence[int]) -> list[Array]:
  """`J_leaf[o, leaf]` for each output: the sum over the leaf's sites."""
  sp = plan.sides[side]
  total = None
  for i in site_ids:
    site, form = sp.sites[i], sp.forms[i]
    if form is not None:
      j_v = _form_jacobian(form, g_of(form.target),
                           [env[id(f.atom)] for f in form.factors],
                           sp.example_letters[i], out_row_ndims)
    else:
      j_v = _generic_jacobian(
          site, [g_of(v) if sf.inexact(v) else None for v in site.eqn.outputs],
          [env[id(a)] for a in site.eqn.inputs], out_row_ndims)
    j_leaf = [_pull_back(site.chain, leaf_value, j) for j in j_v]
    total = j_leaf if total is None else [a + b for a, b in zip(total, j_leaf)]
  return total


def _form_jacobian(form: Form, g: list[Array], atom_values: list[Array],
                   example_letter: Letter,
                   out_row_ndims: Sequence[int]) -> list[Array]:
  """`J_v[e?, o, v]` from the form, for each output (e: example axis)."""
  results = []
  for g_l, n in zip(g, out_row_ndims):
    letters = layout_lib.Letters()
    o = letters.many(n)
    local: dict[int, int] = {}

    def m(ls):
      out = []
      for l in ls:
        if l is not None:
          local.setdefault(l, letters.new())
          out.append(local[l])
      return out

    ops = [(_squeeze_units(g_l, form.y, n), o + m(form.y))]
    for f, value in zip(form.factors, atom_values):
      ops.append((_squeeze_units(f.value(value), f.letters, 0), m(f.letters)))
    e = [local[example_letter]] if example_letter is not None else []
    v_letters = m(form.v)
    j = layout_lib.einsum(*ops, result=e + o + v_letters)
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
    return prog.bind(eqn, ins)

  _, pull = jax.vjp(apply, in_values[k])
  results = []
  for l, n in enumerate(out_row_ndims):
    lead = next(g_out[l].shape[:n] for g_out in g if g_out is not None)
    rows = math.prod(lead)
    cts = [np.zeros((rows,) + out.shape, jax.dtypes.float0) if g_out is None
           else g_out[l].reshape((rows,) + out.shape)
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
             layouts: Sequence[layout_lib.KernelLayout],
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
  for l, (layout, out_shape, shape) in enumerate(
      zip(layouts, out_shapes, result_shapes)):
    letters = layout_lib.Letters()
    kl = layout_lib.kernel_letters(layout, letters)
    terms = []
    for group in plan.groups:
      terms.append(_group_kernel(plan, group, l, values, kl, letters, shape))
    for lazy in plan.lazy:
      terms.append(_lazy_kernel(plan, lazy, l, values, kl, letters, shape))
    for leaf, _ in plan.materialized:
      j1, j2 = values[0]['J'][leaf][l], values[1]['J'][leaf][l]
      terms.append(_jacobian_kernel(j1, j2, kl, letters, plan.mode))
    terms = [t for t in terms if t is not None]
    kernel = sum(terms) if terms else jnp.zeros(shape, _dtype(values))
    kernels.append(kernel / layout_lib.trace_size(layout, out_shape))
  return kernels


def _einsum_into(ops: list, result: Sequence[int], shape: Sequence[int],
                 dtype: Any) -> Array:
  """An einsum whose result letters may be missing from all operands.

  A missing letter is a dimension the value does not depend on: an output
  dimension of size 1, or examples when only shared values are involved;
  the result is broadcast along it. Without operands (the cotangent of a
  single output entry with respect to itself) the product is 1.
  """
  if not ops:
    return jnp.ones(tuple(shape), dtype)
  present = set(l for _, ls in ops for l in ls)
  kept = [l for l in result if l in present]
  out = layout_lib.einsum(*ops, result=kept)
  out = out.reshape([s if l in present else 1 for l, s in zip(result, shape)])
  return jnp.broadcast_to(out, tuple(shape))


class _Mapper:
  """Maps one side's form (and tail) letters to an einsum's letters.

  Letters of the leaf (`shared`) are common to both sides; the example
  letter becomes the side's example letter; other letters are the side's
  own.
  """

  def __init__(self, shared: dict, example: Letter, example_global: Any,
               letters: layout_lib.Letters):
    self.shared, self.example = shared, example
    self.example_global, self.letters = example_global, letters
    self.local: dict[int, int] = {}

  def __call__(self, ls: Sequence[Letter]) -> list[int]:
    out = []
    for l in ls:
      if l is None:
        continue
      if self.example is not None and l == self.example:
        out.append(self.example_global)
      elif l in self.shared:
        out.append(self.shared[l])
      else:
        out.append(self.local.setdefault(l, self.letters.new()))
    return out


def _form_operands(plan: Plan, side: int, site: int, values: dict, l: int,
                   kl, letters, shared: dict, g: bool = True,
                   x: bool = True,
                   tail: bool = False) -> Optional[tuple[list, float]]:
  """Einsum operands of one side of a site's form, and their scaling.

  Args:
    plan, side, site, values, l, kl, letters, shared: as in the callers.
    g: whether to include the cotangent's operands.
    x: whether to include the site's other inputs.
    tail: whether the cotangent is written as its tail's factors.

  Returns:
    `(operands, scale)`, or None if the site's cotangent is zero for `l`.
  """
  sp = plan.sides[side]
  form = sp.forms[site]
  e_global, out = kl.side(side + 1)
  example = plan.mode == Mode.EXAMPLE
  m = _Mapper(shared, sp.example_letters[site], e_global, letters)
  ops, scale = [], 1.
  if g:
    key = _target_key(sp, form.target)
    if tail:
      factors = plan.tails[key][side]
      if factors.output != l:
        return None
      ops += _tail_operands(plan, sp, factors, form, values['T'][key], m,
                            list(out), e_global)
      scale = factors.coefficient
    else:
      lead = ([e_global] if example else []) + list(out)
      g_l = values['G'][key][l]
      ops.append((_squeeze_units(g_l, form.y, len(lead)), lead + m(form.y)))
  if x:
    for f, value in zip(form.factors, values['X'][site]):
      ex = [e_global] if example and not sp.shared(f.atom) else []
      ops.append((_squeeze_units(value, f.letters, len(ex)), ex + m(f.letters)))
  return ops, scale


# A cotangent tail is used when its contraction costs less than this
# fraction of the one with the materialized cotangent: at equal FLOPs the
# latter wins, its factors being formed by fewer elementwise operations.
_TAIL_ADVANTAGE = 0.8


def _cheapest_operands(plan: Plan, site: int, values: tuple, l: int, kl,
                       letters, shared: tuple[dict, dict], x: bool,
                       result: Sequence[int]) -> Optional[tuple[list, float]]:
  """Both sides' operands, with the cotangent materialized or as factors."""
  key = _target_key(plan.sides[0], plan.sides[0].forms[site].target)
  options = [False] + ([True] if key in plan.tails else [])
  best, best_cost = None, None
  for tail in options:
    sides = [_form_operands(plan, s, site, values[s], l, kl, letters,
                            shared[s], x=x, tail=tail) for s in (0, 1)]
    if sides[0] is None or sides[1] is None:
      if tail:
        return None  # The tail proves the cotangent is zero for `l`.
      continue
    ops, scale = sides[0][0] + sides[1][0], sides[0][1] * sides[1][1]
    present = set(l for _, ls in ops for l in ls)
    cost = layout_lib.einsum_cost(*ops, result=[
        r for r in result if r in present]) if ops else 0.
    if tail:
      cost /= _TAIL_ADVANTAGE
    if best is None or cost < best_cost:
      best, best_cost = (ops, scale), cost
  return best


def _tail_operands(plan: Plan, sp: _SidePlan, tail: sf.Tail, form: Form,
                   tail_values: list, m: _Mapper, out: list,
                   e_global: Any) -> list:
  """Operands of a cotangent tail: its letters for the target's dimensions
  are the form's, those for the output's are the kernel's."""
  to_form = {t: f for t, f in zip(tail.y, form.y) if t is not None}
  out_dims = list(tail.out)
  if plan.mode == Mode.SEPARABLE:
    out_dims = out_dims[1:]  # Dimension 0 is the batch: the example letter.
  to_kernel = {t: o for t, o in zip(out_dims, out) if t is not None}
  private = _Mapper({}, None, None, m.letters)
  ops = []
  for f, value in zip(tail.factors, tail_values):
    ls = []
    for t in f.letters:
      if t is None:
        continue
      if t in to_form:
        ls += m([to_form[t]])
      elif t in to_kernel:
        ls.append(to_kernel[t])
      else:
        ls += private([t])
    ex = [e_global] if plan.mode == Mode.EXAMPLE and not sp.shared(
        f.atom) else []
    ops.append((_squeeze_units(value, f.letters, len(ex)), ex + ls))
  return ops


def _dtype(values: tuple[dict, dict]) -> Any:
  """The floating dtype of the values (that of the network)."""
  leaves = [x for x in jax.tree_util.tree_leaves(values)
            if jnp.issubdtype(x.dtype, jnp.inexact)]
  return jnp.result_type(*leaves) if leaves else jnp.float32


def _shared_letters(plan: Plan, site: int, letters) -> tuple[dict, dict]:
  """Global letters for the leaf's letters, per side (by leaf dimension)."""
  ll1 = plan.sides[0].leaf_letters[site].letters
  ll2 = plan.sides[1].leaf_letters[site].letters
  s1, s2 = {}, {}
  for a, b in zip(ll1, ll2):
    if a is None or b is None:
      continue
    g = letters.new()
    s1[a], s2[b] = g, g
  return s1, s2


def _scale2(plan: Plan, site: int) -> float:
  """The product of both sides' scalings of the leaf at a lazy site."""
  return math.prod(p.forms[site].coefficient * p.leaf_letters[site].scale
                   for p in plan.sides)


def _lazy_kernel(plan: Plan, lazy: _Lazy, l: int, values: tuple, kl,
                 letters, shape) -> Optional[Array]:
  shared = _shared_letters(plan, lazy.site, letters)
  found = _cheapest_operands(plan, lazy.site, values, l, kl, letters, shared,
                             True, kl.result)
  if found is None:
    return None
  ops, scale = found
  return (_scale2(plan, lazy.site) * scale) * _einsum_into(
      ops, kl.result, shape, _dtype(values))


def _group_kernel(plan: Plan, group: _Group, l: int, values: tuple, kl,
                  letters, shape) -> Optional[Array]:
  first = group.members[0].site
  # `G1 G2^T`, contracted over all of the target's dimensions but examples.
  shared = _shared_letters_for_target(plan, first, letters)
  found = _cheapest_operands(plan, first, values, l, kl, letters, shared,
                             False, kl.result)
  if found is None:
    return None
  ops, scale = found
  k_g = scale * _einsum_into(ops, kl.result, shape, _dtype(values))
  examples = [e for e in (kl.example1, kl.example2) if e is not None]
  k_x = 0.
  for m in group.members:
    t1, t2 = _shared_letters(plan, m.site, letters)
    x_ops = (_form_operands(plan, 0, m.site, values[0], l, kl, letters, t1,
                            g=False)[0] +
             _form_operands(plan, 1, m.site, values[1], l, kl, letters, t2,
                            g=False)[0])
    scale = _scale2(plan, m.site)
    if not x_ops:
      k_x = k_x + scale
      continue
    x_shape = shape[:len(examples)]
    k_x = k_x + scale * _einsum_into(x_ops, examples, x_shape,
                                     _dtype(values))
  if isinstance(k_x, float) or getattr(k_x, 'ndim', 0) == 0:
    return k_g * k_x
  return k_g * k_x.reshape(k_x.shape + (1,) * (k_g.ndim - k_x.ndim))


def _shared_letters_for_target(plan: Plan, site: int,
                               letters) -> tuple[dict, dict]:
  """Shared letters for the target's (non-example) dimensions."""
  y1 = plan.sides[0].forms[site].y
  y2 = plan.sides[1].forms[site].y
  e1 = plan.sides[0].example_letters[site]
  e2 = plan.sides[1].example_letters[site]
  s1, s2 = {}, {}
  for a, b in zip(y1, y2):
    if a is None or b is None or a == e1 or b == e2:
      continue
    g = letters.new()
    s1[a], s2[b] = g, g
  return s1, s2


def _jacobian_kernel(j1: Array, j2: Array, kl, letters, mode: Mode) -> Array:
  """`sum_p J1[.., p] J2[.., p]` for materialized Jacobians."""
  lead1 = ([kl.example1] if mode != Mode.WHOLE else []) + list(kl.out1)
  lead2 = ([kl.example2] if mode != Mode.WHOLE else []) + list(kl.out2)
  p = letters.many(j1.ndim - len(lead1))
  return layout_lib.einsum((j1, lead1 + p), (j2, lead2 + p), result=kl.result)
