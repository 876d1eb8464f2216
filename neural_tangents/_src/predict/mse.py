"""Closed-form MSE gradient descent of one linearized network
(`gradient_descent_mse`) and its largest stable learning rate
(`max_learning_rate`)."""
from typing import Any, Callable, NamedTuple, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.predict import solve
from neural_tangents._src.predict import stored
from neural_tangents._src.predict.flow import flow_times
from neural_tangents._src.predict.flow import integrated_relaxation
from neural_tangents._src.predict.flow import relaxation
from neural_tangents._src.predict.flow import scaled_product
from neural_tangents._src.predict.flow import with_time_axes
from neural_tangents._src.predict.kernel_rows import to_device
from neural_tangents._src.predict.layout import Array
from neural_tangents._src.predict.layout import ArrayOrScalar
from neural_tangents._src.predict.layout import as_array_kernel
from neural_tangents._src.predict.layout import broadcast_initial_outputs
from neural_tangents._src.predict.layout import check_initial_outputs
from neural_tangents._src.predict.layout import check_kernel
from neural_tangents._src.predict.layout import checked_train_kernel
from neural_tangents._src.predict.layout import kernel_to_matrix
from neural_tangents._src.predict.layout import matrix_to_outputs
from neural_tangents._src.predict.layout import OutputLayout
from neural_tangents._src.predict.layout import output_layout
from neural_tangents._src.predict.layout import outputs_to_matrix
from neural_tangents._src.predict.layout import shape_of_test_outputs
from neural_tangents._src.predict.options import solve_options
from neural_tangents._src.predict.train_kernels import TrainKernels
from neural_tangents._src.predict.low_rank import low_rank_gradient_descent_mse
from neural_tangents._src.predict.low_rank import LowRankKernel
from neural_tangents._src.utils import linalg
from neural_tangents._src.utils import precision
from neural_tangents._src.utils.typing import Axes


