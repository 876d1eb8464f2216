"""Kernel maps of elementwise nonlinearities (dual activations) and their
numerics.

For an elementwise `phi` applied to jointly Gaussian pre-activations
`(u, v) ~ N(0, [[q1, c], [c, q2]])` (the inputs' variances and covariance),
a *kernel map* is

  (q1, q2, c, compute_dot) -> (E[phi(u) phi(v)], E[phi'(u) phi'(v)] or None)

on broadcastable arrays (Neal 1996; Lee et al. 2018; Jacot et al. 2018). By
Price's theorem the derivative kernel is also `E[phi'(u) phi'(v)] = d nngp' /
d c` at fixed `q1`, `q2`, which is how kernels without a separate closed form
for the derivative (`Gabor`, `Elementwise` without `d_nngp_fn`) get it.
`elementwise_kernel` applies a map to every covariance of a `Kernel` (the
layers of `elementwise` are built on it); `attention` and `normalization` use
the same numerics (`correlation`, `arccos_angle`).

All maps are written to stay finite (no NaN / inf, finite gradients) at the
edges of their domain: equal or opposite inputs (`|c| = sqrt(q1 q2)`) and zero
variances. Two devices do most of the work: angles are computed with `atan2`
and a floored square root (`arccos_angle`), and determinants such as
`(1 + q1)(1 + q2) - c^2` are expanded as `1 + q1 + q2 + (q1 q2 - c^2)`, a sum
of non-negative terms that cannot cancel to zero or below.

Clamps that only undo rounding (`rounding_clip`) pass every derivative
through, so that kernels keep all their derivatives with respect to the
inputs on the diagonal `x1 = x2` too (where the clamps are active).

Example:
  >>> nngp, dot = relu_kernel_map(1., 1., 1., True)  # equal inputs
  >>> round(float(nngp), 6), round(float(dot), 6)
  (0.5, 0.5)
"""
import functools
import math
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.utils import kernel as kernel_lib
from neural_tangents._src.utils import row_blocks
from neural_tangents._src.utils import scaling
from neural_tangents._src.utils.arctan import arctan2
from neural_tangents._src.utils.kernel import Kernel

Array = jax.Array
KernelMap = Callable[[Array, Array, Array, bool],
                     tuple[Array, Optional[Array]]]
# `nngp_fn(cov12, var1, var2) -> E[phi(u) phi(v)]`, as users write it.
NngpFn = Callable[[Array, Array, Array], Array]


# -----------------------------------------------------------------------------
# Numerically safe building blocks.


def safe_sqrt(x: Array) -> Array:
  """`sqrt(max(x, 0))` with a finite, zero-at-zero gradient."""
  positive = x > 0
  return jnp.where(positive, jnp.sqrt(jnp.where(positive, x, 1)), 0)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2))
def rounding_clip(x: Array, lower: Optional[float],
                  upper: Optional[float]) -> Array:
  """`clip(x, lower, upper)` for an `x` within the bounds in exact arithmetic.

  The clip only undoes rounding (a correlation of `1 + eps`, a Cauchy-Schwarz
  gap of `-eps`), so every derivative is `x`'s, at any order: at the bound
  itself (the diagonal `x1 = x2`, where the gap has its minimum 0 and the
  correlation its maximum 1), `jnp.maximum` would halve the derivatives and
  `jnp.where` drop them past it.
  """
  if lower is not None:
    x = jnp.where(x < lower, lower, x)
  if upper is not None:
    x = jnp.where(x > upper, upper, x)
  return x


@rounding_clip.defjvp
def _rounding_clip_jvp(lower, upper, primals, tangents):
  (x,), (dx,) = primals, tangents
  return rounding_clip(x, lower, upper), dx


def _eps(x: Array) -> float:
  return float(np.finfo(jnp.result_type(x, float)).eps)


