"""Outputs of wide networks trained by gradient descent, and GP inference.

A network linearized around its initial parameters `theta_0`,
`f_lin(x) = f_0(x) + J(x) (theta - theta_0)`, trained by gradient descent
moves its outputs in function space through the neural tangent kernel
`Theta(x, x') = J(x) J(x')^T`. For MSE these dynamics are linear and solved in
closed form; for infinitely wide networks `f_0` is a Gaussian process (the
NNGP) and so are the trained outputs [1, 2].

Conventions (the published Neural Tangents ones):

* Loss. The MSE is the mean over all `y_train.size` entries,
  `loss = 0.5 * mean((f(x_train) - y_train)**2)`. Gradient descent with
  learning rate `lr` is followed in the continuous-time limit: after `t` steps
  the train outputs solve
  `df/ds = -Theta (f - y_train) / y_train.size`, `s = lr * t`,
  so `t` counts steps and may be fractional.
* Layout. `y_train` has shape `(N, O_1, ..., O_d)`. The output axes in
  `trace_axes` are traced out of the kernel: the kernel is the identity on
  them, and the same kernel acts on each of their entries. A kernel relating
  `N1` to `N2` points therefore has shape `(N1, N2)` followed by one pair of
  axes `(O_i, O_i')` for each output axis not in `trace_axes`, interleaved as
  in `nt.Kernel`: `trace_axes=(-1,)` and `y_train` of shape `(N, O)` need an
  `(N, N)` kernel, `trace_axes=()` an `(N, N, O, O)` one.
* Kernels. Functions of one kernel take arrays. `gp_inference` also takes
  `nt.Kernel` objects or namedtuples with `nngp` / `ntk` fields, and selects
  with `get`: 'nngp' (the NNGP posterior, or training only the readout),
  'ntk' (training the whole network) or 'ntkgp' (the GP posterior with the
  NTK as prior, He et al. 2020).
* Regularization. `diag_reg` adds `diag_reg * trace(K) / n` (or `diag_reg`
  itself when `diag_reg_absolute_scale`) to the diagonal of the `n x n`
  train-train kernel `K` that is inverted (the NTK for 'ntk' and 'ntkgp', the
  NNGP for 'nngp'); no other kernel is changed (in particular not the NNGP
  prior of 'ntk' covariances). It acts as observation noise (GP inference)
  or ridge regularization (kernel regression).
* Singular kernels. Eigenvalues of the (regularized) `n x n` train-train
  kernel at or below `4 sqrt(n) eps(dtype) lambda_max`, the round-off level of
  a computed kernel, are treated as exactly zero: those directions do not move
  under the flow and carry nothing to test points (as for an exactly singular
  PSD kernel), and infinite-time predictions use the pseudo-inverse, i.e. the
  minimum-norm least-squares interpolant. Results stay finite; pass
  `diag_reg > 0` for a ridge answer instead.

[1] Jacot, Gabriel, Hongler. "Neural Tangent Kernel: Convergence and
    Generalization in Neural Networks." NeurIPS 2018.
[2] Lee, Xiao, Schoenholz, Bahri, Novak, Sohl-Dickstein, Pennington. "Wide
    Neural Networks of Any Depth Evolve as Linear Models Under Gradient
    Descent." NeurIPS 2019.
"""
import collections
import functools
import math
from typing import Any, Callable, NamedTuple, Optional, Sequence, Union

import jax
from jax.experimental import ode
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.utils.typing import Axes, Get

Array = jax.Array
ArrayOrScalar = Union[Array, float, np.ndarray]

# What `get=None` returns.
_GETS = ('nngp', 'ntk')


class _Posterior(NamedTuple):
  """The two kernels that define the prediction of one `get`.

  Attributes:
    flow: the train-train kernel that drives gradient flow and is inverted
      (the only one that `diag_reg` regularizes).
    prior: the covariance of the outputs at initialization, `f_0`.
  """
  flow: str
  prior: str


_POSTERIORS = {
    'nngp': _Posterior(flow='nngp', prior='nngp'),
    'ntk': _Posterior(flow='ntk', prior='nngp'),
    'ntkgp': _Posterior(flow='ntk', prior='ntk'),
}


class Gaussian(NamedTuple):
  """A Gaussian distribution over outputs.

  Attributes:
    mean: the mean, shaped like the outputs.
    covariance: the covariance in the kernel layout (see the module
      docstring); `None` when not computed.
  """
  mean: Array
  covariance: Optional[Array]


class ODEState(NamedTuple):
  """State of the gradient descent ODE solved by `gradient_descent`.

  Attributes:
    fx_train: outputs on the training set.
    fx_test: outputs on the test set (`None` when not computed).
    qx_train: velocity of `fx_train` (with momentum only).
    qx_test: velocity of `fx_test` (with momentum only).
  """
  fx_train: Optional[Array] = None
  fx_test: Optional[Array] = None
  qx_train: Optional[Array] = None
  qx_test: Optional[Array] = None


# Layout: output axes, and conversion of kernels and outputs to matrices.


class _Layout(NamedTuple):
  """Which output axes of `y_train` are kept in the kernel, and which traced."""
  untraced: tuple[int, ...]
  traced: tuple[int, ...]


def _layout(y_train: Array, trace_axes: Axes) -> _Layout:
  """Splits the output axes of `y_train` into untraced and traced ones."""
  ndim = y_train.ndim
  if ndim < 1:
    raise ValueError('`y_train` must have a leading batch axis (one row per '
                     f'training point); got a scalar of shape {y_train.shape}.')
  axes = (trace_axes,) if isinstance(trace_axes, int) else tuple(trace_axes)
  for axis in axes:
    if not -ndim <= axis < ndim:
      raise ValueError(f'`trace_axes={trace_axes}` is out of range for '
                       f'`y_train` of shape {y_train.shape}.')
  traced = tuple(sorted({axis % ndim for axis in axes}))
  if 0 in traced:
    raise ValueError(
        f'`trace_axes={trace_axes}` includes the batch axis 0 of `y_train` '
        f'of shape {y_train.shape}. Only output axes can be traced: reshape '
        '`y_train` to `(N, 1)`, or pass `trace_axes=()`.')
  untraced = tuple(i for i in range(1, ndim) if i not in traced)
  return _Layout(untraced, traced)


def _kernel_to_matrix(k: Array, n_pairs: int) -> Array:
  """`(A, B, a_1, b_1, ..., a_n, b_n)` -> `(A * a_1 * ... , B * b_1 * ...)`."""
  rows = (0,) + tuple(2 + 2 * i for i in range(n_pairs))
  cols = (1,) + tuple(3 + 2 * i for i in range(n_pairs))
  k = jnp.transpose(k, rows + cols)
  n_rows = math.prod(k.shape[:len(rows)])
  return k.reshape(n_rows, -1)