@precision.library_precision
def gradient_descent_mse(
    k_train_train: Array,
    y_train: Array,
    learning_rate: float = 1.,
    diag_reg: float = 0.,
    diag_reg_absolute_scale: bool = False,
    trace_axes: Axes = (-1,),
    *,
    solver: str = 'cholesky',
    tol: float = 1e-5,
    maxiter: Optional[int] = None,
    preconditioner_rank: int = 100,
    progress: bool = False,
) -> Callable[..., Union[Array, tuple[Array, Array]]]:
  """Outputs of a linearized network trained by gradient descent on MSE.

  With `Theta` the regularized train-train NTK, `n = y_train.size`,
  `s = learning_rate * t` and `Theta_*` the test-train NTK, gradient flow on
  `0.5 * mean((f - y)**2)` gives [2]

    f_train(t) = f_train(0) + (I - exp(-Theta s / n)) (y - f_train(0)),
    f_test(t) = f_test(0) + Theta_* Theta^{-1} (I - exp(-Theta s / n))
                (y - f_train(0)).

  Finite times are evaluated through one eigendecomposition of `Theta`,
  computed on first use and reused for every call and every time. At
  `t=None` (infinity) the test outputs are kernel (ridge) regression
  `f_test(0) + Theta_* Theta^+ (y - f_train(0))` and the train outputs reach
  `y` (if `Theta` is singular, `f_train(0)` plus the projection of
  `y - f_train(0)` on its range); this needs only a solve with `Theta`, by
  default a Cholesky factorization (about 25x cheaper than the
  eigendecomposition; a kernel singular to working precision falls back to
  the eigendecomposition with a warning, and an indefinite one raises a
  `ValueError` naming the `diag_reg` that would fix it). float16 kernels are
  solved in float32 and the outputs returned in float16.

  Args:
    k_train_train: train-train NTK, `(N, N)` plus a pair of axes per output
      axis not in `trace_axes` (see the module docstring). Passing the NNGP
      instead gives the dynamics of training only the readout layer. A
      `nt.predict.LowRankKernel` `F F^T` is solved in feature space
      (`k_test_train` is then a `LowRankKernel` too).
    y_train: targets, `(N, O_1, ..., O_d)`.
    learning_rate: learning rate of the gradient descent steps counted by `t`.
    diag_reg: diagonal regularizer of `k_train_train`, relative to its mean
      diagonal entry.
    diag_reg_absolute_scale: whether `diag_reg` is absolute instead.
    trace_axes: output axes of `y_train` traced out of the kernels.
    solver: the solve at `t=None`: 'cholesky' (default), 'eigh' (always the
      eigendecomposition), or 'cg' (conjugate gradients, for host or
      memory-mapped kernels too large to factor; finite times still need the
      eigendecomposition). See `docs/predict.md`.
    tol: 'cg': relative residual at which to stop.
    maxiter: 'cg': maximum number of iterations (`None`: 10 times the rows).
    preconditioner_rank: 'cg': rank of the pivoted Cholesky preconditioner
      (0: none).
    progress: 'cg': whether to show a progress bar of the iterations and the
      residual (needs `tqdm`).

  Returns:
    `predict_fn(t=None, fx_train_0=0., fx_test_0=None, k_test_train=None)`.
    `t`: the number of steps, a scalar or an array of any shape (adding its
    shape as leading axes of the outputs); `None` is infinite time.
    `fx_train_0`: train outputs at `t = 0`, a scalar or shaped like `y_train`;
    `None` skips train predictions. `fx_test_0`: test outputs at `t = 0`;
    `None` (the default) skips test predictions, even with `k_test_train`.
    `k_test_train`: test-train NTK, `(N_test, N)` plus output axis pairs.
    It returns `fx_train_t` (without `fx_test_0`), `fx_test_t` (with
    `fx_train_0=None`; the train outputs then start at zero), or
    `(fx_train_t, fx_test_t)`. `predict_fn.solve_info` is the `SolveInfo` of
    the last solve (iterations and relative residual for 'cg').

    `trace_axes` may contain the batch axis 0: the kernel then has no batch
    axes (as `nt.empirical_kernel_fn(f, trace_axes=trace_axes)` returns it),
    acts as the identity across training examples, and each example evolves
    on its own; for a scalar kernel `k`,
    `f_t = y + exp(-s k / y_train.size) (f_0 - y)`. A test-train kernel then
    relates test example `i` to training example `i` (as many of each).

  Raises:
    ValueError: if the kernel's shape does not match `y_train` and
      `trace_axes`, or the kernel is not finite.

  Example:
    >>> from jax import random
    >>> import jax.numpy as jnp
    >>> import neural_tangents as nt
    >>> from neural_tangents import stax
    >>> _, _, kernel_fn = stax.serial(stax.Dense(512), stax.Relu(),
    ...                               stax.Dense(1))
    >>> x_train = random.normal(random.PRNGKey(1), (3, 4))
    >>> x_test = random.normal(random.PRNGKey(2), (2, 4))
    >>> y_train = jnp.array([[1.], [-1.], [0.5]])
    >>> predict_fn = nt.predict.gradient_descent_mse(
    ...     kernel_fn(x_train, None, 'ntk'), y_train)
    >>> fx_train_t, fx_test_t = predict_fn(
    ...     t=jnp.array([1., 10.]), fx_train_0=0., fx_test_0=0.,
    ...     k_test_train=kernel_fn(x_test, x_train, 'ntk'))
    >>> fx_test_t.shape  # (t, N_test, O)
    (2, 2, 1)
  """
  if isinstance(k_train_train, LowRankKernel):  # Solved in feature space.
    return low_rank_gradient_descent_mse(
        k_train_train, y_train, learning_rate, diag_reg,
        diag_reg_absolute_scale, trace_axes)
  if solver == 'cg':  # A stored kernel is read by row blocks (else whole).
    k_train_train = stored.as_row_kernel(k_train_train, 'k_train_train')
  if isinstance(k_train_train, solve.KernelRows):
    # Row blocks, never held whole: only CG at infinite time can use them.
    if solver != 'cg':
      raise ValueError(
          '`k_train_train` is given by row blocks (`KernelRows`), which only '
          f'`solver="cg"` can use; got solver={solver!r}. Pass solver="cg" '
          '(and predict at t=None), or the kernel as an array.')
    y_train = jnp.asarray(y_train)
    layout = output_layout(y_train, trace_axes)
    check_kernel(k_train_train, 'k_train_train', y_train, layout, trace_axes,
                 square=True)
  else:
    y_train, k_train_train, layout = checked_train_kernel(
        k_train_train, y_train, trace_axes)
  options = solve_options(solver, diag_reg, diag_reg_absolute_scale, tol,
                          maxiter, preconditioner_rank, progress)
  out_dtype = jnp.result_type(k_train_train.dtype, y_train.dtype, float)
  # LAPACK has no half precision: solve in float32, return `out_dtype`.
  dtype = solve.compute_dtype(out_dtype)
  k = _train_matrix(k_train_train, layout, dtype)
  solve.check_symmetric(k)
  train = TrainKernels(y_train, layout, options, lambda _: {'ntk': k},
                       trace_axes=trace_axes)
  flow = _Flow(learning_rate / y_train.size, dtype, out_dtype)

  @precision.library_precision
  def predict_fn(
      t: Optional[ArrayOrScalar] = None,
      fx_train_0: Optional[ArrayOrScalar] = 0.,
      fx_test_0: Optional[ArrayOrScalar] = None,
      k_test_train: Optional[Array] = None,
  ) -> Union[Optional[Array], tuple[Optional[Array], Array]]:
    try:
      with train.one_call():
        return _predict(train, flow, t, fx_train_0, fx_test_0, k_test_train)
    finally:
      predict_fn.solve_info = train.last_info

  predict_fn.solve_info = None
  return predict_fn


