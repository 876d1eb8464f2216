"""Small helpers shared across the package."""
import collections
import functools
from typing import Any, Sequence, Union


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


@functools.lru_cache(maxsize=None)
def get_namedtuple(names: tuple[str, ...]) -> type:
  """The namedtuple type `Kernel` with fields `names` (cached, so results of
  equal `get` share a type)."""
  return collections.namedtuple('Kernel', names)


def is_list_or_tuple(x: Any) -> bool:
  return isinstance(x, (list, tuple))
