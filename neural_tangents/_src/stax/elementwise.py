"""Elementwise nonlinearities with closed-form NNGP and NTK kernels.

For an elementwise `phi` applied to jointly Gaussian pre-activations
`(u, v) ~ N(0, [[q1, c], [c, q2]])` (the inputs' variances and covariance),

  nngp' = E[phi(u) phi(v)]
  ntk'  = E[phi'(u) phi'(v)] * ntk

(Lee et al. 2018; Jacot et al. 2018). Each layer supplies a *kernel map*
`(q1, q2, c, compute_dot) -> (E[phi(u) phi(v)], E[phi'(u) phi'(v)] or None)`
on broadcastable arrays, and `elementwise` applies it to `cov1`, `nngp` and
`cov2` with the right variances.

All maps are written to stay finite (no NaN / inf, finite gradients) at the
edges of their domain: equal or opposite inputs (`|c| = sqrt(q1 q2)`) and zero
variances.
"""
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.stax.requirements import Diagonal
from neural_tangents._src.stax.requirements import layer
from neural_tangents._src.stax.requirements import requires
from neural_tangents._src.utils import kernel as kernel_lib
from neural_tangents._src.utils.kernel import Kernel
from neural_tangents._src.utils.typing import Layer

Array = jax.Array
KernelMap = Callable[[Array, Array, Array, bool],
                     tuple[Array, Optional[Array]]]


def safe_sqrt(x: Array) -> Array:
  """`sqrt(max(x, 0))` with a finite, zero-at-zero gradient."""
  positive = x > 0
  return jnp.where(positive, jnp.sqrt(jnp.where(positive, x, 1)), 0)


def _eps(x: Array) -> float:
  return float(np.finfo(jnp.result_type(x, float)).eps)


def correlation(q1: Array, q2: Array, c: Array) -> tuple[Array, Array]:
  """`(sqrt(q1 q2), rho)` with `rho = c / sqrt(q1 q2)` clipped to [-1, 1].

  Where a variance is zero, `rho` is 0 (the product is then 0 anyway).
  """
  norm = safe_sqrt(q1 * q2)
  positive = norm > 0
  rho = jnp.where(positive, c / jnp.where(positive, norm, 1), 0)
  return norm, jnp.clip(rho, -1, 1)


def arccos_angle(rho: Array) -> tuple[Array, Array]:
  """`(theta, sin(theta))` for `theta = arccos(rho)`, with finite gradients.

  `arccos` has an infinite derivative at `rho = +-1` (equal or opposite
  inputs); computing the angle as `atan2(sqrt(1 - rho^2), rho)` with a square
  root floored at machine precision keeps values and gradients finite.
  """
  sin = jnp.sqrt(jnp.maximum(1 - rho**2, _eps(rho)**2))
  return jnp.arctan2(sin, rho), sin


def relu_kernel_map(q1, q2, c, compute_dot):
  """Arc-cosine kernel of degree 1 (Cho & Saul 2009) and its derivative.

  E[relu(u) relu(v)] = sqrt(q1 q2) / (2 pi) * (sin t + (pi - t) cos t)
  E[step(u) step(v)] = (pi - t) / (2 pi),    t = arccos(c / sqrt(q1 q2)).
  """
  norm, rho = correlation(q1, q2, c)
  theta, sin = arccos_angle(rho)
  nngp = norm / (2 * np.pi) * (sin + (np.pi - theta) * rho)
  dot = (np.pi - theta) / (2 * np.pi) if compute_dot else None
  return nngp, dot


def erf_kernel_map(a: float, b: float, c_shift: float) -> KernelMap:
  """Kernel map of `a * erf(b x) + c_shift` (Williams 1997)."""
  def kernel_map(q1, q2, c, compute_dot):
    s1, s2 = 1 + 2 * b**2 * q1, 1 + 2 * b**2 * q2
    # |2 b^2 c| < sqrt(s1 s2) strictly, so arcsin's argument is in (-1, 1).
    nngp = (a**2 * 2 / np.pi * jnp.arcsin(2 * b**2 * c / jnp.sqrt(s1 * s2))
            + c_shift**2)
    dot = None
    if compute_dot:
      dot = a**2 * 4 * b**2 / np.pi / jnp.sqrt(s1 * s2 - 4 * b**4 * c**2)
    return nngp, dot
  return kernel_map


def elementwise_kernel(k: Kernel, kernel_map: KernelMap, name: str) -> Kernel:
  """Applies a nonlinearity's kernel map to every covariance of `k`."""
  if not k.is_gaussian:
    raise ValueError(
        f'`{name}` needs Gaussian pre-activations, but its input kernel is '
        f'{"the raw inputs" if k.is_input else "the output of a nonlinearity"}'
        f'. Put a `Dense` (or convolution) layer before `{name}`.')
  variances = kernel_lib.covariance_variances(k)
  cov1, _ = kernel_map(*variances['cov1'], k.cov1, False)
  nngp, dot = kernel_map(*variances['nngp'], k.nngp, k.ntk is not None)
  cov2 = (None if k.cov2 is None else
          kernel_map(*variances['cov2'], k.cov2, False)[0])
  ntk = None if k.ntk is None else dot * k.ntk
  return k.replace(nngp=nngp, ntk=ntk, cov1=cov1, cov2=cov2,
                   is_gaussian=False, is_input=False)


def elementwise(fn: Callable[[Array], Array], kernel_map: KernelMap,
                name: str) -> Layer:
  """An elementwise layer `(init_fn, apply_fn, kernel_fn)` from `fn` and its
  kernel map. Decorate the public constructor with `@layer`."""
  init_fn = lambda rng, input_shape: (input_shape, ())
  apply_fn = lambda params, inputs, **kwargs: fn(inputs)

  @requires(diagonal_batch=Diagonal(), diagonal_spatial=Diagonal())
  def kernel_fn(k: Kernel, **kwargs) -> Kernel:
    return elementwise_kernel(k, kernel_map, name)

  return init_fn, apply_fn, kernel_fn


@layer
def Relu(do_stabilize: bool = False) -> Layer:
  """Rectified linear unit `max(x, 0)`, with the arc-cosine kernel.

  Args:
    do_stabilize: accepted for compatibility; the kernel here is always
      computed in a numerically stable form.

  Returns:
    `(init_fn, apply_fn, kernel_fn)`.

  Example:
    >>> _, _, kernel_fn = stax.serial(stax.Dense(1), stax.Relu())
    >>> float(kernel_fn(jnp.ones((1, 2)), None, 'nngp')[0, 0])
    0.5
  """
  del do_stabilize
  return elementwise(jax.nn.relu, relu_kernel_map, 'Relu')


@layer
def Erf(a: float = 1., b: float = 1., c: float = 0.) -> Layer:
  """`a * erf(b * x) + c`, with the arcsine kernel of Williams (1997).

  nngp' = a^2 * 2/pi * arcsin(2 b^2 k / sqrt((1 + 2 b^2 q1)(1 + 2 b^2 q2)))
          + c^2
  E[phi' phi'] = a^2 * 4 b^2 / pi / sqrt((1 + 2b^2 q1)(1 + 2b^2 q2) - 4b^4 k^2)

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
