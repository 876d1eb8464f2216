"""Elementwise nonlinearities with closed-form NNGP and NTK kernels.

For an elementwise `phi` applied to jointly Gaussian pre-activations
`(u, v) ~ N(0, [[q1, c], [c, q2]])` (the inputs' variances and covariance),

  nngp' = E[phi(u) phi(v)]
  ntk'  = E[phi'(u) phi'(v)] * ntk

(Neal 1996; Lee et al. 2018; Jacot et al. 2018).

Each layer supplies a *kernel map*
`(q1, q2, c, compute_dot) -> (E[phi(u) phi(v)], E[phi'(u) phi'(v)] or None)`
(written in `kernel_maps`, with the numerics that keep them finite at the
edges of their domain), and `elementwise` applies it to `cov1`, `nngp` and
`cov2` with the right variances; the same map serves fully connected,
convolutional and batch- or spatially-diagonal kernels.

Masked inputs (see `masking`) keep their mask through these layers; covariance
entries at masked positions are re-zeroed after the map, since `phi(0)` need
not be 0.
"""
import math
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.stax.kernel_maps import ab_relu_kernel_map
from neural_tangents._src.stax.kernel_maps import accepts_scaled as reads_scaled
from neural_tangents._src.stax.kernel_maps import elementwise_kernel
from neural_tangents._src.stax.kernel_maps import erf_kernel_map
from neural_tangents._src.stax.kernel_maps import exp_kernel_map
from neural_tangents._src.stax.kernel_maps import exp_normalized_kernel_map
from neural_tangents._src.stax.kernel_maps import gabor_kernel_map
from neural_tangents._src.stax.kernel_maps import gaussian_kernel_map
from neural_tangents._src.stax.kernel_maps import gelu_kernel_map
from neural_tangents._src.stax.kernel_maps import KernelMap
from neural_tangents._src.stax.kernel_maps import nngp_fn_kernel_map
from neural_tangents._src.stax.kernel_maps import NngpFn
from neural_tangents._src.stax.kernel_maps import polynomial_kernel_map
from neural_tangents._src.stax.kernel_maps import polynomial_value
from neural_tangents._src.stax.kernel_maps import rectified_monomial_kernel_map
from neural_tangents._src.stax.kernel_maps import relu_kernel_map
from neural_tangents._src.stax.kernel_maps import sign_kernel_map
from neural_tangents._src.stax.kernel_maps import sin_kernel_map
from neural_tangents._src.stax.masking import supports_masking
from neural_tangents._src.stax.protocol import Diagonal
from neural_tangents._src.stax.quadrature import elementwise_derivative
from neural_tangents._src.stax.quadrature import quadrature_kernel_map
from neural_tangents._src.stax.requirements import layer
from neural_tangents._src.stax.requirements import requires
from neural_tangents._src.utils import arguments
from neural_tangents._src.utils.kernel import Kernel
from neural_tangents._src.utils.typing import Layer

Array = jax.Array


# -----------------------------------------------------------------------------
# The layer of a kernel map.


def elementwise(fn: Optional[Callable[[Array], Array]], kernel_map: KernelMap,
                name: str) -> Layer:
  """An elementwise layer `(init_fn, apply_fn, kernel_fn)` from `fn` and its
  kernel map. Decorate the public constructor with `@layer`.

  Args:
    fn: the function applied by `apply_fn`; `None` when the layer has no
      finite-width counterpart (`apply_fn` then raises a `ValueError`).
    kernel_map: `(q1, q2, c, compute_dot) -> (nngp, dot)`.
    name: the layer's name, for error messages.
  """
  init_fn = lambda rng, input_shape: (input_shape, ())

  def apply_fn(params, inputs, **kwargs):
    if fn is None:
      raise ValueError(
          f'`{name}` has no finite-width function (`fn` is None), so its '
          '`apply_fn` cannot be evaluated; only its `kernel_fn` is defined. '
          f'Pass `fn=` to `{name}` to use it in a finite network.')
    return fn(inputs)

  @requires(diagonal_batch=Diagonal(), diagonal_spatial=Diagonal(),
            accepts_scaled=reads_scaled(kernel_map))
  def kernel_fn(k: Kernel, **kwargs) -> Kernel:
    return elementwise_kernel(k, kernel_map, name)

  return init_fn, apply_fn, kernel_fn


# -----------------------------------------------------------------------------
# Layers.


