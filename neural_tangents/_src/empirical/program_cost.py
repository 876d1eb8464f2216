"""FLOPs and bytes of a traced program, counted as XLA's cost analysis would.

AUTO ranks its candidates by `FLOPs + FLOPS_PER_BYTE * bytes` (`auto`).
XLA's cost analysis of the lowered program gives both
(`jax.jit(fn).trace(*args).lower().cost_analysis()`), but lowering and
analysing is most of what choosing costs on a first call: on the CNN of
`benchmarks/first_call.py`, 0.039 s + 0.022 s for structured derivatives
and 0.019 s + 0.012 s for the Jacobian contraction, against 0.003 s to
count both jaxprs here. `program_cost` counts the same quantities on the
jaxpr that tracing already made, by the rules of XLA's `HloCostAnalysis` on
the unoptimized module that JAX lowers a jaxpr to:

* FLOPs: `dot_general` `2 M N K` (multiply-adds twice); a convolution
  `2 B F_out F_in prod_d T_d`, with `T_d` the (output position, kernel tap)
  pairs of spatial dimension `d` that read the dilated input rather than
  its padding (XLA counts those only); a reduction one per input element
  not in the output; other elementwise ops one per output element, but
  transcendental ones (`exp`, `tanh`, `erf`, ...) none (XLA counts them
  apart); data movement none.
* Bytes: every operand and result, except where XLA counts less: a slice
  or a gather the region it reads (`2 x` its result, and a gather its
  indices); an in-place `dynamic_update_slice` its update (`2 x`); a
  scatter its updates (`3 x`, and the indices; a combining scatter also
  a FLOP per update); transposes and `split` nothing. An operand of an
  elementwise op with another shape is broadcast first: `2 x` a
  result-sized copy more (and `4 x` its own bytes if it has size-1 axes
  rather than none). `square` reads its operand twice (`x * x`), and
  `integer_pow` squares repeatedly (`x^4 = (x^2)^2`), dividing 1 by the
  result for a negative power.
* What MLIR's canonicalizer removes before the analysis is not counted:
  `x * 1`, `x + 0`, `x - 0`, `x / 1` and same-type conversions, reshapes of
  reshapes back to a shape already seen, and equations whose results are
  never used. Repeated equations are counted each time, as XLA does.
* Calls (`jit`, custom derivative rules, `custom_vmap`) count their body
  once per call; loops their body once (as XLA, whatever the trip count);
  a conditional its costliest branch.

Measured against XLA's own analysis (`tests/empirical/program_cost_test.py`
and RESULTS.md, First calls): FLOPs within 0.1% and bytes 6-19% above on
the candidates of the FCN and CNN of `benchmarks/first_call.py`; on the 22
workloads of `entk_bench.py` and `benchmarks/empirical_ntk.py` (both
formulations), AUTO picks the same candidate with either count.
"""
import math
from typing import Any, Optional, Sequence

from jax.extend import core as jex_core
import numpy as np

# Elementwise primitives that XLA counts as transcendentals, not FLOPs.
_TRANSCENDENTAL = frozenset({
    'exp', 'exp2', 'log', 'log1p', 'expm1', 'tanh', 'logistic', 'sin', 'cos',
    'tan', 'asin', 'acos', 'atan', 'atan2', 'sinh', 'cosh', 'asinh', 'acosh',
    'atanh', 'erf', 'erfc', 'erf_inv', 'sqrt', 'rsqrt', 'cbrt', 'pow',
    'lgamma', 'digamma'})
# Data movement: no FLOPs; bytes of operands and result unless below.
_MOVES = frozenset({
    'broadcast_in_dim', 'concatenate', 'pad', 'rev', 'copy', 'copy_p',
    'reduce_precision',
    'reshape', 'squeeze', 'expand_dims', 'select_and_gather_add'})
_RESHAPES = frozenset({'reshape', 'squeeze', 'expand_dims'})
_COMBINING = frozenset({
    'scatter', 'scatter-add', 'scatter_add', 'scatter-mul', 'scatter_mul',
    'scatter-min', 'scatter_min', 'scatter-max', 'scatter_max', 'reduce',
    'reduce_window', 'select_and_scatter'})
# `op(x, literal)` that MLIR folds to `x`: (primitive, literal, its position
# or None for either).
_IDENTITIES = (('mul', 1., None), ('add', 0., None), ('sub', 0., 1),
               ('div', 1., 1))


def _is_literal(v: Any) -> bool:
  return isinstance(v, jex_core.Literal)


