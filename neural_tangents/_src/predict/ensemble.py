"""Gaussian outputs of ensembles of infinitely wide networks trained on MSE
(`gradient_descent_mse_ensemble`), from a stax-style `kernel_fn`."""
import functools
import hashlib
import math
import os
from typing import Any, Callable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.predict import solve
from neural_tangents._src.predict import stored
from neural_tangents._src.predict.flow import finite_time_covariance
from neural_tangents._src.predict.flow import flow_times
from neural_tangents._src.predict.flow import infinite_time_covariance
from neural_tangents._src.predict.flow import integrated_relaxation
from neural_tangents._src.predict.flow import scaled_product
from neural_tangents._src.predict.flow import train_set_flow
from neural_tangents._src.predict.kernel_rows import on_host
from neural_tangents._src.predict.kernel_rows import to_device
from neural_tangents._src.predict.layout import Array
from neural_tangents._src.predict.layout import ArrayOrScalar
from neural_tangents._src.predict.layout import check_finite
from neural_tangents._src.predict.layout import check_kernel
from neural_tangents._src.predict.layout import kernel_to_matrix
from neural_tangents._src.predict.layout import matrix_row_shape
from neural_tangents._src.predict.layout import matrix_to_covariance
from neural_tangents._src.predict.layout import matrix_to_outputs
from neural_tangents._src.predict.layout import output_layout
from neural_tangents._src.predict.layout import shape_of_test_outputs
from neural_tangents._src.predict.options import solve_options
from neural_tangents._src.predict.posterior import Gaussian
from neural_tangents._src.predict.posterior import kernels_needed
from neural_tangents._src.predict.posterior import parse_posterior_get
from neural_tangents._src.predict.posterior import Posterior
from neural_tangents._src.predict.posterior import POSTERIORS
from neural_tangents._src.predict.posterior import results_by_get
from neural_tangents._src.predict.train_kernels import TrainKernels
from neural_tangents._src.stax.requirements import is_pairwise_kernel_fn
from neural_tangents._src.utils import precision
from neural_tangents._src.utils.typing import Axes, Get


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
      raise ValueError(
          f'`kernel_fn` did not return the "{name}" kernel for `get={names}`: '
          f'it returned a {type(out).__name__} without it. Pass a '
          f'`kernel_fn(x1, x2, get)` that computes "{name}" (stax networks '
          'compute "nngp" and "ntk").')
    # A stored kernel (`nt.batch(..., store=...)`) is read by row blocks.
    value = stored.as_row_kernel(value, f'kernel_fn(x1, x2, "{name}")')
    kernels[name] = (value if isinstance(value, solve.KernelRows) else
                     jnp.asarray(value))
  return kernels


# Joint kernels (see `_joint_kernel_matrices`) are computed for at most this
# many training and test points together.
JOINT_KERNEL_MAX_POINTS = 512


def _store_per_call(kernel_fn: Callable[..., Any],
                    x_train: Any) -> Callable[..., Any]:
  """`kernel_fn`, each distinct call in its own store where it is an
  `nt.batch(..., store=root)` function.

  One store holds the kernel of one call (its fingerprint refuses any
  other), and the ensemble makes up to three calls per prediction: each goes
  to `root/<train|test>_<train|test>_<digest>`, the digest (SHA-256) of its
  inputs, `get` and keyword arguments. The same call again (a prediction
  repeated, or resumed after a kill) finds its store complete.
  """
  root = getattr(kernel_fn, 'store', None)
  with_store = getattr(kernel_fn, 'with_store', None)
  if root is None or with_store is None:
    return kernel_fn

  def kernel_fn_in_its_store(x1: Any, x2: Any = None, get: Any = None,
                             **kwargs) -> Any:
    leaves = jax.tree_util.tree_leaves((x1, x2, get, kwargs))
    if any(isinstance(leaf, jax.core.Tracer) for leaf in leaves):
      return kernel_fn(x1, x2, get, **kwargs)  # No store under tracing.
    digest = hashlib.sha256(repr(jax.tree_util.tree_structure(
        (x1, x2, get, kwargs))).encode())
    for leaf in leaves:
      if isinstance(leaf, (jax.Array, np.ndarray, np.generic)):
        leaf = np.asarray(leaf)
        digest.update(f'{leaf.shape}{leaf.dtype}'.encode())
        digest.update(np.ascontiguousarray(leaf).tobytes())
      else:
        digest.update(repr(leaf).encode())
    side = lambda x: 'train' if x is x_train else 'test'
    name = f'{side(x1)}_{side(x1 if x2 is None else x2)}_'
    path = os.path.join(root, name + digest.hexdigest()[:16])
    return with_store(path)(x1, x2, get, **kwargs)

  return kernel_fn_in_its_store