@layer
@supports_masking(remask_kernel=True)
def Relu(do_stabilize: bool = False) -> Layer:
  """Rectified linear unit `max(x, 0)`, with the arc-cosine kernel.

    nngp' = sqrt(q1 q2) / (2 pi) (sin t + (pi - t) cos t)
    ntk'  = (pi - t) / (2 pi) * ntk,          t = arccos(c / sqrt(q1 q2))

  (Cho & Saul 2009), computed stably at `t = 0` and `t = pi`.

  Args:
    do_stabilize: accepted for compatibility; the kernel here is always
      computed in a numerically stable form.

  Returns:
    `(init_fn, apply_fn, kernel_fn)`.

  Example:
    >>> _, _, kernel_fn = stax.serial(stax.Dense(1), stax.Relu())
    >>> round(float(kernel_fn(jnp.ones((1, 2)), None, 'nngp')[0, 0]), 6)
    0.5
  """
  del do_stabilize
  return elementwise(jax.nn.relu, relu_kernel_map, 'Relu')


@layer
@supports_masking(remask_kernel=True)
def ABRelu(a: float, b: float, do_stabilize: bool = False) -> Layer:
  """`a * min(x, 0) + b * max(x, 0)`, with arc-cosine kernels.

    nngp' = (a - b)^2 sqrt(q1 q2) / (2 pi) (sin t - t cos t) + (a^2 + b^2) c / 2
    ntk'  = ((a^2 + b^2)(pi - t) + 2 a b t) / (2 pi) * ntk

  with `t = arccos(c / sqrt(q1 q2))` (see `ab_relu_kernel_map`).

  Args:
    a: slope for negative inputs.
    b: slope for positive inputs.
    do_stabilize: accepted for compatibility; the kernel is always computed
      in a numerically stable form.

  Returns:
    `(init_fn, apply_fn, kernel_fn)`.

  Example:
    >>> _, apply_fn, _ = stax.ABRelu(-0.5, 2.)
    >>> apply_fn((), jnp.array([-2., 3.]))
    Array([1., 6.], dtype=float32)
  """
  del do_stabilize
  fn = lambda x: a * jnp.minimum(x, 0) + b * jnp.maximum(x, 0)
  return elementwise(fn, ab_relu_kernel_map(a, b), 'ABRelu')


@layer
@supports_masking(remask_kernel=True)
def LeakyRelu(alpha: float, do_stabilize: bool = False) -> Layer:
  """Leaky ReLU `x if x > 0 else alpha * x`: `ABRelu(alpha, 1)`.

  Args:
    alpha: slope for negative inputs.
    do_stabilize: accepted for compatibility (always stable here).

  Returns:
    `(init_fn, apply_fn, kernel_fn)`.

  Example:
    >>> _, apply_fn, _ = stax.LeakyRelu(0.1)
    >>> apply_fn((), jnp.array([-2., 3.]))
    Array([-0.2,  3. ], dtype=float32)
  """
  del do_stabilize
  fn = lambda x: jnp.where(x > 0, x, alpha * x)
  return elementwise(fn, ab_relu_kernel_map(alpha, 1.), 'LeakyRelu')


@layer
@supports_masking(remask_kernel=True)
def Abs(do_stabilize: bool = False) -> Layer:
  """Absolute value `|x|`: `ABRelu(-1, 1)`.

    nngp' = 2 sqrt(q1 q2) / pi (sin t - t cos t) + c

  Args:
    do_stabilize: accepted for compatibility (always stable here).

  Returns:
    `(init_fn, apply_fn, kernel_fn)`.

  Example:
    >>> _, apply_fn, _ = stax.Abs()
    >>> apply_fn((), jnp.array([-2., 3.]))
    Array([2., 3.], dtype=float32)
  """
  del do_stabilize
  return elementwise(jnp.abs, ab_relu_kernel_map(-1., 1.), 'Abs')


