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
3. gets all cotangents at once, by one reverse pass per output entry through
   the program with zero perturbations added at the site outputs;
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

from neural_tangents._src import empirical_layout as layout_lib
from neural_tangents._src import empirical_program as prog
from neural_tangents._src import empirical_separability as sep
from neural_tangents._src.utils.typing import Array

Letter = Optional[int]  # `None` marks a dimension of size 1.


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
          _inexact(eqn.outputs[0]) and
          all(isinstance(a, prog.Const) for i, a in enumerate(eqn.inputs)
              if i != k))


def _inexact(a: prog.Atom) -> bool:
  return jnp.issubdtype(a.dtype, jnp.inexact)


def _scalar(a: prog.Atom) -> Optional[float]:
  """The value of a scalar constant, if it is a concrete number."""
  if not isinstance(a, prog.Const) or a.shape != ():
    return None
  try:
    return float(np.asarray(a.value))
  except Exception:  # pylint: disable=broad-except
    return None  # A constant closed over from an outer trace.


def _leaf_letters(chain: Chain, letters: Sequence[Letter]
                  ) -> Optional[tuple[tuple[Letter, ...], float]]:
  """Letters of the leaf's dimensions, given those of the chain value.

  A chain of transposes, broadcasts, unit reshapes and scalings maps each
  entry of the leaf to entries of the value with the same letters (a
  broadcast dimension's letter is summed over). Returns `(letters, scale)`
  with `value = scale * P(leaf)`, or None if an equation is not of this kind.
  """
  scale = 1.
  out = list(letters)
  for eqn, k in zip(reversed(chain.eqns), reversed(chain.positions)):
    operand = eqn.inputs[k]
    shape, out_shape = operand.shape, eqn.outputs[0].shape
    name, p = eqn.name, eqn.params
    if name == 'transpose':
      new: list[Letter] = [None] * len(shape)
      for i, d in enumerate(p['permutation']):
        new[d] = out[i]
    elif name == 'broadcast_in_dim':
      new = [out[b] if shape[i] == out_shape[b] else None
             for i, b in enumerate(p['broadcast_dimensions'])]
    elif name in ('squeeze', 'reshape'):
      if [s for s in shape if s != 1] != [s for s in out_shape if s != 1]:
        return None
      kept = iter([l for l, s in zip(out, out_shape) if s != 1])
      new = [None if s == 1 else next(kept) for s in shape]
    elif name in ('convert_element_type', 'copy', 'copy_p', 'neg'):
      new = out
      scale *= -1. if name == 'neg' else 1.
    elif name in ('mul', 'div', 'add', 'add_any', 'sub'):
      c = _scalar(eqn.inputs[1 - k])
      if shape != out_shape or c is None or (name == 'div' and c == 0):
        return None
      new = out
      scale *= {'mul': c, 'div': 1 / c if c else 0.,
                'sub': -1. if k == 1 else 1.}.get(name, 1.)
    else:
      return None
    out = new
  return tuple(out), scale


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


@dataclasses.dataclass(frozen=True, eq=False)
class Factor:
  """A non-parameter input of a site, as it enters the site's form.

  Attributes:
    atom: the program value it is computed from.
    letters: letters of the factor's dimensions (after `transform`).
    transform: applied to the atom's value to get the factor, or None.
    batch_letter: letter of the atom's dimension `batch_axis`, a function of
      that axis (for the separability check), or None for a scalar.
  """
  atom: prog.Atom
  letters: tuple[Letter, ...]
  transform: Optional[Callable[[Array], Array]] = None
  atom_letters: Optional[tuple[Letter, ...]] = None

  def value(self, atom_value: Array) -> Array:
    return (atom_value if self.transform is None else
            self.transform(atom_value))


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


def _mask(letters: Sequence[int], shape: Sequence[int]) -> tuple[Letter, ...]:
  """Drops (to None) the letters of size-1 dimensions."""
  return tuple(None if s == 1 else l for l, s in zip(letters, shape))


class _Counter:

  def __init__(self):
    self.n = 0

  def __call__(self) -> int:
    self.n += 1
    return self.n - 1