def _joint_kernel_matrices(
    kernel_fn: Callable[..., Any], x_train: Any, x_test: Any,
    names: Sequence[str], kwargs: dict[str, Any]
) -> Optional[tuple[dict[str, Array], dict[str, Array], dict[str, Array]]]:
  """Train-train, test-train and test-test kernels from one `kernel_fn` call.

  A stax `kernel_fn` is pairwise (`is_pairwise_kernel_fn`), so the kernel of
  `x = concatenate([x_train, x_test])` with itself holds all three blocks:

    kernel_fn(x, None) = [[K(X, X),  K(X, x*)],
                          [K(x*, X), K(x*, x*)]].

  For few points a first prediction then traces and compiles one kernel
  program instead of three (compilation is most of a first call); the
  entries are those of the same formulas. Used only for plain arrays of one
  shape and dtype, without keyword arguments, and at most
  `JOINT_KERNEL_MAX_POINTS` points in all.

  Returns:
    `(train_train, test_train, test_test)` dicts by name, or `None` where the
    joint call does not apply.
  """
  if kwargs or not is_pairwise_kernel_fn(kernel_fn):
    return None
  for x in (x_train, x_test):
    if (not isinstance(x, (jax.Array, np.ndarray)) or np.ma.isMaskedArray(x)
        or np.ndim(x) < 1):
      return None
  if (x_train.shape[1:] != x_test.shape[1:] or x_train.dtype != x_test.dtype
      or getattr(x_train, 'weak_type', False) !=
      getattr(x_test, 'weak_type', False)):
    return None
  n = x_train.shape[0]
  if n + x_test.shape[0] > JOINT_KERNEL_MAX_POINTS:
    return None
  # Concrete host inputs are concatenated, and the kernels split, by numpy
  # (copies of at most `JOINT_KERNEL_MAX_POINTS^2` entries): the only program
  # compiled is then the kernel's own (`kernel_fn`'s, cached per signature).
  host = all(on_host(x) and not getattr(x, 'weak_type', False)
             for x in (x_train, x_test))
  if host:
    both = np.concatenate([np.asarray(x_train), np.asarray(x_test)])
  else:
    both = jnp.concatenate([jnp.asarray(x_train), jnp.asarray(x_test)])
  joint = _kernel_fn_matrices(kernel_fn, both, None, names, {})
  if not (host and all(isinstance(k, jax.Array) and on_host(k)
                       for k in joint.values())):
    return _split_blocks(joint, n)
  joint = {name: np.asarray(k) for name, k in joint.items()}
  return ({name: to_device(k[:n, :n]) for name, k in joint.items()},
          {name: to_device(k[n:, :n]) for name, k in joint.items()},
          {name: to_device(k[n:, n:]) for name, k in joint.items()})


