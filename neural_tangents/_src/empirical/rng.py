"""The published PRNG-key convention of the empirical kernels, and per-call
keyword arguments.

`f(x1)` gets the key `rng` and `f(x2)` gets `jax.random.fold_in(rng, 1)`,
unless x2 is None or equal to x1, when both get `rng`. Any other keyword
argument given as a 2-tuple is the pair `(value for x1, value for x2)`.
"""
from typing import Any, Callable, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.utils.typing import Array, PyTree
from neural_tangents._src.utils.utils import inputs_are_equal


def takes_rng_pairs(kernel_fn: Callable) -> Callable:
  """Marks `kernel_fn` as following `read_rng`'s convention for `rng`.

  `nt.batch` then chooses the keys of `f(x1)` and `f(x2)` once for the whole
  call and passes them to every block as a pair, since a block cannot tell
  whether its `x2` is the call's `x1`.

  Example:
    >>> takes_rng_pairs(lambda x1, x2, params: x1).takes_rng_pairs
    True
  """
  kernel_fn.takes_rng_pairs = True
  return kernel_fn


def is_array(value: Any) -> bool:
  """Whether `value` is a JAX or NumPy array (or NumPy scalar)."""
  return isinstance(value, (jax.Array, np.ndarray, np.generic))


def is_raw_key(value: Any) -> bool:
  """A legacy PRNG key (uint32[2]) or a scalar typed key, shared by default."""
  dtype = getattr(value, 'dtype', None)
  if dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key):
    return np.ndim(value) == 0
  return dtype == np.uint32 and np.shape(value) == (2,)


def is_single_key(value: Any) -> bool:
  """A legacy PRNG key (uint32[2]) or a scalar typed key array.

  Example:
    >>> is_single_key(jax.random.PRNGKey(0)), is_single_key(jnp.ones(2))
    (True, False)
  """
  return is_array(value) and is_raw_key(value)


def read_rng(rng: Any, x1: PyTree,
             x2: Optional[PyTree]) -> tuple[Any, Any]:
  """The PRNG keys of `f(x1)` and `f(x2)` from an `rng` keyword argument.

  The published convention: `f(x1)` gets `rng` and `f(x2)` gets
  `random.fold_in(rng, 1)`, unless x2 is None or equal to x1 (by value),
  when both get `rng`. A pair `(key1, key2)` is used as given.

  Args:
    rng: a PRNG key, or a pair of keys.
    x1: the first inputs.
    x2: the second inputs, or None.

  Returns:
    `(key for f(x1), key for f(x2))`.

  Example:
    >>> k = jax.random.PRNGKey(0)
    >>> read_rng(k, jnp.ones(2), jnp.zeros(2))[1] == jax.random.fold_in(k, 1)
    Array([ True,  True], dtype=bool)
  """
  if isinstance(rng, tuple) and len(rng) == 2:
    return rng
  return rng, second_key(rng, inputs_are_equal(x1, x2))


def second_key(rng: Any, same: Union[bool, Array]) -> Any:
  """The key of `f(x2)`: `rng` if `same` (x2 is None or equals x1), else
  `random.fold_in(rng, 1)`; selected by value when `same` is traced.

  Example:
    >>> k = jax.random.PRNGKey(0)
    >>> second_key(k, True) is k
    True
  """
  if same is True:
    return rng
  other = jax.random.fold_in(rng, 1)
  if same is False:
    return other
  # Under tracing: select between the keys' data (typed keys included).
  typed = jnp.issubdtype(rng.dtype, jax.dtypes.prng_key)
  data = jax.random.key_data if typed else (lambda key: key)
  selected = jnp.where(same, data(rng), data(other))
  if typed:
    selected = jax.random.wrap_key_data(selected,
                                        impl=jax.random.key_impl(rng))
  return selected


def split_kwargs(kwargs: dict[str, Any], x1: PyTree,
                 x2: Optional[PyTree]) -> tuple[dict, dict, bool]:
  """Per-call keyword arguments: a 2-tuple is `(for x1, for x2)`; with x2
  None, `(v, None)` is `v`.

  A single PRNG key `rng` follows the published convention, `read_rng`.

  Returns:
    `(kwargs of f(x1), kwargs of f(x2), whether they are the same)`.

  Example:
    >>> kwargs1, kwargs2, same = split_kwargs({'scale': (1., 2.)}, x1, x2)
    >>> kwargs1, kwargs2, same
    ({'scale': 1.0}, {'scale': 2.0}, False)
  """
  kwargs1, kwargs2, same = {}, {}, True
  for name, value in kwargs.items():
    if name == 'rng' and is_single_key(value):
      kwargs1[name], kwargs2[name] = read_rng(value, x1, x2)
      same = same and kwargs1[name] is kwargs2[name]
    elif isinstance(value, tuple) and len(value) == 2:
      first, second = value
      if x2 is None and second is None:
        second = first  # As published: `(v, None)` with x2=None is `v`.
      kwargs1[name], kwargs2[name] = first, second
      same = same and first is second
    else:
      kwargs1[name] = kwargs2[name] = value
  return kwargs1, kwargs2, same
