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

from neural_tangents._src.batching.options import progress_bar_class
from neural_tangents._src.predict import posterior as posterior_lib
from neural_tangents._src.predict import solve
from neural_tangents._src.predict.gp import kernel_of
from neural_tangents._src.predict.layout import is_kernel_like
from neural_tangents._src.predict.layout import output_layout
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
    k = kernel_of(k_train_train, kernel, 'k_train_train')
    values[name] = _exact(jnp.asarray(k), y, diag_reg,
                          diag_reg_absolute_scale, kernel)
  if single:
    return values[names[0]]
  return utils.get_namedtuple(names, 'LogMarginalLikelihoods')(
      *(values[name] for name in names))


def _check_targets(y: jax.Array, trace_axes: Axes) -> None:
  kept = output_layout(y, trace_axes).untraced
  if kept:
    raise ValueError(
        f'`log_marginal_likelihood` needs one kernel for every output entry, '
        f'so every output axis of `y_train` (shape {y.shape}) must be in '
        f'`trace_axes`; got trace_axes={trace_axes!r}, leaving axes {list(kept)}. '
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


class FitResult(NamedTuple):
  """The outcome of `fit_hyperparameters`.

  Attributes:
    hyperparameters: the fitted values, a dict like `init`.
    log_likelihood: the log marginal likelihood (summed over outputs) at
      the fitted values.
    initial_log_likelihood: the same at `init`.
    iterations: L-BFGS iterations.
    converged: whether L-BFGS met its tolerance.
  """
  hyperparameters: dict[str, float]
  log_likelihood: float
  initial_log_likelihood: float
  iterations: int
  converged: bool


def fit_hyperparameters(
    kernel_fn_of: Any,
    x_train: Any,
    y_train: Any,
    init: dict[str, float],
    *,
    get: str = 'nngp',
    diag_reg_absolute_scale: bool = False,
    trace_axes: Axes = (-1,),
    maxiter: int = 100,
    progress: bool = False,
) -> FitResult:
  """Maximum-likelihood hyperparameters of an NNGP or NTK-GP, by L-BFGS.

  Maximizes `log_marginal_likelihood(kernel_fn_of(hp)(x_train, None, get),
  y_train, hp['diag_reg'], get=get).total` over the positive
  hyperparameters `hp`, in log space (`hp = exp(log_hp)`), with SciPy's
  L-BFGS-B and gradients from `jax.grad`. The objective and its gradient are
  one jitted program, compiled once for the whole fit.

  Args:
    kernel_fn_of: `kernel_fn_of(hp) -> kernel_fn`, building the network from
      a dict of (traced) hyperparameters, e.g. `lambda hp: stax.serial(
      stax.Dense(1, hp['W_std'], hp['b_std']), stax.Relu(),
      stax.Dense(1, hp['W_std'], hp['b_std']))[2]`.
    x_train: training inputs.
    y_train: targets, `(n, O_1, ...)` with every output axis traced.
    init: starting values, all `> 0`; the key 'diag_reg' (if present) is
      the observation noise, fitted too (else 0).
    get: 'nngp' or 'ntk' (the NTK-GP).
    diag_reg_absolute_scale: whether 'diag_reg' is absolute.
    trace_axes: output axes traced out of the kernel.
    maxiter: the most L-BFGS iterations.
    progress: whether to show a `tqdm` bar of the iterations with the log
      likelihood.

  Returns:
    A `FitResult`.

  Raises:
    ValueError: for an empty `init`, a value that is not positive and
      finite, or a `get` other than 'nngp', 'ntk', 'ntkgp'.

  Example:
    >>> import jax.numpy as jnp
    >>> import neural_tangents as nt
    >>> from neural_tangents import stax
    >>> x = jnp.linspace(-2., 2., 8)[:, None]
    >>> y = jnp.sin(2. * x)
    >>> fit = nt.predict.fit_hyperparameters(
    ...     lambda hp: stax.serial(stax.Dense(1, 1., 1.),
    ...                            stax.Rbf(hp['gamma']))[2],
    ...     x, y, {'gamma': 1., 'diag_reg': 0.1}, maxiter=20)
    >>> bool(fit.log_likelihood > fit.initial_log_likelihood)
    True
  """
  # Imported here: scipy.optimize adds 0.17 s (14%) to `import
  # neural_tangents`, and only a fit needs it.
  import scipy.optimize  # pylint: disable=g-import-not-at-top

  if not isinstance(init, dict) or not init:
    raise ValueError(f'`init` must be a non-empty dict of starting values; '
                     f"got {init!r}. Pass e.g. {{'W_std': 1.5, 'b_std': 0.1, "
                     "'diag_reg': 1e-2}.")
  names = sorted(init)
  values = np.array([init[n] for n in names], np.float64)
  bad = [n for n, v in zip(names, values) if not (np.isfinite(v) and v > 0)]
  if bad:
    raise ValueError(f'Hyperparameters are fitted in log space, so `init` '
                     f'must be positive and finite; got '
                     f'{ {n: init[n] for n in bad} }. Pass positive values.')
  posterior_lib.parse_posterior_get(get)
  x_train, y_train = jnp.asarray(x_train), jnp.asarray(y_train)

  def neg_log_likelihood(log_values, x, y):
    hp = dict(zip(names, jnp.exp(log_values)))
    kernel_fn = kernel_fn_of(hp)
    k = kernel_fn(x, None, posterior_lib.POSTERIORS[get].flow)
    return -log_marginal_likelihood(
        k, y, hp.get('diag_reg', 0.), diag_reg_absolute_scale, trace_axes,
        get=get).total

  value_and_grad = jax.jit(jax.value_and_grad(neg_log_likelihood))

  last = {}  # The latest evaluation, which the progress bar shows.

  def objective(log_values):
    value, grad = value_and_grad(jnp.asarray(log_values), x_train, y_train)
    value = last['value'] = float(value)
    if not np.isfinite(value):  # L-BFGS backs off from an undefined point.
      return np.inf, np.zeros_like(log_values)
    return value, np.asarray(grad, np.float64)

  initial = -objective(np.log(values))[0]
  bar = None
  if progress:
    bar = progress_bar_class()(total=maxiter, desc='fitting hyperparameters',
                               unit='it')

  def step(log_values):
    del log_values  # L-BFGS evaluated it last, in its line search.
    if bar is not None:
      bar.update(1)
      bar.set_postfix(log_likelihood=-last['value'])

  try:
    result = scipy.optimize.minimize(
        objective, np.log(values), jac=True, method='L-BFGS-B',
        callback=step, options={'maxiter': int(maxiter)})
  finally:
    if bar is not None:
      bar.close()
  fitted = dict(zip(names, np.exp(result.x).tolist()))
  return FitResult(fitted, -float(result.fun), initial, int(result.nit),
                   bool(result.success))
