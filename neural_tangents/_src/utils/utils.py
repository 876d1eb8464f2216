"""Small helpers shared across the package."""
import collections
import functools
from typing import Any


@functools.lru_cache(maxsize=None)
def get_namedtuple(names: tuple[str, ...]) -> type:
  """The namedtuple type `Kernel` with fields `names` (cached, so results of
  equal `get` share a type)."""
  return collections.namedtuple('Kernel', names)


def is_list_or_tuple(x: Any) -> bool:
  return isinstance(x, (list, tuple))
