"""Exact GP posterior (`gp_inference`): NNGP, NTK-GP, or infinitely wide
networks trained to convergence."""
import math
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.predict import solve
from neural_tangents._src.predict import stored
from neural_tangents._src.predict.flow import infinite_time_covariance
from neural_tangents._src.predict.kernel_rows import to_device
from neural_tangents._src.predict.layout import Array
from neural_tangents._src.predict.layout import check_kernel
from neural_tangents._src.predict.layout import is_kernel_like
from neural_tangents._src.predict.layout import kernel_to_matrix
from neural_tangents._src.predict.layout import matrix_row_shape
from neural_tangents._src.predict.layout import matrix_to_covariance
from neural_tangents._src.predict.layout import matrix_to_outputs
from neural_tangents._src.predict.layout import output_layout
from neural_tangents._src.predict.layout import shape_of_test_outputs
from neural_tangents._src.predict.low_rank import low_rank_gp_inference
from neural_tangents._src.predict.low_rank import LowRankKernel
from neural_tangents._src.predict.options import solve_options
from neural_tangents._src.predict.posterior import Gaussian
from neural_tangents._src.predict.posterior import parse_posterior_get
from neural_tangents._src.predict.posterior import Posterior
from neural_tangents._src.predict.posterior import POSTERIORS
from neural_tangents._src.predict.posterior import results_by_get
from neural_tangents._src.predict.train_kernels import TrainKernels
from neural_tangents._src.utils import precision
from neural_tangents._src.utils.typing import Axes, Get


@precision.library_precision
def gp_inference(
    k_train_train: Any,
    y_train: Array,
    diag_reg: float = 0.,
    diag_reg_absolute_scale: bool = False,
    trace_axes: Axes = (-1,),
    *,
    solver: str = 'cholesky',
    tol: float = 1e-5,
    maxiter: Optional[int] = None,
    preconditioner_rank: int = 100,
    progress: bool = False,
) -> Callable[..., Any]:
  """Exact GP posterior, for the NNGP, the NTK-GP, or trained NTK networks.

  With `Theta_reg` the inverted train-train kernel plus
  `diag_reg * trace(Theta) / m` on its diagonal (`m` its number of rows;
  `diag_reg` itself with `diag_reg_absolute_scale`), `*` the test points and
  `K` the NNGP:

  * `get='nngp'`: the textbook posterior with prior `K` and observation noise
    (`Theta = K`, `K_reg` its regularized train-train kernel)::

      mean = K_* K_reg^{-1} y,    cov = K_** - K_* K_reg^{-1} K_*^T.

  * `get='ntkgp'`: the same posterior with the NTK as prior covariance, the
    NTK-GP of He, Lakshminarayanan & Teh 2020 (the distribution of their
    Bayesian deep ensembles)::

      mean = Theta_* Theta_reg^{-1} y,
      cov = Theta_** - Theta_* Theta_reg^{-1} Theta_*^T.

  * `get='ntk'`: infinitely wide networks trained to convergence (`t = inf`
    in `gradient_descent_mse_ensemble`), whose outputs at initialization have
    the prior `K`::

      mean = Theta_* Theta_reg^{-1} y,
      cov = K_** - Theta_* Theta_reg^{-1} K_*^T - K_* Theta_reg^{-1} Theta_*^T
            + Theta_* Theta_reg^{-1} K Theta_reg^{-1} Theta_*^T,

    with the train-train NNGP `K` not regularized.

  Each train-train kernel is factored once, on first use: by default a
  Cholesky factorization of `Theta_reg` (a kernel singular to working
  precision falls back to the pseudo-inverse of its eigendecomposition, with
  a warning; an indefinite one raises a `ValueError` naming the `diag_reg`
  that would fix it). See `docs/predict.md` for choosing `solver`.

  Args:
    k_train_train: train-train kernel: an array (used as the kernel of any
      `get`), or an `nt.Kernel` / namedtuple with the `nngp` and/or `ntk`
      kernels that the calls need ('ntkgp' needs `ntk`; the 'ntk'
      covariance needs both), or a `nt.predict.LowRankKernel` `F F^T`,
      solved in feature space (test kernels are then `LowRankKernel`s too).
    y_train: targets, `(N, O_1, ..., O_d)`.
    diag_reg: diagonal regularizer (noise variance) of the inverted
      train-train kernel, relative to its mean diagonal entry.
    diag_reg_absolute_scale: whether `diag_reg` is absolute instead.
    trace_axes: output axes traced out of the kernels.
    solver: how `Theta_reg` is solved: 'cholesky' (default), 'eigh'
      (pseudo-inverse of singular kernels), or 'cg' (conjugate gradients;
      the train-train kernel may then be a numpy array, an `np.memmap` or a
      `nt.predict.KernelRows`, and is never copied).
    tol: 'cg': relative residual at which to stop.
    maxiter: 'cg': maximum number of iterations (`None`: 10 times the rows).
    preconditioner_rank: 'cg': rank of the pivoted Cholesky preconditioner
      (0: none).
    progress: 'cg': whether to show a progress bar of the iterations and the
      residual (needs `tqdm`).

  Returns:
    `predict_fn(get=None, k_test_train=None, k_test_test=None)` returning, for
    each `get` in 'nngp', 'ntk', 'ntkgp', the posterior mean (an array shaped
    like the test outputs) or, when `k_test_test` is given, a
    `Gaussian(mean, covariance)`; for a tuple `get` (or `get=None`, which is
    `('nngp', 'ntk')`, or 'nngp' alone when `k_train_train` is an array) a
    namedtuple `Gaussians` of these with fields in the order of `get`, for a
    string the value itself. `predict_fn.solve_info` maps each train-train
    kernel solved ('nngp', 'ntk') to the `SolveInfo` of its last solve
    (iterations and relative residual for 'cg').

    `k_test_train=None` predicts on the training points, where `diag_reg` is
    ignored: the mean is exactly `y_train`, the covariance zero, and
    `k_test_test` only says whether to return it (pass `True`). Only the
    train-train kernel that drives the flow is needed there (no NNGP for
    'ntk').

  Raises:
    ValueError: if `y_train` has no rows, a kernel does not match `y_train`
      and `trace_axes`, a needed kernel is missing, or the 'ntk' covariance
      is asked of a bare array (it needs both the NTK and the NNGP).

  Example:
    >>> from jax import random
    >>> import jax.numpy as jnp
    >>> import neural_tangents as nt
    >>> from neural_tangents import stax
    >>> _, _, kernel_fn = stax.serial(stax.Dense(512), stax.Relu(),
    ...                               stax.Dense(1))
    >>> x_train = random.normal(random.PRNGKey(1), (3, 4))
    >>> x_test = random.normal(random.PRNGKey(2), (2, 4))
    >>> y_train = jnp.ones((3, 1))
    >>> predict_fn = nt.predict.gp_inference(kernel_fn(x_train, None),
    ...                                      y_train, diag_reg=1e-3)
    >>> mean, cov = predict_fn('ntkgp', kernel_fn(x_test, x_train),
    ...                        kernel_fn(x_test, None))
    >>> mean.shape, cov.shape
    ((2, 1), (2, 2))
  """
  if isinstance(k_train_train, LowRankKernel):  # Solved in feature space.
    return low_rank_gp_inference(k_train_train, y_train, diag_reg,
                                 diag_reg_absolute_scale, trace_axes)
  y_train = jnp.asarray(y_train)
  layout = output_layout(y_train, trace_axes)
  options = solve_options(solver, diag_reg, diag_reg_absolute_scale, tol,
                          maxiter, preconditioner_rank, progress)
  train = TrainKernels(
      y_train, layout, options, trace_axes=trace_axes, checked_finite=False,
      load=lambda kernels: {kernel: _matrix(train, k_train_train, kernel,
                                            'k_train_train', square=True)
                            for kernel in kernels})

  @precision.library_precision
  def predict_fn(get: Get = None,
                 k_test_train: Any = None,
                 k_test_test: Any = None) -> Any:
    with train.one_call():
      names, single = parse_posterior_get(get)
      if get is None and not is_kernel_like(k_train_train):
        names, single = ('nngp',), True
      out = {name: _posterior(train, name, k_train_train, k_test_train,
                              k_test_test) for name in names}
      return results_by_get(out, names, single, 'Gaussians')

  predict_fn.solve_info = train.solve_info
  return predict_fn