def _matrix_to_covariance(m: Array, row_shape: tuple[int, ...]) -> Array:
  """`(..., R, R)`, `R = prod(row_shape)` -> `(..., n, n, a_1, a_1, ...)`."""
  lead = m.shape[:-2]
  n_lead, n_row = len(lead), len(row_shape)
  m = m.reshape(lead + row_shape + row_shape)
  pairs = tuple(axis for i in range(n_row)
                for axis in (n_lead + i, n_lead + n_row + i))
  return jnp.transpose(m, tuple(range(n_lead)) + pairs)


def _outputs_to_matrix(fx: Array, layout: _Layout) -> Array:
  """`(N, O_1, ..., O_d)` -> `(N * untraced sizes, traced sizes)`."""
  fx = jnp.transpose(fx, (0,) + layout.untraced + layout.traced)
  n_rows = math.prod(fx.shape[:1 + len(layout.untraced)])
  return fx.reshape(n_rows, -1)


def _matrix_to_outputs(m: Array, shape: tuple[int, ...],
                       layout: _Layout) -> Array:
  """Inverse of `_outputs_to_matrix` on `(..., R, T)`, keeping leading axes."""
  lead = m.shape[:-2]
  order = (0,) + layout.untraced + layout.traced
  m = m.reshape(lead + tuple(shape[i] for i in order))
  inverse = tuple(int(i) for i in np.argsort(order))
  n_lead = len(lead)
  return jnp.transpose(m, tuple(range(n_lead)) +
                       tuple(n_lead + i for i in inverse))


def _test_shape(k_test_train: Array, y_train: Array,
                layout: _Layout) -> tuple[int, ...]:
  """Shape of the test outputs: test sizes of untraced axes, else train's."""
  shape = [k_test_train.shape[0]] + list(y_train.shape[1:])
  for i, axis in enumerate(layout.untraced):
    shape[axis] = k_test_train.shape[2 + 2 * i]
  return tuple(shape)


def _test_row_shape(test_shape: tuple[int, ...],
                    layout: _Layout) -> tuple[int, ...]:
  return (test_shape[0],) + tuple(test_shape[i] for i in layout.untraced)


# Argument checks.


def _is_kernel_like(k: Any) -> bool:
  return hasattr(k, 'nngp') or hasattr(k, 'ntk')


def _as_array_kernel(k: Any, name: str) -> Array:
  if _is_kernel_like(k):
    raise ValueError(
        f'`{name}` must be an array, got a {type(k).__name__} with `nngp` / '
        f'`ntk` fields. Pass `{name}.ntk` to train the whole network, or '
        f'`{name}.nngp` to train only its readout layer.')
  return jnp.asarray(k)


def _expected_kernel_shape(rows: Union[int, str], y_train: Array,
                           layout: _Layout) -> tuple[Any, ...]:
  shape = [rows, y_train.shape[0]]
  for axis in layout.untraced:
    shape += ['*' if rows == '*' else y_train.shape[axis], y_train.shape[axis]]
  return tuple(shape)


def _check_kernel(k: Array, name: str, y_train: Array, layout: _Layout,
                  trace_axes: Axes, square: bool) -> None:
  """Raises `ValueError` unless `k` relates points to the `y_train` points."""
  n = y_train.shape[0]
  expected = _expected_kernel_shape(n if square else '*', y_train, layout)
  if k.ndim != len(expected):
    raise ValueError(
        f'`{name}` has shape {k.shape}, but `y_train` of shape '
        f'{y_train.shape} with `trace_axes={trace_axes}` needs a kernel of '
        f'shape {expected}: the two batch axes, then a pair of axes for each '
        'output axis not in `trace_axes`. Compute the kernel with these '
        '`trace_axes`, or change `trace_axes`.')
  if k.shape[1] != n or (square and k.shape[0] != n):
    raise ValueError(
        f'`y_train` has {n} rows (shape {y_train.shape}) but `{name}` has '
        f'shape {k.shape}; expected {expected}. The kernel must relate the '
        'same training points that `y_train` labels: pass one `y_train` row '
        'per training point of the kernel.')
  for i, axis in enumerate(layout.untraced):
    if k.shape[3 + 2 * i] != y_train.shape[axis] or (
        square and k.shape[2 + 2 * i] != y_train.shape[axis]):
      raise ValueError(
          f'`{name}` has shape {k.shape} but `y_train` has shape '
          f'{y_train.shape}: output axis {axis} of size {y_train.shape[axis]} '
          f'needs kernel axes of shape {expected}. Check `trace_axes`.')


def _check_finite(k: Array, name: str) -> None:
  """Raises `ValueError` on NaN / inf, when `k` is concrete (not traced)."""
  if isinstance(k, jax.core.Tracer):
    return
  if not bool(jnp.all(jnp.isfinite(k))):
    raise ValueError(f'`{name}` contains NaN or inf values; the kernel must '
                     'be finite.')


def _check_fx(fx: Any, shape: tuple[int, ...], name: str) -> Array:
  """Broadcasts initial outputs `fx` to `shape`, or raises `ValueError`."""
  fx = jnp.asarray(fx)
  try:
    return jnp.broadcast_to(fx, shape)
  except ValueError:
    raise ValueError(f'`{name}` has shape {fx.shape}, but the outputs have '
                     f'shape {shape}: pass a scalar or an array of shape '
                     f'{shape}.') from None


def _parse_get(get: Get) -> tuple[tuple[str, ...], bool]:
  """`get` -> (names, whether a single value, not a namedtuple, is returned)."""
  if get is None:
    return _GETS, False
  single = isinstance(get, str)
  names = (get,) if single else tuple(get)
  for name in names:
    if name not in _POSTERIORS:
      raise ValueError(f'`get` must be "nngp", "ntk", "ntkgp", a tuple of '
                       f'them, or None; got {get!r}.')
  return names, single


def _kernels_needed(names: Sequence[str], compute_cov: bool) -> tuple[str, ...]:
  """Kernels ('nngp', 'ntk' in this order) that predictions of `names` use."""
  used = set()
  for name in names:
    used.add(_POSTERIORS[name].flow)
    if compute_cov:
      used.add(_POSTERIORS[name].prior)
  return tuple(k for k in ('nngp', 'ntk') if k in used)


@functools.lru_cache(maxsize=None)
def _namedtuple(typename: str, fields: tuple[str, ...]) -> type:
  return collections.namedtuple(typename, fields)


def _by_get(values: dict[str, Any], names: tuple[str, ...], single: bool,
            typename: str) -> Any:
  if single:
    return values[names[0]]
  return _namedtuple(typename, names)(*(values[name] for name in names))


def _is_concrete(tree: Any) -> bool:
  return not any(isinstance(leaf, jax.core.Tracer)
                 for leaf in jax.tree_util.tree_leaves(tree))


