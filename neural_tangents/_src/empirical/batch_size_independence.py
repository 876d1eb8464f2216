"""Whether `f` is the same program at every batch size.

AUTO may compute the kernel of a whole-batch `f` per example only if `f` on
a batch of one is `f` on the batch up to the batch size: no literal,
constant, parameter or branch depends on it (e.g. `x / x.shape[0]`). The
check traces `f` at the batch size N, at a probe size P and at 1, and walks
the three jaxprs together: the same primitives with the same params and
literals, the same data flow, the same constants, and avals equal except
for dimensions (and integer params) that are N, P and 1 respectively, the
batch axes. Only the public `jax.extend` API is read.
"""
from typing import Any, Sequence

import jax
from jax.extend import core as jax_core
import numpy as np

from neural_tangents._src.empirical import problem as problem_lib

# Batch sizes to probe with: primes, so that they differ from N and 1 and
# from every other dimension of a typical program.
_PROBE_SIZES = (1009, 1013)


def batch_of_one_agrees(side: problem_lib.Side, params: list,
                        data: list) -> bool:
  """Whether `side.fn` is the same program at batch sizes N and 1.

  Any difference makes the check fail, which is safe: the per-example
  formulation is then not used.

  Example:
    >>> problem, params, data1, _ = problem_lib.setup(
    ...     lambda p, x: jnp.tanh(x @ p), x1, None, jnp.ones((4, 2)), {},
    ...     (-1,), (), 0)
    >>> batch_of_one_agrees(problem.sides[0], params, data1)
    True
  """
  n = side.n
  if n < 2 or any(axis not in (None, 0) for axis in side.data_axes):
    return False
  param_avals = [problem_lib.abstract(p) for p in params]
  data_avals = [problem_lib.abstract(d) for d in data]

  def trace(size: int) -> jax_core.ClosedJaxpr:
    batch = [aval if axis is None else
             jax.ShapeDtypeStruct((size,) + aval.shape[1:], aval.dtype)
             for aval, axis in zip(data_avals, side.data_axes)]
    return jax.make_jaxpr(side.fn)(param_avals, batch)

  probe = next(size for size in _PROBE_SIZES if size != n)
  try:
    jaxprs = (trace(n), trace(probe), trace(1))
    return same_program(jaxprs, (n, probe, 1))
  except Exception:  # pylint: disable=broad-except
    return False  # e.g. a constant closed over a tracer.


def same_program(jaxprs: Sequence[jax_core.ClosedJaxpr],
                 sizes: Sequence[int]) -> bool:
  """Whether closed jaxprs traced at batch sizes `sizes` are one program.

  Example:
    >>> f = lambda x: jnp.tanh(x) * 2.
    >>> same_program([jax.make_jaxpr(f)(jnp.ones((n, 3))) for n in (4, 7, 1)],
    ...              (4, 7, 1))
    True
  """
  return _same_closed_jaxprs(tuple(jaxprs), tuple(sizes))


def _same_closed_jaxprs(jaxprs: tuple, sizes: tuple) -> bool:
  consts = [jaxpr.consts for jaxpr in jaxprs]
  if any(len(c) != len(consts[0]) for c in consts):
    return False
  for values in zip(*consts):
    if not _equal_values(values):
      return False
  return _same_jaxprs(tuple(jaxpr.jaxpr for jaxpr in jaxprs), sizes)