def _matrix(train: TrainKernels, k: Any, kernel: str, arg: str,
            square: bool) -> Array:
  """The `kernel` field of a kernel-like `k` (else `k`), checked against
  `y_train`, as a matrix; host train kernels and row-block kernels (a store
  of `nt.batch`: `stored.StoredKernel`) as they are."""
  if stored.is_store_path(k):
    k = stored.open_store_leaf(k, kernel, arg)
  if is_kernel_like(k):
    kernels, k = k, getattr(k, kernel, None)
    if k is None:
      raise ValueError(
          f'`{arg}` has no "{kernel}" kernel (got a {type(kernels).__name__} '
          f'whose `{kernel}` is None); `get="nngp"` needs "nngp", "ntk" and '
          '"ntkgp" need "ntk", and the "ntk" covariance also needs "nngp". '
          f'Pass a `{arg}` that contains "{kernel}", e.g. '
          "`kernel_fn(x1, x2, ('nngp', 'ntk'))`.")
  if not square or train.options.solver == 'cg':
    # Stored test kernels, and train ones for CG, are read by row blocks
    # (other solvers read a stored train kernel whole).
    k = stored.as_row_kernel(k, arg)
  n_pairs = len(train.layout.untraced)
  if not ((isinstance(k, solve.KernelRows) or
           (isinstance(k, np.ndarray) and square)) and n_pairs == 0):
    # Host and row-block train kernels stay where they are (no copy).
    k = jnp.asarray(k)
  check_kernel(k, arg, train.y_train, train.layout, train.trace_axes,
               square=square)
  if not isinstance(k, jax.Array):
    return k
  return kernel_to_matrix(k.astype(jnp.result_type(k.dtype, float)), n_pairs)


