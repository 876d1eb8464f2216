"""Linear algebra of the gradient flow `df/ds = -Theta (f - y) / n`: flow
times, relaxation factors per time in the eigenbasis of the train-train kernel
(whose eigendecomposition, `solve.Eigen`, lives in `solve`), and posterior
covariances at finite and infinite time."""
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.predict import solve
from neural_tangents._src.predict.kernel_rows import to_device
from neural_tangents._src.predict.layout import Array
from neural_tangents._src.predict.layout import ArrayOrScalar


def flow_times(t: Optional[ArrayOrScalar], rate: float,
               dtype: Any) -> tuple[Optional[Array], tuple[int, ...]]:
  """Flattened flow times `rate * t` and the shape of `t`; `None`: infinity."""
  if t is None:
    return None, ()
  t = jnp.asarray(t, dtype)
  return t.reshape(-1) * rate, t.shape


def with_time_axes(x: Array, t_shape: tuple[int, ...]) -> Array:
  """`x` with `len(t_shape)` leading unit axes, to add to per-time outputs."""
  return x.reshape((1,) * len(t_shape) + x.shape)


def relaxation(eig: solve.Eigen, tau: Optional[Array]) -> Array:
  """`1 - exp(-lambda tau)`, shape `(n_times, n_evals)`; 1 at infinite time."""
  if tau is None:
    return eig.positive.astype(eig.evals.dtype)[None]
  return jnp.where(eig.positive[None],
                   -jnp.expm1(-eig.evals[None] * tau[:, None]), 0.)


def integrated_relaxation(eig: solve.Eigen, tau: Optional[Array]) -> Array:
  """`(1 - exp(-lambda tau)) / lambda`: `1 / lambda` at infinite time.

  Zero on masked eigenvalues: for a PSD kernel of train and test points
  together, the test-train kernel vanishes on the null space of the train-train
  kernel, so these directions carry nothing to the test set.
  """
  return relaxation(eig, tau) / eig.evals[None]


def scaled_product(left: Array, scales: Array, right: Array) -> Array:
  """`left @ diag(scales[i]) @ right` for each row `i` of `scales`."""
  return jnp.einsum('ij,tj,jk->tik', left, scales, right)


def train_set_flow(eig: solve.Eigen, tau: Array, y_eigen: Array,
                   k_prior: Optional[Array], compute_cov: bool
                   ) -> tuple[Array, Optional[Array]]:
  """Mean and covariance on the training set at finite times, as published.

  With `(l, V)` the eigensystem of the (regularized) train-train flow kernel,
  `l_+ = max(l, 0)` and `E = V diag(exp(-l_+ tau)) V^T` (Neural Tangents
  0.6.5's convention for `x_test=None`):

    mean = V diag(1 - exp(-l tau)) V^T y,
    cov  = V diag(l_+ exp(-2 l_+ tau)) V^T     where the prior is the flow
                                               kernel ('nngp', 'ntkgp'),
    cov  = E K E                               with `K = k_prior` ('ntk').

  Masked (numerically zero) eigenvalues count as 0.

  Args:
    eig: eigensystem of the flow kernel.
    tau: flow times, `(n_times,)`.
    y_eigen: `V^T y`.
    k_prior: the unregularized train-train prior kernel, or `None` when the
      prior is the flow kernel.
    compute_cov: whether to compute the covariance.

  Returns:
    `(mean, cov)`, shapes `(n_times, n, k)` and `(n_times, n, n)` (`cov` is
    `None` without `compute_cov`).
  """
  evals = jnp.where(eig.positive, eig.evals, 0.)
  clipped = jnp.maximum(evals, 0.)
  mean = scaled_product(eig.evecs, -jnp.expm1(-evals[None] * tau[:, None]),
                        y_eigen)
  if not compute_cov:
    return mean, None
  decay = jnp.exp(-clipped[None] * tau[:, None])
  if k_prior is None:
    cov = scaled_product(eig.evecs, clipped[None] * decay**2, eig.evecs.T)
  else:
    e = scaled_product(eig.evecs, decay, eig.evecs.T)
    cov = e @ k_prior @ e
  return mean, (cov + jnp.swapaxes(cov, -1, -2)) / 2


def finite_time_covariance(b: Array, scales: Array, k_test_test: Array,
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
  cross = scaled_product(b, scales, d)
  b_scaled = b[None] * scales[:, None, :]
  if middle is None:
    b_scaled = b_scaled * jnp.sqrt(evals)[None, None]
    inner = b_scaled @ jnp.swapaxes(b_scaled, -1, -2)
  else:
    inner = b_scaled @ middle @ jnp.swapaxes(b_scaled, -1, -2)
  cov = k_test_test[None] - cross - jnp.swapaxes(cross, -1, -2) + inner
  # Round-off makes the sum slightly asymmetric; a covariance is symmetric.
  return (cov + jnp.swapaxes(cov, -1, -2)) / 2


def infinite_time_covariance(solver: solve.Solver, k_test_flow: Array,
                             k_test_prior: Array, k_test_test: Array,
                             k_prior_train: Optional[Any] = None) -> Array:
  """Covariance of `f_0(x) - A f_0(X)`, `A = Theta_* (Theta + r I)^{-1}`.

  With `W = (Theta + r I)^{-1} Theta_*^T` (one solve with the test columns)
  and `P` the prior, the covariance is `P_** - P_* W - W^T P_*^T + W^T P W`.
  `k_prior_train=None` means `P = Theta + r I` (the prior is the regularized
  flow kernel), where it reduces to `P_** - Theta_* (Theta + r I)^{-1}
  Theta_*^T`, computed as `P_** - V^T V` with `V = L^{-1} Theta_*^T` for
  direct solvers (symmetric and PSD by construction).

  Args:
    solver: a `solve.factorize` solver of the regularized flow kernel.
    k_test_flow: `(M*, M)` test-train flow kernel `Theta_*`.
    k_test_prior: `(M*, M)` test-train prior `P_*`.
    k_test_test: `(M*, M*)` prior `P_**`.
    k_prior_train: `(M, M)` prior `P`, or None (see above).

  Returns:
    `(M*, M*)` covariance.
  """
  host = not isinstance(solver, solve.EighSolver) and solve.all_on_host(
      k_test_flow, k_test_prior, k_test_test)
  if host:  # numpy: nothing to compile.
    k_test_flow, k_test_prior, k_test_test = (
        np.asarray(a) for a in (k_test_flow, k_test_prior, k_test_test))
  if k_prior_train is None:
    if isinstance(solver, solve.CGSolver):
      w = solver.solve(k_test_flow.T)
      inner = k_test_flow @ (np.asarray(w) if host else w)
    else:
      v = solver.half_solve(k_test_flow.T)
      if host:
        v = np.asarray(v)
      inner = v.T @ v
    cov = k_test_test - inner
  else:
    w = solver.solve(k_test_flow.T)
    if host:
      w = np.asarray(w)
    cross = k_test_prior @ w
    if host or not isinstance(k_prior_train, jax.Array):
      p_w = solve.kernel_matmul(solve.host_view(k_prior_train),
                                np.asarray(w)).astype(w.dtype)
    else:
      p_w = k_prior_train @ w
    cov = k_test_test - cross - cross.T + w.T @ p_w
  cov = (cov + cov.T) / 2
  return to_device(cov.astype(k_test_test.dtype)) if host else cov
