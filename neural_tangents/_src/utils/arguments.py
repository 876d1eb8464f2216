"""Checks of user arguments: each returns the canonical value or raises an
error that names the argument, the value and the fix."""
import difflib
import enum
import functools
from typing import Any, Optional, Sequence, TypeVar, Union

import jax
import numpy as np

from neural_tangents._src.utils.kernel import Kernel

EnumT = TypeVar('EnumT', bound=enum.Enum)


def parse_get(get: Any, allowed: Sequence[str], fix: Optional[str] = None
              ) -> tuple[Optional[tuple[str, ...]], bool]:
  """`get` as `(names, single)`: the requested names and whether one was
  asked for as a bare string (so one value, not a namedtuple, is returned).

  `None` gives `(None, False)`: every name the caller computes. Names are
  matched in any case (as published, `'NTK'` is `'ntk'`) and returned as
  spelled in `allowed`, so output fields are lower case.

  Args:
    get: `None`, a name, or a non-empty tuple/list of distinct names.
    allowed: the names this function can return.
    fix: what to pass instead of a wrong name (default: the allowed names).

  Returns:
    `(names or None, single)`.

  Example:
    >>> parse_get('ntk', ('nngp', 'ntk'))
    (('ntk',), True)
    >>> parse_get(['nngp', 'ntk'], ('nngp', 'ntk'))
    (('nngp', 'ntk'), False)
    >>> parse_get(('NTK', 'Nngp'), ('nngp', 'ntk'))
    (('ntk', 'nngp'), False)
  """
  if get is None:
    return None, False
  single = isinstance(get, str)
  names = (get,) if single else get
  if fix is None:
    fix = (f'Pass one of {tuple(allowed)}, a tuple of them, e.g. '
           f'get={tuple(allowed)[:2]!r}, or None for all.')
  if not isinstance(names, (tuple, list)):
    raise ValueError(f'`get` must be a name or a tuple of names; got '
                     f'{get!r}. {fix}')
  if not names:
    raise ValueError(f'`get={get!r}` is empty: it asks for nothing. {fix}')
  by_lower = {a.lower(): a for a in allowed}
  canonical = []
  for name in names:
    if not isinstance(name, str) or name.lower() not in by_lower:
      close = difflib.get_close_matches(str(name).lower(), by_lower, n=1)
      guess = f' (did you mean {by_lower[close[0]]!r}?)' if close else ''
      raise ValueError(f'`get={get!r}` asks for {name!r}, which is not '
                       f'available here{guess}. {fix}')
    canonical.append(by_lower[name.lower()])
  names = canonical
  if len(set(names)) != len(names):
    duplicate = next(n for n in names if names.count(n) > 1)
    raise ValueError(f'`get={get!r}` has a duplicate: it names a kernel '
                     f'twice ({duplicate!r}). Pass each name once, e.g. '
                     f'get={tuple(dict.fromkeys(names))!r}.')
  return tuple(names), single


def reject_kernel(value: Any, name: str, fix: str) -> None:
  """Raises a `TypeError` if `value` is, or holds, a `Kernel` where arrays
  are expected (e.g. the inputs of an `apply_fn` or an empirical kernel).

  Args:
    value: the argument (an array or a pytree of arrays).
    name: the argument's name, for the message.
    fix: how to fix it, for the message.

  Example:
    >>> reject_kernel(np.ones((2, 3)), 'x1', 'Pass the inputs.')
  """
  leaves = jax.tree_util.tree_leaves(
      value, is_leaf=lambda v: isinstance(v, Kernel))
  if any(isinstance(leaf, Kernel) for leaf in leaves):
    raise TypeError(
        f'`{name}` is (or holds) an `nt.Kernel`, but arrays are expected '
        f'here. {fix}')


