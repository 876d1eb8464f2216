"""Small helpers shared across the package."""
import collections
import functools
from typing import Any, Optional, Union

import jax
from jax import tree_util
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.utils.typing import Array, PyTree


def get_namedtuple(names: tuple[str, ...], typename: str = 'Kernel') -> type:
  """The namedtuple type `typename` with fields `names` (cached, so results of
  equal `get` share a type).

  Example:
    >>> get_namedtuple(('nngp', 'ntk')) is get_namedtuple(('nngp', 'ntk'))
    True
  """
  return _namedtuple(typename, tuple(names))


@functools.lru_cache(maxsize=None)
def _namedtuple(typename: str, names: tuple[str, ...]) -> type:
  return collections.namedtuple(typename, names)


def is_list_or_tuple(x: Any) -> bool:
  return isinstance(x, (list, tuple))


def inputs_are_equal(x1: PyTree,
                     x2: Optional[PyTree]) -> Union[bool, Array]:
  """Whether x2 is None or has x1's values (a traced bool under tracing).

  Example:
    >>> inputs_are_equal(jnp.ones(2), None), inputs_are_equal(jnp.ones(2),
    ...                                                       jnp.zeros(2))
    (True, False)
  """
  if x2 is None or x2 is x1:
    return True
  leaves1, treedef1 = tree_util.tree_flatten(x1)
  leaves2, treedef2 = tree_util.tree_flatten(x2)
  if treedef1 != treedef2 or any(np.shape(a) != np.shape(b)
                                 for a, b in zip(leaves1, leaves2)):
    return False
  if not any(isinstance(leaf, jax.core.Tracer) for leaf in leaves1 + leaves2):
    return all(np.array_equal(np.asarray(a), np.asarray(b))
               for a, b in zip(leaves1, leaves2))
  return jnp.all(jnp.stack([jnp.all(a == b)
                            for a, b in zip(leaves1, leaves2)]))