def _on_train(train: TrainKernels, posterior: Posterior,
              compute_cov: bool) -> Any:
  """Predictions on the training points: not regularized, so at infinite
  time they interpolate, `y_train` with zero covariance."""
  k = train.matrix(posterior.flow)  # Checks the kernel against `y_train`.
  mean = train.y_train.astype(jnp.result_type(k.dtype, train.y_train.dtype))
  if not compute_cov:
    return mean
  row_shape = matrix_row_shape(train.y_train.shape, train.layout)
  rows = math.prod(row_shape)
  cov = matrix_to_covariance(jnp.zeros((rows, rows), mean.dtype), row_shape)
  return Gaussian(mean, cov)


def _posterior(train: TrainKernels, name: str, k_train_train: Any,
               k_test_train: Any, k_test_test: Any) -> Any:
  """The posterior mean of `get=name` at the test points (the training points
  if `k_test_train` is None), and with `k_test_test` the `Gaussian` with its
  covariance."""
  posterior = POSTERIORS[name]
  if k_test_train is None:
    return _on_train(train, posterior, k_test_test is not None)
  if k_test_test is not None and posterior.prior != posterior.flow:
    # A bare `k_test_test` is the NNGP, the prior's test-test kernel (as
    # published); the train kernels must hold both.
    _check_both_kernels(name, posterior, k_train_train=k_train_train,
                        k_test_train=k_test_train)
  factor, alpha = train.weights(posterior.flow)
  k_test = _matrix(train, k_test_train, posterior.flow, 'k_test_train',
                   square=False)
  test_shape = shape_of_test_outputs(
      kernel_of(k_test_train, posterior.flow, 'k_test_train'), train.y_train,
      train.layout)
  mean = matrix_to_outputs(_matmul(k_test, alpha), test_shape, train.layout)
  if k_test_test is None:
    return mean
  k_prior_test = _matrix(train, k_test_train, posterior.prior, 'k_test_train',
                         square=False)
  k_tt_array = jnp.asarray(kernel_of(k_test_test, posterior.prior,
                                      'k_test_test'))
  row_shape = matrix_row_shape(test_shape, train.layout)
  expected = tuple(size for size in row_shape for _ in range(2))
  if k_tt_array.shape != expected:
    raise ValueError(
        f'`k_test_test` has shape {k_tt_array.shape} but the test '
        f'outputs have shape {test_shape}, which need a test-test '
        f'kernel of shape {expected}: pass the test-test kernel of the '
        'same test points as `k_test_train`.')
  k_tt = kernel_to_matrix(k_tt_array, len(train.layout.untraced))
  prior_train = (None if posterior.prior == posterior.flow else
                 train.matrix(posterior.prior))
  dtype = solve.compute_dtype(jnp.result_type(k_test.dtype, float))
  # The covariance needs the test-train kernels whole (stored ones are read).
  k_test, k_prior_test = (stored.whole(k) for k in (k_test, k_prior_test))
  cov = infinite_time_covariance(
      factor, jnp.asarray(k_test, dtype), jnp.asarray(k_prior_test, dtype),
      k_tt.astype(dtype), prior_train)
  train.record(posterior.flow, factor)
  return Gaussian(mean, matrix_to_covariance(cov, row_shape))


def _check_both_kernels(name: str, posterior: Posterior,
                        **kernels: Any) -> None:
  """Raises `ValueError` if a kernel that must hold two kernels is an array."""
  for arg, k in kernels.items():
    if not is_kernel_like(k):
      raise ValueError(
          f'`{arg}` is a bare array, but the covariance of `get={name!r}` '
          f'needs two kernels: the "{posterior.flow}" that drives training '
          f'and the "{posterior.prior}" of the outputs at initialization. '
          'Pass `nt.Kernel`s (or namedtuples) with `nngp` and `ntk` fields '
          'as `k_train_train` and `k_test_train`, or leave '
          'out `k_test_test` to get the mean only.')


def _matmul(k: Any, v: Array) -> Array:
  """`k @ v` for a device kernel, by row blocks for a host one."""
  if solve.all_on_host(k, v):  # numpy, float64 arithmetic, by row blocks.
    dtype = jnp.result_type(k.dtype, float)
    return to_device(solve.kernel_matmul(solve.host_view(k), np.asarray(v)
                                         ).astype(dtype))
  if isinstance(k, jax.Array):
    return k @ v.astype(k.dtype)
  return jnp.asarray(solve.kernel_matmul(k, np.asarray(v)), v.dtype)


def kernel_of(k: Any, name: str, arg: str) -> Any:
  """The `name` field of a kernel-like `k` (argument `arg`), or of a store's
  directory; else `k`."""
  if stored.is_store_path(k):
    return stored.open_store_leaf(k, name, arg)
  if is_kernel_like(k):
    value = getattr(k, name, None)
    if value is None:
      raise ValueError(
          f'`{arg}` has no "{name}" kernel (got a {type(k).__name__} whose '
          f'`{name}` is None). Pass a `{arg}` that contains "{name}", e.g. '
          "`kernel_fn(x1, x2, ('nngp', 'ntk'))`.")
    return value
  return k