def _cached(cache: dict[Any, Any], key: Any, compute: Callable[[], Any]) -> Any:
  """`cache[key]`, computed once; traced values are not kept (they'd leak)."""
  if key in cache:
    return cache[key]
  value = compute()
  if _is_concrete(value):
    cache[key] = value
  return value


# Linear algebra of the flow.


def _regularize(k: Array, diag_reg: float,
                diag_reg_absolute_scale: bool) -> Array:
  """`k + diag_reg * mean(diag(k)) * I`, or `k + diag_reg * I` if absolute."""
  scale = 1. if diag_reg_absolute_scale else jnp.trace(k) / k.shape[0]
  return k + diag_reg * scale * jnp.eye(k.shape[0], dtype=k.dtype)


# Eigenvalues of computed `n x n` kernels that are exactly singular in exact
# arithmetic come out up to ~`sqrt(n) * eps * lambda_max` (measured on
# low-rank and duplicated-point kernels, float32 and float64); below
# `_NOISE_FLOOR` times that they are treated as zero, since inverting round-off
# would blow up predictions. The `n * eps` of `lstsq` would be too high: on a
# 2,000-point float32 ReLU NTK (condition number 2e4) it drops half the
# spectrum and moves predictions by 0.17 where float32 is accurate to 3e-4.
_NOISE_FLOOR = 4.


class _Eigen(NamedTuple):
  """Eigendecomposition of a PSD matrix, with negligible eigenvalues masked.

  Attributes:
    evals: eigenvalues, with masked ones replaced by 1 (never divided by 0).
    evecs: orthonormal eigenvectors as columns.
    positive: mask of the eigenvalues above the numerical zero.
  """
  evals: Array
  evecs: Array
  positive: Array


def _eigh_psd(k: Array) -> _Eigen:
  """Eigendecomposition of a symmetric PSD `k` (round-off negatives -> 0)."""
  k = (k + k.T) / 2
  evals, evecs = jnp.linalg.eigh(k)
  cutoff = (_NOISE_FLOOR * math.sqrt(k.shape[0]) * jnp.finfo(evals.dtype).eps *
            jnp.maximum(evals[-1], 0))
  positive = evals > cutoff
  return _Eigen(jnp.where(positive, evals, 1.), evecs, positive)


def _flow_times(t: Optional[ArrayOrScalar], rate: float,
                dtype: Any) -> tuple[Optional[Array], tuple[int, ...]]:
  """Flattened flow times `rate * t` and the shape of `t`; `None`: infinity."""
  if t is None:
    return None, ()
  t = jnp.asarray(t, dtype)
  return t.reshape(-1) * rate, t.shape


def _lead(x: Array, t_shape: tuple[int, ...]) -> Array:
  """`x` with `len(t_shape)` leading unit axes, to add to per-time outputs."""
  return x.reshape((1,) * len(t_shape) + x.shape)


def _relaxation(eig: _Eigen, tau: Optional[Array]) -> Array:
  """`1 - exp(-lambda tau)`, shape `(n_times, n_evals)`; 1 at infinite time."""
  if tau is None:
    return eig.positive.astype(eig.evals.dtype)[None]
  return jnp.where(eig.positive[None],
                   -jnp.expm1(-eig.evals[None] * tau[:, None]), 0.)


def _integrated_relaxation(eig: _Eigen, tau: Optional[Array]) -> Array:
  """`(1 - exp(-lambda tau)) / lambda`: `1 / lambda` at infinite time.

  Zero on masked eigenvalues: for a PSD kernel of train and test points
  together, the test-train kernel vanishes on the null space of the train-train
  kernel, so these directions carry nothing to the test set.
  """
  return _relaxation(eig, tau) / eig.evals[None]


def _scaled_product(left: Array, scales: Array, right: Array) -> Array:
  """`left @ diag(scales[i]) @ right` for each row `i` of `scales`."""
  return jnp.einsum('ij,tj,jk->tik', left, scales, right)


def _posterior_covariance(b: Array, scales: Array, k_test_test: Array,
                          d: Array, middle: Optional[Array],
                          evals: Array) -> Array:
  """Covariance of `f_0(x) - A f_0(X)` with `A = B diag(scales) V^T`.

  With `K` the NNGP, `f_0` has covariance `K`, so the covariance is
  `K** - A K*^T - K* A^T + A K A^T`, where `D = V^T K*^T` and
  `middle = V^T K V`. `middle=None` means that `V` diagonalizes `K` with
  eigenvalues `evals` (the NNGP-trained case), saving a cubic product.

  Args:
    b: `(M*, M)`, the test-train kernel driving the flow times `V`.
    scales: `(T, M)`, flow factors per time.
    k_test_test: `(M*, M*)` NNGP.
    d: `(M, M*)`.
    middle: `(M, M)` or None.
    evals: `(M,)`, used when `middle` is None.

  Returns:
    `(T, M*, M*)` covariances.
  """
  cross = _scaled_product(b, scales, d)
  b_scaled = b[None] * scales[:, None, :]
  if middle is None:
    b_scaled = b_scaled * jnp.sqrt(evals)[None, None]
    inner = b_scaled @ jnp.swapaxes(b_scaled, -1, -2)
  else:
    inner = b_scaled @ middle @ jnp.swapaxes(b_scaled, -1, -2)
  cov = k_test_test[None] - cross - jnp.swapaxes(cross, -1, -2) + inner
  # Round-off makes the sum slightly asymmetric; a covariance is symmetric.
  return (cov + jnp.swapaxes(cov, -1, -2)) / 2


# MSE gradient descent of a single network.