def _same_jaxprs(jaxprs: tuple, sizes: tuple) -> bool:
  """Same equations, data flow and avals (up to the batch size)."""
  first = jaxprs[0]
  if any(len(j.constvars) != len(first.constvars) or
         len(j.invars) != len(first.invars) or
         len(j.outvars) != len(first.outvars) or
         len(j.eqns) != len(first.eqns) for j in jaxprs):
    return False
  numbers = [{} for _ in jaxprs]  # Each variable's definition order.

  def define(variables: tuple) -> bool:
    for number, var in zip(numbers, variables):
      number[var] = len(number)
    return _same_avals(tuple(var.aval for var in variables), sizes)

  def same_uses(atoms: tuple) -> bool:
    if all(isinstance(atom, jax_core.Literal) for atom in atoms):
      return (_equal_values(tuple(atom.val for atom in atoms)) and
              _same_avals(tuple(atom.aval for atom in atoms), sizes))
    if any(isinstance(atom, jax_core.Literal) for atom in atoms):
      return False
    return len({number.get(atom) for number, atom in zip(numbers, atoms)}
               ) == 1 and numbers[0].get(atoms[0]) is not None

  for variables in zip(*(j.constvars + j.invars for j in jaxprs)):
    if not define(variables):
      return False
  for eqns in zip(*(j.eqns for j in jaxprs)):
    if len({eqn.primitive for eqn in eqns}) != 1:
      return False
    if any(len(eqn.invars) != len(eqns[0].invars) or
           len(eqn.outvars) != len(eqns[0].outvars) for eqn in eqns):
      return False
    if not all(same_uses(atoms) for atoms in zip(*(e.invars for e in eqns))):
      return False
    if not _same_params(tuple(eqn.params for eqn in eqns), sizes):
      return False
    for variables in zip(*(eqn.outvars for eqn in eqns)):
      if not define(variables):
        return False
  return all(same_uses(atoms) for atoms in zip(*(j.outvars for j in jaxprs)))


def _same_avals(avals: tuple, sizes: tuple) -> bool:
  """Same dtype and rank, each dimension equal or the batch size."""
  first = avals[0]
  if any(type(aval) is not type(first) for aval in avals):
    return False
  if not hasattr(first, 'shape'):
    return all(aval == first for aval in avals)
  if any(aval.dtype != first.dtype or
         getattr(aval, 'weak_type', None) != getattr(first, 'weak_type', None)
         for aval in avals):
    return False
  return _same_ints_or_batch(tuple(tuple(aval.shape) for aval in avals),
                             sizes)


def _same_ints_or_batch(tuples: tuple, sizes: tuple) -> bool:
  if any(len(t) != len(tuples[0]) for t in tuples):
    return False
  return all(len(set(dims)) == 1 or dims == sizes for dims in zip(*tuples))


def _same_params(params: tuple, sizes: tuple) -> bool:
  if any(p.keys() != params[0].keys() for p in params):
    return False
  return all(_same_param(tuple(p[name] for p in params), sizes)
             for name in params[0])


def _same_param(values: tuple, sizes: tuple) -> bool:
  """Equal params; ints (and ints in tuples) may be the batch size."""
  first = values[0]
  if any(type(value) is not type(first) for value in values):
    return False
  if isinstance(first, jax_core.ClosedJaxpr):
    return _same_closed_jaxprs(values, sizes)
  if isinstance(first, jax_core.Jaxpr):
    return _same_jaxprs(values, sizes)
  if isinstance(first, (tuple, list)):
    return (all(len(value) == len(first) for value in values) and
            all(_same_param(items, sizes) for items in zip(*values)))
  if isinstance(first, (int, np.integer)) and not isinstance(first, bool):
    return len(set(values)) == 1 or tuple(values) == sizes
  if isinstance(first, (np.ndarray, jax.Array)):
    return _equal_values(values)
  if ((callable(first) or callable(getattr(first, 'f', None))) and
      not isinstance(first, type)):
    # e.g. the rules of a custom_jvp: fresh (wrapped) functions at each
    # trace, compared by name as the printed jaxpr shows them.
    return len({_function_name(value) for value in values}) == 1
  try:
    return all(bool(value == first) for value in values)
  except Exception:  # pylint: disable=broad-except
    return False


def _function_name(value: Any) -> Any:
  for function in (value, getattr(value, 'f', None)):
    name = getattr(function, '__name__', None)
    if name is not None:
      return name
  return type(value)


def _equal_values(values: Sequence[Any]) -> bool:
  arrays = [np.asarray(value) for value in values]
  return all(a.shape == arrays[0].shape and a.dtype == arrays[0].dtype and
             np.array_equal(a, arrays[0]) for a in arrays)
