"""One record per JAX primitive: everything structured derivatives know of it.

A `Rule` says, for one primitive,

* `linear_in`: whether it is linear in input `k` when its other inputs are
  constants, so that a parameter's *chain* of linear operations continues
  through it (`plan.Chain`);
* `leaf_letters`: the backward letter map of such a chain step: the letters
  of input `k` from those of the output, and a constant scaling; None when
  the step mixes entries (then the leaf's Jacobian is materialized);
* `jacobian_form`: the Jacobian of the output with respect to input `k` as
  an einsum of the output's cotangent and of the other inputs (`Form`);
* `passes_cotangent`: the scaling `c` when `out = c * in_k + (terms without
  in_k)`, so that a site's cotangent target moves on through it;
* `tail_step`: the forward step of a cotangent tail (`tails.py`): the
  output's letters from input `k`'s, and the factors it multiplies by;
* `batch_axis`: the batch axis of each output from those of the inputs
  (`separability.py`); it raises `NotSeparable` where examples would mix;
* `expand`: the equations that replace it when a program is flattened
  (`program.py`): a call's body, the steps of a short `scan`;
* `elementwise`, `shape_dependent`, `call`: plain properties.

The records are grouped by primitive family below (elementwise functions,
sums, products, `select_n`, `dot_general`, convolutions, shape operations,
reductions, slices and concatenations, windows, calls and loops, ...), each
family's functions next to its records; `RULES` collects them all.

A primitive without a record, or a field left None, takes the generic path:
its Jacobian comes from its own VJP, and separability is not proven through
it. The engines (`plan`, `tails`, `separability`) look records up with
`rule(name)`, which also resolves names of older JAX releases (`ALIASES`).

Example:
  >>> rule('dot_general').jacobian_form is not None
  True
  >>> rule('pjit').call
  'inlined'
"""
import dataclasses
import functools
import itertools
import math
from typing import Any, Callable, Optional, Sequence

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.empirical.einsum import Letter
from neural_tangents._src.empirical.einsum import Letters
from neural_tangents._src.empirical.einsum import mask
from neural_tangents._src.empirical.structured import ir
from neural_tangents._src.empirical.structured import params
from neural_tangents._src.empirical.structured.factor import Factor
from neural_tangents._src.utils.typing import Array

BatchAxis = Optional[int]

# Names that older supported JAX releases (>= 0.6) give primitives now named
# otherwise: {old name: current name}.
ALIASES = {
    'pjit': 'jit',  # JAX < 0.7.
    'custom_vjp_call_jaxpr': 'custom_vjp_call',  # JAX < 0.7.
}

INLINED = 'inlined'  # A call that only groups equations: flattened.
CUSTOM = 'custom'  # A call with its own derivative rules: kept whole.


class NotSeparable(Exception):
  """Raised when the batch items of a program may interact."""


# A step of a cotangent tail: `(output letters, factors, scale, products)`.
TailStep = tuple[list, list, float, int]
# A Jacobian form: `(output letters y, factors, letters v of input k,
# coefficient)`: `J[y, v] = coefficient * einsum(factors)`.
FormParts = tuple[list, tuple, list, float]
# `inline(jaxpr, consts, atoms)`: appends a jaxpr's equations on `atoms` to
# the program being flattened and returns its outputs (`program.py`).
Inline = Callable[[Any, Sequence[Any], Sequence[ir.Atom]], list[ir.Atom]]


@dataclasses.dataclass(frozen=True)
class Rule:
  """What structured derivatives know about one primitive (module docstring).

  Signatures (`eqn` the equation, `k` the position of the input considered):
    linear_in(eqn, k) -> bool
    leaf_letters(eqn, k, output_letters) -> (input_letters, scale) or None
    leaf_region(eqn) -> (start, limit) or None: the chain starts with a
      contiguous slice of the leaf (a step of an unrolled `scan`).
    jacobian_form(eqn, k, letters) -> (y, factors, v, coefficient) or None
    passes_cotangent(eqn, k) -> scale or None
    tail_step(eqn, k, input_letters, letters) -> TailStep or None
    batch_axis(eqn, in_axes) -> output batch axes (raises NotSeparable)
    expand(eqn_params, inputs, inline) -> outputs, or None to keep it whole
  """
  name: str
  linear_in: Optional[Callable[[ir.Eqn, int], bool]] = None
  leaf_letters: Optional[Callable[..., Optional[tuple[list, float]]]] = None
  leaf_region: Optional[Callable[[ir.Eqn], Optional[tuple]]] = None
  jacobian_form: Optional[Callable[..., Optional[FormParts]]] = None
  passes_cotangent: Optional[Callable[[ir.Eqn, int], Optional[float]]] = None
  tail_step: Optional[Callable[..., Optional[TailStep]]] = None
  batch_axis: Optional[Callable[[ir.Eqn, list], list]] = None
  expand: Optional[Callable[[dict, Sequence[ir.Atom], Inline],
                            Optional[list[ir.Atom]]]] = None
  elementwise: bool = False
  shape_dependent: bool = False
  call: Optional[str] = None