def _dot_general_form(eqn: prog.Eqn, k: int, new: _Counter):
  (lc, rc), (lb, rb) = eqn.params['dimension_numbers']
  lhs, rhs = eqn.inputs
  l = [new() for _ in lhs.shape]
  r: list[Any] = [None] * len(rhs.shape)
  for a, b in list(zip(lc, rc)) + list(zip(lb, rb)):
    r[b] = l[a]
  r = [x if x is not None else new() for x in r]
  free_l = [l[d] for d in range(len(l)) if d not in lc and d not in lb]
  free_r = [r[d] for d in range(len(r)) if d not in rc and d not in rb]
  y = [l[d] for d in lb] + free_l + free_r
  other, other_letters = (rhs, r) if k == 0 else (lhs, l)
  v = l if k == 0 else r
  factor = Factor(other, _mask(other_letters, other.shape),
                  atom_letters=_mask(other_letters, other.shape))
  return y, (factor,), v


def _conv_form(eqn: prog.Eqn, k: int, new: _Counter):
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
  factor = Factor(lhs, _mask(x_letters, x_shape), windows,
                  _mask(atom_letters, lhs.shape))
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


def _broadcast_letters(eqn: prog.Eqn, new: _Counter):
  """Letters of an elementwise equation's output and of each input."""
  out = eqn.outputs[0].shape
  y = [new() for _ in out]
  ins = [[] if a.shape == () else
         [y[d] if a.shape[d] == out[d] else None for d in range(len(out))]
         for a in eqn.inputs]
  return y, ins


def _elementwise_form(eqn: prog.Eqn, k: int, new: _Counter):
  y, ins = _broadcast_letters(eqn, new)
  name = eqn.name
  if name in ('add', 'add_any', 'sub'):
    return y, (), ins[k]
  if name == 'mul':
    other = eqn.inputs[1 - k]
    return y, (Factor(other, _mask(ins[1 - k], other.shape),
                      atom_letters=_mask(ins[1 - k], other.shape)),), ins[k]
  if name == 'div' and k == 0:
    other = eqn.inputs[1]
    return y, (Factor(other, _mask(ins[1], other.shape), jnp.reciprocal,
                      _mask(ins[1], other.shape)),), ins[0]
  if name == 'select_n' and k >= 1:
    pred = eqn.inputs[0]
    dtype = eqn.outputs[0].dtype
    picks = lambda x: (x == (k - 1)).astype(dtype)
    return y, (Factor(pred, _mask(ins[0], pred.shape), picks,
                      _mask(ins[0], pred.shape)),), ins[k]
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
  new = _Counter()
  if site.eqn is None:
    out = program.outputs[site.position]
    y = _mask([new() for _ in out.shape], out.shape)
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
  return Form(target, coefficient, _mask(y, out.shape), factors,
              _mask(v, operand.shape), operand.shape)


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
    elif eqn.name in ('mul', 'div') and _scalar(eqn.inputs[1 - k]):
      # A scaling by a constant (e.g. stax's `W_std / sqrt(fan_in)`).
      c = _scalar(eqn.inputs[1 - k])
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
  # For each site with a form: (leaf letters, scale), or None if its chain
  # does not preserve letters.
  leaf_letters: list[Optional[tuple[tuple[Letter, ...], float]]]
  # Letter of the example axis in each form (SEPARABLE mode only).
  example_letters: list[Letter]
  eqn_index: dict[prog.Eqn, int]


def _side_plan(program: prog.Program, n_params: int, mode: Mode,
               batch_axes: Optional[dict[prog.Var, Optional[int]]]
               ) -> _SidePlan:
  chains: dict[prog.Var, Chain] = {}
  for i in range(n_params):
    v = program.inputs[i]
    if _inexact(v):
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
    elif any(_inexact(v) for v in eqn.outputs):
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
    example_letters = [_example_letter(s, f, ll, program, batch_axes)
                       for s, f, ll in zip(sites, forms, leaf_letters)]
  return _SidePlan(program, sites, forms, site_keys, leaf_letters,
                   example_letters, eqn_index)