@layer
@supports_masking(remask_kernel=True)
def Erf(a: float = 1., b: float = 1., c: float = 0.) -> Layer:
  """`a * erf(b * x) + c`, with the arcsine kernel of Williams (1997).

    nngp' = a^2 2/pi arcsin(2 b^2 k / sqrt((1 + 2 b^2 q1)(1 + 2 b^2 q2))) + c^2
    E[phi' phi'] = a^2 4 b^2 / pi / sqrt((1 + 2b^2 q1)(1 + 2b^2 q2) - 4b^4 k^2)

  where `k` is the covariance (see `erf_kernel_map` for the stable form).

  Args:
    a: output scale.
    b: input scale.
    c: output shift.

  Returns:
    `(init_fn, apply_fn, kernel_fn)`.

  Example:
    >>> _, apply_fn, _ = stax.Erf()
    >>> apply_fn((), jnp.zeros(1))
    Array([0.], dtype=float32)
  """
  return elementwise(lambda x: a * jax.scipy.special.erf(b * x) + c,
                     erf_kernel_map(a, b, c), 'Erf')


@layer
@supports_masking(remask_kernel=True)
def Sigmoid_like() -> Layer:
  """A sigmoid with a closed-form kernel: `0.5 erf(x / 2.40206) + 0.5`.

  The scale `2.4020563531719796` makes it close to the logistic sigmoid
  `1 / (1 + exp(-x))` (largest absolute difference about 0.0097). It is
  `Erf(a=0.5, b=1 / 2.4020563531719796, c=0.5)`, so

    nngp' = 1/(2 pi) arcsin(2 b^2 k / sqrt((1 + 2 b^2 q1)(1 + 2 b^2 q2))) + 1/4

  Returns:
    `(init_fn, apply_fn, kernel_fn)`.

  Example:
    >>> _, apply_fn, _ = stax.Sigmoid_like()
    >>> apply_fn((), jnp.zeros(1))
    Array([0.5], dtype=float32)
  """
  a, b, c = 0.5, 1 / 2.4020563531719796, 0.5
  return elementwise(lambda x: a * jax.scipy.special.erf(b * x) + c,
                     erf_kernel_map(a, b, c), 'Sigmoid_like')


@layer
@supports_masking(remask_kernel=True)
def Gelu(approximate: bool = False) -> Layer:
  """Gaussian error linear unit `gelu(x) = x Phi(x)` (Hendrycks & Gimpel).

  With `A = 1/4 + arcsin(c / sqrt((1 + q1)(1 + q2))) / (2 pi)`,
  `D = (1 + q1)(1 + q2) - c^2` and `P = 1 / (2 pi sqrt(D))`:

    nngp' = c A + P (q1 q2 + c^2 (1 - q1 q2) / ((1 + q1)(1 + q2)))
    ntk'  = (A + c P (1 / (1 + q1) + 1 / (1 + q2) + 1 / D)) * ntk

  Args:
    approximate: whether `apply_fn` uses the tanh approximation
      `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))` (as
      `jax.nn.gelu(approximate=True)`). The kernel is always that of the exact
      GELU: the approximation differs from it by less than 5e-4 everywhere.

  Returns:
    `(init_fn, apply_fn, kernel_fn)`.

  Example:
    >>> _, apply_fn, _ = stax.Gelu()
    >>> apply_fn((), jnp.zeros(1))
    Array([0.], dtype=float32)
  """
  fn = lambda x: jax.nn.gelu(x, approximate=approximate)
  return elementwise(fn, gelu_kernel_map, 'Gelu')


@layer
@supports_masking(remask_kernel=True)
def Sign() -> Layer:
  """`sign(x)`, with `nngp' = 2/pi arcsin(c / sqrt(q1 q2))`.

  The derivative of `sign` is 0 almost everywhere (as autodiff of the finite
  network sees it), so `ntk' = 0`: layers before a `Sign` add nothing to the
  NTK.

  Returns:
    `(init_fn, apply_fn, kernel_fn)`.

  Example:
    >>> _, apply_fn, _ = stax.Sign()
    >>> apply_fn((), jnp.array([-2., 0., 3.]))
    Array([-1.,  0.,  1.], dtype=float32)
  """
  return elementwise(jnp.sign, sign_kernel_map, 'Sign')


@layer
@supports_masking(remask_kernel=True)
def Sin(a: float = 1., b: float = 1., c: float = 0.) -> Layer:
  """`a * sin(b * x + c)`.

    nngp' = a^2/2 (exp(-b^2 (q1 + q2 - 2k) / 2)
                   - cos(2c) exp(-b^2 (q1 + q2 + 2k) / 2))
    ntk'  = a^2 b^2/2 (exp(-b^2 (q1 + q2 - 2k) / 2)
                       + cos(2c) exp(-b^2 (q1 + q2 + 2k) / 2)) * ntk

  where `k` is the covariance.

  Args:
    a: output scale.
    b: input scale (frequency).
    c: phase.

  Returns:
    `(init_fn, apply_fn, kernel_fn)`.

  Example:
    >>> _, apply_fn, _ = stax.Sin(a=2.)
    >>> apply_fn((), jnp.zeros(1))
    Array([0.], dtype=float32)
  """
  return elementwise(lambda x: a * jnp.sin(b * x + c), sin_kernel_map(a, b, c),
                     'Sin')