def parse_enum(value: Union[str, EnumT], cls: type[EnumT], name: str) -> EnumT:
  """`value` as a member of `cls`: a member, its name or its value (any case).

  Example:
    >>> import enum
    >>> class Color(enum.Enum):
    ...   RED = 'RED'
    >>> parse_enum('red', Color, 'color')
    <Color.RED: 'RED'>
  """
  if isinstance(value, cls):
    return value
  if isinstance(value, str):
    for member in cls:
      if value.upper() in (member.name.upper(), str(member.value).upper()):
        return member
  elif not isinstance(value, bool):
    try:
      return cls(value)
    except (ValueError, TypeError):
      pass
  raise ValueError(
      f'`{name}={value!r}` is not a `{cls.__name__}`: `{name}` must be one of '
      f'{[m.name for m in cls]} (a string in any case or a `{cls.__name__}` '
      f'member). Pass e.g. {name}={next(iter(cls)).name!r}.')


def canonicalize_axis(axis: int, ndim: int, name: str = 'axis') -> int:
  """`axis` in `[0, ndim)`, or a `ValueError` naming the argument.

  Example:
    >>> canonicalize_axis(-1, 3)
    2
  """
  if not -ndim <= axis < ndim:
    raise ValueError(f'`{name}`={axis} is out of range for arrays of rank '
                     f'{ndim}. Pass an axis in [{-ndim}, {ndim}).')
  return axis % ndim


def canonicalize_axes(axes: Union[int, Sequence[int]], ndim: int,
                      name: str = 'axes') -> tuple[int, ...]:
  """Sorted, unique, non-negative `axes`; each checked by `canonicalize_axis`."""
  if isinstance(axes, int):
    axes = (axes,)
  return tuple(sorted({canonicalize_axis(a, ndim, name) for a in axes}))



def is_int(value: Any) -> bool:
  """Whether `value` is a Python or NumPy int (bools are not ints here).

  Example:
    >>> is_int(3), is_int(np.int32(3)), is_int(True), is_int(3.)
    (True, True, False, False)
  """
  return (isinstance(value, (int, np.integer)) and
          not isinstance(value, (bool, np.bool_)))


def _int_kind(minimum: int) -> str:
  return {0: 'a non-negative int', 1: 'a positive int'}.get(
      minimum, f'an int >= {minimum}')


def positive_int(value: Any, name: str, fix: str, *, layer_name: str = '',
                 minimum: int = 1) -> int:
  """`value` as an int `>= minimum` (1: positive, 0: non-negative).

  The one check of int arguments; `positive_int_tuple` applies it to each
  entry of a tuple.

  Args:
    value: the argument.
    name: the argument's name, for the message.
    fix: how to fix a bad value, for the message.
    layer_name: the layer the argument belongs to, if any, for the message.
    minimum: the smallest valid value.

  Returns:
    The int.

  Raises:
    TypeError: if `value` is not an int (bools are not ints here).
    ValueError: if it is smaller than `minimum`.

  Example:
    >>> positive_int(3, 'n_heads', 'Pass e.g. n_heads=4.')
    3
  """
  where = f' of `{layer_name}`' if layer_name else ''
  kind = _int_kind(minimum)
  if not is_int(value):
    raise TypeError(f'`{name}`{where} must be {kind}; got {value!r} '
                    f'({type(value).__name__}). {fix}')
  if value < minimum:
    raise ValueError(f'`{name}`{where} must be {kind}; got {value}. {fix}')
  return int(value)


