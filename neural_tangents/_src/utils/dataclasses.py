"""Immutable dataclasses that are JAX pytrees.

Fields are pytree children (arrays, traced by `jit`, `vmap`, `lax.scan`)
unless declared with `field(pytree_node=False)`, in which case they are static
auxiliary data (hashable metadata compared when pytrees are matched).

Example:
  >>> @dataclass
  ... class Point:
  ...   x: jax.Array
  ...   name: str = field(pytree_node=False, default='p')
  >>> p = Point(jnp.ones(2)).replace(name='q')
"""
import dataclasses
from typing import Any, TypeVar

import jax

_T = TypeVar('_T')


def field(pytree_node: bool = True, **kwargs) -> Any:
  """A `dataclasses.field`; `pytree_node=False` makes it static aux data."""
  metadata = dict(kwargs.pop('metadata', {}) or {})
  metadata['pytree_node'] = pytree_node
  return dataclasses.field(metadata=metadata, **kwargs)


def dataclass(cls: type[_T]) -> type[_T]:
  """Makes `cls` a frozen dataclass registered as a pytree, with `.replace`."""
  cls = dataclasses.dataclass(frozen=True)(cls)
  fields = dataclasses.fields(cls)
  data_names = tuple(f.name for f in fields
                     if f.metadata.get('pytree_node', True))
  meta_names = tuple(f.name for f in fields
                     if not f.metadata.get('pytree_node', True))

  def flatten_with_keys(obj):
    children = tuple((jax.tree_util.GetAttrKey(name), getattr(obj, name))
                     for name in data_names)
    aux = tuple(getattr(obj, name) for name in meta_names)
    return children, aux

  def unflatten(aux, children):
    obj = object.__new__(cls)
    for name, value in zip(data_names, children):
      object.__setattr__(obj, name, value)
    for name, value in zip(meta_names, aux):
      object.__setattr__(obj, name, value)
    return obj

  def flatten(obj):
    return (tuple(getattr(obj, name) for name in data_names),
            tuple(getattr(obj, name) for name in meta_names))

  jax.tree_util.register_pytree_with_keys(cls, flatten_with_keys, unflatten,
                                          flatten)

  def replace(self, **changes):
    return dataclasses.replace(self, **changes)

  cls.replace = replace
  return cls