class _Flow(NamedTuple):
  """The time scale and dtypes of a `gradient_descent_mse` prediction.

  Attributes:
    rate: `learning_rate / y_train.size`, flow time per step.
    dtype: the dtype of the solve.
    out_dtype: the dtype of the outputs (half precision is solved in
      float32).
  """
  rate: float
  dtype: Any
  out_dtype: Any


def _train_matrix(k_train_train: Any, layout: OutputLayout, dtype: Any) -> Any:
  """The checked train-train kernel as an `(n, n)` matrix of `dtype`."""
  if isinstance(k_train_train, solve.KernelRows):
    return k_train_train
  if isinstance(k_train_train, np.ndarray) and k_train_train.ndim == 2:
    # On the host, already a matrix: no copy.
    return k_train_train.astype(dtype, copy=False)
  return kernel_to_matrix(k_train_train.astype(dtype), len(layout.untraced))


def _predict(train: TrainKernels, flow: _Flow, t: Optional[ArrayOrScalar],
             fx_train_0: Optional[ArrayOrScalar],
             fx_test_0: Optional[ArrayOrScalar],
             k_test_train: Optional[Array]) -> Any:
  """`predict_fn` of `gradient_descent_mse` (see there)."""
  check_initial_outputs(fx_train_0, fx_test_0, k_test_train)
  tau, t_shape = flow_times(t, flow.rate, flow.dtype)
  residual = train.targets(flow.dtype)
  if fx_train_0 is not None:
    fx_train_0 = broadcast_initial_outputs(fx_train_0, train.y_train.shape,
                                           'fx_train_0')
    residual = residual - outputs_to_matrix(fx_train_0.astype(flow.dtype),
                                            train.layout)
  if t is None and train.options.solver != 'eigh':
    return _infinite_time(train, flow, residual, fx_train_0, fx_test_0,
                          k_test_train)
  if isinstance(train.matrix('ntk'), solve.KernelRows):
    raise ValueError(
        f'Predictions at finite `t` (got t={t!r}) need the '
        'eigendecomposition of `k_train_train`, which needs the kernel in '
        'memory, but it is given by row blocks (`KernelRows`). Predict at '
        't=None (with solver="cg"), or pass the kernel as an array.')
  eig = train.solver('ntk', 'eigh').eig
  residual_eigen = eig.evecs.T @ residual

  fx_train_t = None
  if fx_train_0 is not None:
    change = scaled_product(eig.evecs, relaxation(eig, tau), residual_eigen)
    change = change.reshape(t_shape + change.shape[1:])
    fx_train_t = with_time_axes(fx_train_0, t_shape) + matrix_to_outputs(
        change, train.y_train.shape, train.layout)
  if fx_test_0 is None:
    return _cast(fx_train_t, flow.out_dtype)

  k_test, fx_test_0, test_shape = _test_set(train, flow.dtype, k_test_train,
                                            fx_test_0)
  k_test = jnp.asarray(stored.whole(k_test), flow.dtype)
  change = scaled_product(k_test @ eig.evecs, integrated_relaxation(eig, tau),
                          residual_eigen)
  change = change.reshape(t_shape + change.shape[1:])
  fx_test_t = with_time_axes(fx_test_0, t_shape) + matrix_to_outputs(
      change, test_shape, train.layout)
  if fx_train_t is None:
    return _cast(fx_test_t, flow.out_dtype)
  return _cast(fx_train_t, flow.out_dtype), _cast(fx_test_t, flow.out_dtype)