def positive_int_tuple(value: Any, name: str, fix: str, *,
                       layer_name: str = '', length: Optional[int] = None,
                       length_of: str = 'entry', minimum: int = 1
                       ) -> tuple[int, ...]:
  """`value` as a non-empty tuple of ints `>= minimum` (see `positive_int`).

  Args:
    value: the argument (e.g. a filter shape, strides, or the standard
      parameterization's `s`), a tuple or list.
    name: the argument's name, for the message.
    fix: how to fix a bad value, for the message.
    layer_name: the layer the argument belongs to, if any, for the message.
    length: the required length, if any.
    length_of: what each entry corresponds to, for the message.
    minimum: the smallest valid entry.

  Returns:
    The tuple of ints.

  Raises:
    TypeError: if `value` is not a tuple/list, or an entry is not an int.
    ValueError: if it is empty, of the wrong `length`, or an entry is
      smaller than `minimum`.

  Example:
    >>> positive_int_tuple([2, 2], 'strides', 'Pass e.g. strides=(1, 1).')
    (2, 2)
  """
  where = f' of `{layer_name}`' if layer_name else ''
  ints = _int_kind(minimum).split(' ', 1)[1] + 's'
  what = (f'`{name}`{where} must be '
          f'{"a pair" if length == 2 else "a non-empty tuple"} of {ints}')
  if length is not None:
    what += f', one entry per {length_of} ({length})'
  if not isinstance(value, (tuple, list)):
    raise TypeError(f'{what}; got {value!r} ({type(value).__name__}). {fix}')
  if not all(is_int(v) for v in value):
    bad = next(v for v in value if not is_int(v))
    raise TypeError(f'{what}; got {value!r}, whose entry {bad!r} is a '
                    f'{type(bad).__name__}. {fix}')
  if not value or any(v < minimum for v in value):
    raise ValueError(f'{what}; got {value!r}. {fix}')
  if length is not None and len(value) != length:
    raise ValueError(f'{what}; got {value!r} of length {len(value)}. Pass '
                     f'{length} values. {fix}')
  return tuple(int(v) for v in value)


def positive_ints(value: Any, name: str, layer_name: str,
                  length: Optional[int] = None,
                  length_of: str = 'spatial dimension',
                  example: str = '(3, 3)') -> tuple[int, ...]:
  """`positive_int_tuple` with a fix built from a valid `example`.

  Example:
    >>> positive_ints([2, 2], 'strides', 'Conv')
    (2, 2)
  """
  return positive_int_tuple(
      value, name, f'Pass e.g. {name}={example} for images, or None for all '
      '1s.' if name == 'strides' else f'Pass e.g. {name}={example} for '
      'images.', layer_name=layer_name, length=length, length_of=length_of)


def callable_arg(value: Any, name: str, fix: str) -> Any:
  """`value` if it is callable, else a `TypeError` naming `name` and `fix`.

  Example:
    >>> callable_arg(len, 'fn', 'Pass a function.')
    <built-in function len>
  """
  if not callable(value):
    raise TypeError(f'`{name}` must be callable; got {value!r}. {fix}')
  return value


def real_number(value: Any, name: str, fix: str, *, layer_name: str = '',
                allow_none: bool = False) -> Any:
  """`value` if it is a real number (a Python, NumPy or JAX scalar, or an
  array of them, possibly traced), or None where `allow_none`; else a
  `TypeError`. Strings and bools are not numbers here.

  Example:
    >>> real_number(2., 'W_std', 'Pass e.g. W_std=1.5.')
    2.0
  """
  if value is None and allow_none:
    return value
  where = f' of `{layer_name}`' if layer_name else ''
  if isinstance(value, (int, float, np.integer, np.floating)) and not (
      isinstance(value, (bool, np.bool_))):
    return value
  dtype = getattr(value, 'dtype', None)
  if dtype is not None and (np.issubdtype(dtype, np.integer) or
                            np.issubdtype(dtype, np.floating)):
    return value
  none = ' or None' if allow_none else ''
  raise TypeError(f'`{name}`{where} must be a real number{none}; got '
                  f'{value!r} ({type(value).__name__}). {fix}')


def concrete_real(value: Any) -> Optional[float]:
  """`value` as a Python float if it is one concrete real number (a Python,
  NumPy or JAX scalar, or a 0-d array, not a bool), else None (traced
  values, arrays of several numbers, other types).

  Example:
    >>> concrete_real(np.float32(0.5)), concrete_real(True)
    (0.5, None)
  """
  if isinstance(value, (bool, np.bool_)) or isinstance(value, jax.core.Tracer):
    return None
  if isinstance(value, (int, float, np.integer, np.floating)):
    return float(value)
  dtype = getattr(value, 'dtype', None)
  if (dtype is not None and np.ndim(value) == 0 and
      (np.issubdtype(dtype, np.integer) or np.issubdtype(dtype, np.floating))):
    return float(np.asarray(value))
  return None


