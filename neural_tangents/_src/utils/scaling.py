"""Exact rescaling by powers of 2, to keep products of kernel entries in range.

Multiplying or dividing by a power of 2 is exact in binary floating point (in
the normal range), so a formula evaluated on rescaled arguments and scaled
back loses nothing to the rescaling, while the products inside it (of two
variances, of two input entries) no longer over- or underflow.

Powers of 2 are built from, and exponents read off, the bits of the float.
float64 on a TPU is emulated by float32 pairs, with float32's exponent range
and no IEEE float64 bits (`backends`): there they go through float32, which
holds every power of 2 that emulated float64 can.
"""
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.utils import backends

Array = jax.Array


def _bits_dtype(dtype) -> np.dtype:
  """The float type whose bits encode powers of 2 of `dtype` here: float32
  for float64 emulated by float32 pairs (`backends`), else `dtype`."""
  if backends.float64_emulated(dtype):
    return np.dtype(np.float32)
  return np.dtype(dtype)


def _int_dtype(dtype) -> np.dtype:
  """The signed integer type of the bits of the float type `dtype`."""
  return np.dtype(f'int{jnp.finfo(dtype).bits}')


def power_of_two(exponent: Array, dtype) -> Array:
  """`2^exponent` in `dtype`, the exponent clipped to the normal range.

  Equal to `jnp.ldexp(1, clip(exponent, minexp, maxexp - 1))`, built from
  its bits: the biased exponent `exponent + maxexp - 1` shifted into the
  exponent field, with a zero mantissa. (`jnp.ldexp` is ~40 operations that
  handle any mantissa; this is 4, which matters for compile time: it runs in
  every layer's scale-free formulas.)

  Example:
    >>> power_of_two(jnp.array([3, 1000]), jnp.float32)
    Array([8.0000000e+00, 1.7014118e+38], dtype=float32)
  """
  bits_dtype = _bits_dtype(dtype)
  info = jnp.finfo(bits_dtype)
  int_dtype = _int_dtype(bits_dtype)
  exponent = jnp.minimum(jnp.maximum(exponent, info.minexp), info.maxexp - 1)
  biased = lax.convert_element_type(exponent, int_dtype) + (info.maxexp - 1)
  power = lax.bitcast_convert_type(
      lax.shift_left(biased, np.array(info.nmant, int_dtype)), bits_dtype)
  return power.astype(dtype)


def power_of_two_exponent(p: Array) -> Array:
  """`e` with `p = 2^e`, for `p` a normal power of 2 (as `power_of_two`
  makes): read from the exponent field of its bits (3 operations, where
  `exponent_of`'s `frexp` takes ~40); no gradient flows through it.

  Example:
    >>> power_of_two_exponent(jnp.array([8., 0.25]))
    Array([ 3, -2], dtype=int32)
  """
  bits_dtype = _bits_dtype(p.dtype)
  info = jnp.finfo(bits_dtype)
  int_dtype = _int_dtype(bits_dtype)
  p = lax.stop_gradient(p).astype(bits_dtype)  # Exact: a power of 2.
  bits = lax.bitcast_convert_type(p, int_dtype)
  biased = lax.shift_right_logical(bits, np.array(info.nmant, int_dtype))
  return (biased - (info.maxexp - 1)).astype(np.int32)


def exponent_of(x: Array) -> Array:
  """`e` with `|x| = f 2^e`, `0.5 <= f < 1` (0 for 0, inf and NaN); no
  gradient flows through it.

  This is `jnp.frexp(x)[1]` itself: a version reading the exponent field of
  `x`'s bits would differ from it on subnormal `x` on CPUs, where whether a
  subnormal compares equal to 0 depends on how XLA fuses the comparison.

  Example:
    >>> exponent_of(jnp.array([1., 3., 0.25]))
    Array([ 1,  2, -1], dtype=int32)
  """
  x = lax.stop_gradient(x)
  if not backends.float64_emulated(x.dtype):
    return jnp.frexp(x)[1]
  # Emulated float64: `x` rounded to float32 has the same exponent, or one
  # more where the rounding carried up to the next power of 2.
  exponent = jnp.frexp(x.astype(np.float32))[1]
  below = jnp.abs(x) < power_of_two(exponent - 1, x.dtype)
  return jnp.where(below & (x != 0), exponent - 1, exponent)


def scale_above(x: Array) -> Array:
  """The largest power of 2 `m <= max(x, 1)`, so `1 <= max(x, 1) / m < 2`;
  no gradient flows through it.

  `m` is capped at `2^-minexp` (`2^126` in float32), so that `1 / m` is a
  normal number (CPUs flush subnormals to zero) and `x / m` is still below 4.

  Example:
    >>> scale_above(jnp.array([0.5, 10.]))
    Array([1., 8.], dtype=float32)
  """
  x = lax.stop_gradient(jnp.maximum(x, 1))
  exponent = jnp.minimum(exponent_of(x) - 1, -np.finfo(x.dtype).minexp)
  return power_of_two(exponent, x.dtype)


def times_powers_of_two(x: Array, e1: Array, e2: Array) -> Array:
  """`x 2^e1 2^e2`, each factor a normal power of 2 (`|e1|, |e2| <= 125`).

  Exact where the result is a normal number; it over- and underflows where
  `x 2^(e1 + e2)` does (the intermediate `x 2^e1` lies between `x` and the
  result), and `0` stays `0` where `2^(e1 + e2)` alone would overflow.

  Example:
    >>> times_powers_of_two(jnp.float32(3.), jnp.array(100), jnp.array(-98))
    Array(12., dtype=float32)
  """
  dtype = jnp.result_type(x)
  return x * power_of_two(e1, dtype) * power_of_two(e2, dtype)