def rule(name: str) -> Optional[Rule]:
  """The record of a primitive, by its current or an older name."""
  return RULES.get(ALIASES.get(name, name))


def is_call(name: str, kind: str) -> bool:
  """Whether `name` is a call primitive of `kind` (`INLINED`, `CUSTOM`)."""
  r = rule(name)
  return r is not None and r.call == kind


# ---------------------------------------------------------------------------
# Shared by the families: letters, constants, linearity, batch axes.
# ---------------------------------------------------------------------------

def inexact(a: ir.Atom) -> bool:
  return jnp.issubdtype(a.dtype, jnp.inexact)


def scalar_value(a: ir.Atom) -> Optional[float]:
  """The value of a scalar constant, if it is a concrete number."""
  if not isinstance(a, ir.Const) or a.shape != ():
    return None
  try:
    return float(np.asarray(a.value))
  except Exception:  # pylint: disable=broad-except
    return None  # A constant closed over from an outer trace.


def unit_reshape_letters(from_shape: Sequence[int], to_shape: Sequence[int],
                         letters: Sequence[Letter]) -> Optional[list]:
  """Letters of `to_shape` for a reshape that only adds or drops unit dims.

  Works in both directions (a reshape's input from its output and back).
  Returns None if the reshape moves entries across dimensions.

  Example:
    >>> unit_reshape_letters((3, 1, 4), (3, 4), [0, None, 1])
    [0, 1]
  """
  if [s for s in from_shape if s != 1] != [s for s in to_shape if s != 1]:
    return None
  kept = iter([letter for letter, s in zip(letters, from_shape) if s != 1])
  return [None if s == 1 else next(kept) for s in to_shape]


def broadcast_letters(eqn: ir.Eqn, y: Sequence[Letter]
                      ) -> list[tuple[Letter, ...]]:
  """Letters of each input of an elementwise equation with output letters `y`.

  Inputs have the output's rank (size-1 dimensions broadcast) or are scalars.
  """
  out = eqn.outputs[0].shape
  return [() if a.shape == () else
          tuple(y[d] if a.shape[d] == out[d] else None
                for d in range(len(out))) for a in eqn.inputs]


def _linear_in_any(eqn: ir.Eqn, k: int) -> bool:
  del eqn, k
  return True


def _linear_in_first(eqn: ir.Eqn, k: int) -> bool:
  del eqn
  return k == 0


def _linear_in_only_input(eqn: ir.Eqn, k: int) -> bool:
  del k
  return len(eqn.inputs) == 1


def _identity_back(scale: float):
  return lambda eqn, k, out: (out, scale)


def _same_shape(eqn: ir.Eqn, k: int) -> bool:
  return tuple(eqn.inputs[k].shape) == tuple(eqn.outputs[0].shape)


def require(condition: bool) -> None:
  if not condition:
    raise NotSeparable()


def _batched(in_axes: list[BatchAxis]) -> list[tuple[int, int]]:
  return [(i, a) for i, a in enumerate(in_axes) if a is not None]


def _only_axis(in_axes: list[BatchAxis]) -> int:
  (_, a), = _batched(in_axes)
  return a


def _common_axis(in_axes: list[BatchAxis]) -> int:
  axes = {a for _, a in _batched(in_axes)}
  require(len(axes) == 1)
  return axes.pop()


def _elementwise_axis(eqn, in_axes):
  # Operands have the output's rank (with size-1 broadcasting) or are
  # scalars; a batched operand must not be broadcast along its batch axis.
  a = _common_axis(in_axes)
  out = eqn.outputs[0].shape
  for i, _ in _batched(in_axes):
    shape = eqn.inputs[i].shape
    require(len(shape) == len(out) and shape[a] == out[a])
  return [a]


def _dropping_axis(dims: Sequence[int], a: int) -> int:
  """Axis `a` after dropping `dims` (which must not contain it)."""
  require(a not in dims)
  return a - sum(d < a for d in dims)


def _keeps_axis(operated_on: Callable[[ir.Eqn], Sequence[int]],
                find: Optional[Callable[[list], int]] = None):
  """The batch-axis rule of a primitive acting along `operated_on(eqn)`.

  The batch axis (found by `find`: the only batched input's by default) must
  be another axis, and every output keeps it.
  """
  find = find or _only_axis

  def batch_axis(eqn, in_axes):
    a = find(in_axes)
    require(a not in operated_on(eqn))
    return [a] * len(eqn.outputs)

  return batch_axis