def _non_finite(value: Any) -> Optional[str]:
  """'nan' or 'inf' if a concrete float (scalar, float sequence or array)
  holds one; None for finite values, non-floats and traced values."""
  if isinstance(value, (bool, np.bool_)) or isinstance(value, jax.core.Tracer):
    return None
  if isinstance(value, (float, np.floating)):
    array = np.asarray(value)
  elif isinstance(value, (np.ndarray, jax.Array)) and _is_inexact(value):
    array = np.asarray(value)
  elif (isinstance(value, (list, tuple)) and value and
        all(isinstance(v, (float, np.floating)) for v in value)):
    array = np.asarray(value, np.float64)
  else:
    return None
  if np.all(np.isfinite(array)):
    return None
  if np.any(np.isnan(array)):
    return 'nan'
  return 'inf'


def _is_inexact(value: Any) -> bool:
  dtype = getattr(value, 'dtype', None)
  return dtype is not None and np.issubdtype(dtype, np.inexact)


# Annotations of layer arguments that take one number.
_SCALAR_ANNOTATIONS = (float, Optional[float], 'float', 'Optional[float]')


def finite_hyperparameters(layer_name: str, bound: Any) -> None:
  """Raises a `ValueError` naming the first argument of `bound` (an
  `inspect.BoundArguments` of a layer constructor) that is a NaN or infinite
  float, or a float sequence or array holding one: a kernel computed from it
  would be NaN, or worse, finite and wrong. An argument annotated `float`
  given an array raises a `TypeError`.

  Example:
    >>> import inspect
    >>> def Dense(out_dim, W_std=1.): pass
    >>> bound = inspect.signature(Dense).bind(8, W_std=float('nan'))
    >>> finite_hyperparameters('Dense', bound)
    Traceback (most recent call last):
    ...
    ValueError: `W_std` of `Dense` must be finite; got nan, which would make the kernel NaN or wrong. Pass finite values, e.g. the default W_std=1.0.
  """
  parameters = bound.signature.parameters
  for name, value in bound.arguments.items():
    if parameters[name].annotation in _SCALAR_ANNOTATIONS and (
        value is not None and np.ndim(value) != 0):
      raise TypeError(
          f'`{name}` of `{layer_name}` must be a scalar; got an array of '
          f'shape {np.shape(value)}. Pass one number, e.g. {name}=1.5 (a '
          'layer has one such hyperparameter for all its units).')
    if _non_finite(value) is None:
      continue
    default = bound.signature.parameters[name].default
    example = (f', e.g. the default {name}={default!r}' if isinstance(
        default, (int, float)) and not isinstance(default, bool) else '')
    raise ValueError(
        f'`{name}` of `{layer_name}` must be finite; got {value!r}, which '
        f'would make the kernel NaN or wrong. Pass finite values{example}.')


_KEY_FIX = ('Pass one key: `jax.random.PRNGKey(0)` (a raw uint32[2] key) or '
            '`jax.random.key(0)` (a typed key).')


