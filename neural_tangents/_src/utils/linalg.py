"""Symmetric factorizations (Cholesky, eigendecomposition) on every backend.

XLA's TPU backend has no float64 Cholesky, triangular solve or symmetric
eigendecomposition (its float64 is emulated, see `backends`): compiling one
aborts the whole Python process inside XLA, with no exception to catch. The
library's own factorizations of float64 matrices on such a backend therefore
run on the host, in NumPy's LAPACK, and their results go back to the
matrix's device:

* a concrete matrix is factored (or solved with) on the host directly;
* a traced one (inside `jax.jit`, `vmap`) through `jax.pure_callback`, so the
  same code runs under transformations. Such a factorization has no
  derivative: differentiating through it raises a `ValueError` naming the
  fix (float32, or differentiating outside the factorization).

Elsewhere (any dtype on CPUs and GPUs, float32 on TPUs) these are
`jnp.linalg`'s functions, unchanged.

Example:
  >>> import jax.numpy as jnp
  >>> evals, evecs = eigh(jnp.array([[2., 1.], [1., 2.]]))
  >>> [round(float(e), 6) for e in evals]
  [1.0, 3.0]
"""
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg

from neural_tangents._src.utils import backends

Array = Any


def factored_on_host(x: Any) -> bool:
  """Whether a factorization of `x` runs on the host: a float64 or
  complex128 matrix on a backend that emulates float64 (`backends`)."""
  return backends.float64_emulated(x.dtype, x)


def _no_derivative(name: str) -> ValueError:
  return ValueError(
      f'A float64 `{name}` on the {backends.compute_platform()} backend runs on the '
      'host (XLA has no float64 factorizations there), where it has no '
      'derivative. Differentiate in float32 (`jax.config.update('
      '"jax_enable_x64", False)` or `.astype(jnp.float32)`), or on a CPU.')


def _on_host(name: str, numpy_fn: Callable[..., Any], out_shapes: Any,
             *arrays: Array) -> Any:
  """`numpy_fn(*arrays)` computed on the host, as arrays of `out_shapes`
  (`jax.ShapeDtypeStruct`s), on the device of the first array again."""

  def host_fn(*host_arrays):
    out = numpy_fn(*[np.asarray(a) for a in host_arrays])
    return jax.tree_util.tree_map(lambda o, s: np.asarray(o, s.dtype), out,
                                  out_shapes)

  if not any(isinstance(a, jax.core.Tracer) for a in arrays):
    first = arrays[0]
    device = (next(iter(first.devices())) if isinstance(first, jax.Array)
              else None)
    return jax.device_put(host_fn(*arrays), device)

  @jax.custom_jvp
  def call(*args):
    return jax.pure_callback(host_fn, out_shapes, *args,
                             vmap_method='sequential')

  @call.defjvp
  def _(primals, tangents):
    raise _no_derivative(name)

  return call(*arrays)


def _like(x: Array, *others: Array) -> jax.ShapeDtypeStruct:
  """The shape of `x`, the dtype of `x` promoted with `others`."""
  return jax.ShapeDtypeStruct(np.shape(x), jnp.result_type(x, *others))


def _eigenvalues_like(k: Array) -> jax.ShapeDtypeStruct:
  """Eigenvalues of the (stacked) Hermitian `k`: real, one per row."""
  return jax.ShapeDtypeStruct(np.shape(k)[:-1],
                              jnp.finfo(jnp.result_type(k)).dtype)


def _numpy_cholesky(k: np.ndarray) -> np.ndarray:
  """Lower Cholesky factor, NaN where `k` is not positive definite (as
  `jnp.linalg.cholesky`), for a matrix or a stack of them."""
  try:
    return np.linalg.cholesky(k)
  except np.linalg.LinAlgError:
    if k.ndim == 2:
      return np.full_like(k, np.nan)
    return np.stack([_numpy_cholesky(m) for m in k])


def cholesky(k: Array) -> Array:
  """`jnp.linalg.cholesky(k)`, on the host where the backend cannot."""
  if factored_on_host(k):
    return _on_host('cholesky', _numpy_cholesky, _like(k), k)
  return jnp.linalg.cholesky(k)


def eigh(k: Array) -> tuple[Array, Array]:
  """`jnp.linalg.eigh(k)` as `(eigenvalues, eigenvectors)`, on the host
  where the backend cannot."""
  if factored_on_host(k):
    return _on_host('eigh', lambda a: tuple(np.linalg.eigh(a)),
                    (_eigenvalues_like(k), _like(k)), k)
  return tuple(jnp.linalg.eigh(k))


def eigvalsh(k: Array) -> Array:
  """`jnp.linalg.eigvalsh(k)`, on the host where the backend cannot."""
  if factored_on_host(k):
    return _on_host('eigvalsh', np.linalg.eigvalsh, _eigenvalues_like(k), k)
  return jnp.linalg.eigvalsh(k)


def cho_solve(lower_factor: Array, b: Array) -> Array:
  """`jax.scipy.linalg.cho_solve((lower_factor, True), b)`, on the host
  where the backend cannot."""
  if factored_on_host(lower_factor) or factored_on_host(b):
    return _on_host('cho_solve',
                    lambda c, v: scipy.linalg.cho_solve((c, True), v),
                    _like(b, lower_factor), lower_factor, b)
  return jax.scipy.linalg.cho_solve((lower_factor, True), b)


def solve_lower_triangular(lower_factor: Array, b: Array) -> Array:
  """`jax.scipy.linalg.solve_triangular(lower_factor, b, lower=True)`, on
  the host where the backend cannot."""
  if factored_on_host(lower_factor) or factored_on_host(b):
    return _on_host('solve_triangular',
                    lambda c, v: scipy.linalg.solve_triangular(c, v,
                                                               lower=True),
                    _like(b, lower_factor), lower_factor, b)
  return jax.scipy.linalg.solve_triangular(lower_factor, b, lower=True)