def _same_axes(eqn, in_axes):
  del eqn
  return list(in_axes)


# ---------------------------------------------------------------------------
# Elementwise functions: a diagonal factor f'(v) in cotangent tails.
# ---------------------------------------------------------------------------

def _elementwise_tail(eqn, k, letters, new):
  """An elementwise `f` of input `k` alone: a diagonal factor `f'(v)`."""
  del new
  if not (_same_shape(eqn, k) and _is_elementwise(eqn, k)):
    return None
  derivative = functools.partial(_diagonal, eqn, k)
  return letters, [Factor(eqn.inputs[k], tuple(letters), derivative)], 1., 0


def _is_elementwise(eqn: ir.Eqn, k: int) -> bool:
  """Whether `eqn` is an elementwise function of input `k` alone."""
  others = [a for i, a in enumerate(eqn.inputs) if i != k]
  if not all(isinstance(a, ir.Const) for a in others):
    return False
  r = rule(eqn.name)
  if r is not None and r.elementwise:
    return True
  if is_call(eqn.name, CUSTOM) and not others:
    body = params.call_body(eqn.params)
    return body is not None and _elementwise_body(body[0],
                                                  eqn.inputs[0].shape)
  return False


def _elementwise_body(jaxpr: Any, shape: tuple[int, ...]) -> bool:
  """Whether a call's body applies elementwise functions to its input."""
  for eqn in jaxpr.eqns:
    r = rule(eqn.primitive.name)
    if r is not None and r.elementwise:
      ok = all(tuple(getattr(a.aval, 'shape', ())) in ((), shape)
               for a in eqn.invars)
    elif r is not None and r.call is not None:
      body = params.call_body(eqn.params)
      ok = body is not None and _elementwise_body(body[0], shape)
    else:
      ok = False
    if not ok or any(tuple(v.aval.shape) != shape for v in eqn.outvars):
      return False
  return all(tuple(getattr(v.aval, 'shape', ())) == shape
             for v in jaxpr.outvars)


def _diagonal(eqn: ir.Eqn, k: int, value: Array) -> Array:
  """`f'(v)` of an elementwise `f`: its JVP along a tangent of ones."""
  ins = [a.value if isinstance(a, ir.Const) else None for a in eqn.inputs]

  def f(a: Array) -> Array:
    ins[k] = a
    return ir.bind(eqn, ins)[0]

  return jax.jvp(f, (value,), (jnp.ones_like(value),))[1]


_ELEMENTWISE = dict(tail_step=_elementwise_tail, batch_axis=_elementwise_axis,
                    elementwise=True)

# Elementwise primitives with nothing more to them than `_ELEMENTWISE`.
_PLAIN_ELEMENTWISE = """
    abs acos acosh and asin asinh atan atan2 atanh bessel_i0e bessel_i1e cbrt
    ceil clamp clz complex cos cosh digamma eq erf erf_inv erfc exp exp2 expm1
    floor ge gt igamma igammac integer_pow is_finite le lgamma log log1p
    logistic lt max min ne nextafter not or polygamma population_count pow
    reduce_precision rem round rsqrt shift_left shift_right_arithmetic
    shift_right_logical sign sin sinh sqrt square tan tanh xor zeta
    """.split()

def _identity_tail(eqn, k, letters, new):
  del new
  if not _same_shape(eqn, k):
    return None
  return letters, [], -1. if eqn.name == 'neg' else 1., 0


_ELEMENTWISE_RULES = (
    *(Rule(name, **_ELEMENTWISE) for name in _PLAIN_ELEMENTWISE),
    Rule('neg', linear_in=_linear_in_any, leaf_letters=_identity_back(-1.),
         passes_cotangent=lambda eqn, k: -1., tail_step=_identity_tail,
         batch_axis=_elementwise_axis, elementwise=True),
    *(Rule(name, linear_in=_linear_in_any, leaf_letters=_identity_back(1.),
           tail_step=_identity_tail, batch_axis=_elementwise_axis,
           elementwise=True)
      for name in ('convert_element_type', 'copy')),
    *(Rule(name, linear_in=_linear_in_any, batch_axis=_elementwise_axis,
           tail_step=_elementwise_tail, elementwise=True)
      for name in ('real', 'imag', 'conj')),
)

# ---------------------------------------------------------------------------
# Sums: add, add_any, sub.
# ---------------------------------------------------------------------------

def _sum_sign(eqn: ir.Eqn, k: int) -> float:
  """`d(a - b)/db = -1`; every other input of a sum enters with `+1`."""
  return -1. if eqn.name == 'sub' and k == 1 else 1.


