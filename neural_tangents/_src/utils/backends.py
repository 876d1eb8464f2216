"""What a JAX backend can compute: the platform a computation runs on, and
where float64 is emulated.

TPUs have no float64 arithmetic units: XLA emulates float64 there by pairs
of float32 numbers. Sums and products come out accurate to about float64's
`eps`, but the exponent range is float32's (`1e300 * 2` is inf, `1e-300 / 3`
is 0), the bits are not IEEE float64's (a `bitcast` to int64 reads
garbage, `frexp` fails to compile), and there are no float64 factorizations
(compiling a Cholesky or `eigh` aborts the process). Code that depends on
any of these asks `float64_emulated()` first.

Example:
  >>> compute_platform() in ('cpu', 'gpu', 'tpu')
  True
"""
from typing import Any

import jax
import numpy as np

# Platforms whose float64 is emulated by pairs of float32.
FLOAT64_EMULATED_PLATFORMS = {'tpu'}


def compute_platform() -> str:
  """The platform new computations run on: the default device's (set by
  `jax.default_device` or `jax_default_device`), else the default
  backend's."""
  device = jax.config.jax_default_device
  if device is None:
    return jax.default_backend()
  return getattr(device, 'platform', str(device))


def platform_of(x: Any) -> str:
  """The platform a computation with `x` runs on: its device's for a concrete
  JAX array, else (NumPy arrays, tracers) `compute_platform()`."""
  if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
    return next(iter(x.devices())).platform
  return compute_platform()


def float64_emulated(dtype: Any, x: Any = None) -> bool:
  """Whether `dtype` is float64 (or complex128) emulated by float32 pairs on
  the platform of `x` (default: `compute_platform()`)."""
  return (np.dtype(dtype) in (np.float64, np.complex128) and
          (platform_of(x) if x is not None else compute_platform())
          in FLOAT64_EMULATED_PLATFORMS)