@layer
@supports_masking(remask_kernel=True)
def Cos(a: float = 1., b: float = 1., c: float = 0.) -> Layer:
  """`a * cos(b * x + c)`, which is `Sin(a, b, c + pi/2)`.

    nngp' = a^2/2 (exp(-b^2 (q1 + q2 - 2k) / 2)
                   + cos(2c) exp(-b^2 (q1 + q2 + 2k) / 2))

  Args:
    a: output scale.
    b: input scale (frequency).
    c: phase.

  Returns:
    `(init_fn, apply_fn, kernel_fn)`.

  Example:
    >>> _, apply_fn, _ = stax.Cos()
    >>> apply_fn((), jnp.zeros(1))
    Array([1.], dtype=float32)
  """
  return elementwise(lambda x: a * jnp.cos(b * x + c),
                     sin_kernel_map(a, b, c + np.pi / 2), 'Cos')


@layer
@supports_masking(remask_kernel=True)
def Rbf(gamma: float = 1.0) -> Layer:
  """Random Fourier features `sqrt(2) sin(sqrt(2 gamma) x + pi/4)`.

  This is `Sin(a=sqrt(2), b=sqrt(2 gamma), c=pi/4)`; since
  `cos(2 c) = cos(pi/2) = 0`, its kernel is exactly the RBF kernel of the
  pre-activations,

    nngp' = exp(-gamma (q1 + q2 - 2k)) = exp(-gamma E[(u - v)^2])
    ntk'  = 2 gamma exp(-gamma (q1 + q2 - 2k)) * ntk

  After `Dense(W_std=1, b_std=None)` on inputs of dimension `d` this is
  `exp(-gamma ||x - x'||^2 / d)` (Rahimi & Recht 2007).

  Args:
    gamma: inverse length scale, `> 0`.

  Returns:
    `(init_fn, apply_fn, kernel_fn)`.

  Example:
    >>> _, _, kernel_fn = stax.serial(stax.Dense(1), stax.Rbf())
    >>> float(kernel_fn(jnp.ones((1, 2)), None, 'nngp')[0, 0])
    1.0
  """
  gamma = arguments.real_number(gamma, 'gamma', 'Pass e.g. `Rbf(gamma=1.)`.',
                                layer_name='Rbf')
  gamma_value = arguments.concrete_real(gamma)
  if gamma_value is not None and not gamma_value > 0:
    raise ValueError(f'`gamma` of `Rbf` must be > 0 (an inverse length '
                     f'scale); got {gamma!r}. Pass e.g. `Rbf(gamma=1.)`.')
  # `jnp.sqrt` for a traced `gamma` (a hyperparameter being fitted).
  sqrt = jnp.sqrt if isinstance(gamma, jax.core.Tracer) else math.sqrt
  a, b, c = math.sqrt(2.), sqrt(2. * gamma), math.pi / 4
  return elementwise(lambda x: a * jnp.sin(b * x + c), sin_kernel_map(a, b, c),
                     'Rbf')


@layer
@supports_masking(remask_kernel=True)
def Exp(a: float = 1., b: float = 1.) -> Layer:
  """`a * exp(b * x)`, with log-normal moments.

    nngp' = a^2 exp(b^2 (q1 + q2 + 2k) / 2)
    ntk'  = a^2 b^2 exp(b^2 (q1 + q2 + 2k) / 2) * ntk

  The kernel grows doubly exponentially with depth; keep variances small.

  Args:
    a: output scale.
    b: input scale.

  Returns:
    `(init_fn, apply_fn, kernel_fn)`.

  Example:
    >>> _, apply_fn, _ = stax.Exp()
    >>> apply_fn((), jnp.zeros(1))
    Array([1.], dtype=float32)
  """
  return elementwise(lambda x: a * jnp.exp(b * x), exp_kernel_map(a, b), 'Exp')