@functools.partial(jax.jit, static_argnums=1)
def _split_blocks(joint: dict[str, Array], n: int
                  ) -> tuple[dict[str, Array], dict[str, Array],
                             dict[str, Array]]:
  """The `[:n, :n]`, `[n:, :n]` and `[n:, n:]` blocks, in one program."""
  return ({k: v[:n, :n] for k, v in joint.items()},
          {k: v[n:, :n] for k, v in joint.items()},
          {k: v[n:, n:] for k, v in joint.items()})


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

  A kwarg given only to `gradient_descent_mse_ensemble` is passed unchanged
  (a stax `params=(W, b)` is not a pair of per-side values). A pair-valued
  kwarg `(value_for_x1, value_for_x2)` given to `predict_fn`, such as
  `Aggregate`'s `pattern`, becomes `(value for x_test, value for x_train)`:
  the first entries of the test-test and of the train-train pairs, which
  describe `x1` in the `x2=None` calls (their second entry may be `None` or a
  repeat). Any other kwarg is shared by all calls: given to both, the values
  must be equal.

  Raises:
    ValueError: if a kwarg that is not a pair has different train and test
      values.
  """
  test_all = _test_test_kwargs(train_kwargs, test_kwargs)
  out = {}
  for key, test_value in test_all.items():
    if key not in test_kwargs:
      out[key] = test_value
      continue
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


@precision.library_precision
def gradient_descent_mse_ensemble(
    kernel_fn: Callable[..., Any],
    x_train: Array,
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

  Each train-train kernel is computed once, factored once, and cached
  across calls: finite times `t` share one eigendecomposition; `t=None`
  needs only a solve, by default a Cholesky factorization (see `solver`).

  Args:
    kernel_fn: stax-style `kernel_fn(x1, x2, get, **kwargs)`.
    x_train: training inputs.
    y_train: targets, `(N, O_1, ..., O_d)`.
    learning_rate: learning rate of the steps counted by `t`.
    diag_reg: diagonal regularizer of the inverted train-train kernel,
      relative to its mean diagonal entry.
    diag_reg_absolute_scale: whether `diag_reg` is absolute instead.
    trace_axes: output axes traced out of the kernels.
    solver: the solve at `t=None`: 'cholesky' (default; a kernel singular to
      working precision falls back to the eigendecomposition with a
      warning), 'eigh', or 'cg' (conjugate gradients). Finite times always
      use the eigendecomposition. See `docs/predict.md`.
    tol: 'cg': relative residual at which to stop.
    maxiter: 'cg': maximum number of iterations (`None`: 10 times the rows).
    preconditioner_rank: 'cg': rank of the pivoted Cholesky preconditioner
      (0: none).
    progress: 'cg': whether to show a progress bar of the iterations and the
      residual (needs `tqdm`).
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
    predicts on the training inputs: at infinite time exactly `y_train`
    with zero covariance (without computing the NNGP for 'ntk'), at finite
    times as the published release, from the eigensystem `(l, V)` of the
    regularized flow kernel: mean `V diag(1 - exp(-l s / n)) V^T y`,
    covariance `V diag(l exp(-2 l s / n)) V^T` ('nngp', 'ntkgp') or
    `E K E` with `E = V diag(exp(-l s / n)) V^T` and the unregularized NNGP
    `K` ('ntk'); an empty `x_test` gives empty outputs;
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
    >>> from jax import random
    >>> import jax.numpy as jnp
    >>> import neural_tangents as nt
    >>> from neural_tangents import stax
    >>> _, _, kernel_fn = stax.serial(stax.Dense(512), stax.Relu(),
    ...                               stax.Dense(1))
    >>> x_train = random.normal(random.PRNGKey(1), (3, 4))
    >>> x_test = random.normal(random.PRNGKey(2), (2, 4))
    >>> y_train = jnp.ones((3, 1))
    >>> predict_fn = nt.predict.gradient_descent_mse_ensemble(
    ...     kernel_fn, x_train, y_train, diag_reg=1e-4)
    >>> out = predict_fn(t=jnp.array([1., 100.]), x_test=x_test,
    ...                  get=('ntk', 'ntkgp'), compute_cov=True)
    >>> out.ntkgp.mean.shape, out.ntkgp.covariance.shape  # (t, N_test, ...)
    ((2, 2, 1), (2, 2, 2))

  [3] He, Lakshminarayanan, Teh. "Bayesian Deep Ensembles via the Neural
      Tangent Kernel." NeurIPS 2020.
  """
  y_train = jnp.asarray(y_train)
  layout = output_layout(y_train, trace_axes)
  options = solve_options(solver, diag_reg, diag_reg_absolute_scale, tol,
                          maxiter, preconditioner_rank, progress)
  kernel_fn = _store_per_call(kernel_fn, x_train)
  train = TrainKernels(
      y_train, layout, options, trace_axes=trace_axes,
      name='kernel_fn(x_train, None, "{}")',
      load=lambda kernels: _checked_train_matrices(train, _kernel_fn_matrices(
          kernel_fn, x_train, None, kernels, kernel_fn_train_train_kwargs)))

  @precision.library_precision
  def predict_fn(t: Optional[ArrayOrScalar] = None,
                 x_test: Optional[Array] = None,
                 get: Get = None,
                 compute_cov: bool = False,
                 **kernel_fn_test_test_kwargs) -> Any:
    with train.one_call():
      return _predict(train, learning_rate, kernel_fn, x_train, t, x_test,
                      get, compute_cov, kernel_fn_train_train_kwargs,
                      kernel_fn_test_test_kwargs)

  return predict_fn


