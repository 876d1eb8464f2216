"""One compiled program per input signature for functions called unjitted.

An analytic `kernel_fn` is hundreds of small array operations (covariance
contractions, the arc-cosine formulas, the exact power-of-2 rescalings that
keep correlations scale-free). Called outside `jax.jit`, JAX dispatches, and
the first time compiles, each of them separately: ~1,900 tiny XLA programs
for a 5-layer network. `compile_per_signature(fn)` instead traces the whole
call once per *signature* and compiles it as one program:

  signature = (treedef of (args, kwargs),
               for each array leaf: shape, dtype, weak type, kind, and which
                 earlier leaf it is (`x2 is x1` stays an identity),
               for each other leaf: its type and value (static: `get`,
                 `diagonal_batch`, `mask_constant`, ...),
               jax_enable_x64),

so a first call costs one trace and one compilation, and later calls with the
same signature one dispatch. The result is the same function:

* called with any JAX tracer among its arguments (inside the user's `jit`,
  `vmap`, `grad`), it is called through, unchanged;
* with an argument that is not hashable (as a static value), it runs eagerly;
* if tracing needs a concrete value (a `ConcretizationTypeError` or one of
  its kin), the signature is remembered as eager-only and the call reruns
  eagerly, so value-dependent checks raise what they raise eagerly;
* a program of more than `MAX_EQUATIONS` equations (hundreds of unfolded
  layers) runs eagerly too, since op-by-op dispatch reuses small programs;
* any other exception of the trace (a `ValueError` naming a bad argument) is
  raised as is;
* output leaves that are not arrays (`shape1`, `None`) are returned as
  traced, not turned into arrays.

Python side effects of `fn` (prints, warnings) happen when it is traced, i.e.
on the first call of each signature, not on every call.

Example:
  >>> import jax.numpy as jnp
  >>> calls = []
  >>> def f(x, scale=1.):
  ...   calls.append(1)  # Runs when traced.
  ...   return jnp.sin(x) * scale
  >>> g = compile_per_signature(f)
  >>> x = jnp.ones(3)
  >>> bool(jnp.all(g(x) == g(x))), len(calls)
  (True, 1)
"""
import collections
import functools
import os
from typing import Any, Callable, Optional

import jax
import numpy as np

# Errors of a trace that needed a concrete value; the call is rerun eagerly.
CONCRETIZATION_ERRORS = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerBoolConversionError,
    jax.errors.TracerArrayConversionError,
    jax.errors.TracerIntegerConversionError,
    jax.errors.NonConcreteBooleanIndexError,
)
# Signatures remembered per function (least recently used dropped).
MAX_SIGNATURES = 32
# Programs of more equations than this (an unfolded `serial` of hundreds of
# layers) run eagerly: their compilation would cost more than op-by-op
# dispatch, whose small programs are compiled once per shape and shared.
MAX_EQUATIONS = 5000
# `NT_COMPILE_UNJITTED_CALLS=0` in the environment turns compilation per
# signature off (every unjitted call op by op, as before).
ENABLED = os.environ.get('NT_COMPILE_UNJITTED_CALLS', '1') != '0'

_EAGER = object()  # A signature that needs concrete values.
# JAX's message for a `jit` with `compiler_options` staged into another.
_NESTED_OPTIONS = 'can only be passed to top-level'


def _array_spec(leaf: Any) -> Optional[tuple[Any, ...]]:
  """`(kind, shape, dtype, weak_type)` of a concrete array leaf, else None."""
  if isinstance(leaf, jax.core.Tracer):
    raise _Traced()
  if isinstance(leaf, np.ma.MaskedArray):  # Converted eagerly by the layers.
    raise _Unhashable()
  if isinstance(leaf, jax.Array):
    return ('jax', leaf.shape, leaf.dtype, leaf.weak_type)
  if isinstance(leaf, np.ndarray):
    return ('numpy', leaf.shape, leaf.dtype)
  return None


# Keyword arguments whose values the layers check eagerly (`Aggregate`'s
# `pattern`: edges within the node count, equal pairs): calls with them run
# eagerly, where the checks raise.
VALUE_CHECKED_KEYWORDS = ('pattern',)


class _Traced(Exception):
  """Raised while reading a signature: an argument is a tracer."""


class _TooLarge(Exception):
  """Raised on a first call: the program has too many equations."""


class _Unhashable(Exception):
  """Raised while reading a signature: a static argument is unhashable."""


def signature(args: tuple[Any, ...], kwargs: dict[str, Any]
              ) -> tuple[Any, list[Any]]:
  """`(key, arrays)`: the hashable key of a call and its distinct arrays.

  Raises:
    _Traced: an argument is a tracer.
    _Unhashable: a non-array leaf cannot be hashed.
  """
  if any(name in kwargs for name in VALUE_CHECKED_KEYWORDS):
    raise _Unhashable()  # Checked by value (e.g. edges): run eagerly.
  leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
  arrays, index_of, specs = [], {}, []
  for leaf in leaves:
    spec = _array_spec(leaf)
    if spec is None:
      try:
        hash(leaf)
      except TypeError:
        raise _Unhashable() from None
      if isinstance(leaf, (float, np.floating)) and np.isnan(leaf):
        # NaN != NaN: one key for every NaN (e.g. `mask_constant=np.nan`).
        specs.append(('nan', type(leaf)))
      else:
        specs.append(('static', type(leaf), leaf))
      continue
    index = index_of.get(id(leaf))
    if index is None:
      index = index_of[id(leaf)] = len(arrays)
      arrays.append(leaf)
    specs.append(('array', index) + spec)
  key = (treedef, tuple(specs), bool(jax.config.jax_enable_x64))
  return key, arrays