@layer
@supports_masking(remask_kernel=True)
def ExpNormalized(gamma: float = 1,
                  shift: float = -1,
                  do_clip: bool = False) -> Layer:
  """The normalized exponential ("Gaussian normalized") kernel; kernel only.

    nngp' = sqrt(q1 q2) exp(gamma (c / sqrt(q1 q2) + shift))
    ntk'  = gamma exp(gamma (c / sqrt(q1 q2) + shift)) * ntk

  With the default `shift = -1` this is
  `|x| |y| exp(-gamma/2 |x/|x| - y/|y||^2)`: a Gaussian kernel between the
  directions of the pre-activations, scaled by their norms, so that the
  variance is preserved (`nngp' = q` on the diagonal) for any `gamma`
  (cf. Shankar et al. 2020, "Neural Kernels Without Tangents"). The NTK uses
  `d nngp' / d c`, the analogue of `E[phi'(u) phi'(v)]` (Price's theorem).

  No elementwise function has this kernel (a function whose kernel scales
  as `sqrt(q1 q2)` must be positively homogeneous, `a min(x, 0) + b max(x,
  0)`, whose kernel is the arc-cosine one), so `apply_fn` raises a
  `ValueError`; use the layer in infinite networks only.

  Args:
    gamma: exponent scale, `>= 0` (a negative one gives a kernel that is not
      positive semi-definite).
    shift: added to the correlation before exponentiating.
    do_clip: whether to clip the correlation `c / sqrt(q1 q2)` to `[-1, 1]`
      (rounding can push it out slightly; the kernel is finite either way).

  Returns:
    `(init_fn, apply_fn, kernel_fn)`.

  Example:
    >>> _, _, kernel_fn = stax.serial(stax.Dense(1), stax.ExpNormalized())
    >>> float(kernel_fn(jnp.ones((1, 2)), None, 'nngp')[0, 0])
    1.0
  """
  gamma = arguments.real_number(
      gamma, 'gamma', 'Pass e.g. `ExpNormalized(gamma=1.)`.',
      layer_name='ExpNormalized')
  gamma_value = arguments.concrete_real(gamma)
  if gamma_value is not None and not gamma_value >= 0:
    # `exp(gamma rho)` is PSD in `rho` (a correlation) only for `gamma >= 0`
    # (a power series in `rho` with nonnegative coefficients).
    raise ValueError(
        f'`gamma` of `ExpNormalized` must be >= 0; got {gamma!r}, which makes '
        'the kernel not positive semi-definite (no network has it). Pass e.g. '
        '`ExpNormalized(gamma=1.)` (0 gives the linear-in-norms kernel).')
  return elementwise(None, exp_normalized_kernel_map(gamma, shift, do_clip),
                     'ExpNormalized')


@layer
@supports_masking(remask_kernel=True)
def Gaussian(a: float = 1., b: float = -1.) -> Layer:
  """`a * exp(b * x^2)`.

    nngp' = a^2 / sqrt(D)
    ntk'  = 4 a^2 b^2 k / D^(3/2) * ntk,
    D = (1 - 2b q1)(1 - 2b q2) - 4 b^2 k^2

  where `k` is the covariance. For `b > 0` the moments are infinite once
  `D <= 0`, and the kernel is `inf` there.

  Args:
    a: output scale.
    b: exponent scale; `b < 0` for a bump.

  Returns:
    `(init_fn, apply_fn, kernel_fn)`.

  Example:
    >>> _, apply_fn, _ = stax.Gaussian()
    >>> apply_fn((), jnp.zeros(1))
    Array([1.], dtype=float32)
  """
  return elementwise(lambda x: a * jnp.exp(b * x**2), gaussian_kernel_map(a, b),
                     'Gaussian')


@layer
@supports_masking(remask_kernel=True)
def Monomial(degree: int) -> Layer:
  """`x^degree`, with Gaussian moments (Isserlis' theorem).

    nngp' = E[u^n v^n] = sum_k (h(n, k))^2 k! (q1 q2)^((n - k)/2) c^k
    ntk'  = n^2 E[u^(n-1) v^(n-1)] * ntk

  with `h(n, k) = n! / (2^m m! k!)`, `n - k = 2m` (see
  `polynomial_kernel_map`); e.g. `degree=2`: `nngp' = q1 q2 + 2 c^2`.

  Args:
    degree: non-negative int; `0` is the constant 1.

  Returns:
    `(init_fn, apply_fn, kernel_fn)`.

  Example:
    >>> _, apply_fn, _ = stax.Monomial(3)
    >>> apply_fn((), jnp.array([2.]))
    Array([8.], dtype=float32)
  """
  degree = arguments.positive_int(degree, 'degree', 'Pass e.g. `Monomial(2)`.',
                                  minimum=0)
  coef = [0.] * degree + [1.]
  return elementwise(lambda x: x**degree, polynomial_kernel_map(coef),
                     'Monomial')


