"""Small helpers shared across the package."""
import collections
import functools
from typing import Any, Optional, Sequence, Union


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


def positive_ints(value: Any, name: str, layer_name: str,
                  length: Optional[int] = None,
                  length_of: str = 'spatial dimension',
                  example: str = '(3, 3)') -> tuple[int, ...]:
  """`value` as a non-empty tuple of positive ints, else a `ValueError`.

  Args:
    value: the argument (e.g. a filter shape or strides).
    name: the argument's name, for the message.
    layer_name: the layer's name, for the message.
    length: the required length, if any.
    length_of: what each entry corresponds to, for the message.
    example: a valid value, for the message.

  Returns:
    The tuple of ints.

  Example:
    >>> positive_ints([2, 2], 'strides', 'Conv')
    (2, 2)
  """
  try:
    values = tuple(value)
  except TypeError:
    values = None
  if (values is None or not values or
      any(isinstance(v, bool) or not isinstance(v, int) or v <= 0
          for v in values)):
    raise ValueError(
        f'`{name}` of `{layer_name}` must be a non-empty tuple of positive '
        f'ints; got {value!r}. Pass e.g. {name}={example} for images.')
  if length is not None and len(values) != length:
    raise ValueError(
        f'`{name}` of `{layer_name}` must have one entry per {length_of} '
        f'({length}); got {value!r} of length {len(values)}. Pass {length} '
        'values, or None for all 1s.')
  return values