def _example_letter(site: Site, form: Optional[Form], leaf_letters,
                    program: prog.Program,
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
  """A name for a target that is the same in both sides' programs."""
  if isinstance(target, int):
    return ('output', target)
  for eqn_i, eqn in enumerate(plan.program.eqns):
    for j, v in enumerate(eqn.outputs):
      if v is target:
        return ('eqn', eqn_i, j)
  raise AssertionError('target not found')


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
    i = site_ids[0]
    ok = len(site_ids) == 1 and all(
        p.forms[i] is not None and p.leaf_letters[i] is not None and
        (mode != Mode.SEPARABLE or p.example_letters[i] not in
         p.leaf_letters[i][0]) for p in (p1, p2))
    if not ok:
      materialized.append((leaf, tuple(site_ids)))
      continue
    key = _target_key(p1, p1.forms[i].target)
    if (all(_separable(p, i) for p in (p1, p2)) and
        key == _target_key(p2, p2.forms[i].target) and
        _target_dims(p1, i) == _target_dims(p2, i)):
      groups.setdefault(key, []).append(_Lazy(leaf, i))
    else:
      lazy.append(_Lazy(leaf, i))
  return Plan(mode, (p1, p2),
              tuple(_Group(k, tuple(m)) for k, m in groups.items()),
              tuple(lazy), tuple(materialized))


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
  p = set(plan.leaf_letters[i][0]) - {None}
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
        if _inexact(v):
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

  values: dict[str, Any] = {'G': {}, 'X': {}, 'J': {}}
  it = iter(factor_values)
  for i in lazy_sites:
    form = sp.forms[i]
    values['X'][i] = [f.value(next(it)) for f in form.factors]
    values['G'][_target_key(sp, form.target)] = g_of(form.target)
  mat_env = dict(zip([id(a) for a in mat_atoms], mat_values))
  leaf_values = {i: inputs[i] for i in range(len(inputs))}
  for leaf, ids in plan.materialized:
    values['J'][leaf] = _materialize(plan, side, leaf, ids, g_of, mat_env,
                                     leaf_values[leaf], out_row_ndims)
  return values


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
          site, [g_of(v) if _inexact(v) else None for v in site.eqn.outputs],
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
      EXAMPLE mode).
    layouts: the kernel layout of each output.
    out_shapes: the shape of one call's output (one example's, except in
      WHOLE mode), for the normalization of traced axes.
    result_shapes: the shape of each kernel (used if no parameter matters).

  Returns:
    The kernel of each output.
  """
  v1, v2 = values
  kernels = []
  for l, (layout, out_shape, result_shape) in enumerate(
      zip(layouts, out_shapes, result_shapes)):
    letters = layout_lib.Letters()
    kl = layout_lib.kernel_letters(layout, letters)
    terms = []
    for group in plan.groups:
      terms.append(_group_kernel(plan, group, l, v1, v2, kl, letters))
    for lazy in plan.lazy:
      terms.append(_lazy_kernel(plan, lazy, l, v1, v2, kl, letters))
    for leaf, _ in plan.materialized:
      j1, j2 = v1['J'][leaf][l], v2['J'][leaf][l]
      terms.append(_jacobian_kernel(j1, j2, kl, letters, plan.mode))
    kernel = sum(terms) if terms else jnp.zeros(result_shape)
    kernels.append(kernel / layout_lib.trace_size(layout, out_shape))
  return kernels


def _side_letters(kl: layout_lib.KernelLetters, side: int, mode: Mode):
  """Leading letters of a side's cotangents/Jacobians, and its example letter."""
  e, out = kl.side(side + 1)
  lead = ([e] if mode == Mode.EXAMPLE else []) + list(out)
  return lead, e


def _map(ls: Sequence[Letter], shared: dict, local: dict, example: Letter,
         example_global: Optional[int], letters: layout_lib.Letters
         ) -> list[int]:
  """Maps a form's letters to an einsum's: shared ones (the leaf's) are
  common to both sides, the example letter is the side's, others are the
  side's own."""
  out = []
  for l in ls:
    if l is None:
      continue
    if example is not None and l == example:
      out.append(example_global)
    elif l in shared:
      out.append(shared[l])
    else:
      local.setdefault(l, letters.new())
      out.append(local[l])
  return out