def _predict(train: TrainKernels, learning_rate: float,
             kernel_fn: Callable[..., Any],
             x_train: Any, t: Optional[ArrayOrScalar], x_test: Any, get: Get,
             compute_cov: bool, train_kwargs: dict[str, Any],
             test_kwargs: dict[str, Any]) -> Any:
  """`predict_fn` of `gradient_descent_mse_ensemble` (see there)."""
  names, single = parse_posterior_get(get)
  on_train = x_test is None
  # On the training set at infinite time the outputs interpolate: only the
  # flow kernels are computed (to check them), no prior.
  needed = kernels_needed(names, compute_cov and not (on_train and
                                                      t is None))
  priors = tuple(k for k in needed if compute_cov and any(
      POSTERIORS[name].prior == k for name in names))
  if on_train:
    k_train = train.matrices(needed)
    test = _Test(k_train, {k: k_train[k] for k in priors}, train.y_train.shape,
                 matrix_row_shape(train.y_train.shape, train.layout))
  else:
    test = _test_kernels(train, kernel_fn, x_train, x_test, needed, priors,
                         train_kwargs, test_kwargs)
  dtype = jnp.result_type(*(k.dtype for k in test.train.values()), float)
  tau, t_shape = flow_times(t, learning_rate / train.y_train.size, dtype)
  out = {}
  for name in names:
    posterior = POSTERIORS[name]
    if on_train and t is None:
      out[name] = _interpolation(train, t_shape, dtype, compute_cov)
    elif t is None and train.options.solver != 'eigh':
      out[name] = _infinite_time(train, posterior, test, compute_cov)
    elif on_train:  # The published convention (`flow.train_set_flow`).
      out[name] = _train_set(train, posterior, tau, t_shape, compute_cov)
    else:
      out[name] = _finite_time(train, posterior, test, tau, t_shape,
                               compute_cov)
  return results_by_get(out, names, single,
                        'Gaussians' if compute_cov else 'Means')


class _Test(NamedTuple):
  """The test kernels of one `predict_fn` call, as matrices by name.

  Attributes:
    train: test-train kernels (the train-train ones on the training set).
    test: test-test kernels of the priors.
    shape: the shape of the test outputs.
    row_shape: the test outputs' shape in the covariance's rows.
  """
  train: dict[str, Array]
  test: dict[str, Array]
  shape: tuple[int, ...]
  row_shape: tuple[int, ...]


def _checked_train_matrices(train: TrainKernels,
                            kernels: dict[str, Array]) -> dict[str, Array]:
  """Train-train kernels checked against `y_train`, finite, as matrices."""
  out = {}
  for kernel, k in kernels.items():
    check_kernel(k, train.name(kernel), train.y_train, train.layout,
                 train.trace_axes, square=True)
    if isinstance(k, solve.KernelRows):
      if train.options.solver == 'cg':  # Stored: read by row blocks.
        out[kernel] = k
        continue
      k = jnp.asarray(stored.whole(k))  # Other solvers factor it whole.
    check_finite(k, train.name(kernel))
    k = k.astype(jnp.result_type(k.dtype, float))
    out[kernel] = kernel_to_matrix(k, len(train.layout.untraced))
  return out


def _test_kernels(train: TrainKernels, kernel_fn: Callable[..., Any],
                  x_train: Any, x_test: Any, needed: tuple[str, ...],
                  priors: tuple[str, ...], train_kwargs: dict[str, Any],
                  test_kwargs: dict[str, Any]) -> _Test:
  """The test-train kernels of `needed` and test-test ones of `priors` (with
  the train-train ones not kept yet, in one joint call where it applies)."""
  joint = None
  if train.missing(needed):
    joint = _joint_kernel_matrices(kernel_fn, x_train, x_test, needed,
                                   {**train_kwargs, **test_kwargs})
  k_train = train.matrices(needed, joint and (
      lambda kernels: _checked_train_matrices(
          train, {k: joint[0][k] for k in kernels})))
  dtype = jnp.result_type(*(k.dtype for k in k_train.values()), float)
  n_pairs = len(train.layout.untraced)
  kernels = joint[1] if joint else _kernel_fn_matrices(
      kernel_fn, x_test, x_train, needed,
      _test_train_kwargs(train_kwargs, test_kwargs))
  k_test_train = {}
  for kernel, k in kernels.items():
    check_kernel(k, f'kernel_fn(x_test, x_train, "{kernel}")', train.y_train,
                 train.layout, train.trace_axes, square=False)
    test_shape = shape_of_test_outputs(k, train.y_train, train.layout)
    k_test_train[kernel] = (k if isinstance(k, solve.KernelRows) else
                            kernel_to_matrix(k.astype(dtype), n_pairs))
  k_test_test = {}
  if priors:
    kernels = {k: joint[2][k] for k in priors} if joint else (
        _kernel_fn_matrices(kernel_fn, x_test, None, priors,
                            _test_test_kwargs(train_kwargs, test_kwargs)))
    k_test_test = {  # Covariances need it whole (a store read in memory).
        kernel: kernel_to_matrix(stored.whole(k).astype(dtype), n_pairs,
                                 name=f'kernel_fn(x_test, None, "{kernel}")')
        for kernel, k in kernels.items()}
  return _Test(k_test_train, k_test_test, test_shape,
               matrix_row_shape(test_shape, train.layout))