def gradient_descent_mse(
    k_train_train: Array,
    y_train: Array,
    learning_rate: float = 1.,
    diag_reg: float = 0.,
    diag_reg_absolute_scale: bool = False,
    trace_axes: Axes = (-1,),
) -> Callable[..., Union[Array, tuple[Array, Array]]]:
  """Outputs of a linearized network trained by gradient descent on MSE.

  With `Theta` the regularized train-train NTK, `n = y_train.size`,
  `s = learning_rate * t` and `Theta_*` the test-train NTK, gradient flow on
  `0.5 * mean((f - y)**2)` gives [2]

    f_train(t) = f_train(0) + (I - exp(-Theta s / n)) (y - f_train(0)),
    f_test(t) = f_test(0) + Theta_* Theta^{-1} (I - exp(-Theta s / n))
                (y - f_train(0)).

  Both are evaluated through one eigendecomposition of `Theta`, computed here
  and reused for every call and every time. At `t=None` (infinity) the test
  outputs are kernel (ridge) regression `f_test(0) + Theta_* Theta^+ (y -
  f_train(0))` and the train outputs reach `y` (if `Theta` is singular,
  `f_train(0)` plus the projection of `y - f_train(0)` on its range).

  Args:
    k_train_train: train-train NTK, `(N, N)` plus a pair of axes per output
      axis not in `trace_axes` (see the module docstring). Passing the NNGP
      instead gives the dynamics of training only the readout layer.
    y_train: targets, `(N, O_1, ..., O_d)`.
    learning_rate: learning rate of the gradient descent steps counted by `t`.
    diag_reg: diagonal regularizer of `k_train_train`, relative to its mean
      diagonal entry.
    diag_reg_absolute_scale: whether `diag_reg` is absolute instead.
    trace_axes: output axes of `y_train` traced out of the kernels.

  Returns:
    `predict_fn(t=None, fx_train_0=0., fx_test_0=None, k_test_train=None)`.
    `t`: the number of steps, a scalar or an array of any shape (adding its
    shape as leading axes of the outputs); `None` is infinite time.
    `fx_train_0`: train outputs at `t = 0`, a scalar or shaped like `y_train`;
    `None` skips train predictions (returned as `None`). `fx_test_0`: test
    outputs at `t = 0` (zero if `k_test_train` is given without it).
    `k_test_train`: test-train NTK, `(N_test, N)` plus output axis pairs.
    It returns `fx_train_t`, or `(fx_train_t, fx_test_t)` when `k_test_train`
    is given.

  Raises:
    ValueError: if the kernel's shape does not match `y_train` and
      `trace_axes`, or the kernel is not finite.

  Example:
    >>> predict_fn = nt.predict.gradient_descent_mse(k_train_train, y_train)
    >>> fx_train_t, fx_test_t = predict_fn(
    ...     t=jnp.array([1., 10.]), fx_train_0=fx_train_0,
    ...     fx_test_0=fx_test_0, k_test_train=k_test_train)
    >>> fx_test_t.shape  # (2, N_test, O)
  """
  y_train = jnp.asarray(y_train)
  k_train_train = _as_array_kernel(k_train_train, 'k_train_train')
  layout = _layout(y_train, trace_axes)
  _check_kernel(k_train_train, 'k_train_train', y_train, layout, trace_axes,
                square=True)
  _check_finite(k_train_train, 'k_train_train')
  dtype = jnp.result_type(k_train_train.dtype, y_train.dtype, float)
  k = _kernel_to_matrix(k_train_train.astype(dtype), len(layout.untraced))
  eig = _eigh_psd(_regularize(k, diag_reg, diag_reg_absolute_scale))
  y = _outputs_to_matrix(y_train.astype(dtype), layout)
  rate = learning_rate / y_train.size

  def predict_fn(
      t: Optional[ArrayOrScalar] = None,
      fx_train_0: Optional[ArrayOrScalar] = 0.,
      fx_test_0: Optional[ArrayOrScalar] = None,
      k_test_train: Optional[Array] = None,
  ) -> Union[Optional[Array], tuple[Optional[Array], Array]]:
    if fx_test_0 is not None and k_test_train is None:
      raise ValueError('`fx_test_0` was given without `k_test_train`: pass '
                       '`k_test_train` to predict on the test set.')
    tau, t_shape = _flow_times(t, rate, dtype)
    residual = y
    if fx_train_0 is not None:
      fx_train_0 = _check_fx(fx_train_0, y_train.shape, 'fx_train_0')
      residual = y - _outputs_to_matrix(fx_train_0.astype(dtype), layout)
    residual_eigen = eig.evecs.T @ residual

    fx_train_t = None
    if fx_train_0 is not None:
      change = _scaled_product(eig.evecs, _relaxation(eig, tau),
                               residual_eigen)
      change = change.reshape(t_shape + change.shape[1:])
      fx_train_t = _lead(fx_train_0, t_shape) + _matrix_to_outputs(
          change, y_train.shape, layout)
    if k_test_train is None:
      return fx_train_t

    k_test_train = _as_array_kernel(k_test_train, 'k_test_train')
    _check_kernel(k_test_train, 'k_test_train', y_train, layout, trace_axes,
                  square=False)
    test_shape = _test_shape(k_test_train, y_train, layout)
    fx_test_0 = _check_fx(0. if fx_test_0 is None else fx_test_0, test_shape,
                          'fx_test_0')
    k_test = _kernel_to_matrix(k_test_train.astype(dtype),
                               len(layout.untraced))
    change = _scaled_product(k_test @ eig.evecs,
                             _integrated_relaxation(eig, tau), residual_eigen)
    change = change.reshape(t_shape + change.shape[1:])
    fx_test_t = _lead(fx_test_0, t_shape) + _matrix_to_outputs(
        change, test_shape, layout)
    return fx_train_t, fx_test_t

  return predict_fn


# Ensembles of infinitely wide networks.


def _kernel_fn_matrices(kernel_fn: Callable[..., Any], x1: Array,
                        x2: Optional[Array], names: Sequence[str],
                        kwargs: dict[str, Any]) -> dict[str, Array]:
  """Calls a stax-style `kernel_fn` once and returns the requested kernels."""
  names = tuple(names)
  out = kernel_fn(x1, x2, get=names, **kwargs)
  kernels = {}
  for name in names:
    if hasattr(out, name):
      value = getattr(out, name)
    elif isinstance(out, dict):
      value = out.get(name)
    elif len(names) == 1:
      value = out
    else:
      value = None
    if value is None:
      raise ValueError(f'`kernel_fn` did not return the "{name}" kernel for '
                       f'`get={names}`; pass a `kernel_fn` that computes it.')
    kernels[name] = jnp.asarray(value)
  return kernels


def _is_pair(value: Any) -> bool:
  return isinstance(value, tuple) and len(value) == 2


def _value_for_x1(value: Any) -> Any:
  """The entry of a pair-valued kwarg that describes `x1`; else the value."""
  return value[0] if _is_pair(value) else value


def _comparable(leaf: Any) -> Any:
  if hasattr(leaf, 'dtype') and jnp.issubdtype(leaf.dtype,
                                                 jax.dtypes.prng_key):
    leaf = jax.random.key_data(leaf)
  return np.asarray(leaf)


def _values_match(a: Any, b: Any) -> bool:
  """Whether two kwarg values are equal; traced leaves count as equal."""
  if a is b:
    return True
  leaves_a, tree_a = jax.tree_util.tree_flatten(a)
  leaves_b, tree_b = jax.tree_util.tree_flatten(b)
  if tree_a != tree_b:
    return False
  for leaf_a, leaf_b in zip(leaves_a, leaves_b):
    if leaf_a is leaf_b or isinstance(leaf_a, jax.core.Tracer) or isinstance(
        leaf_b, jax.core.Tracer):
      continue
    leaf_a, leaf_b = _comparable(leaf_a), _comparable(leaf_b)
    if leaf_a.shape != leaf_b.shape or not np.array_equal(leaf_a, leaf_b):
      return False
  return True