def _form_operands(plan: Plan, side: int, site: int, values: dict, l: int,
                   kl, letters, shared: dict, g: bool = True,
                   x: bool = True) -> list:
  sp = plan.sides[side]
  form = sp.forms[site]
  lead, e_global = _side_letters(kl, side, plan.mode)
  e = sp.example_letters[site]
  local: dict[int, int] = {}
  ops = []
  ex = [e_global] if plan.mode == Mode.EXAMPLE else []
  if g:
    g_l = values['G'][_target_key(sp, form.target)][l]
    n_lead = len(lead)
    ops.append((_squeeze_units(g_l, form.y, n_lead),
                lead + _map(form.y, shared, local, e, e_global, letters)))
  if x:
    for f, value in zip(form.factors, values['X'][site]):
      ops.append((_squeeze_units(value, f.letters, len(ex)),
                  ex + _map(f.letters, shared, local, e, e_global, letters)))
  return ops


def _shared_letters(plan: Plan, site: int, letters) -> dict[int, int]:
  """Global letters for the leaf's letters, per side (by leaf dimension)."""
  ll1 = plan.sides[0].leaf_letters[site][0]
  ll2 = plan.sides[1].leaf_letters[site][0]
  s1, s2 = {}, {}
  for a, b in zip(ll1, ll2):
    if a is None or b is None:
      continue
    g = letters.new()
    s1[a], s2[b] = g, g
  return s1, s2


def _scale2(plan: Plan, site: int) -> float:
  """The product of both sides' scalings of the leaf at a lazy site."""
  return math.prod(p.forms[site].coefficient * p.leaf_letters[site][1]
                   for p in plan.sides)


def _lazy_kernel(plan: Plan, lazy: _Lazy, l: int, v1: dict, v2: dict, kl,
                 letters) -> Array:
  s1, s2 = _shared_letters(plan, lazy.site, letters)
  ops = (_form_operands(plan, 0, lazy.site, v1, l, kl, letters, s1) +
         _form_operands(plan, 1, lazy.site, v2, l, kl, letters, s2))
  return _scale2(plan, lazy.site) * layout_lib.einsum(
      *ops, result=kl.result)


def _group_kernel(plan: Plan, group: _Group, l: int, v1: dict, v2: dict, kl,
                  letters) -> Array:
  first = group.members[0].site
  # `G1 G2^T`, contracted over all of the target's dimensions but examples.
  s1, s2 = _shared_letters_for_target(plan, first, letters)
  g_ops = (_form_operands(plan, 0, first, v1, l, kl, letters, s1, x=False) +
           _form_operands(plan, 1, first, v2, l, kl, letters, s2, x=False))
  k_g = layout_lib.einsum(*g_ops, result=kl.result)
  e1, e2 = kl.example1, kl.example2
  k_x = 0.
  for m in group.members:
    t1, t2 = _shared_letters(plan, m.site, letters)
    x_ops = (_form_operands(plan, 0, m.site, v1, l, kl, letters, t1, g=False) +
             _form_operands(plan, 1, m.site, v2, l, kl, letters, t2, g=False))
    scale = _scale2(plan, m.site)
    if not x_ops:
      k_x = k_x + scale
      continue
    present = [e for e in (e1, e2) if any(e in ls for _, ls in x_ops)]
    k = layout_lib.einsum(*x_ops, result=present)
    if e1 is not None and e1 not in present:
      k = k[None]
    if e2 is not None and e2 not in present:
      k = k[..., None] if e1 is not None else k[None]
    k_x = k_x + scale * k
  if isinstance(k_x, float) or getattr(k_x, 'ndim', 0) == 0:
    return k_g * k_x
  return k_g * k_x.reshape(k_x.shape + (1,) * (k_g.ndim - k_x.ndim))


def _shared_letters_for_target(plan: Plan, site: int, letters):
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