def _sum_back(eqn, k, out):
  """`v = in +- c` with a scalar constant `c`."""
  c = scalar_value(eqn.inputs[1 - k])
  if eqn.inputs[k].shape != eqn.outputs[0].shape or c is None:
    return None
  return out, _sum_sign(eqn, k)


def _sum_form(eqn: ir.Eqn, k: int, letters: Letters) -> FormParts:
  y = letters.many(len(eqn.outputs[0].shape))
  return y, (), broadcast_letters(eqn, y)[k], _sum_sign(eqn, k)


def _sum_tail(eqn, k, letters, new):
  del new
  return (letters, [], _sum_sign(eqn, k), 0) if _same_shape(eqn, k) else None


_SUM_RULES = tuple(
    Rule(name, linear_in=_linear_in_any, leaf_letters=_sum_back,
         jacobian_form=_sum_form, passes_cotangent=_sum_sign,
         tail_step=_sum_tail, batch_axis=_elementwise_axis, elementwise=True)
    for name in ('add', 'add_any', 'sub'))

# ---------------------------------------------------------------------------
# Products: mul, div.
# ---------------------------------------------------------------------------

def _scaling_back(eqn, k, out):
  """`v = c * in` or `in / c` with a scalar constant `c`."""
  c = scalar_value(eqn.inputs[1 - k])
  if eqn.inputs[k].shape != eqn.outputs[0].shape or c is None or (
      eqn.name == 'div' and c == 0):
    return None
  return out, c if eqn.name == 'mul' else 1 / c


def _product_form(eqn: ir.Eqn, k: int,
                  letters: Letters) -> Optional[FormParts]:
  """`d(a * b)/da = b`, `d(a / b)/da = 1 / b` (elementwise, broadcast)."""
  if eqn.name == 'div' and k == 1:
    return None
  y = letters.many(len(eqn.outputs[0].shape))
  ins = broadcast_letters(eqn, y)
  other = eqn.inputs[1 - k]
  other_letters = mask(ins[1 - k], other.shape)
  transform = jnp.reciprocal if eqn.name == 'div' else None
  factor = Factor(other, other_letters, transform, other_letters)
  return y, (factor,), ins[k], 1.


def _scaling_passes(eqn: ir.Eqn, k: int) -> Optional[float]:
  """A scaling by a constant (e.g. stax's `W_std / sqrt(fan_in)`)."""
  c = scalar_value(eqn.inputs[1 - k])
  if not c or (eqn.name == 'div' and k == 1):
    return None
  return c if eqn.name == 'mul' else 1 / c


def _product_tail(eqn, k, letters, new):
  if eqn.name == 'div' and k == 1:
    return _elementwise_tail(eqn, k, letters, new)
  if not _same_shape(eqn, k):
    return None
  other = eqn.inputs[1 - k]
  c = scalar_value(other)
  if c is not None and c != 0:
    return letters, [], c if eqn.name == 'mul' else 1 / c, 0
  other_letters = broadcast_letters(eqn, letters)[1 - k]
  transform = None if eqn.name == 'mul' else jnp.reciprocal
  return letters, [Factor(other, other_letters, transform)], 1., 0


_PRODUCT_RULES = (
    Rule('mul', linear_in=_linear_in_any, leaf_letters=_scaling_back,
         jacobian_form=_product_form, passes_cotangent=_scaling_passes,
         tail_step=_product_tail, batch_axis=_elementwise_axis,
         elementwise=True),
    Rule('div', linear_in=_linear_in_first, leaf_letters=_scaling_back,
         jacobian_form=_product_form, passes_cotangent=_scaling_passes,
         tail_step=_product_tail, batch_axis=_elementwise_axis,
         elementwise=True),
)

# ---------------------------------------------------------------------------
# select_n: linear in its cases, not in its predicate.
# ---------------------------------------------------------------------------

def _linear_in_cases(eqn: ir.Eqn, k: int) -> bool:
  """`select_n`: linear in its cases, not in its predicate."""
  del eqn
  return k >= 1


def _select_form(eqn: ir.Eqn, k: int, letters: Letters) -> Optional[FormParts]:
  """`d select_n(p, x_0, x_1, ...)/d x_j = (p == j)` (elementwise)."""
  if k < 1:
    return None
  y = letters.many(len(eqn.outputs[0].shape))
  ins = broadcast_letters(eqn, y)
  pred = eqn.inputs[0]
  dtype = eqn.outputs[0].dtype
  picks = lambda x: (x == (k - 1)).astype(dtype)
  return y, (Factor(pred, mask(ins[0], pred.shape), picks,
                    mask(ins[0], pred.shape)),), ins[k], 1.