@layer
@supports_masking(remask_kernel=True)
def RectifiedMonomial(degree: int) -> Layer:
  """`max(x, 0)^degree`: the arc-cosine kernel of degree `n` (Cho & Saul).

    nngp' = (q1 q2)^(n/2) J_n(t) / (2 pi)
    ntk'  = n^2 (q1 q2)^((n-1)/2) J_{n-1}(t) / (2 pi) * ntk

  with `t = arccos(c / sqrt(q1 q2))` and
  `J_n(t) = P_n(cos t) sin t + (pi - t) Q_n(cos t)` for polynomials from a
  division-free recursion (see `kernel_maps.arccos_kernel`), which keeps the
  kernel and its gradients finite at `t = 0` and `t = pi`.

  Args:
    degree: non-negative int. `degree=0` is the step function `1[x > 0]`,
      whose derivative (and NTK contribution) is zero almost everywhere;
      `degree=1` is `Relu`.

  Returns:
    `(init_fn, apply_fn, kernel_fn)`.

  Example:
    >>> _, apply_fn, _ = stax.RectifiedMonomial(2)
    >>> apply_fn((), jnp.array([-2., 3.]))
    Array([0., 9.], dtype=float32)
  """
  degree = arguments.positive_int(
      degree, 'degree', 'Pass e.g. `RectifiedMonomial(2)`.', minimum=0)

  def fn(x):
    if degree == 0:
      return jnp.where(x > 0, 1, 0).astype(x.dtype)
    return jnp.where(x > 0, x, 0)**degree

  return elementwise(fn, rectified_monomial_kernel_map(degree),
                     'RectifiedMonomial')


def _check_coefficients(coef) -> list[float]:
  try:
    values = [float(a) for a in np.asarray(coef, dtype=float).reshape(-1)]
    ok = np.ndim(coef) == 1 and len(values) > 0
  except (TypeError, ValueError):
    ok = False
  if not ok:
    raise ValueError(
        f'`coef` must be a non-empty 1D sequence of numbers (the coefficients '
        f'of x^0, x^1, ...); got {coef!r}. Pass e.g. `Polynomial([0., 1., '
        '0.5])` for x + 0.5 x^2.')
  return values


@layer
@supports_masking(remask_kernel=True)
def Polynomial(coef: Sequence[float]) -> Layer:
  """The polynomial `p(x) = sum_i coef[i] x^i`.

    nngp' = E[p(u) p(v)] = sum_k k! A_k(q1) A_k(q2) c^k
    ntk'  = E[p'(u) p'(v)] * ntk (the same with the coefficients of p')

  with `A_k(q) = sum_i coef[i] h(i, k) q^((i - k)/2)` from the Hermite
  expansion of monomials (see `polynomial_kernel_map`).

  Args:
    coef: coefficients of `x^0, x^1, ...` (increasing powers).

  Returns:
    `(init_fn, apply_fn, kernel_fn)`.

  Example:
    >>> _, apply_fn, _ = stax.Polynomial([1., 0., 2.])
    >>> apply_fn((), jnp.array([3.]))
    Array([19.], dtype=float32)
  """
  coef = _check_coefficients(coef)
  return elementwise(lambda x: polynomial_value(coef, x),
                     polynomial_kernel_map(coef), 'Polynomial')