def prng_key(rng: Any, name: str = 'rng', *, allow_none: bool = False
             ) -> Any:
  """`rng` if it is one PRNG key, raw (`uint32[2]`, from
  `jax.random.PRNGKey`) or typed (shape `()`, from `jax.random.key`), or
  None where `allow_none` (layers without parameters take `init_fn(None,
  shape)`); else a `TypeError` / `ValueError` that says which keys are
  accepted.

  Example:
    >>> import jax
    >>> prng_key(jax.random.PRNGKey(0)).shape
    (2,)
  """
  import jax  # pylint: disable=g-import-not-at-top
  if rng is None and allow_none:
    return rng
  dtype = getattr(rng, 'dtype', None)
  shape = getattr(rng, 'shape', None)
  if dtype is None or shape is None:
    hint = (f' To seed, pass `jax.random.PRNGKey({rng})`.'
            if isinstance(rng, (int, np.integer)) and
            not isinstance(rng, bool) else '')
    raise TypeError(f'`{name}` must be a PRNG key; got {rng!r} '
                    f'({type(rng).__name__}).{hint} {_KEY_FIX}')
  if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
    if shape != ():
      raise ValueError(
          f'`{name}` must be one PRNG key; got an array of typed keys of '
          f'shape {shape}. Pass one of them, e.g. `keys[0]`, or `jax.vmap` '
          f'over the keys for several networks. {_KEY_FIX}')
    return rng
  if dtype != np.uint32:
    raise TypeError(f'`{name}` must be a PRNG key; got an array of dtype '
                    f'{dtype} and shape {shape}. {_KEY_FIX}')
  raw_shape = _raw_key_shape(str(jax.config.jax_default_prng_impl))
  if len(shape) == len(raw_shape) + 1 and shape[1:] == raw_shape:
    raise ValueError(
        f'`{name}` must be one PRNG key; got {shape[0]} keys (an array of '
        f'shape {shape}). Pass one of them, e.g. `keys[0]`, or `jax.vmap` '
        f'over the keys for several networks. {_KEY_FIX}')
  if shape != raw_shape:
    raise ValueError(f'`{name}` must be one PRNG key; a raw key has shape '
                     f'{raw_shape}, got shape {shape}. {_KEY_FIX}')
  return rng


@functools.lru_cache(maxsize=None)
def _raw_key_shape(impl: str) -> tuple[int, ...]:
  """The shape of a raw key of the default PRNG implementation `impl`."""
  del impl  # The cache key.
  import jax  # pylint: disable=g-import-not-at-top
  return tuple(jax.eval_shape(lambda: jax.random.PRNGKey(0)).shape)


def input_shape(shape: Any, name: str = 'input_shape') -> Any:
  """`shape` if it is a shape (a tuple or list of ints, `-1` allowed for an
  unknown size) or a tuple/list of shapes (for `parallel` layers); else a
  `TypeError` naming the bad entry.

  Example:
    >>> input_shape((-1, 3))
    (-1, 3)
  """
  def bad(why):
    return TypeError(f'`{name}` must be a tuple of ints such as (-1, 32, 32, '
                     f'3) (or a list of such tuples for parallel inputs); got '
                     f'{shape!r}: {why}. Pass e.g. `x.shape`.')
  def check(s):
    if isinstance(s, (str, bytes)) or not isinstance(s, (tuple, list)):
      raise bad(f'{s!r} is a {type(s).__name__}, not a tuple')
    for d in s:
      if isinstance(d, (tuple, list)):
        check(d)
      elif (isinstance(d, (bool, np.bool_)) or
            not isinstance(d, (int, np.integer))):
        raise bad(f'the entry {d!r} is not an int')
      elif d < -1:
        raise ValueError(
            f'`{name}` must be a tuple of sizes >= 0 (or -1 for an unknown '
            f'size); got {shape!r}, with the entry {d!r}. Pass e.g. '
            '`x.shape`.')
  check(shape)
  return shape


def layers(values: Any, combinator: str) -> Any:
  """`values` if each is a layer `(init_fn, apply_fn, kernel_fn)`; else a
  `TypeError` naming the position, e.g. a layer constructor not called
  (`serial(stax.Dense)` instead of `serial(stax.Dense(512))`).

  Example:
    >>> f = lambda *a: None
    >>> len(layers([(f, f, f)], 'serial'))
    1
  """
  for i, value in enumerate(values):
    if (isinstance(value, (tuple, list)) and len(value) == 3 and
        all(callable(f) for f in value)):
      continue
    name = getattr(value, '__name__', None)
    if callable(value) and name:
      fix = (f'`{name}` looks like a layer constructor that was not called: '
             f'pass `{name}(...)`, e.g. `stax.{name}(512)` or '
             f'`stax.{name}()`.')
    else:
      fix = ('Pass layers such as `stax.Dense(512)` or `stax.Relu()`, each a '
             'tuple (init_fn, apply_fn, kernel_fn).')
    raise TypeError(f'`layers[{i}]` of `{combinator}` must be a layer (init_fn, '
                    f'apply_fn, kernel_fn); got {value!r}. {fix}')
  return values