def _test_test_kwargs(train_kwargs: dict[str, Any],
                      test_kwargs: dict[str, Any]) -> dict[str, Any]:
  """Keyword arguments of `kernel_fn(x_test, None)`: test ones override."""
  return {**train_kwargs, **test_kwargs}


def _test_train_kwargs(train_kwargs: dict[str, Any],
                       test_kwargs: dict[str, Any]) -> dict[str, Any]:
  """Keyword arguments of `kernel_fn(x_test, x_train)`.

  A pair-valued kwarg `(value_for_x1, value_for_x2)`, such as `Aggregate`'s
  `pattern`, becomes `(value for x_test, value for x_train)`: the first entries
  of the test-test and of the train-train pairs, which describe `x1` in the
  `x2=None` calls (their second entry may be `None` or a repeat). Any other
  kwarg is shared by all calls: given to both, the values must be equal.

  Raises:
    ValueError: if a kwarg that is not a pair has different train and test
      values.
  """
  test_all = _test_test_kwargs(train_kwargs, test_kwargs)
  out = {}
  for key, test_value in test_all.items():
    train_value = train_kwargs.get(key)
    if _is_pair(test_value) or _is_pair(train_value):
      out[key] = (_value_for_x1(test_value), _value_for_x1(train_value))
      continue
    if (key in train_kwargs and key in test_kwargs and
        not _values_match(test_value, train_value)):
      raise ValueError(
          f'`{key}` is {test_value!r} for the test points but {train_value!r} '
          'for the training points, and is not a pair `(value_for_x1, '
          'value_for_x2)` that could combine them for the test-train kernel. '
          f'Pass the same `{key}` to `predict_fn` as to '
          '`gradient_descent_mse_ensemble` (or leave it out of `predict_fn`), '
          'or pass pairs.')
    out[key] = test_value
  return out