@layer
@supports_masking(remask_kernel=True)
def Hermite(degree: int) -> Layer:
  """The normalized probabilists' Hermite polynomial `He_n(x) / sqrt(n!)`.

  `He_0 = 1`, `He_1 = x`, `He_{n+1} = x He_n - n He_{n-1}`. The normalization
  makes `E[He_n(z)^2] / n! = 1` for standard normal `z`, and for unit-variance
  pre-activations (`q1 = q2 = 1`, e.g. after `LayerNorm`)

    nngp' = c^n,      ntk' = n c^(n-1) * ntk.

  For other variances the kernel is the exact `E[He_n(u) He_n(v)] / n!`, a
  polynomial in `q1`, `q2`, `c` (see `polynomial_kernel_map`).

  Args:
    degree: non-negative int.

  Returns:
    `(init_fn, apply_fn, kernel_fn)`.

  Example:
    >>> _, apply_fn, _ = stax.Hermite(2)
    >>> apply_fn((), jnp.array([3.]))  # (9 - 1) / sqrt(2)
    Array([5.656854], dtype=float32)
  """
  degree = arguments.positive_int(degree, 'degree', 'Pass e.g. `Hermite(3)`.',
                                  minimum=0)
  basis = [0.] * degree + [1.]
  # Python floats are weakly typed: they keep the input's dtype.
  coef = [float(a) for a in np.polynomial.hermite_e.herme2poly(basis) /
          math.sqrt(math.factorial(degree))]
  return elementwise(lambda x: polynomial_value(coef, x),
                     polynomial_kernel_map(coef), 'Hermite')


@layer
@supports_masking(remask_kernel=True)
def Gabor() -> Layer:
  """The Gabor function `exp(-x^2) sin(x)`.

  With `d = q1 q2 - c^2`, `D = 1 + 2 (q1 + q2) + 4d` and `s = q1 + q2 + 4d`
  (derived in `gabor_kernel_map`):

    nngp' = (exp(-(s - 2c) / (2D)) - exp(-(s + 2c) / (2D))) / (2 sqrt(D))
    ntk'  = d nngp' / d c * ntk        (Price's theorem)

  Returns:
    `(init_fn, apply_fn, kernel_fn)`.

  Example:
    >>> _, apply_fn, _ = stax.Gabor()
    >>> apply_fn((), jnp.zeros(1))
    Array([0.], dtype=float32)
  """
  return elementwise(lambda x: jnp.exp(-x**2) * jnp.sin(x), gabor_kernel_map,
                     'Gabor')


@layer
@supports_masking(remask_kernel=True)
def Elementwise(fn: Optional[Callable[[Array], Array]] = None,
                nngp_fn: Optional[NngpFn] = None,
                d_nngp_fn: Optional[NngpFn] = None) -> Layer:
  """A custom elementwise nonlinearity with a user-supplied kernel.

    nngp' = nngp_fn(c, q1, q2)         = E[fn(u) fn(v)]
    ntk'  = d_nngp_fn(c, q1, q2) * ntk = E[fn'(u) fn'(v)] * ntk

  where `d_nngp_fn` defaults to `d nngp_fn / d c` by autodiff, which equals
  `E[fn'(u) fn'(v)]` by Price's theorem. `nngp_fn` must act elementwise on
  its (same-shaped) arguments, and, for the default `d_nngp_fn`, be
  differentiable in `c` on `|c| <= sqrt(q1 q2)` including the endpoints (write
  angles as `atan2(sqrt(max(1 - rho^2, eps^2)), rho)` rather than
  `arccos(rho)`, or pass `d_nngp_fn`).

  Args:
    fn: the function applied by `apply_fn`; with `fn=None`, `apply_fn` raises
      a `ValueError` (a kernel-only layer).
    nngp_fn: `(cov12, var1, var2) -> E[fn(u) fn(v)]` for
      `(u, v) ~ N(0, [[var1, cov12], [cov12, var2]])`.
    d_nngp_fn: `(cov12, var1, var2) -> E[fn'(u) fn'(v)]`, or None.

  Returns:
    `(init_fn, apply_fn, kernel_fn)`.

  Example:
    >>> nngp_fn = lambda c, q1, q2: 2 / np.pi * jnp.arcsin(
    ...     2 * c / jnp.sqrt((1 + 2 * q1) * (1 + 2 * q2)))
    >>> layer = stax.Elementwise(jax.scipy.special.erf, nngp_fn)  # = Erf()
  """
  if fn is None and nngp_fn is None:
    raise ValueError(
        '`Elementwise` needs `fn` (the function of the finite network) or '
        '`nngp_fn` (its kernel); got neither (fn=None, nngp_fn=None). Pass '
        'e.g. `Elementwise(fn=jnp.tanh, nngp_fn=...)`, or '
        '`ElementwiseNumerical(fn, deg=25)` to integrate `fn` numerically.')
  if fn is not None:
    arguments.callable_arg(fn, 'fn', 'Pass e.g. `fn=jnp.tanh`.')
  if d_nngp_fn is not None:
    arguments.callable_arg(d_nngp_fn, 'd_nngp_fn',
                           'Pass e.g. the kernel of `fn\'`.')
  if nngp_fn is None:
    def kernel_map(q1, q2, c, compute_dot):
      raise ValueError(
          '`Elementwise(fn=...)` was given no `nngp_fn` (nngp_fn=None), so it '
          'has no kernel. Pass `nngp_fn=` (E[fn(u) fn(v)]), or use '
          '`ElementwiseNumerical(fn, deg=25)` to integrate it numerically.')
  else:
    arguments.callable_arg(nngp_fn, 'nngp_fn', 'Pass e.g. a function '
                           '(cov12, var1, var2) -> E[fn(u) fn(v)].')
    kernel_map = nngp_fn_kernel_map(nngp_fn, d_nngp_fn)
  return elementwise(fn, kernel_map, 'Elementwise')


