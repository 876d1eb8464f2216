"""The Gaussian-process log marginal likelihood of training targets.

Under the GP prior `f ~ N(0, K)` with observation noise `r I` (the
regularizer of `diag_reg`, as in `gp_inference`), each output column `y_j` of
`y_train` has the log marginal likelihood

  log p(y_j) = -1/2 y_j^T (K + r I)^{-1} y_j - 1/2 log det(K + r I)
               - n/2 log(2 pi),

the same kernel acting on every column (the output axes traced). This module
computes it exactly, by a Cholesky factorization `K + r I = L L^T`
(`log det = 2 sum log diag(L)`), in JAX: its gradient with respect to
anything the kernel depends on (`W_std`, `b_std` of the stax layers, the
inputs, `diag_reg`) is `jax.grad`'s.
"""
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.predict import posterior as posterior_lib
from neural_tangents._src.predict import solve
from neural_tangents._src.predict.layout import is_kernel_like
from neural_tangents._src.predict.options import check_diag_reg
from neural_tangents._src.utils import linalg
from neural_tangents._src.utils import precision
from neural_tangents._src.utils import utils
from neural_tangents._src.utils.typing import Axes, Get


class LogMarginalLikelihood(NamedTuple):
  """The log marginal likelihood of `y_train`.

  Attributes:
    total: the sum over output columns, a scalar (what a fit maximizes).
    per_output: one value per output entry, shaped like `y_train[0]`.
  """
  total: jax.Array
  per_output: jax.Array


@precision.library_precision
def log_marginal_likelihood(
    k_train_train: Any,
    y_train: Any,
    diag_reg: Any = 0.,
    diag_reg_absolute_scale: bool = False,
    trace_axes: Axes = (-1,),
    *,
    get: Get = None,
) -> Any:
  """Exact GP log marginal likelihood of `y_train` under a train kernel.

  `log p(y_j) = -y_j^T (K + r I)^{-1} y_j / 2 - log det(K + r I) / 2
  - n log(2 pi) / 2` for each output column `y_j`, with `r` the regularizer
  of `diag_reg` (`diag_reg * trace(K) / n`, or `diag_reg` itself with
  `diag_reg_absolute_scale`), as in `gp_inference`: for `get='nngp'` the
  NNGP, for `get='ntk'` (or 'ntkgp') the NTK-GP, whose prior covariance is
  the NTK. Computed by Cholesky in the kernel's dtype; differentiable with
  `jax.grad` through `kernel_fn` (e.g. with respect to `W_std`, `b_std`),
  `diag_reg` and the inputs.

  Args:
    k_train_train: `(n, n)` train-train kernel: an array, or an `nt.Kernel`
      / namedtuple with the `nngp` and/or `ntk` fields that `get` needs.
    y_train: targets, `(n, O_1, ..., O_d)`; every output axis must be in
      `trace_axes` (one kernel for every output entry).
    diag_reg: observation-noise regularizer, relative to the mean diagonal
      entry of the kernel unless `diag_reg_absolute_scale`; may be traced.
    diag_reg_absolute_scale: whether `diag_reg` is absolute.
    trace_axes: output axes traced out of the kernel.
    get: 'nngp', 'ntk' ('ntkgp' is the same), a tuple of them, or None
      (`('nngp', 'ntk')` for a kernel with both fields, the array itself
      for an array).

  Returns:
    A `LogMarginalLikelihood(total, per_output)` for a string `get` (or an
    array kernel with `get=None`), else a namedtuple of them by `get`.

  Raises:
    ValueError: for a kernel that does not match `y_train`, output axes not
      traced, NaN or inf targets, a negative `diag_reg`, or (concrete
      kernels) a kernel plus `diag_reg` that is not positive definite.

  Example:
    >>> import jax.numpy as jnp
    >>> import neural_tangents as nt
    >>> from neural_tangents import stax
    >>> _, _, kernel_fn = stax.serial(stax.Dense(1), stax.Relu(),
    ...                               stax.Dense(1))
    >>> x = jnp.array([[0., 1.], [1., 0.], [1., 1.]])
    >>> y = jnp.array([[1.], [-1.], [0.5]])
    >>> mll = nt.predict.log_marginal_likelihood(kernel_fn(x, None), y,
    ...                                          diag_reg=1e-2, get='nngp')
    >>> mll.per_output.shape
    (1,)
  """
  check_diag_reg(diag_reg)
  if get is None and not is_kernel_like(k_train_train):
    names, single = ('nngp',), True
  else:
    names, single = posterior_lib.parse_posterior_get(get)
  y = jnp.asarray(y_train)
  _check_targets(y, trace_axes)
  values = {}
  for name in names:
    kernel = posterior_lib.POSTERIORS[name].flow
    k = k_train_train
    if is_kernel_like(k):
      k = getattr(k, kernel, None)
      if k is None:
        raise ValueError(
            f'`k_train_train` has no "{kernel}" kernel, which get={name!r} '
            f'needs. Pass a kernel with `{kernel}` (e.g. `kernel_fn(x_train, '
            f"None, ('nngp', 'ntk'))`), or another `get`.")
    values[name] = _exact(jnp.asarray(k), y, diag_reg,
                          diag_reg_absolute_scale, kernel)
  if single:
    return values[names[0]]
  return utils.get_namedtuple(names, 'LogMarginalLikelihoods')(
      *(values[name] for name in names))