def gradient_descent_mse_ensemble(
    kernel_fn: Callable[..., Any],
    x_train: Array,
    y_train: Array,
    learning_rate: float = 1.,
    diag_reg: float = 0.,
    diag_reg_absolute_scale: bool = False,
    trace_axes: Axes = (-1,),
    **kernel_fn_train_train_kwargs,
) -> Callable[..., Any]:
  """Outputs of an ensemble of infinitely wide networks trained on MSE.

  At initialization the outputs `f_0` are a GP with a prior kernel `P`. The
  network trained by gradient flow for `t` steps (see `gradient_descent_mse`)
  with the tangent kernel `Theta` is affine in `f_0`:

    f_t(x) = f_0(x) + A_t(x) (y - f_0(X)),
    A_t(x) = Theta(x, X) Theta^{-1} (I - exp(-Theta s / n)),

  so it is Gaussian [2] with

    mean(x) = A_t(x) y,
    cov(x, x') = P(x, x') - A_t(x) P(X, x') - P(x, X) A_t(x')^T
                 + A_t(x) P(X, X) A_t(x')^T.

  `get` chooses `Theta` and `P` (`K` is the NNGP):

  * `'ntk'`: the whole network is trained, `Theta` is the NTK and `P = K`.
  * `'nngp'`: only the readout layer is trained; its tangent kernel is the
    NNGP, `Theta = P = K`. At infinite time this is the exact Bayesian
    (NNGP) posterior.
  * `'ntkgp'`: the NTK-GP of He, Lakshminarayanan & Teh 2020 [3]: adding to
    each network an untrainable random function makes the prior the NTK,
    `Theta = P = NTK`, so that trained networks sample the GP posterior with
    the NTK as prior covariance. With `P = Theta = V diag(l) V^T` the cross
    terms and the last one add up to `(1 - e)^2 - 2 (1 - e) = -(1 - e^2)`,
    `e = exp(-l s / n)`::

      mean(x) = Theta(x, X) Theta^{-1} (I - exp(-Theta s / n)) y,
      cov(x, x') = Theta(x, x')
                   - Theta(x, X) Theta^{-1} (I - exp(-2 Theta s / n))
                     Theta(X, x'),

    at infinite time `Theta(x, X) Theta^{-1} y` and
    `Theta(x, x') - Theta(x, X) Theta^{-1} Theta(X, x')`. The same holds for
    `'nngp'` with `K` in place of `Theta`.

  `diag_reg` regularizes only the inverted kernel `Theta(X, X)` (NNGP for
  'nngp', NTK for 'ntk' and 'ntkgp'), adding `diag_reg * trace(Theta(X, X))
  / m` to its diagonal (`m` its number of rows), or `diag_reg` itself with
  `diag_reg_absolute_scale`. Where `P = Theta` the regularized kernel is also
  the prior's (noise on the observations: the textbook noisy posterior);
  the NNGP `P(X, X)` of 'ntk' is used as is.

  Each train-train kernel is computed once, eigendecomposed once, and cached
  across calls; all times `t` of a call share it.

  Args:
    kernel_fn: stax-style `kernel_fn(x1, x2, get, **kwargs)`.
    x_train: training inputs.
    y_train: targets, `(N, O_1, ..., O_d)`.
    learning_rate: learning rate of the steps counted by `t`.
    diag_reg: diagonal regularizer of the inverted train-train kernel,
      relative to its mean diagonal entry.
    diag_reg_absolute_scale: whether `diag_reg` is absolute instead.
    trace_axes: output axes traced out of the kernels.
    **kernel_fn_train_train_kwargs: passed as they are to
      `kernel_fn(x_train, None)`; to `kernel_fn(x_test, None)` unless
      `predict_fn` overrides them; for `kernel_fn(x_test, x_train)`, pairs
      `(value_for_x1, value_for_x2)` (e.g. `pattern`) combine the test and the
      train values into `(test[0], train[0])`, and other values, if given to
      both, must match.

  Returns:
    `predict_fn(t=None, x_test=None, get=None, compute_cov=False,
    **kernel_fn_test_test_kwargs)`: `t` a number of steps, an array of them
    (leading axes of the outputs), or `None` (infinite time); `x_test=None`
    predicts on the training inputs (with unregularized test kernels);
    `kernel_fn_test_test_kwargs` are the kwargs of `kernel_fn(x_test, None)`
    (see above). Returns for each `get` in 'nngp', 'ntk', 'ntkgp' (a
    namedtuple with fields in the order of `get` for a tuple, `('nngp',
    'ntk')` for `get=None`; the value itself for a string) the mean, of shape
    `t.shape + (N_test, O_1, ..., O_d)`, or with `compute_cov` a
    `Gaussian(mean, covariance)`, the covariance in the kernel layout
    `t.shape + (N_test, N_test, O_i, O_i, ...)` (untraced axes only).

  Raises:
    ValueError: if `get` is unknown, `kernel_fn` does not return a needed
      kernel, shapes do not match `y_train` and `trace_axes`, or a kwarg has
      conflicting train and test values.

  Example:
    >>> _, _, kernel_fn = stax.serial(stax.Dense(512), stax.Relu(),
    ...                               stax.Dense(1))
    >>> predict_fn = nt.predict.gradient_descent_mse_ensemble(
    ...     kernel_fn, x_train, y_train, diag_reg=1e-4)
    >>> out = predict_fn(t=jnp.array([1., 100.]), x_test=x_test,
    ...                  get=('ntk', 'ntkgp'), compute_cov=True)
    >>> out.ntkgp.mean.shape, out.ntkgp.covariance.shape
    ((2, N_test, 1), (2, N_test, N_test))

  [3] He, Lakshminarayanan, Teh. "Bayesian Deep Ensembles via the Neural
      Tangent Kernel." NeurIPS 2020.
  """
  y_train = jnp.asarray(y_train)
  layout = _layout(y_train, trace_axes)
  n_pairs = len(layout.untraced)
  cache: dict[Any, Any] = {}

  def train_kernels(kernels: Sequence[str]) -> dict[str, Array]:
    """Unregularized train-train matrices; missing ones in one call."""
    fresh = {}
    missing = [k for k in kernels if ('k', k) not in cache]
    if missing:
      computed = _kernel_fn_matrices(kernel_fn, x_train, None, missing,
                                     kernel_fn_train_train_kwargs)
      for kernel, k in computed.items():
        _check_kernel(k, f'kernel_fn(x_train, None, "{kernel}")', y_train,
                      layout, trace_axes, square=True)
        _check_finite(k, f'kernel_fn(x_train, None, "{kernel}")')
        k = k.astype(jnp.result_type(k.dtype, float))
        fresh[kernel] = _cached(cache, ('k', kernel),
                                lambda k=k: _kernel_to_matrix(k, n_pairs))
    return {k: fresh[k] if k in fresh else cache[('k', k)] for k in kernels}

  def flow(kernel: str, k: Array) -> tuple[_Eigen, Array]:
    """Eigendecomposition of the regularized kernel, and `V^T y`."""
    def compute():
      eig = _eigh_psd(_regularize(k, diag_reg, diag_reg_absolute_scale))
      y = _outputs_to_matrix(y_train.astype(k.dtype), layout)
      return eig, eig.evecs.T @ y
    return _cached(cache, ('flow', kernel), compute)

  def prior_in_eigenbasis(posterior: _Posterior, eig: _Eigen,
                          k_prior: Array) -> Array:
    """`V^T P V` for the flow eigenvectors `V` and the unregularized prior."""
    return _cached(cache, ('middle', posterior),
                   lambda: eig.evecs.T @ k_prior @ eig.evecs)

  def predict_fn(t: Optional[ArrayOrScalar] = None,
                 x_test: Optional[Array] = None,
                 get: Get = None,
                 compute_cov: bool = False,
                 **kernel_fn_test_test_kwargs) -> Any:
    names, single = _parse_get(get)
    needed = _kernels_needed(names, compute_cov)
    k_train = train_kernels(needed)
    dtype = jnp.result_type(*k_train.values())
    priors = tuple(k for k in needed if compute_cov and any(
        _POSTERIORS[name].prior == k for name in names))

    if x_test is None:
      k_test_train, test_shape = k_train, y_train.shape
      k_test_test = {k: k_train[k] for k in priors}
    else:
      kernels = _kernel_fn_matrices(
          kernel_fn, x_test, x_train, needed,
          _test_train_kwargs(kernel_fn_train_train_kwargs,
                             kernel_fn_test_test_kwargs))
      k_test_train = {}
      for kernel, k in kernels.items():
        _check_kernel(k, f'kernel_fn(x_test, x_train, "{kernel}")', y_train,
                      layout, trace_axes, square=False)
        test_shape = _test_shape(k, y_train, layout)
        k_test_train[kernel] = _kernel_to_matrix(k.astype(dtype), n_pairs)
      k_test_test = {}
      if priors:
        kernels = _kernel_fn_matrices(
            kernel_fn, x_test, None, priors,
            _test_test_kwargs(kernel_fn_train_train_kwargs,
                              kernel_fn_test_test_kwargs))
        k_test_test = {kernel: _kernel_to_matrix(k.astype(dtype), n_pairs)
                       for kernel, k in kernels.items()}

    tau, t_shape = _flow_times(t, learning_rate / y_train.size, dtype)
    row_shape = _test_row_shape(test_shape, layout)
    out = {}
    for name in names:
      posterior = _POSTERIORS[name]
      eig, y_eigen = flow(posterior.flow, k_train[posterior.flow])
      scales = _integrated_relaxation(eig, tau)
      b = k_test_train[posterior.flow] @ eig.evecs
      mean = _scaled_product(b, scales, y_eigen)
      mean = _matrix_to_outputs(mean.reshape(t_shape + mean.shape[1:]),
                                test_shape, layout)
      if not compute_cov:
        out[name] = mean
        continue
      middle = (None if posterior.prior == posterior.flow else
                prior_in_eigenbasis(posterior, eig, k_train[posterior.prior]))
      d = eig.evecs.T @ k_test_train[posterior.prior].T
      cov = _posterior_covariance(b, scales, k_test_test[posterior.prior], d,
                                  middle, eig.evals)
      cov = _matrix_to_covariance(cov.reshape(t_shape + cov.shape[1:]),
                                  row_shape)
      out[name] = Gaussian(mean, cov)
    return _by_get(out, names, single, 'Gaussians' if compute_cov else 'Means')

  return predict_fn