@layer
@supports_masking(remask_kernel=True)
def ElementwiseNumerical(fn: Callable[[Array], Array],
                         deg: int,
                         df: Optional[Callable[[Array], Array]] = None
                         ) -> Layer:
  """Any elementwise `fn`, its kernel by Gauss-Hermite quadrature.

    nngp' = E[fn(u) fn(v)]  ~ sum_ij w_i w_j fn(u_ij) fn(v_ij)
    ntk'  = E[fn'(u) fn'(v)] * ntk  (the same quadrature with `df`)

  over the `deg x deg` grid of Gauss-Hermite nodes (see
  `quadrature_kernel_map`). The quadrature is exact for polynomials of degree
  `< 2 deg`; smooth functions converge fast in `deg`, functions with kinks
  or jumps slowly: for ReLU at `deg=100` the NNGP is off by about 1e-3 and the
  derivative kernel (of the step function) by about 2e-2, relative. Memory
  and time grow as `deg^2` times the kernel's size.

  The degree needed grows with the pre-activation variance `q` (the NNGP
  diagonal of the layer's input): the nodes sample `fn(sqrt(q) z)`, whose
  features (e.g. where `tanh` bends, and the bump of its derivative) narrow
  as `1 / sqrt(q)`. Relative errors for `jnp.tanh`, against a float64
  quadrature of 1,201 points (largest `q` of the batch in the first column):

    q_max   deg=25        deg=32        deg=64        deg=128
            NNGP / NTK    NNGP / NTK    NNGP / NTK    NNGP / NTK
    2.3     2e-3 / 2e-2   5e-4 / 8e-3   6e-6 / 2e-4   1e-8 / 6e-7
    5.2     2e-2 / 0.18   8e-3 / 0.10   4e-4 / 1e-2   7e-6 / 3e-4
    9.3     4e-2 / 0.46   3e-2 / 0.30   3e-3 / 7e-2   2e-4 / 6e-3
    20.8    0.10 / 1.1    7e-2 / 0.72   2e-2 / 0.36   3e-3 / 9e-2

  For `tanh`-like functions take `deg >= 20 q_max + 16` for NTK errors below
  1e-3 (the NNGP is then ~50x better), e.g. `deg=76` for `q_max <= 3`; or
  use a layer with a closed form (`Erf` is close to `tanh`:
  `tanh(x) ~ erf(sqrt(pi) x / 2)`). Any degree works (nodes and weights from
  `utils.quadrature.gauss_hermite`).

  Args:
    fn: elementwise function.
    deg: quadrature degree, a positive int (e.g. 76 for `tanh` with
      pre-activation variances up to 3; see above).
    df: derivative of `fn`; defaults to `fn`'s derivative by autodiff.

  Returns:
    `(init_fn, apply_fn, kernel_fn)`.

  Example:
    >>> _, _, kernel_fn = stax.serial(
    ...     stax.Dense(1), stax.ElementwiseNumerical(jnp.tanh, deg=76))
  """
  arguments.callable_arg(fn, 'fn', 'Pass e.g. `fn=jnp.tanh`.')
  deg = arguments.positive_int(deg, 'deg', 'Pass e.g. `deg=76`.')
  if df is None:
    df = elementwise_derivative(fn)
  else:
    arguments.callable_arg(df, 'df', 'Pass e.g. the derivative of `fn`.')
  return elementwise(fn, quadrature_kernel_map(fn, df, deg),
                     'ElementwiseNumerical')