def _check_targets(y: jax.Array, trace_axes: Axes) -> None:
  if y.ndim < 1 or y.shape[0] == 0:
    raise ValueError(f'`y_train` must have at least one row (one per '
                     f'training point); got shape {y.shape}.')
  traced = {a % max(y.ndim, 1) for a in
            ((trace_axes,) if isinstance(trace_axes, int) else trace_axes)}
  kept = [a for a in range(1, y.ndim) if a not in traced]
  if kept:
    raise ValueError(
        f'`log_marginal_likelihood` needs one kernel for every output entry, '
        f'so every output axis of `y_train` (shape {y.shape}) must be in '
        f'`trace_axes`; got trace_axes={trace_axes!r}, leaving axes {kept}. '
        f'Pass trace_axes={tuple(range(1, y.ndim))!r} (or trace the outputs '
        'out of the kernel).')
  if not isinstance(y, jax.core.Tracer) and not bool(jnp.all(jnp.isfinite(y))):
    raise ValueError('`y_train` contains NaN or inf values; the likelihood '
                     'of non-finite targets is undefined. Drop or impute '
                     'those rows.')


def _exact(k: jax.Array, y: jax.Array, diag_reg: Any, absolute: bool,
           kernel: str) -> LogMarginalLikelihood:
  n = y.shape[0]
  if k.shape != (n, n):
    raise ValueError(
        f'The "{kernel}" train-train kernel must have shape ({n}, {n}) (one '
        f'row and column per row of `y_train`, outputs traced); got shape '
        f'{k.shape}. Pass `kernel_fn(x_train, None)` for the same x_train.')
  dtype = jnp.result_type(k.dtype, y.dtype, float)
  k = (k.astype(dtype) + k.astype(dtype).T) / 2
  reg = solve.regularizer(k, diag_reg, absolute)
  k_reg = k + jnp.asarray(reg, dtype) * jnp.eye(n, dtype=dtype)
  factor = linalg.cholesky(k_reg)
  if not isinstance(factor, jax.core.Tracer):
    _check_factor(factor, k_reg, kernel)
  columns = y.reshape(n, -1).astype(dtype)
  alpha = linalg.cho_solve(factor, columns)
  fit = jnp.sum(columns * alpha, axis=0)
  log_det = 2 * jnp.sum(jnp.log(jnp.diagonal(factor)))
  per_output = -0.5 * (fit + log_det + n * math.log(2 * math.pi))
  per_output = per_output.reshape(y.shape[1:])
  return LogMarginalLikelihood(jnp.sum(per_output), per_output)


def _check_factor(factor: jax.Array, k_reg: jax.Array, kernel: str) -> None:
  """Raises a `ValueError` if the Cholesky factorization failed."""
  if bool(jnp.all(jnp.isfinite(factor))) and bool(
      jnp.min(jnp.diagonal(factor)) > 0):
    return
  evals = np.asarray(linalg.eigvalsh(k_reg), np.float64)
  raise ValueError(
      f'The "{kernel}" train-train kernel plus `diag_reg` is not positive '
      f'definite (eigenvalues from {evals[0]:.3g} to {evals[-1]:.3g}), so '
      'its likelihood is undefined. Pass a larger `diag_reg` (observation '
      f'noise), e.g. diag_reg_absolute_scale=True and diag_reg >= '
      f'{max(-evals[0], 0) + 1e-6 * max(evals[-1], 1e-30):.2g}, or check '
      'how the kernel was computed.')