def _test_set(train: TrainKernels, dtype: Any, k_test_train: Any,
              fx_test_0: ArrayOrScalar
              ) -> tuple[Array, Array, tuple[int, ...]]:
  """The checked test-train kernel as a matrix, `fx_test_0` broadcast to
  the test outputs' shape, and that shape."""
  k_test_train = stored.as_row_kernel(k_test_train, 'k_test_train')
  if not isinstance(k_test_train, solve.KernelRows):
    k_test_train = as_array_kernel(k_test_train, 'k_test_train')
  check_kernel(k_test_train, 'k_test_train', train.y_train, train.layout,
               train.trace_axes, square=False)
  test_shape = shape_of_test_outputs(k_test_train, train.y_train,
                                     train.layout)
  fx_test_0 = broadcast_initial_outputs(fx_test_0, test_shape, 'fx_test_0')
  if isinstance(k_test_train, solve.KernelRows):  # Read by row blocks.
    return k_test_train, fx_test_0, test_shape
  k_test = kernel_to_matrix(k_test_train.astype(dtype),
                            len(train.layout.untraced))
  return k_test, fx_test_0, test_shape


def _infinite_time(train: TrainKernels, flow: _Flow, residual: Array,
                   fx_train_0: Optional[Array],
                   fx_test_0: Optional[ArrayOrScalar],
                   k_test_train: Optional[Array]) -> Any:
  """`t=None` by one solve: train outputs reach `y`, test outputs
  `fx_test_0 + Theta_* Theta_reg^{-1} (y - fx_train_0)`."""
  factor = train.solver('ntk')
  if isinstance(factor, solve.EighSolver):  # Singular: the projection.
    eig = factor.eig
    change = eig.evecs @ (eig.positive[:, None] * (eig.evecs.T @ residual))
  else:
    change = residual
  fx_train_t = None
  if fx_train_0 is not None:
    fx_train_t = _cast(fx_train_0 + matrix_to_outputs(
        change, train.y_train.shape, train.layout), flow.out_dtype)
  if fx_test_0 is None:
    return fx_train_t
  k_test, fx_test_0, test_shape = _test_set(train, flow.dtype, k_test_train,
                                            fx_test_0)
  weights = factor.solve(residual)
  train.record('ntk', factor)
  if solve.all_on_host(k_test, weights):  # float64 arithmetic, no compile.
    change = to_device(solve.kernel_matmul(
        solve.host_view(k_test), np.asarray(weights)).astype(flow.dtype))
  else:
    change = k_test @ jnp.asarray(weights, flow.dtype)
  fx_test_t = _cast(fx_test_0 + matrix_to_outputs(change, test_shape,
                                                  train.layout),
                    flow.out_dtype)
  if fx_train_t is None:
    return fx_test_t
  return fx_train_t, fx_test_t