_SELECT_RULES = (
    Rule('select_n', linear_in=_linear_in_cases, jacobian_form=_select_form,
         tail_step=_elementwise_tail, batch_axis=_elementwise_axis,
         elementwise=True),
)

# ---------------------------------------------------------------------------
# dot_general.
# ---------------------------------------------------------------------------

def dot_general_letters(eqn: ir.Eqn, k: int, operand: Sequence[Letter],
                        letters: Letters) -> tuple[list, list]:
  """Letters of the other input and of the output of a `dot_general`.

  Args:
    eqn: the `dot_general` equation.
    k: which input (0 or 1) has letters `operand`.
    operand: its letters.
    letters: fresh letters for the other input's remaining dimensions.

  Returns:
    `(other_letters, output_letters)`.
  """
  dims = params.dot_general_dimensions(eqn)
  mine, theirs = dims.of(k), dims.of(1 - k)
  other_atom = eqn.inputs[1 - k]
  unset = object()
  other: list[Any] = [unset] * len(other_atom.shape)
  for a, b in zip(mine[0] + mine[1], theirs[0] + theirs[1]):
    other[b] = operand[a]
  other = list(mask([letters.new() if letter is unset else letter
                     for letter in other], other_atom.shape))
  lhs, rhs = (operand, other) if k == 0 else (other, operand)
  lc, lb = dims.of(0)
  rc, rb = dims.of(1)
  free_l = [lhs[d] for d in range(len(lhs)) if d not in lc and d not in lb]
  free_r = [rhs[d] for d in range(len(rhs)) if d not in rc and d not in rb]
  return other, [lhs[d] for d in lb] + free_l + free_r


def _dot_general_form(eqn: ir.Eqn, k: int, letters: Letters) -> FormParts:
  operand = eqn.inputs[k]
  v = list(mask(letters.many(len(operand.shape)), operand.shape))
  other_letters, y = dot_general_letters(eqn, k, v, letters)
  factor = Factor(eqn.inputs[1 - k], tuple(other_letters),
                  atom_letters=tuple(other_letters))
  return y, (factor,), v, 1.


def _dot_general_tail(eqn, k, letters, new):
  other, out = dot_general_letters(eqn, k, letters, new)
  return out, [Factor(eqn.inputs[1 - k], tuple(other))], 1., 1


def _dot_general_axis(eqn, in_axes):
  dims = params.dot_general_dimensions(eqn)
  lc, lb = dims.of(0)
  rc, rb = dims.of(1)
  la, ra = in_axes
  lhs_free = [d for d in range(len(eqn.inputs[0].shape))
              if d not in lc and d not in lb]
  rhs_free = [d for d in range(len(eqn.inputs[1].shape))
              if d not in rc and d not in rb]
  if la is not None and ra is not None:
    # Both batched: only an elementwise pairing of examples is separable.
    require(la in lb and ra in rb and lb.index(la) == rb.index(ra))
    return [lb.index(la)]
  if la is not None:
    require(la not in lc)
    return [lb.index(la) if la in lb else len(lb) + lhs_free.index(la)]
  require(ra not in rc)
  return [rb.index(ra) if ra in rb else
          len(lb) + len(lhs_free) + rhs_free.index(ra)]


_DOT_RULES = (
    Rule('dot_general', linear_in=_linear_in_any,
         jacobian_form=_dot_general_form, tail_step=_dot_general_tail,
         batch_axis=_dot_general_axis),
)

# ---------------------------------------------------------------------------
# Convolutions: conv_general_dilated.
# ---------------------------------------------------------------------------

