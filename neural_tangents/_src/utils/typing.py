"""Types shared across the package."""
from typing import Any, Callable, Sequence, TypeVar, Union

import jax

PyTree = Any
Axes = Union[int, Sequence[int]]
Shapes = Any  # a shape tuple, or a pytree (list/tuple) of shape tuples
Get = Union[None, str, tuple[str, ...]]
KernelOrArray = Any

InitFn = Callable[..., tuple[Shapes, PyTree]]
ApplyFn = Callable[..., PyTree]
KernelFn = Callable[..., Any]
Layer = tuple[InitFn, ApplyFn, KernelFn]

EmpiricalKernelFn = Callable[..., Any]
NTTree = Union[list['NTTree[_T]'], tuple['NTTree[_T]', ...], '_T']

_T = TypeVar('_T')

Array = jax.Array
