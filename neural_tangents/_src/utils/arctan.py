"""`arctan2` from vectorizable arithmetic, as accurate as `jnp.arctan2`.

XLA's CPU backend lowers `atan2` (and `acos`, `asin`, `atan`) to a scalar
library call per element, about ten times slower than `exp` or `tanh`; in the
arc-cosine, erf and gelu kernels it was most of the time of a ReLU / Erf /
Gelu layer. Here `atan2` is reduced to `atan(t)` on `t in [0, 1]` and
evaluated with the same range reduction and minimax fits as the Cephes
library: the single-precision polynomial of `atanf` for `float32` (and
narrower types, evaluated in `float32`), and the rational function of `atan`
for `float64`:

* `|y| > |x|` uses `atan2(y, x) = pi/2 - atan(|x| / |y|)` (quadrant fold);
* `t > tan(pi/8)` (`float32`) or `t > 0.66` (`float64`) uses
  `atan(t) = pi/4 + atan((t - 1) / (t + 1))`;
* `x < 0` uses `pi - a`; the sign of `y` gives the sign of the result.

Constants `pi/2`, `pi/4`, `pi` are added as a rounded part plus the rounding
error, so that the result is within about one unit in the last place of the
true value (the tests compare with `numpy.arctan2` on edge cases and a dense
grid, in both precisions). Signed zeros follow IEEE: `atan2(+-0, -1) = +-pi`.

The derivative is that of `jnp.arctan2`, `(x dy - y dx) / (x^2 + y^2)`
(0 at the origin).

Example:
  >>> float(arctan2(jnp.float32(1.), jnp.float32(-1.)))  # 3 pi / 4
  2.356194...
"""
import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.utils import backends

Array = jax.Array

# Cephes `atanf`: atan(x) = x + x z P(z), z = x^2, for |x| <= tan(pi / 8).
_ATANF_P = (-3.33329491539e-1, 1.99777106478e-1, -1.38776856032e-1,
            8.05374449538e-2)
# Cephes `atan`: atan(x) = x + x z P(z) / Q(z) for |x| <= 0.66, Q monic.
_ATAN_P = (-6.485021904942025371773e1, -1.228866684490136173410e2,
           -7.500855792314704667340e1, -1.615753718733365076637e1,
           -8.750608600031904122785e-1)
_ATAN_Q = (1.945506571482613964425e2, 4.853903996359136964868e2,
           4.328810604912902668951e2, 1.650270098316988542046e2,
           2.485846490142306297962e1, 1.)


def _horner(coef, x: Array) -> Array:
  """`sum_i coef[i] x^i`, `coef` in increasing order."""
  out = jnp.full_like(x, coef[-1])
  for a in reversed(coef[:-1]):
    out = out * x + a
  return out


def _split(value: float, dtype) -> tuple[float, float]:
  """`value` as `hi + lo`, `hi` rounded to `dtype` and `lo` its error."""
  hi = np.asarray(value, dtype)
  return hi, np.asarray(value - float(hi), dtype)


def _atan_ratio(num: Array, den: Array) -> Array:
  """`atan(num / den)` for `0 <= num <= den` (0 where `den` is 0).

  The reduced argument `(t - 1) / (t + 1)`, `t = num / den`, is taken as
  `(num - den) / (num + den)`: one division instead of two, no less accurate.
  """
  double = num.dtype == np.float64
  threshold = 0.66 if double else float(np.tan(np.pi / 8))
  reduce = num > threshold * den
  top = jnp.where(reduce, num - den, num)
  bottom = jnp.where(reduce, num + den, den)
  t = jnp.where(bottom > 0, top / jnp.where(bottom > 0, bottom, 1), 0)
  z = t * t
  if double:
    poly = z * _horner(_ATAN_P, z) / _horner(_ATAN_Q, z)
  else:
    poly = z * _horner(_ATANF_P, z)
  atan = t + t * poly
  hi, lo = _split(np.pi / 4, t.dtype)
  return jnp.where(reduce, hi + (atan + lo), atan)


def _signbit(x: Array) -> Array:
  """`jnp.signbit(x)`; for float64 emulated by float32 pairs (`backends`),
  which has no IEEE bits to read, that of `x` rounded to float32 (the same
  sign, -0 included)."""
  if backends.float64_emulated(x.dtype):
    return jnp.signbit(x.astype(np.float32))
  return jnp.signbit(x)


@jax.custom_jvp
def arctan2(y: Array, x: Array) -> Array:
  """`jnp.arctan2(y, x)`, computed with vectorizable arithmetic.

  Args:
    y: ordinates.
    x: abscissae, broadcastable against `y`.

  Returns:
    The angle of `(x, y)` in `[-pi, pi]`, in the promoted floating dtype.
  """
  dtype = jnp.result_type(y, x, float)
  compute = np.float64 if dtype == np.float64 else np.float32
  y, x = jnp.asarray(y, compute), jnp.asarray(x, compute)
  ax, ay = jnp.abs(x), jnp.abs(y)
  swap = ay > ax
  num, den = jnp.where(swap, ax, ay), jnp.where(swap, ay, ax)
  a = _atan_ratio(num, den)
  hi, lo = _split(np.pi / 2, compute)
  a = jnp.where(swap, (hi - a) + lo, a)
  a = jnp.where(_signbit(x), (2 * hi - a) + 2 * lo, a)
  # NaN in, NaN out (the comparisons above would otherwise hide it).
  a = jnp.where(jnp.isnan(x) | jnp.isnan(y), np.nan, a)
  return jnp.where(_signbit(y), -a, a).astype(dtype)


@arctan2.defjvp
def _arctan2_jvp(primals, tangents):
  y, x = primals
  dy, dx = tangents
  out = arctan2(y, x)
  r2 = x * x + y * y
  safe_r2 = jnp.where(r2 > 0, r2, 1)
  d = jnp.where(r2 > 0, (x * dy - y * dx) / safe_r2, 0)
  return out, d.astype(out.dtype)