def _interpolation(train: TrainKernels, t_shape: tuple[int, ...], dtype: Any,
                   compute_cov: bool) -> Any:
  """Train-set predictions at infinite time: `y_train`, zero covariance."""
  y_train = train.y_train
  mean = jnp.broadcast_to(y_train.astype(dtype), t_shape + y_train.shape)
  if not compute_cov:
    return mean
  row_shape = matrix_row_shape(y_train.shape, train.layout)
  rows = math.prod(row_shape)
  cov = matrix_to_covariance(jnp.zeros(t_shape + (rows, rows), dtype),
                             row_shape)
  return Gaussian(mean, cov)


def _infinite_time(train: TrainKernels, posterior: Posterior, test: _Test,
                   compute_cov: bool) -> Any:
  """Test predictions at `t=None`, by one solve with the flow kernel."""
  factor, alpha = train.weights(posterior.flow)
  k_test = test.train[posterior.flow]
  if isinstance(k_test, solve.KernelRows):  # Stored: by row blocks.
    product = jnp.asarray(solve.kernel_matmul(k_test, np.asarray(alpha)),
                          jnp.result_type(k_test.dtype, float))
  elif solve.all_on_host(k_test, alpha):  # float64 arithmetic, no compile.
    product = to_device(solve.kernel_matmul(
        solve.host_view(k_test), np.asarray(alpha)).astype(k_test.dtype))
  else:
    product = k_test @ jnp.asarray(alpha, k_test.dtype)
  mean = matrix_to_outputs(product, test.shape, train.layout)
  if not compute_cov:
    return mean
  # The covariance needs the test-train kernels whole (stored ones are read).
  cov = infinite_time_covariance(
      factor, jnp.asarray(stored.whole(k_test)),
      jnp.asarray(stored.whole(test.train[posterior.prior])),
      test.test[posterior.prior],
      None if posterior.prior == posterior.flow else
      train.matrix(posterior.prior))
  return Gaussian(mean, matrix_to_covariance(cov, test.row_shape))


def _train_set(train: TrainKernels, posterior: Posterior, tau: Array,
               t_shape: tuple[int, ...], compute_cov: bool) -> Any:
  """Predictions on the training set at finite times, as published."""
  eig, y_eigen = train.eigen(posterior.flow)
  mean, cov = train_set_flow(
      eig, tau, y_eigen,
      None if posterior.prior == posterior.flow or not compute_cov
      else train.matrix(posterior.prior), compute_cov)
  y_shape = train.y_train.shape
  mean = matrix_to_outputs(mean.reshape(t_shape + mean.shape[1:]), y_shape,
                           train.layout)
  if cov is None:
    return mean
  return Gaussian(mean, matrix_to_covariance(
      cov.reshape(t_shape + cov.shape[1:]),
      matrix_row_shape(y_shape, train.layout)))


def _finite_time(train: TrainKernels, posterior: Posterior, test: _Test,
                 tau: Array, t_shape: tuple[int, ...],
                 compute_cov: bool) -> Any:
  """Test predictions at finite times, in the flow kernel's eigenbasis."""
  eig, y_eigen = train.eigen(posterior.flow)
  scales = integrated_relaxation(eig, tau)
  # Finite times need the test-train kernel whole (a store read in memory).
  b = jnp.asarray(stored.whole(test.train[posterior.flow])) @ eig.evecs
  mean = scaled_product(b, scales, y_eigen)
  mean = matrix_to_outputs(mean.reshape(t_shape + mean.shape[1:]),
                           test.shape, train.layout)
  if not compute_cov:
    return mean
  middle = (None if posterior.prior == posterior.flow else
            train.prior_in_eigenbasis(posterior.flow, posterior.prior))
  d = eig.evecs.T @ jnp.asarray(stored.whole(test.train[posterior.prior])).T
  cov = finite_time_covariance(b, scales, test.test[posterior.prior], d,
                               middle, eig.evals)
  cov = matrix_to_covariance(cov.reshape(t_shape + cov.shape[1:]),
                             test.row_shape)
  return Gaussian(mean, cov)
