"""The matrix-product precision of the library's own computations.

JAX's default precision for float32 matrix products depends on the backend:
exact float32 on CPUs, but bfloat16 passes on TPUs (about 3 significant
digits) and TF32 on recent NVIDIA GPUs (about 4). A kernel is a sum over
thousands of products, so empirical NTKs came out 5e-3 off a float64
reference on a TPU, and an ensemble's predictions 1% off, with no warning.

The library therefore runs its own contractions (empirical NTKs, including
the derivatives of the user's `f`, Monte Carlo estimates, the solves and
kernel products of `nt.predict`, analytic kernels) at
`jax.default_matmul_precision('highest')`, float32-accurate on every backend,
unless the user has chosen a default precision (`jax.config.update(
'jax_default_matmul_precision', ...)`, the `JAX_DEFAULT_MATMUL_PRECISION`
environment variable, or a `with jax.default_matmul_precision(...)` block):
the user's choice always wins. To trade accuracy for speed on an accelerator,
choose it:

  with jax.default_matmul_precision('default'):  # the backend's fastest
    ntk = ntk_fn(x1, x2, params)

On a CPU the library leaves the precision alone: XLA:CPU's default float32
products are already exact float32, so its programs stay exactly what they
were. An explicit `precision=` argument of an operation (in the user's `f`,
or in a layer) is never overridden.

Example:
  >>> import jax
  >>> import jax.numpy as jnp
  >>> @library_precision
  ... def product(a, b):
  ...   return jax.config.jax_default_matmul_precision, a @ b
  >>> with jax.default_matmul_precision('bfloat16'):  # The user's wins.
  ...   product(jnp.ones((2, 2)), jnp.ones((2, 2)))[0]
  'bfloat16'
"""
import contextlib
import functools
from typing import Any, Callable, TypeVar

import jax

from neural_tangents._src.utils import backends

# The precision of the library's products where the user chose none.
LIBRARY_PRECISION = 'highest'
# Platforms whose default float32 products are exact float32 already.
EXACT_FLOAT32_PLATFORMS = {'cpu'}

_Fn = TypeVar('_Fn', bound=Callable[..., Any])


def user_precision() -> Any:
  """The default matmul precision the user set (config, environment or a
  `jax.default_matmul_precision` block), or None."""
  return jax.config.jax_default_matmul_precision


def precision_scope() -> contextlib.AbstractContextManager:
  """A context running products at `LIBRARY_PRECISION`, unless the user set a
  default precision or the computation runs where float32 products are exact
  (then it changes nothing)."""
  if (user_precision() is not None or
      backends.compute_platform() in EXACT_FLOAT32_PLATFORMS):
    return contextlib.nullcontext()
  return jax.default_matmul_precision(LIBRARY_PRECISION)


def library_precision(fn: _Fn) -> _Fn:
  """`fn`, called inside `precision_scope()`; attributes of `fn` (such as a
  `kernel_fn`'s layer records) stay readable on the result."""

  @functools.wraps(fn)
  def scoped(*args, **kwargs):
    with precision_scope():
      return fn(*args, **kwargs)

  return scoped