def _conv_form(eqn: ir.Eqn, k: int,
               letters: Letters) -> Optional[FormParts]:
  """`y = conv(x, W)` is `einsum(windows(x), W)` over the kernel's offsets."""
  conv = params.convolution(eqn)
  if k != 1 or conv.feature_group_count != 1 or conv.batch_group_count != 1:
    return None
  lhs, rhs = eqn.inputs
  out = eqn.outputs[0]
  y = letters.many(len(out.shape))
  feature = letters.new()
  offsets = letters.many(len(conv.rhs_spec) - 2)
  # Windows have the input's dimensions (spatial ones of the output's size),
  # then one dimension per kernel offset.
  x_letters: list[Any] = [None] * len(lhs.shape)
  x_letters[conv.lhs_spec[0]] = y[conv.out_spec[0]]
  x_letters[conv.lhs_spec[1]] = feature
  for i, d in enumerate(conv.lhs_spec[2:]):
    x_letters[d] = y[conv.out_spec[2 + i]]
  x_letters += offsets
  v: list[Any] = [None] * len(rhs.shape)
  v[conv.rhs_spec[0]], v[conv.rhs_spec[1]] = y[conv.out_spec[1]], feature
  for i, d in enumerate(conv.rhs_spec[2:]):
    v[d] = offsets[i]
  atom_letters = letters.many(len(lhs.shape))
  atom_letters[conv.lhs_spec[0]] = y[conv.out_spec[0]]
  filter_shape = tuple(rhs.shape[d] for d in conv.rhs_spec[2:])
  out_spatial = tuple(out.shape[d] for d in conv.out_spec[2:])
  x_shape = list(lhs.shape)
  for i, d in enumerate(conv.lhs_spec[2:]):
    x_shape[d] = out_spatial[i]
  x_shape += filter_shape
  windows = functools.partial(
      conv_windows, filter_shape=filter_shape, out_spatial=out_spatial,
      strides=conv.window_strides, padding=conv.padding,
      lhs_dilation=conv.lhs_dilation, rhs_dilation=conv.rhs_dilation,
      spatial=conv.lhs_spec[2:])
  factor = Factor(lhs, mask(x_letters, x_shape), windows,
                  mask(atom_letters, lhs.shape))
  return y, (factor,), v, 1.