class _Program:
  """The jitted call of one signature; it remembers its static outputs."""

  def __init__(self, fn: Callable[..., Any], key: Any,
               compiler_options: Optional[dict[str, Any]] = None):
    treedef, specs, _ = key
    self._fn, self._treedef, self._specs = fn, treedef, specs
    self._out = None  # (treedef, static leaves or None for arrays)
    self._jitted = jax.jit(self._traced, compiler_options=compiler_options)
    # Inside another trace (the layers close over a tracer, or concrete
    # inputs are passed inside the user's `jit`), the program is staged into
    # the outer one, which refuses compiler options of its own.
    self._nested = (self._jitted if compiler_options is None else
                    jax.jit(self._traced))

  def _traced(self, arrays: list[Any]) -> list[Any]:
    leaves = [arrays[s[1]] if s[0] == 'array' else
              s[1]('nan') if s[0] == 'nan' else s[2] for s in self._specs]
    args, kwargs = jax.tree_util.tree_unflatten(self._treedef, leaves)
    out_leaves, out_treedef = jax.tree_util.tree_flatten(
        self._fn(*args, **kwargs))
    dynamic = [isinstance(leaf, jax.Array) for leaf in out_leaves]
    self._out = (out_treedef, [None if d else leaf
                               for d, leaf in zip(dynamic, out_leaves)])
    return [leaf for d, leaf in zip(dynamic, out_leaves) if d]

  def small_enough(self, arrays: list[Any]) -> bool:
    """Traces the program (the trace is reused by the call): whether it has
    at most `MAX_EQUATIONS` equations."""
    return len(self._jitted.trace(arrays).jaxpr.eqns) <= MAX_EQUATIONS

  def __call__(self, arrays: list[Any]) -> Any:
    try:
      out_arrays = self._jitted(arrays)
    except ValueError as e:
      if self._nested is self._jitted or _NESTED_OPTIONS not in str(e):
        raise
      out_arrays = self._nested(arrays)
    out_arrays = iter(out_arrays)
    treedef, statics = self._out
    return jax.tree_util.tree_unflatten(
        treedef, [next(out_arrays) if s is None else s for s in statics])


def compile_per_signature(
    fn: Callable[..., Any],
    compiler_options: Optional[Callable[..., Optional[dict[str, Any]]]] = None
) -> Callable[..., Any]:
  """`fn`, compiled as one XLA program per input signature when unjitted.

  See the module docstring for the signature and the fallbacks. The returned
  function has `fn`'s name, docstring and signature (`functools.wraps`).

  Args:
    fn: a function of arrays and static (hashable) arguments, returning a
      pytree; it may raise for bad arguments.
    compiler_options: called as `compiler_options(*args, **kwargs)` once per
      new signature, the XLA compiler options of its program (`None` for
      the defaults); e.g. a lower optimization level for small inputs.

  Returns:
    The function, with a `cache_clear()` attribute.
  """
  # Held by an object, not a dict in the closure: a store's fingerprint of
  # the function (`batching.store.fingerprint_of`) describes the dicts a
  # function closes over, and the programs compiled so far are not what the
  # function computes.
  programs = _Programs()

  @functools.wraps(fn)
  def compiled_fn(*args, **kwargs):
    cache = programs.by_signature
    if not ENABLED:
      return fn(*args, **kwargs)
    try:
      key, arrays = signature(args, kwargs)
      program = cache.get(key)
    except (_Traced, _Unhashable, TypeError):
      # Inside the user's transformation, or an unhashable static argument.
      return fn(*args, **kwargs)
    if program is _EAGER:
      return fn(*args, **kwargs)
    if program is None:
      try:
        options = compiler_options and compiler_options(*args, **kwargs)
      except Exception:  # pylint: disable=broad-except  A hint only.
        options = None
      program = _Program(fn, key, options)
      try:
        if not program.small_enough(arrays):
          raise _TooLarge()
        out = program(arrays)
      except (_TooLarge,) + CONCRETIZATION_ERRORS:
        # A value-dependent step: this signature runs eagerly from now on.
        cache[key] = _EAGER
        _evict(cache)
        return fn(*args, **kwargs)
      cache[key] = program
      _evict(cache)
      return out
    try:
      cache.move_to_end(key)
    except KeyError:  # Dropped meanwhile by another thread's call.
      pass
    return program(arrays)

  compiled_fn.cache_clear = programs.by_signature.clear
  return compiled_fn


class _Programs:
  """The compiled programs of one function, by signature."""

  def __init__(self):
    self.by_signature: collections.OrderedDict = collections.OrderedDict()


def _evict(cache: collections.OrderedDict) -> None:
  while len(cache) > MAX_SIGNATURES:
    cache.popitem(last=False)