def _nbytes(aval) -> float:
  return float(math.prod(aval.shape) * np.dtype(aval.dtype).itemsize)


def _size(aval) -> float:
  return float(math.prod(aval.shape))


def _bodies(eqn_params: dict[str, Any]) -> list[Any]:
  """The jaxprs among an equation's parameters, in order."""
  found = []
  for value in eqn_params.values():
    for v in value if isinstance(value, (tuple, list)) else (value,):
      if isinstance(v, jex_core.ClosedJaxpr):
        found.append(v.jaxpr)
      elif isinstance(v, jex_core.Jaxpr):
        found.append(v)
  return found


def _identity_operand(eqn, invars: Sequence[Any]) -> Optional[Any]:
  """The operand `eqn` returns unchanged (`x * 1`, ...), if any."""
  out = eqn.outvars[0].aval
  name = eqn.primitive.name
  if name == 'convert_element_type':
    x = invars[0]
    same = not _is_literal(x) and x.aval.dtype == out.dtype
    return x if same else None
  for primitive, value, position in _IDENTITIES:
    if name != primitive or len(invars) != 2:
      continue
    for i in ((0, 1) if position is None else (position,)):
      literal, other = invars[i], invars[1 - i]
      if (_is_literal(literal) and np.ndim(literal.val) == 0 and
          float(literal.val) == value and not _is_literal(other) and
          other.aval.shape == out.shape and other.aval.dtype == out.dtype):
        return other
  return None


def _canonical(jaxpr) -> tuple[list[tuple[Any, list[Any]]], list[Any]]:
  """`([(eqn, its operands)], outvars)`, identities and reshape chains
  folded: a reshape reads the value its chain of reshapes started from, and
  one back to that value's shape is that value."""
  alias, source = {}, {}
  resolve = lambda v: v if _is_literal(v) else alias.get(v, v)
  kept = []
  for eqn in jaxpr.eqns:
    invars = [resolve(v) for v in eqn.invars]
    same = _identity_operand(eqn, invars)
    if same is not None:
      alias[eqn.outvars[0]] = same
      continue
    if eqn.primitive.name in _RESHAPES and not _is_literal(invars[0]):
      start = source.get(invars[0], invars[0])
      if start.aval.shape == eqn.outvars[0].aval.shape:
        alias[eqn.outvars[0]] = start
        continue
      source[eqn.outvars[0]] = start
      invars = [start] + invars[1:]
    kept.append((eqn, invars))
  return kept, [resolve(v) for v in jaxpr.outvars]


def _live(jaxpr, live_out: Sequence[bool]
          ) -> tuple[list[tuple[Any, list[Any]]], set[Any]]:
  """The canonical equations that the live outputs need, and live values."""
  eqns, outvars = _canonical(jaxpr)
  live = {v for v, needed in zip(outvars, live_out)
          if needed and not _is_literal(v)}
  kept = []
  for eqn, invars in reversed(eqns):
    if eqn.effects or any(v in live for v in eqn.outvars):
      kept.append((eqn, invars))
      live.update(v for v in invars if not _is_literal(v))
  return kept[::-1], live


def _valid_taps(n_in: int, n_out: int, taps: int, stride: int, low: int,
                lhs_dilation: int, rhs_dilation: int) -> int:
  """(Output position, tap) pairs of one spatial dimension that read the
  dilated input (`n_in` entries, `lhs_dilation` apart), not its padding."""
  at = (np.arange(n_out)[:, None] * stride +
        np.arange(taps)[None, :] * rhs_dilation - low)
  inside = (at >= 0) & (at <= (n_in - 1) * lhs_dilation)
  return int(np.sum(inside & (at % lhs_dilation == 0)))


def _convolution_flops(eqn, invars: Sequence[Any]) -> float:
  lhs, rhs = invars[0].aval.shape, invars[1].aval.shape
  out = eqn.outvars[0].aval.shape
  p = eqn.params
  spec = p['dimension_numbers']
  # Batch x output features x input features per group.
  products = float(out[spec.out_spec[0]] * out[spec.out_spec[1]] *
                   rhs[spec.rhs_spec[1]])
  for i, (l, r, o) in enumerate(zip(spec.lhs_spec[2:], spec.rhs_spec[2:],
                                    spec.out_spec[2:])):
    products *= _valid_taps(lhs[l], out[o], rhs[r], p['window_strides'][i],
                            p['padding'][i][0], p['lhs_dilation'][i],
                            p['rhs_dilation'][i])
  return 2. * products


