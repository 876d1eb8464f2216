"""Small helpers shared across the package."""
import collections
import functools
from typing import Any


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