def correlation(q1: Array, q2: Array, c: Array,
                clip: bool = True) -> tuple[Array, Array]:
  """`(sqrt(q1 q2), rho)` with `rho = c / sqrt(q1 q2)`.

  The product `q1 q2` under- or overflows long before the kernel does
  (float32 variances below 1e-19 or above 1e19), and the correlation must not
  depend on the scale of the inputs, since the arc-cosine kernels are
  homogeneous (`K(s x) = s^2 K(x)`). So the norm is `m sqrt((q1 / m)(q2 / m))`
  for a power of 2 `m` near `sqrt(q1 q2)`: the scaling is exact, and for
  `q1 = q2 = c` (the diagonal) `rho` is exactly 1, as `sqrt(q^2) = q` in
  floating point (which `sqrt(q1) sqrt(q2)` would not give).

  Where the covariance itself overflowed (`c = +-inf`, so the norm is
  infinite too), the correlation is unknown; it is taken to be `sign(c)`,
  the limit `|c| -> sqrt(q1 q2)`, which is exact on the diagonal
  (`c = q1 = q2`). A finite `c` against an infinite norm gives `rho = 0`.

  Args:
    q1, q2: variances (broadcastable against `c`).
    c: covariances.
    clip: whether to clip `rho` to `[-1, 1]` (rounding can push it out).

  Returns:
    `(norm, rho)`. Where a variance is zero, `rho` is 0 (the product is then 0
    anyway).
  """
  e1, e2 = scaling.exponent_of(q1), scaling.exponent_of(q2)
  m = scaling.power_of_two((e1 + e2) // 2 - 1, jnp.result_type(q1, q2, c))
  norm = m * safe_sqrt((q1 / m) * (q2 / m))
  positive = norm > 0
  rho = jnp.where(positive, c / jnp.where(positive, norm, 1), 0)
  rho = jnp.where(jnp.isinf(c), jnp.sign(c), rho)
  if clip:
    # Unlike `jnp.clip`, keeps every derivative at and past `rho = +-1`
    # (equal inputs, and their rounding), where `jnp.clip` would halve them.
    rho = rounding_clip(rho, -1., 1.)
  return norm, rho


def arccos_angle(rho: Array) -> tuple[Array, Array]:
  """`(theta, sin(theta))` for `theta = arccos(rho)`, with finite gradients.

  `arccos` has an infinite derivative at `rho = +-1` (equal or opposite
  inputs); computing the angle as `atan2(sqrt(1 - rho^2), rho)` with a square
  root floored at machine precision keeps values and gradients finite.
  (`arctan2` is a vectorizable `jnp.arctan2`, see `utils.arctan`.)
  """
  sin = jnp.sqrt(jnp.maximum(1 - rho**2, _eps(rho)**2))
  return arctan2(sin, rho), sin


def polynomial_value(coef: Sequence[float], x: Array) -> Array:
  """`sum_i coef[i] x^i` by Horner's rule (`coef` in increasing order)."""
  out = jnp.zeros_like(x)
  for a in reversed(coef):
    out = out * x + a
  return out


def _price_derivative(nngp_fn: Callable[[Array], Array], c: Array) -> Array:
  """`d nngp_fn(c) / d c` of an elementwise function of `c`, by forward mode.

  By Price's theorem this is `E[phi'(u) phi'(v)]` when `nngp_fn` is
  `E[phi(u) phi(v)]` at fixed variances.
  """
  return jax.jvp(nngp_fn, (c,), (jnp.ones_like(c),))[1]


def scaled_gaussian_determinant(q1: Array, q2: Array, c: Array, alpha: float
                                ) -> tuple[Array, Array, Array]:
  """`D = (1 + alpha q1)(1 + alpha q2) - alpha^2 c^2`, computed as `m^2 d`.

  Expanded as `1 + alpha (q1 + q2) + alpha^2 (q1 q2 - c^2)` (non-negative
  terms, `D >= 1`), but on arguments divided by `m`, the largest power of 2
  `<= max(1, q1, q2)`: the products of variances overflow in float32 from
  variances of about 1e19 (inputs of about 1e10) where the bounded kernels
  built from `D` are perfectly representable. For variances up to 1, `m = 1`
  and this is the unscaled expansion.

  Returns:
    `(m, alpha c / m, sqrt(d))`, so that `sqrt(D) = m sqrt(d)` and
    `atan2(alpha c, sqrt(D)) = atan2(alpha c / m, sqrt(d))`.
  """
  m = scaling.scale_above(jnp.maximum(q1, q2))
  u1, u2, v, e = alpha * (q1 / m), alpha * (q2 / m), alpha * (c / m), 1 / m
  # `u1 u2 - v^2 >= 0` (Cauchy-Schwarz) is clamped at 0, so that rounding
  # never takes `d` below `e (e + u1 + u2)`: for large variances that term is
  # tiny (`e` down to 2^-127), and a rounding error of `u1 u2 - v^2` of
  # either sign would swamp it.
  d = e * (e + u1 + u2) + rounding_clip(cauchy_schwarz_gap(u1, u2, v), 0.,
                                        None)
  return m, v, jnp.sqrt(d)


def cauchy_schwarz_gap(q1: Array, q2: Array, c: Array) -> Array:
  """`q1 q2 - c^2`, exactly 0 where `q1 = q2 = |c|` however it is compiled,
  and to a relative error of a few ulps of `q1 q2` elsewhere.

  For variances within a factor of 2 of each other it is written
  `(q1 - |c|) q2 + |c| (q2 - |c|)`: the differences are exact for nearby
  values (Sterbenz), and on the diagonal of a kernel both terms are exact
  zeros. The direct `q1 * q2 - c**2` is 0 there only when both products
  round alike, which XLA's fused multiply-add contraction in a compiled
  program does not ensure (it left a rounding error of `1e-7 q^2`, positive or
  negative, against a determinant term of `1e-38` in float32). For unequal
  variances that form cancels terms of size `|c| q2`, far above `q1 q2` when
  `q1 << |c|` (a small input against a large one): there it is
  `(n - |c|)(n + |c|)` with `n = sqrt(q1) sqrt(q2)`.
  """
  abs_c = jnp.abs(c)
  close = (q1 <= 2 * q2) & (q2 <= 2 * q1)
  near_diagonal = (q1 - abs_c) * q2 + abs_c * (q2 - abs_c)
  norm = jnp.sqrt(q1) * jnp.sqrt(q2)
  return jnp.where(close, near_diagonal, (norm - abs_c) * (norm + abs_c))


# -----------------------------------------------------------------------------
# Kernel maps.


def ab_relu_kernel_map(a: float, b: float) -> KernelMap:
  """Kernel map of `a min(x, 0) + b max(x, 0)` (arc-cosine kernels).

  With `t = arccos(rho)`, `rho = c / sqrt(q1 q2)`, and the degree-1
  arc-cosine kernel `K(rho) = sqrt(q1 q2) / (2 pi) (sin t + (pi - t) rho)`
  (Cho & Saul 2009), writing `phi(x) = b relu(x) - a relu(-x)` gives

    E[phi(u) phi(v)]   = (a^2 + b^2) K(rho) - 2 a b K(-rho)
                       = (a - b)^2 K(-rho) + (a^2 + b^2) c / 2
    E[phi'(u) phi'(v)] = ((a^2 + b^2) (pi - t) + 2 a b t) / (2 pi)

  since `K(rho) - K(-rho) = c / 2` and `P(u > 0, v > 0) = (pi - t) / (2 pi)`.
  """
  def kernel_map(q1, q2, c, compute_dot):
    norm, rho = correlation(q1, q2, c)
    theta, sin = arccos_angle(rho)
    # K(-rho) = norm / (2 pi) (sin t - t rho): `pi - t` becomes `t`. The norm
    # multiplies the angular factor last: at an infinite norm (an overflowed
    # kernel) the result is then inf, not `inf * 0 = nan` from `K(-1) = 0`.
    angular = ((a - b)**2 * (sin - theta * rho) / (2 * np.pi) +
               (a**2 + b**2) * rho / 2)
    nngp = norm * angular
    dot = None
    if compute_dot:
      dot = ((a**2 + b**2) * (np.pi - theta) + 2 * a * b * theta) / (2 * np.pi)
    return nngp, dot
  kernel_map.homogeneous = True
  return kernel_map


def relu_kernel_map(q1, q2, c, compute_dot):
  """Arc-cosine kernel of degree 1 (Cho & Saul 2009) and its derivative.

  E[relu(u) relu(v)] = sqrt(q1 q2) / (2 pi) * (sin t + (pi - t) cos t)
  E[step(u) step(v)] = (pi - t) / (2 pi),    t = arccos(c / sqrt(q1 q2)).
  """
  norm, rho = correlation(q1, q2, c)
  theta, sin = arccos_angle(rho)
  nngp = norm * ((sin + (np.pi - theta) * rho) / (2 * np.pi))
  dot = (np.pi - theta) / (2 * np.pi) if compute_dot else None
  return nngp, dot


# Homogeneous of degree 1 (`K(2^a q1, 2^b q2, 2^((a+b)/2) c) = 2^((a+b)/2)
# K(q1, q2, c)`, exactly, and `dot` unchanged): it maps scaled kernels
# (`Kernel.scale_exponents`) to kernels of the same scale.
relu_kernel_map.homogeneous = True


def erf_kernel_map(a: float, b: float, c_shift: float) -> KernelMap:
  """Kernel map of `a * erf(b x) + c_shift` (Williams 1997).

  With `D = (1 + 2 b^2 q1)(1 + 2 b^2 q2) - 4 b^4 c^2
          = 1 + 2 b^2 (q1 + q2) + 4 b^4 (q1 q2 - c^2) >= 1`:

    E[phi(u) phi(v)]   = a^2 2/pi arcsin(2 b^2 c / sqrt(D + 4 b^4 c^2))
                         + c_shift^2
                       = a^2 2/pi atan2(2 b^2 c, sqrt(D)) + c_shift^2
    E[phi'(u) phi'(v)] = a^2 4 b^2 / (pi sqrt(D))

  (`erf` is odd, so the shift adds `c_shift^2` and nothing else.)
  """
  alpha = 2 * b**2

  def kernel_map(q1, q2, c, compute_dot):
    m, v, root = scaled_gaussian_determinant(q1, q2, c, alpha)
    nngp = a**2 * 2 / np.pi * arctan2(v, root) + c_shift**2
    dot = a**2 * 2 * alpha / (np.pi * rounding_clip(m * root, 1., None))
    # Overflowed (infinite) variances: the limit `q -> inf` of `erf(b x)` is
    # `sign(x)`, whose kernel is `2/pi arcsin(rho)` (with `rho` as
    # `correlation` takes it), and `dot -> 0` as `1 / sqrt(q)`: the smallest
    # positive normal number, so that an infinite incoming NTK stays inf
    # (`0 * inf` would be NaN).
    overflow = jnp.isinf(q1) | jnp.isinf(q2)
    if b != 0:
      _, rho = correlation(q1, q2, c)
      limit = a**2 * (1 - 2 * arccos_angle(rho)[0] / np.pi) + c_shift**2
      nngp = jnp.where(overflow, limit, nngp)
      dot = jnp.where(overflow, np.finfo(dot.dtype).tiny, dot)
    return nngp, (dot if compute_dot else None)

  def scaled(q1, q2, c, ntk, e1, e2):
    """On covariances stored divided by `2^(e1 + e2)` (variances by
    `2^(2 e1)`, `2^(2 e2)`), where `D` itself may overflow: with `t_k =
    2^(-2 e_k)`, `D / 2^(2 e1 + 2 e2) = (t1 + alpha q1)(t2 + alpha q2) -
    alpha^2 c^2 = A^2 + B^2 + C^2` for `A = sqrt(t1 (t2 + alpha q2))`, `B =
    sqrt(t2 alpha q1)`, `C = alpha sqrt(q1 q2 - c^2)`, each representable
    (`sqrt(t_k) = 2^(-e_k)`), summed by `hypot`."""
    m = scaling.scale_above(jnp.maximum(q1, q2))
    gap = rounding_clip(cauchy_schwarz_gap(alpha * (q1 / m), alpha * (q2 / m),
                                           alpha * (c / m)), 0., None)
    dtype = jnp.result_type(q1, q2, c)
    root_t1 = scaling.power_of_two(-e1, dtype)
    root_t2 = scaling.power_of_two(-e2, dtype)
    root = _hypot_of_gap(
        jnp.hypot(root_t1 * jnp.sqrt(root_t2**2 + alpha * q2),
                  root_t2 * safe_sqrt(alpha * q1)), m, gap)
    nngp = a**2 * 2 / np.pi * arctan2(alpha * c, root) + c_shift**2
    if ntk is not None:
      ntk = a**2 * 2 * alpha / np.pi * ntk / root
    return nngp, ntk

  kernel_map.scaled = scaled
  return kernel_map


def _hypot_of_gap(x: Array, m: Array, gap: Array) -> Array:
  """`sqrt(x^2 + m^2 gap)` (`x > 0`, `gap >= 0`, `m` a power of 2), scaled
  by a power of 2 `p` near the larger term so nothing overflows; unlike
  `hypot(x, m sqrt(gap))`, smooth where `gap = 0` (`x1 = x2`, where `gap` is
  quadratic in `x1 - x2` and its root like `|x1 - x2|`)."""
  larger = jax.lax.stop_gradient(jnp.maximum(x, m * safe_sqrt(gap)))
  p = scaling.power_of_two(scaling.exponent_of(larger), larger.dtype)
  return p * jnp.sqrt((x / p)**2 + (m / p) * ((m / p) * gap))


def gelu_kernel_map(q1, q2, c, compute_dot):
  """Kernel map of `gelu(x) = x Phi(x)`, `Phi` the standard normal CDF.

  Derived by Gaussian integration by parts (Stein's lemma). With
  `s_i = 1 + q_i`, `D = s1 s2 - c^2 = 1 + q1 + q2 + (q1 q2 - c^2) >= 1`,
  `A = E[Phi(u) Phi(v)] = 1/4 + arcsin(c / sqrt(s1 s2)) / (2 pi)` and
  `P = E[phi(u) phi(v)] = 1 / (2 pi sqrt(D))` (`phi` the normal density):

    E[gelu(u) gelu(v)]   = c A + P (q1 q2 + c^2 (1 - q1 q2) / (s1 s2))
    E[gelu'(u) gelu'(v)] = A + c P (1 / s1 + 1 / s2 + 1 / D)
  """
  # On arguments scaled by `m` (see `scaled_gaussian_determinant`), with
  # `q1 q2 + c^2 (1 - q1 q2) / (s1 s2) = (q1 q2 D + c^2) / (s1 s2)`, so that
  # no product of two variances is formed.
  m, v, root_scaled = scaled_gaussian_determinant(q1, q2, c, 1.)
  root = rounding_clip(m * root_scaled, 1., None)
  t1, t2 = (1 / m + q1 / m), (1 / m + q2 / m)  # s1 / m, s2 / m
  cdf_kernel = 0.25 + arctan2(v, root_scaled) / (2 * np.pi)
  pdf_terms = ((q1 / m) / t1 * ((q2 / m) / t2) * root +
               v**2 / (t1 * t2) / root) / (2 * np.pi)
  nngp = c * cdf_kernel + pdf_terms
  dot = None
  if compute_dot:
    dot = cdf_kernel + c / (2 * np.pi * root) * (
        1 / (1 + q1) + 1 / (1 + q2) + 1 / root**2)
  return nngp, dot


def sign_kernel_map(q1, q2, c, compute_dot):
  """Kernel map of `sign(x)`: `E[sign(u) sign(v)] = 2/pi arcsin(rho)`.

  `= 1 - 2 t / pi` with `t = arccos(rho)`. The derivative of `sign` is zero
  almost everywhere, as autodiff of the finite network sees it, so the
  derivative kernel is 0: the layers below a `Sign` do not contribute to the
  NTK. (The distributional derivative `2 delta(x)` would give an NTK that is
  infinite on the diagonal.)
  """
  _, rho = correlation(q1, q2, c)
  theta, _ = arccos_angle(rho)
  nngp = 1 - 2 * theta / np.pi
  dot = jnp.zeros_like(nngp) if compute_dot else None
  return nngp, dot


def _snapped_square(value: float, shift: float) -> float:
  """`value**2` for `value` the sine or cosine of `shift`, with float64
  round-off of `shift` (e.g. `pi / 2` for `Cos`) snapped to an exact 0."""
  if abs(value) <= 4 * np.finfo(np.float64).eps * max(1., abs(shift)):
    return 0.
  return value**2


def sin_kernel_map(a: float, b: float, shift: float) -> KernelMap:
  """Kernel map of `a sin(b x + shift)`.

  From `E[cos(w + s)] = cos(s) exp(-Var[w] / 2)` for zero-mean Gaussian `w`
  and `sin x sin y = (cos(x - y) - cos(x + y)) / 2`:

    E[phi(u) phi(v)]   = a^2 / 2 (exp(-b^2 (q1 + q2 - 2c) / 2)
                                  - cos(2 shift) exp(-b^2 (q1 + q2 + 2c) / 2))
    E[phi'(u) phi'(v)] = a^2 b^2 / 2 (exp(-b^2 (q1 + q2 - 2c) / 2)
                                  + cos(2 shift) exp(-b^2 (q1 + q2 + 2c) / 2))

  The difference of exponentials cancels for small inputs (all of it below
  `b^2 c ~ eps`), so it is evaluated as

    E[phi(u) phi(v)]   = a^2 (S + sin(shift)^2 exp(-b^2 (q1 + q2 + 2c) / 2))
    E[phi'(u) phi'(v)] = a^2 b^2 (S + cos(shift)^2 exp(-b^2 (q1 + q2 + 2c) / 2))

  with `S = exp(-b^2 (q1 + q2) / 2) sinh(b^2 c) = sign(c) exp(-b^2 (q1 + q2 -
  2|c|) / 2) (-expm1(-2 b^2 |c|)) / 2`: a product of accurate factors, whose
  exponents are `<= 0` (`|c| <= (q1 + q2) / 2`), so nothing overflows or
  cancels (for `shift = 0` the NNGP is `a^2 S`).
  """
  if isinstance(shift, jax.core.Tracer):  # A hyperparameter being fitted.
    sin2, cos2 = jnp.sin(shift)**2, jnp.cos(shift)**2
  else:
    sin2 = _snapped_square(math.sin(shift), shift)
    cos2 = _snapped_square(math.cos(shift), shift)

  def kernel_map(q1, q2, c, compute_dot):
    t = b**2 * jnp.abs(c)
    near = jnp.exp(-b**2 * (q1 + q2 - 2 * jnp.abs(c)) / 2)
    sinh_part = jnp.sign(c) * near * (-jnp.expm1(-2 * t)) / 2
    opposite = jnp.exp(-b**2 * (q1 + q2 + 2 * c) / 2)
    nngp = a**2 * (sinh_part + sin2 * opposite)
    dot = a**2 * b**2 * (sinh_part + cos2 * opposite) if compute_dot else None
    return nngp, dot

  def scaled(q1, q2, c, ntk, e1, e2):
    """On covariances stored divided by `2^(e1 + e2)` (variances by
    `2^(2 e1)`, `2^(2 e2)`): the exponents need `q1 + q2 -+ 2c`, written
    `(r1 - r2)^2 + 2 r1 r2 (1 -+ rho)` from the standard deviations `r_k`
    (representable where the variances are not) and the scale-free
    correlation `rho` (exactly 1 on the diagonal); they overflow to `inf`
    where the kernel's exponentials vanish."""
    _, rho = correlation(q1, q2, c)
    zero = jnp.zeros_like(e1)
    r1 = scaling.times_powers_of_two(safe_sqrt(q1), e1, zero)
    r2 = scaling.times_powers_of_two(safe_sqrt(q2), e2, zero)
    cross = r1 * r2
    # The `where`s only keep `inf - inf` and `inf * 0` of overflowed standard
    # deviations from making NaN: elsewhere the products are kept, since
    # their first derivatives vanish on the diagonal (`r1 = r2`, `rho = 1`)
    # but not their second ones.
    diff = jnp.where((r1 == r2) & jnp.isinf(r1), 0, (r1 - r2)**2)
    spread = lambda w: diff + jnp.where((w == 0) & jnp.isinf(cross), 0,
                                        2 * cross * w)
    abs_rho = jnp.abs(rho)
    near = jnp.exp(-b**2 * spread(1 - abs_rho) / 2)
    t = b**2 * jnp.where(abs_rho == 0, 0, abs_rho * cross)
    sinh_part = jnp.sign(rho) * near * (-jnp.expm1(-2 * t)) / 2
    opposite = jnp.exp(-b**2 * spread(1 + rho) / 2)
    nngp = a**2 * (sinh_part + sin2 * opposite)
    if ntk is not None:
      dot = a**2 * b**2 * (sinh_part + cos2 * opposite)
      ntk = scaling.times_powers_of_two(dot * ntk, e1, e2)
    return nngp, ntk

  kernel_map.scaled = scaled
  return kernel_map


def exp_kernel_map(a: float, b: float) -> KernelMap:
  """Kernel map of `a exp(b x)`: the log-normal moments.

    E[phi(u) phi(v)]   = a^2 exp(b^2 (q1 + q2 + 2c) / 2)
    E[phi'(u) phi'(v)] = a^2 b^2 exp(b^2 (q1 + q2 + 2c) / 2)
  """
  def kernel_map(q1, q2, c, compute_dot):
    nngp = a**2 * jnp.exp(b**2 * (q1 + q2 + 2 * c) / 2)
    return nngp, (b**2 * nngp if compute_dot else None)
  return kernel_map


def exp_normalized_kernel_map(gamma: float, shift: float,
                              do_clip: bool) -> KernelMap:
  """Kernel map of the normalized exponential kernel (`ExpNormalized`).

    nngp' = sqrt(q1 q2) exp(gamma (rho + shift)),   rho = c / sqrt(q1 q2)
    dot   = d nngp' / d c = gamma exp(gamma (rho + shift))
  """
  def kernel_map(q1, q2, c, compute_dot):
    norm, rho = correlation(q1, q2, c, clip=do_clip)
    exp = jnp.exp(gamma * (rho + shift))
    return norm * exp, (gamma * exp if compute_dot else None)
  return kernel_map


def gaussian_kernel_map(a: float, b: float) -> KernelMap:
  """Kernel map of `a exp(b x^2)`.

  With `D = det(I - 2 b Sigma) = 1 - 2b (q1 + q2) + 4 b^2 (q1 q2 - c^2)`:

    E[phi(u) phi(v)]   = a^2 / sqrt(D)
    E[phi'(u) phi'(v)] = 4 a^2 b^2 c / D^(3/2)

  (the second from `E[u v exp(b (u^2 + v^2))] = c / D^(3/2)`). For `b <= 0`,
  `D >= 1`. For `b > 0` the moments are infinite where `D <= 0` (variances
  of order `1 / (2b)` or more), and the map returns `inf` there.
  """
  def kernel_map(q1, q2, c, compute_dot):
    det = 1 - 2 * b * (q1 + q2) + 4 * b**2 * (q1 * q2 - c**2)
    finite = det > 0
    safe_det = jnp.where(finite, det, 1)
    nngp = jnp.where(finite, a**2 / jnp.sqrt(safe_det), jnp.inf)
    dot = None
    if compute_dot:
      dot = jnp.where(finite, 4 * a**2 * b**2 * c / safe_det**1.5, jnp.inf)
    return nngp, dot
  return kernel_map


def _hermite_coefficient(i: int, k: int) -> float:
  """`h` in `z^i = sum_k h(i, k) He_k(z)` (probabilists' Hermite `He_k`).

  `h(i, k) = i! / (2^m m! k!)` for `i - k = 2m >= 0`, else 0.
  """
  if k > i or (i - k) % 2:
    return 0.
  m = (i - k) // 2
  return math.factorial(i) / (2**m * math.factorial(m) * math.factorial(k))


def polynomial_kernel_map(coef: Sequence[float]) -> KernelMap:
  """Kernel map of the polynomial `p(x) = sum_i coef[i] x^i`.

  Expanding `u^i = q1^(i/2) sum_k h(i, k) He_k(z1)` in Hermite polynomials,
  which are orthogonal under correlated normals
  (`E[He_k(z1) He_l(z2)] = delta_kl k! rho^k`), gives

    E[p(u) p(v)] = sum_k k! A_k(q1) A_k(q2) c^k,
    A_k(q) = sum_{i >= k, i = k mod 2} coef[i] h(i, k) q^((i - k) / 2),

  a polynomial in `q1`, `q2` and `c`: no square roots or divisions, finite
  everywhere. The derivative kernel is the same with the coefficients of
  `p'`.
  """
  coef = [float(a) for a in coef]
  derivative = [i * a for i, a in enumerate(coef)][1:]

  def moments(coef, q1, q2, c):
    out = jnp.zeros_like(c)
    for k in range(len(coef)):
      # A_k(q) is a polynomial in q with coefficients at powers (i - k) / 2.
      a_k = [coef[i] * _hermite_coefficient(i, k)
             for i in range(k, len(coef), 2)]
      out = out + (math.factorial(k) * polynomial_value(a_k, q1) *
                   polynomial_value(a_k, q2) * c**k)
    return out

  def kernel_map(q1, q2, c, compute_dot):
    nngp = moments(coef, q1, q2, c)
    dot = moments(derivative, q1, q2, c) if compute_dot else None
    return nngp, dot
  return kernel_map


def _arccos_polynomials(degree: int) -> tuple[list[float], list[float]]:
  """`(P_n, Q_n)` with `J_n(t) = P_n(cos t) sin t + (pi - t) Q_n(cos t)`.

  `J_n` is Cho & Saul's (2009) angular factor of the arc-cosine kernel,
  `J_n = (-1)^n sin(t)^(2n+1) ((1 / sin t) d/dt)^n ((pi - t) / sin t)`.
  Differentiating in `rho = cos t` instead of `t` turns the operator into the
  polynomial recursion

    P_{n+1} = (1 - rho^2) P_n' + 2n rho P_n + Q_n,      P_0 = 0,
    Q_{n+1} = (1 - rho^2) Q_n' + (2n + 1) rho Q_n,      Q_0 = 1,

  which has no division by `sin t` and so no 0/0 at `rho = +-1`; e.g.
  `J_1 = sin t + (pi - t) cos t` and
  `J_2 = 3 sin t cos t + (pi - t)(1 + 2 cos^2 t)`.
  Coefficients are in increasing order of powers of `rho`.
  """
  poly = np.polynomial.Polynomial
  p, q = poly([0.]), poly([1.])
  one_minus_rho2 = poly([1., 0., -1.])
  rho = poly([0., 1.])
  for n in range(degree):
    p, q = (one_minus_rho2 * p.deriv() + 2 * n * rho * p + q,
            one_minus_rho2 * q.deriv() + (2 * n + 1) * rho * q)
  return [float(a) for a in p.coef], [float(a) for a in q.coef]


def arccos_kernel(degree: int, norm: Array, rho: Array) -> Array:
  """`E[relu(u)^n relu(v)^n] = (q1 q2)^(n/2) J_n(arccos rho) / (2 pi)`.

  `relu(x)^0` is the step function `1[x > 0]`.
  """
  theta, sin = arccos_angle(rho)
  p, q = _arccos_polynomials(degree)
  angular = (polynomial_value(p, rho) * sin +
             (np.pi - theta) * polynomial_value(q, rho))
  if degree == 0:
    # With zero variance the input is 0 and `step(0) = 0`.
    return jnp.where(norm > 0, angular / (2 * np.pi), 0)
  return norm**degree * angular / (2 * np.pi)


def rectified_monomial_kernel_map(degree: int) -> KernelMap:
  """Kernel map of `max(x, 0)^n`: the arc-cosine kernel of degree `n`.

    E[phi(u) phi(v)]   = (q1 q2)^(n/2) J_n(t) / (2 pi)
    E[phi'(u) phi'(v)] = n^2 (q1 q2)^((n-1)/2) J_{n-1}(t) / (2 pi)

  (`phi' = n max(x, 0)^(n-1)`); for `n = 0` (the step function) the
  derivative is zero almost everywhere and so is the derivative kernel.
  """
  def kernel_map(q1, q2, c, compute_dot):
    norm, rho = correlation(q1, q2, c)
    nngp = arccos_kernel(degree, norm, rho)
    dot = None
    if compute_dot:
      dot = (jnp.zeros_like(nngp) if degree == 0 else
             degree**2 * arccos_kernel(degree - 1, norm, rho))
    return nngp, dot
  return kernel_map


def gabor_kernel_map(q1, q2, c, compute_dot):
  """Kernel map of `gabor(x) = exp(-x^2) sin(x)`.

  The weight `exp(-(u^2 + v^2))` turns `N(0, Sigma)` into
  `N(0, Sigma') / sqrt(D)`, `Sigma' = Sigma (I + 2 Sigma)^-1`,
  `D = det(I + 2 Sigma) = 1 + 2 (q1 + q2) + 4 d`, `d = q1 q2 - c^2`, with
  `Sigma' = [[q1 + 2d, c], [c, q2 + 2d]] / D`. Then
  `sin u sin v = (cos(u - v) - cos(u + v)) / 2` and
  `E'[cos w] = exp(-Var'[w] / 2)` give

    E[phi(u) phi(v)] = (exp(-(s - 2c) / (2D)) - exp(-(s + 2c) / (2D)))
                       / (2 sqrt(D)),        s = q1 + q2 + 4d,

  and the derivative kernel `d/dc` of it (Price's theorem), by autodiff.
  """
  def nngp_of(c):
    d = q1 * q2 - c**2
    det = jnp.maximum(1 + 2 * (q1 + q2) + 4 * d, 1)
    s = q1 + q2 + 4 * d
    return (jnp.exp(-(s - 2 * c) / (2 * det)) -
            jnp.exp(-(s + 2 * c) / (2 * det))) / (2 * jnp.sqrt(det))

  nngp = nngp_of(c)
  return nngp, (_price_derivative(nngp_of, c) if compute_dot else None)


def nngp_fn_kernel_map(nngp_fn: NngpFn,
                       d_nngp_fn: Optional[NngpFn]) -> KernelMap:
  """Kernel map from a user's `nngp_fn(cov12, var1, var2)`.

  The derivative kernel is `d_nngp_fn(cov12, var1, var2)` if given, else
  `d nngp_fn / d cov12` by forward-mode autodiff (Price's theorem).
  """
  def kernel_map(q1, q2, c, compute_dot):
    q1, q2, c = jnp.broadcast_arrays(q1, q2, c)
    nngp = nngp_fn(c, q1, q2)
    dot = None
    if compute_dot:
      dot = (d_nngp_fn(c, q1, q2) if d_nngp_fn is not None else
             _price_derivative(lambda c: nngp_fn(c, q1, q2), c))
    return nngp, dot
  return kernel_map


# -----------------------------------------------------------------------------
# Applying a kernel map to a `Kernel`.


def sides_are_one(k: Kernel) -> bool:
  """Whether `k` is trusted to be the kernel of `x1` with itself.

  A hand-built `Kernel` may carry `x1_is_x2=True` with two different sides
  (e.g. a test-train kernel with `cov2` the train variances); only one whose
  `cov2` is `None` (as `x2=None` gives) and whose `nngp` is square is.
  """
  return (k.x1_is_x2 and k.cov2 is None and
          k.nngp.shape[0] == k.nngp.shape[1])


def _with_batch_diagonal(nngp: Array, cov1: Array) -> Array:
  """`nngp` of `x1` with itself, its batch diagonal set to `cov1`.

  The two are equal in exact arithmetic, but they are computed by separate
  (differently fused) operations, and in the chaotic phase a nonlinearity's
  kernel map amplifies a difference between them at every layer (the slope of
  the correlation map at `c = q` exceeds 1): in float32, a 30-layer `Erf`
  network with `W_std=2.29` ends with an NNGP diagonal 21% below the variance.
  Setting the diagonal from `cov1` keeps `nngp[i, i] == cov1[i]` exactly.
  """
  if nngp.shape == cov1.shape:  # `cov1` is the full batch-by-batch covariance.
    return cov1
  batch = jnp.arange(nngp.shape[0])
  return nngp.at[batch, batch].set(cov1)


def _mapped_variances(
    k: Kernel, nngp: Array, fn: Callable[[list[Array]], Array],
    args_of: Callable[[str, Array], list[Array]]
) -> tuple[Array, Optional[Array]]:
  """`(cov1, cov2)` of a nonlinearity's output, `nngp` its mapped NNGP.

  Of `x1` with itself (`sides_are_one`), `cov1` is the batch diagonal of
  `nngp`, which maps exactly those variances: read from it, they equal it
  bitwise, without being mapped apart. Otherwise `cov1` and `cov2` are
  `fn(args_of('cov1', k.cov1))` and `fn(args_of('cov2', k.cov2))`; where
  both are batch-diagonal (`(N1, ...)`, `(N2, ...)`), by one call of `fn` on
  their concatenation (and that of their arguments) along the batch axis:
  the same formulas elementwise, in one XLA loop instead of two (each loop
  costs ~10 ms to compile on a CPU).
  """
  if sides_are_one(k):
    cov1 = (nngp if nngp.shape == k.cov1.shape else
            kernel_lib.batch_diagonal(nngp))
    return cov1, None
  cov1_args = args_of('cov1', k.cov1)
  if k.cov2 is None:
    return fn(cov1_args), None
  cov2_args = args_of('cov2', k.cov2)
  n1, n2 = k.cov1.shape[0], k.cov2.shape[0]
  leading_ok = lambda args, n: all(
      jnp.ndim(a) == k.cov1.ndim and jnp.shape(a)[0] in (1, n) for a in args)
  if not (k.diagonal_batch and k.cov1.shape[1:] == k.cov2.shape[1:] and
          leading_ok(cov1_args, n1) and leading_ok(cov2_args, n2)):
    return fn(cov1_args), fn(cov2_args)
  joint = fn([
      jnp.concatenate([jnp.broadcast_to(a, (n1,) + jnp.shape(a)[1:]),
                       jnp.broadcast_to(b, (n2,) + jnp.shape(b)[1:])])
      for a, b in zip(cov1_args, cov2_args)])
  return joint[:n1], joint[n1:]


def _map_covariance(kernel_map: KernelMap, q1: Array, q2: Array, c: Array,
                    ntk: Optional[Array]) -> tuple[Array, Optional[Array]]:
  """`(nngp', dot * ntk)` of the covariance `c` (same shape as `ntk`).

  Large covariances are mapped in place in blocks of rows
  (`row_blocks.map_rows_in_place`): the kernel map's intermediates (angles,
  square roots, ratios that XLA keeps as buffers because they have several
  uses) are then block-sized, which saves memory and memory traffic; the
  results are bitwise the same.
  """
  def mapped(c, ntk, q1, q2):
    nngp, dot = kernel_map(q1, q2, c, ntk is not None)
    return nngp, None if ntk is None else dot * ntk

  if jnp.ndim(q1) != c.ndim or jnp.ndim(q2) != c.ndim:
    return mapped(c, ntk, q1, q2)
  nngp, ntk = row_blocks.map_rows_in_place(mapped, [c, ntk], [q1, q2])
  return nngp, ntk


def accepts_scaled(kernel_map: KernelMap) -> bool:
  """Whether `elementwise_kernel` can apply `kernel_map` to a scaled
  kernel (`Kernel.scale_exponents`): a homogeneous map, or one with a
  `scaled` form."""
  return (getattr(kernel_map, 'homogeneous', False) or
          hasattr(kernel_map, 'scaled'))


def _scaled_elementwise_kernel(k: Kernel, kernel_map: KernelMap) -> Kernel:
  """`elementwise_kernel` of a scaled `k` by the map's `scaled` form
  `(q1, q2, c, ntk, e1, e2) -> (nngp', ntk')`, which returns the kernel
  itself (`scale_exponents=None`)."""
  variances = kernel_lib.covariance_variances(k)
  exponents = kernel_lib.exponent_pairs(k)

  def mapped(field, c, ntk=None):
    return kernel_map.scaled(*variances[field], c, ntk, *exponents[field])

  c = k.nngp
  if sides_are_one(k):
    c = _with_batch_diagonal(c, k.cov1)
  nngp, ntk = mapped('nngp', c, k.ntk)
  cov1, cov2 = _mapped_variances(
      k, nngp, lambda args: kernel_map.scaled(*args[:3], None, *args[3:])[0],
      lambda field, cov: [*variances[field], cov, *exponents[field]])
  return k.replace(nngp=nngp, ntk=ntk, cov1=cov1, cov2=cov2,
                   is_gaussian=False, is_input=False, scale_exponents=None)


def elementwise_kernel(k: Kernel, kernel_map: KernelMap, name: str) -> Kernel:
  """Applies a nonlinearity's kernel map to every covariance of `k`.

  A scaled `k` (`Kernel.scale_exponents`) stays scaled through a
  homogeneous map and is unscaled by one with a `scaled` form (see
  `accepts_scaled`); other maps are only given unscaled kernels.
  """
  if not k.is_gaussian:
    source = ('the raw inputs' if k.is_input else
              'not Gaussian (e.g. the output of a nonlinearity)')
    raise ValueError(
        f'`{name}` needs Gaussian pre-activations, but its input kernel is '
        f'{source}. Put a `Dense` (or convolution) layer before `{name}`.')
  if (k.scale_exponents is not None and
      not getattr(kernel_map, 'homogeneous', False)):
    return _scaled_elementwise_kernel(k, kernel_map)
  variances = kernel_lib.covariance_variances(k)
  c = k.nngp
  if sides_are_one(k):
    # The batch diagonal of `x1` with itself is `cov1` exactly, so that its
    # correlation is exactly 1 (angle 0): computed apart (e.g. by a jitted
    # block of `nt.batch`), it is 1 - eps, whose angle ~ sqrt(eps) puts a
    # relative error ~ 1e-8 (float64) into the NTK's diagonal.
    c = _with_batch_diagonal(c, k.cov1)
  nngp, ntk = _map_covariance(kernel_map, *variances['nngp'], c, k.ntk)
  cov1, cov2 = _mapped_variances(
      k, nngp, lambda args: kernel_map(*args, False)[0],
      lambda field, cov: [*variances[field], cov])
  return k.replace(nngp=nngp, ntk=ntk, cov1=cov1, cov2=cov2,
                   is_gaussian=False, is_input=False)