def _cast(x: Optional[Array], dtype: Any) -> Optional[Array]:
  """Half-precision outputs back from the float32 solve; else unchanged."""
  if x is None or jnp.dtype(dtype).itemsize >= 4:
    return x
  return x.astype(dtype)


@precision.library_precision
def max_learning_rate(
    ntk_train_train: Array,
    y_train_size: Optional[int] = None,
    momentum: float = 0.,
    eps: float = 1e-12,
) -> float:
  """The largest learning rate for which gradient descent on MSE converges.

  Discrete gradient descent on `0.5 * mean((f - y)**2)` over `n =
  y_train_size` outputs moves the error by `e <- (I - lr Theta / n) e`, which
  converges iff `lr < 2 n / lambda_max(Theta)`. With heavy-ball momentum `m`
  the error follows `e' = ((1 + m) I - lr Theta / n) e - m e_prev`, which
  converges iff `lr < 2 (1 + m) n / lambda_max(Theta)`.

  Args:
    ntk_train_train: train-train NTK, `(N, N)` plus a pair of axes per
      untraced output axis.
    y_train_size: `y_train.size`, the number of outputs the MSE averages over.
      `None` means the kernel's number of rows with output axes flattened,
      i.e. `trace_axes=()` or a single output; with traced output axes pass
      `y_train.size`.
    momentum: heavy-ball momentum in `[0, 1)`.
    eps: added to `lambda_max` so that a zero kernel gives a finite rate.

  Returns:
    The critical learning rate `2 (1 + momentum) n / (lambda_max + eps)`.

  Example:
    >>> from jax import random
    >>> import jax.numpy as jnp
    >>> import neural_tangents as nt
    >>> from neural_tangents import stax
    >>> _, _, kernel_fn = stax.serial(stax.Dense(512), stax.Relu(),
    ...                               stax.Dense(1))
    >>> x_train = random.normal(random.PRNGKey(1), (3, 4))
    >>> ntk_train_train = kernel_fn(x_train, None, 'ntk')
    >>> y_train = jnp.ones((3, 1))
    >>> lr = nt.predict.max_learning_rate(ntk_train_train, y_train.size)
    >>> predict_fn = nt.predict.gradient_descent_mse(ntk_train_train, y_train,
    ...                                              learning_rate=0.5 * lr)
    >>> predict_fn(t=100.).shape
    (3, 1)
  """
  k = as_array_kernel(ntk_train_train, 'ntk_train_train')
  if k.ndim < 2 or k.ndim % 2 or k.shape[0] != k.shape[1]:
    raise ValueError(f'`ntk_train_train` must have shape (N, N) plus pairs of '
                     f'output axes; got {k.shape}. Pass the train-train NTK, '
                     "e.g. `kernel_fn(x_train, None, 'ntk')`.")
  if k.shape[0] == 0:
    raise ValueError(f'`ntk_train_train` has no training points (shape '
                     f'{k.shape}), so no learning rate is the largest stable '
                     'one. Pass the NTK of at least one training point, e.g. '
                     "`kernel_fn(x_train, None, 'ntk')` with a non-empty "
                     '`x_train`.')
  if not 0. <= momentum < 1.:
    raise ValueError(f'`momentum` must be in [0, 1); got momentum={momentum}. '
                     'Pass 0. for plain gradient descent, or e.g. 0.9.')
  k = kernel_to_matrix(k.astype(jnp.result_type(k.dtype, float)),
                       k.ndim // 2 - 1)
  size = k.shape[0] if y_train_size is None else y_train_size
  max_eval = linalg.eigvalsh((k + k.T) / 2)[-1]
  lr = 2. * (1. + momentum) * size / (max_eval + eps)
  return lr if isinstance(lr, jax.core.Tracer) else float(lr)