def _primitive_cost(eqn, invars: Sequence[Any]) -> tuple[float, float]:
  """FLOPs and bytes of one equation without a body."""
  name = eqn.primitive.name
  ins = [v.aval for v in invars]
  outs = [v.aval for v in eqn.outvars]
  nbytes = sum(map(_nbytes, ins)) + sum(map(_nbytes, outs))
  if name == 'dot_general':
    (contracting, _), _ = eqn.params['dimension_numbers']
    return 2. * _size(outs[0]) * math.prod(
        ins[0].shape[d] for d in contracting), nbytes
  if name == 'conv_general_dilated':
    return _convolution_flops(eqn, invars), nbytes
  if name.startswith('reduce_') or name in ('argmax', 'argmin'):
    return _size(ins[0]) - _size(outs[0]), nbytes
  if name in ('transpose', 'split'):
    return 0., 0.
  if name == 'iota':
    return 0., _nbytes(outs[0])
  if name == 'dynamic_update_slice':
    return 0., 2. * _nbytes(ins[1])
  if name in ('slice', 'dynamic_slice'):
    return 0., 2. * _nbytes(outs[0])
  if name == 'gather':  # Reads what it returns, and the indices.
    return 0., 2. * _nbytes(outs[0]) + _nbytes(ins[1])
  if name.startswith('scatter'):  # In place: the updated region, twice.
    combines = name != 'scatter'
    return (_size(ins[2]) if combines else 0.,
            3. * _nbytes(ins[2]) + _nbytes(ins[1]))
  if name in _MOVES or not outs:
    return 0., nbytes
  # Elementwise: operands of another shape are broadcast first.
  out = outs[0]
  for aval in ins:
    if aval.shape != out.shape:
      nbytes += 2. * _size(out) * np.dtype(aval.dtype).itemsize
      if aval.shape:  # Size-1 axes: reshaped, then broadcast.
        nbytes += 4. * _nbytes(aval)
  products = 1.
  if name == 'square':
    nbytes += _nbytes(out)
  elif name == 'integer_pow':  # Repeated squaring, then `1 / x` if y < 0.
    y = int(eqn.params['y'])
    products = max(abs(y).bit_length() + bin(abs(y)).count('1') - 2, 0)
    nbytes = 3. * _nbytes(out) * products
    if y < 0:  # Dividing the broadcast scalar 1.
      products += 1
      nbytes += 4. * _nbytes(out) + np.dtype(out.dtype).itemsize
  flops = 0. if name in _TRANSCENDENTAL else _size(out) * products
  return flops, nbytes


def program_cost(jaxpr, live_out: Optional[Sequence[bool]] = None
                 ) -> tuple[float, float]:
  """`(FLOPs, bytes accessed)` of `jaxpr` as XLA's cost analysis of its
  lowering counts them (see the module docstring for the rules).

  Args:
    jaxpr: a `jax.extend.core.Jaxpr` (`closed_jaxpr.jaxpr`).
    live_out: which outputs are used (default: all); what only unused
      outputs need is not counted.

  Returns:
    `(flops, bytes_accessed)`.

  Example:
    >>> import jax
    >>> closed = jax.make_jaxpr(lambda a, b: a @ b)(
    ...     jnp.ones((2, 3), jnp.float32), jnp.ones((3, 4), jnp.float32))
    >>> program_cost(closed.jaxpr)  # 2 * 2 * 4 * 3; (6 + 12 + 8) * 4 bytes.
    (48.0, 104.0)
  """
  if live_out is None:
    live_out = [True] * len(jaxpr.outvars)
  eqns, live = _live(jaxpr, live_out)
  flops = nbytes = 0.
  for eqn, invars in eqns:
    name = eqn.primitive.name
    # A scatter's or reduction's jaxpr combines two elements: not a body.
    bodies = [] if name in _COMBINING else _bodies(eqn.params)
    if not bodies:
      f, b = _primitive_cost(eqn, invars)
    elif name == 'cond':
      f, b = max(program_cost(body) for body in bodies)
    elif name in ('while', 'scan'):
      costs = [program_cost(body) for body in bodies]
      f, b = sum(c[0] for c in costs), sum(c[1] for c in costs)
    elif len(bodies[0].outvars) == len(eqn.outvars):
      f, b = program_cost(bodies[0], [v in live for v in eqn.outvars])
    else:
      f, b = program_cost(bodies[0])
    flops += f
    nbytes += b
  return flops, nbytes