def conv_windows(x: Array, filter_shape: Sequence[int],
                 out_spatial: Sequence[int], strides: Sequence[int],
                 padding: Sequence[tuple[int, int]],
                 lhs_dilation: Sequence[int], rhs_dilation: Sequence[int],
                 spatial: Sequence[int]) -> Array:
  """The input window of each output position, per kernel offset.

  `out[s] = sum_k xp[s * stride + k * rhs_dilation] W[k]`, where `xp` is the
  input dilated by `lhs_dilation` and padded. Strided slices of `xp` copy
  the windows exactly and cost no FLOPs (unlike a patches convolution).

  Example:
    >>> conv_windows(jnp.ones((1, 5, 2)), (3,), (3,), (1,), ((0, 0),), (1,),
    ...              (1,), (1,)).shape
    (1, 3, 2, 3)
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


def _conv_axis(eqn, in_axes):
  conv = params.convolution(eqn)
  require(in_axes[1] is None and in_axes[0] == conv.lhs_spec[0] and
          conv.batch_group_count == 1)
  return [conv.out_spec[0]]


_CONV_RULES = (
    Rule('conv_general_dilated', linear_in=_linear_in_any,
         jacobian_form=_conv_form, batch_axis=_conv_axis),
)

# ---------------------------------------------------------------------------
# Shape operations: transpose, broadcast_in_dim, reshape, squeeze.
# ---------------------------------------------------------------------------

def _transpose_back(eqn, k, out):
  new: list[Letter] = [None] * len(eqn.inputs[k].shape)
  for j, d in enumerate(params.transpose_permutation(eqn)):
    new[d] = out[j]
  return new, 1.


def _transpose_tail(eqn, k, letters, new):
  del k, new
  return [letters[d] for d in params.transpose_permutation(eqn)], [], 1., 0


def _transpose_axis(eqn, in_axes):
  return [list(params.transpose_permutation(eqn)).index(
      _batched(in_axes)[0][1])]


def _broadcast_back(eqn, k, out):
  shape, out_shape = eqn.inputs[k].shape, eqn.outputs[0].shape
  return [out[b] if shape[j] == out_shape[b] else None
          for j, b in enumerate(params.broadcast_dimensions(eqn))], 1.


def _broadcast_tail(eqn, k, letters, new):
  if len(eqn.inputs) != 1:
    return None
  v, w = eqn.inputs[k], eqn.outputs[0]
  out = list(mask(new.many(len(w.shape)), w.shape))
  for i, b in enumerate(params.broadcast_dimensions(eqn)):
    if v.shape[i] == w.shape[b]:
      out[b] = letters[i]
  return out, [], 1., 0


def _broadcast_axis(eqn, in_axes):
  require(len(eqn.inputs) == 1)
  a = _only_axis(in_axes)
  b = params.broadcast_dimensions(eqn)[a]
  require(eqn.inputs[0].shape[a] == eqn.outputs[0].shape[b])
  return [b]


def _unit_reshape_back(eqn, k, out):
  new = unit_reshape_letters(eqn.outputs[0].shape, eqn.inputs[k].shape, out)
  return None if new is None else (new, 1.)


def _unit_reshape_tail(eqn, k, letters, new):
  del new
  if len(eqn.inputs) != 1:
    return None
  out = unit_reshape_letters(eqn.inputs[k].shape, eqn.outputs[0].shape,
                             letters)
  return None if out is None else (out, [], 1., 0)


def _reshape_axis(eqn, in_axes):
  # The batch axis survives a reshape if it stays a whole axis: the sizes
  # before it multiply to the same number, and it keeps its size.
  require(params.reshape_dimensions(eqn) is None)
  in_shape, a = eqn.inputs[0].shape, _batched(in_axes)[0][1]
  before = math.prod(in_shape[:a])
  for b, size in enumerate(eqn.outputs[0].shape):
    if math.prod(eqn.outputs[0].shape[:b]) == before and size == in_shape[a]:
      return [b]
  raise NotSeparable('reshape')


def _squeeze_axis(eqn, in_axes):
  return [_dropping_axis(params.squeezed_dimensions(eqn),
                         _batched(in_axes)[0][1])]


_SHAPE_RULES = (
    Rule('transpose', linear_in=_linear_in_any, leaf_letters=_transpose_back,
         tail_step=_transpose_tail, batch_axis=_transpose_axis),
    Rule('broadcast_in_dim', linear_in=_linear_in_only_input,
         leaf_letters=_broadcast_back, tail_step=_broadcast_tail,
         batch_axis=_broadcast_axis),
    Rule('reshape', linear_in=_linear_in_only_input,
         leaf_letters=_unit_reshape_back, tail_step=_unit_reshape_tail,
         batch_axis=_reshape_axis),
    Rule('squeeze', linear_in=_linear_in_any, leaf_letters=_unit_reshape_back,
         tail_step=_unit_reshape_tail, batch_axis=_squeeze_axis),
)

# ---------------------------------------------------------------------------
# Reductions and cumulative operations.
# ---------------------------------------------------------------------------

def _reduce_sum_tail(eqn, k, letters, new):
  del k, new
  axes = params.reduction_axes(eqn)
  kept = [letter for d, letter in enumerate(letters) if d not in axes]
  return kept, [], 1., 0


def _reduction_axis(eqn, in_axes):
  a = _dropping_axis(params.reduction_axes(eqn), _only_axis(in_axes))
  return [a] * len(eqn.outputs)


# `cumsum`, ..., `splitting`: the batch axis is not their `axis`.
_not_along_axis_param = _keeps_axis(lambda eqn: (params.axis(eqn),))

_REDUCTION_RULES = (
    Rule('reduce_sum', linear_in=_linear_in_any, tail_step=_reduce_sum_tail,
         batch_axis=_reduction_axis),
    *(Rule(name, batch_axis=_reduction_axis) for name in (
        'reduce_max', 'reduce_min', 'reduce_prod', 'reduce_and', 'reduce_or',
        'reduce_xor', 'argmax', 'argmin')),
    Rule('cumsum', linear_in=_linear_in_any, batch_axis=_not_along_axis_param),
    *(Rule(name, batch_axis=_not_along_axis_param)
      for name in ('cumprod', 'cummax', 'cummin', 'cumlogsumexp')),
)

# ---------------------------------------------------------------------------
# Slices, padding, concatenations and stacks.
# ---------------------------------------------------------------------------

def _slice_region(eqn):
  s = params.slice_bounds(eqn)
  return (s.start, s.limit) if s.unit_strides() else None


def _slice_axis(eqn, in_axes):
  a = _only_axis(in_axes)
  s = params.slice_bounds(eqn)
  require(s.start[a] == 0 and s.limit[a] == eqn.inputs[0].shape[a] and
          (s.strides is None or s.strides[a] == 1))
  return [a]


def _pad_axis(eqn, in_axes):
  require(in_axes[1] is None)
  a = in_axes[0]
  require(params.padding_config(eqn)[a] == (0, 0, 0))
  return [a]


def _stack_axis(eqn, in_axes):
  a = _common_axis(in_axes)
  return [a + 1 if params.axis(eqn) <= a else a]


_rev_axis = _keeps_axis(params.reversed_dimensions)
_concatenate_axis = _keeps_axis(
    lambda eqn: (params.concatenate_dimension(eqn),), _common_axis)

_SLICING_RULES = (
    Rule('slice', linear_in=_linear_in_any, leaf_region=_slice_region,
         batch_axis=_slice_axis),
    Rule('rev', linear_in=_linear_in_any, batch_axis=_rev_axis),
    Rule('pad', linear_in=_linear_in_first, batch_axis=_pad_axis),
    Rule('concatenate', linear_in=_linear_in_any,
         batch_axis=_concatenate_axis),
    Rule('stack', batch_axis=_stack_axis),
    Rule('split', batch_axis=_not_along_axis_param),
    Rule('dynamic_slice', linear_in=_linear_in_first),
    Rule('gather', linear_in=_linear_in_first),
)

# ---------------------------------------------------------------------------
# Windows: reduce_window_*.
# ---------------------------------------------------------------------------

def _reduce_window_axis(eqn, in_axes):
  a = _common_axis(in_axes)
  w = params.reduce_window(eqn)
  require(w.window_dimensions[a] == 1 and w.window_strides[a] == 1 and
          w.padding[a] == (0, 0) and w.base_dilation[a] == 1 and
          w.window_dilation[a] == 1)
  # A generic `reduce_window` also takes init values, which must be shared.
  require(all(i < len(eqn.outputs) for i, _ in _batched(in_axes)))
  return [a] * len(eqn.outputs)


_WINDOW_RULES = (
    Rule('reduce_window_sum', linear_in=_linear_in_only_input,
         batch_axis=_reduce_window_axis),
    *(Rule(name, batch_axis=_reduce_window_axis) for name in (
        'reduce_window_max', 'reduce_window_min', 'reduce_window')),
)

# ---------------------------------------------------------------------------
# Calls and loops: flattened (jit, scan) or kept whole (custom).
# ---------------------------------------------------------------------------

# Longest `scan` unrolled: longer loops stay whole (a generic equation).
MAX_UNROLLED_SCAN = 32


def _inline_call(eqn_params: dict, ins: Sequence[ir.Atom],
                 inline: Inline) -> Optional[list[ir.Atom]]:
  """A call that only groups equations is replaced by its body."""
  body = params.call_body(eqn_params)
  if body is None or len(body[0].invars) != len(ins):
    return None
  return inline(body[0], body[1], ins)


def _unroll_scan(eqn_params: dict, ins: Sequence[ir.Atom],
                 inline: Inline) -> Optional[list[ir.Atom]]:
  """A short `scan`'s steps, one inlined body per step.

  `scan` carries `carry` through `length` steps, each reading slice `t` of
  the stacked inputs `xs` and writing slice `t` of the stacked outputs. Each
  step's use of its slice of stacked parameters (`stax.repeat`) is then seen
  like a layer's (a chain starting with a `slice`, `leaf_region`).
  """
  scan = params.scan(eqn_params)
  if not 0 < scan.length <= MAX_UNROLLED_SCAN:
    return None
  n_consts, n_carry, body = scan.num_consts, scan.num_carry, scan.body
  consts = list(ins[:n_consts])
  carry = list(ins[n_consts:n_consts + n_carry])
  xs = ins[n_consts + n_carry:]
  steps = range(scan.length)
  ys: dict[int, list[ir.Atom]] = {}
  for t in (reversed(steps) if scan.reverse else steps):
    x_t = [_traced(lambda a, t=t: lax.index_in_dim(a, t, keepdims=False),
                   [x], inline) for x in xs]
    outs = inline(body.jaxpr, body.consts, consts + carry + x_t)
    carry, ys[t] = outs[:n_carry], outs[n_carry:]
  stacked = [_traced(lambda *a: jnp.stack(a), [ys[t][k] for t in steps],
                     inline)
             for k in range(len(body.jaxpr.outvars) - n_carry)]
  return carry + stacked


def _traced(fn: Callable[..., Any], atoms: Sequence[ir.Atom],
            inline: Inline) -> ir.Atom:
  """Inlines the equations of `fn(*atoms)` (one output)."""
  avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in atoms]
  closed = jax.make_jaxpr(fn)(*avals)
  out, = inline(closed.jaxpr, closed.consts, atoms)
  return out


_CALL_RULES = (
    *(Rule(name, call=INLINED, expand=_inline_call)
      for name in ('jit', 'closed_call', 'remat2')),
    *(Rule(name, call=CUSTOM, tail_step=_elementwise_tail)
      for name in ('custom_jvp_call', 'custom_vjp_call')),
    Rule('scan', expand=_unroll_scan),
    Rule('optimization_barrier', batch_axis=_same_axes),
)

# ---------------------------------------------------------------------------
# Values that depend on shapes only (iota, random bits).
# ---------------------------------------------------------------------------

_SHAPE_DEPENDENT_RULES = tuple(
    Rule(name, shape_dependent=True)
    for name in ('iota', 'random_bits', 'rng_bit_generator', 'rng_uniform'))

# ---------------------------------------------------------------------------
# The table.
# ---------------------------------------------------------------------------

_TABLE = (*_ELEMENTWISE_RULES, *_SUM_RULES, *_PRODUCT_RULES, *_SELECT_RULES,
          *_DOT_RULES, *_CONV_RULES, *_SHAPE_RULES, *_REDUCTION_RULES,
          *_SLICING_RULES, *_WINDOW_RULES, *_CALL_RULES,
          *_SHAPE_DEPENDENT_RULES)

RULES: dict[str, Rule] = {r.name: r for r in _TABLE}
assert len(RULES) == len(_TABLE), 'a primitive has two records'