def gp_inference(
    k_train_train: Any,
    y_train: Array,
    diag_reg: float = 0.,
    diag_reg_absolute_scale: bool = False,
    trace_axes: Axes = (-1,),
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

  Each train-train kernel is eigendecomposed once, on first use.

  Args:
    k_train_train: train-train kernel: an array (used as the kernel of any
      `get`), or an `nt.Kernel` / namedtuple with the `nngp` and/or `ntk`
      kernels that the calls need ('ntkgp' needs `ntk`; the 'ntk'
      covariance needs both).
    y_train: targets, `(N, O_1, ..., O_d)`.
    diag_reg: diagonal regularizer (noise variance) of the inverted
      train-train kernel, relative to its mean diagonal entry.
    diag_reg_absolute_scale: whether `diag_reg` is absolute instead.
    trace_axes: output axes traced out of the kernels.

  Returns:
    `predict_fn(get=None, k_test_train=None, k_test_test=None)` returning, for
    each `get` in 'nngp', 'ntk', 'ntkgp' (a namedtuple with fields in the
    order of `get` for a tuple, `('nngp', 'ntk')` for `get=None`; the value
    itself for a string or when all kernels are arrays and `get=None`), a
    `Gaussian(mean, covariance)`; `covariance` is `None` unless `k_test_test`
    is given. `k_test_train=None` predicts on the training points (with the
    unregularized kernel).

  Example:
    >>> predict_fn = nt.predict.gp_inference(k_train_train, y_train,
    ...                                      diag_reg=1e-3)
    >>> mean, cov = predict_fn('ntkgp', k_test_train, k_test_test)
  """
  y_train = jnp.asarray(y_train)
  layout = _layout(y_train, trace_axes)
  n_pairs = len(layout.untraced)
  cache: dict[Any, Any] = {}

  def matrix(k: Any, kernel: str, arg: str, square: bool) -> Array:
    if _is_kernel_like(k):
      k = getattr(k, kernel, None)
      if k is None:
        raise ValueError(
            f'`{arg}` has no "{kernel}" kernel; `get="nngp"` needs "nngp", '
            '"ntk" and "ntkgp" need "ntk", and the "ntk" covariance also needs'
            ' "nngp". Pass a kernel that contains it.')
    k = jnp.asarray(k)
    _check_kernel(k, arg, y_train, layout, trace_axes, square=square)
    return _kernel_to_matrix(k.astype(jnp.result_type(k.dtype, float)),
                             n_pairs)

  def train(kernel: str) -> Array:
    return _cached(cache, ('k', kernel),
                   lambda: matrix(k_train_train, kernel, 'k_train_train', True))

  def flow(kernel: str) -> tuple[_Eigen, Array]:
    def compute():
      k = train(kernel)
      _check_finite(k, 'k_train_train')
      eig = _eigh_psd(_regularize(k, diag_reg, diag_reg_absolute_scale))
      y = _outputs_to_matrix(y_train.astype(k.dtype), layout)
      return eig, eig.evecs.T @ y
    return _cached(cache, ('flow', kernel), compute)

  def predict_fn(get: Get = None,
                 k_test_train: Any = None,
                 k_test_test: Any = None) -> Any:
    names, single = _parse_get(get)
    if get is None and not _is_kernel_like(k_train_train):
      names, single = ('nngp',), True
    compute_cov = k_test_test is not None
    out = {}
    for name in names:
      posterior = _POSTERIORS[name]
      eig, y_eigen = flow(posterior.flow)
      if k_test_train is None:
        k_test, test_shape = train(posterior.flow), y_train.shape
      else:
        k_test = matrix(k_test_train, posterior.flow, 'k_test_train', False)
        test_shape = _test_shape(_kernel_of(k_test_train, posterior.flow),
                                 y_train, layout)
      scales = _integrated_relaxation(eig, None)
      b = k_test @ eig.evecs
      mean = _matrix_to_outputs(_scaled_product(b, scales, y_eigen)[0],
                                test_shape, layout)
      cov = None
      if compute_cov:
        k_prior_test = (
            train(posterior.prior) if k_test_train is None else
            matrix(k_test_train, posterior.prior, 'k_test_train', False))
        k_tt_array = jnp.asarray(_kernel_of(k_test_test, posterior.prior))
        row_shape = _test_row_shape(test_shape, layout)
        expected = tuple(size for size in row_shape for _ in range(2))
        if k_tt_array.shape != expected:
          raise ValueError(
              f'`k_test_test` has shape {k_tt_array.shape} but the test '
              f'outputs have shape {test_shape}, which need a test-test '
              f'kernel of shape {expected}: pass the test-test kernel of the '
              'same test points as `k_test_train`.')
        k_tt = _kernel_to_matrix(k_tt_array, n_pairs)
        middle = None
        if posterior.prior != posterior.flow:
          middle = _cached(cache, ('middle', posterior), lambda: (
              eig.evecs.T @ train(posterior.prior) @ eig.evecs))
        d = eig.evecs.T @ k_prior_test.T
        cov = _posterior_covariance(b, scales, k_tt.astype(b.dtype), d,
                                    middle, eig.evals)[0]
        cov = _matrix_to_covariance(cov, row_shape)
      out[name] = Gaussian(mean, cov)
    return _by_get(out, names, single, 'Gaussians')

  return predict_fn


def _kernel_of(k: Any, name: str) -> Any:
  if _is_kernel_like(k):
    value = getattr(k, name, None)
    if value is None:
      raise ValueError(f'The kernel has no "{name}" field; pass a kernel '
                       'that contains it.')
    return value
  return k


# Gradient descent on any loss.


def gradient_descent(
    loss: Callable[[Array, Array], Array],
    k_train_train: Array,
    y_train: Array,
    learning_rate: float = 1.,
    momentum: Optional[float] = None,
    trace_axes: Axes = (-1,),
) -> Callable[..., Any]:
  """Outputs of a linearized network trained by gradient descent on any loss.

  The train and test outputs follow, in continuous time `s = lr * t`,

    d f_train / ds = -Theta grad_f loss(f_train, y),
    d f_test / ds = -Theta_* grad_f loss(f_train, y),

  solved with `jax.experimental.ode.odeint` (adaptive Dormand-Prince). With
  `momentum` `m`, the continuous limit of heavy-ball steps
  `v <- m v - lr grad`, `theta <- theta + v` is second order: in time
  `s = sqrt(lr) * t`, with velocities `q = df/ds`,

    d f / ds = q,    d q / ds = -(1 - m) / sqrt(lr) q - Theta grad_f loss.

  `loss(fx, y_hat)` must be differentiable in `fx`; for the MSE of
  `gradient_descent_mse` use `0.5 * jnp.mean((fx - y_hat)**2)`.

  Args:
    loss: the loss `loss(fx_train, y_train)`, a scalar.
    k_train_train: train-train NTK, `(N, N)` plus a pair of axes per output
      axis not in `trace_axes`.
    y_train: targets, `(N, O_1, ..., O_d)`.
    learning_rate: learning rate of the steps counted by `t`.
    momentum: heavy-ball momentum in `[0, 1)`, or `None` for plain descent.
    trace_axes: output axes traced out of the kernels.

  Returns:
    `predict_fn(t=None, fx_train_or_state_0=0., fx_test_0=None,
    k_test_train=None)`: `t` a number of steps or an array of them (any
    order; their shape leads the outputs' shapes); `fx_train_or_state_0` the
    train outputs at `t = 0` or an `ODEState`. Returns `fx_train_t`, or
    `(fx_train_t, fx_test_t)` when `k_test_train` is given, or an `ODEState`
    when one was passed. `fx_train_0` is accepted as a keyword alias.

  Raises:
    ValueError: if `t` is None (no closed form at infinite time), or shapes do
      not match.

  Example:
    >>> cross_entropy = lambda fx, y_hat: -jnp.mean(
    ...     jax.nn.log_softmax(fx) * y_hat)
    >>> predict_fn = nt.predict.gradient_descent(cross_entropy, k_train_train,
    ...                                          y_train, 1., momentum=0.9)
    >>> fx_train_t, fx_test_t = predict_fn(10., fx_train_0, fx_test_0,
    ...                                    k_test_train)
  """
  y_train = jnp.asarray(y_train)
  k_train_train = _as_array_kernel(k_train_train, 'k_train_train')
  layout = _layout(y_train, trace_axes)
  _check_kernel(k_train_train, 'k_train_train', y_train, layout, trace_axes,
                square=True)
  _check_finite(k_train_train, 'k_train_train')
  if momentum is not None and not 0. <= momentum < 1.:
    raise ValueError(f'`momentum` must be in [0, 1) or None; got {momentum}.')
  dtype = jnp.result_type(k_train_train.dtype, y_train.dtype, float)
  n_pairs = len(layout.untraced)
  k_train = _kernel_to_matrix(k_train_train.astype(dtype), n_pairs)
  y = y_train.astype(dtype)
  grad_loss = jax.grad(lambda fx: loss(fx, y))

  if momentum is None:
    time_scale = learning_rate
  else:
    time_scale = learning_rate ** 0.5
    friction = (1. - momentum) / time_scale

  def apply_kernel(k: Array, g: Array, shape: tuple[int, ...]) -> Array:
    return _matrix_to_outputs(k @ _outputs_to_matrix(g, layout), shape, layout)

  def dynamics(state: ODEState, s: Array, k_test: Optional[Array],
               test_shape: tuple[int, ...]) -> ODEState:
    del s  # The dynamics are autonomous.
    g = grad_loss(state.fx_train)
    force_train = -apply_kernel(k_train, g, y_train.shape)
    force_test = (None if k_test is None else
                  -apply_kernel(k_test, g, test_shape))
    if momentum is None:
      return ODEState(force_train, force_test)
    accel_test = (None if k_test is None else
                  force_test - friction * state.qx_test)
    return ODEState(state.qx_train, state.qx_test,
                    force_train - friction * state.qx_train, accel_test)

  def predict_fn(t: Optional[ArrayOrScalar] = None,
                 fx_train_or_state_0: Union[ArrayOrScalar, ODEState] = 0.,
                 fx_test_0: Optional[ArrayOrScalar] = None,
                 k_test_train: Optional[Array] = None,
                 *,
                 fx_train_0: Optional[ArrayOrScalar] = None) -> Any:
    if t is None:
      raise ValueError(
          '`gradient_descent` integrates an ODE and has no closed form at '
          '`t=None` (infinite time): pass finite times, or use '
          '`gradient_descent_mse` for infinite-time MSE predictions.')
    if fx_train_0 is not None:
      fx_train_or_state_0 = fx_train_0
    return_state = isinstance(fx_train_or_state_0, ODEState)
    state = (fx_train_or_state_0 if return_state else
             ODEState(fx_train_or_state_0, fx_test_0))
    if state.fx_test is not None and k_test_train is None:
      raise ValueError('`fx_test_0` was given without `k_test_train`: pass '
                       '`k_test_train` to predict on the test set.')
    fx_train = _check_fx(
        0. if state.fx_train is None else state.fx_train, y_train.shape,
        'fx_train_0').astype(dtype)
    k_test, test_shape, fx_test = None, (), None
    if k_test_train is not None:
      k_test_train = _as_array_kernel(k_test_train, 'k_test_train')
      _check_kernel(k_test_train, 'k_test_train', y_train, layout, trace_axes,
                    square=False)
      test_shape = _test_shape(k_test_train, y_train, layout)
      k_test = _kernel_to_matrix(k_test_train.astype(dtype), n_pairs)
      fx_test = _check_fx(0. if state.fx_test is None else state.fx_test,
                          test_shape, 'fx_test_0').astype(dtype)
    state = ODEState(fx_train, fx_test)
    if momentum is not None:
      state = state._replace(
          qx_train=_initial_velocity(fx_train_or_state_0, 'qx_train',
                                     fx_train),
          qx_test=(None if fx_test is None else
                   _initial_velocity(fx_train_or_state_0, 'qx_test', fx_test)))

    t = jnp.asarray(t, dtype)
    if not isinstance(t, jax.core.Tracer) and bool(jnp.any(t < 0)):
      raise ValueError(f'`t` must be non-negative; got {t}.')
    t_shape, s = t.shape, t.reshape(-1) * time_scale
    # `odeint` needs increasing times starting at the initial one, and
    # returns NaN for a later time equal to it: move `t = 0` to the smallest
    # positive float, where the state is the initial one to round-off.
    order = jnp.argsort(s)
    times = jnp.concatenate([jnp.zeros((1,), dtype),
                             jnp.maximum(s[order], jnp.finfo(dtype).tiny)])
    path = ode.odeint(functools.partial(dynamics, test_shape=test_shape),
                      state, times, k_test)
    unsort = jnp.argsort(order)
    path = jax.tree_util.tree_map(
        lambda x: x[1:][unsort].reshape(t_shape + x.shape[1:]), path)
    if return_state:
      return path
    if k_test_train is None:
      return path.fx_train
    return path.fx_train, path.fx_test

  return predict_fn


def _initial_velocity(state: Any, field: str, fx: Array) -> Array:
  value = getattr(state, field, None) if isinstance(state, ODEState) else None
  return jnp.zeros_like(fx) if value is None else jnp.broadcast_to(
      jnp.asarray(value, fx.dtype), fx.shape)


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
    >>> lr = nt.predict.max_learning_rate(ntk_train_train, y_train.size)
    >>> predict_fn = nt.predict.gradient_descent_mse(ntk_train_train, y_train,
    ...                                              learning_rate=0.5 * lr)
  """
  k = _as_array_kernel(ntk_train_train, 'ntk_train_train')
  if k.ndim < 2 or k.ndim % 2 or k.shape[0] != k.shape[1]:
    raise ValueError(f'`ntk_train_train` must have shape (N, N) plus pairs of '
                     f'output axes; got {k.shape}.')
  if not 0. <= momentum < 1.:
    raise ValueError(f'`momentum` must be in [0, 1); got {momentum}.')
  k = _kernel_to_matrix(k.astype(jnp.result_type(k.dtype, float)),
                        k.ndim // 2 - 1)
  size = k.shape[0] if y_train_size is None else y_train_size
  max_eval = jnp.linalg.eigvalsh((k + k.T) / 2)[-1]
  lr = 2. * (1. + momentum) * size / (max_eval + eps)
  return lr if isinstance(lr, jax.core.Tracer) else float(lr)
