"""The train-train kernels of one `predict` entry point: `TrainKernels`.

A prediction function returned by `gp_inference`, `gradient_descent_mse` or
`gradient_descent_mse_ensemble` solves with the same train-train kernels on
every call. `TrainKernels` owns them for the life of that function: the
kernels ('nngp', 'ntk') as `(n, n)` matrices (loaded on first use, by a
`load` function of the entry point that checks them), the targets `y_train`
and their `OutputLayout`, the checked `SolveOptions`, and the cache of work
per kernel:

* `matrices(kernels)`: the unregularized matrices;
* `solver(kernel, solver)`: the factorization of `K + r I` (`solve.py`);
* `weights(kernel)`: that solver and `(K + r I)^{-1} y` (infinite time);
* `eigen(kernel)`: the eigendecomposition `K + r I = V diag(l) V^T` and
  `V^T y` (finite times);
* `prior_in_eigenbasis(flow, prior)`: `V^T P V`, `V` the eigenvectors of the
  flow kernel and `P` the unregularized prior kernel.

Values that are traced (under `jit`) are kept only for the rest of one
prediction call (`one_call`), never across calls: they would leak out of their
trace. `solve_info` maps each kernel to the `SolveInfo` of
its last solve, `last_info` is the latest of them.

Example:
  >>> import jax.numpy as jnp
  >>> from neural_tangents._src.predict.layout import output_layout
  >>> from neural_tangents._src.predict.options import solve_options
  >>> from neural_tangents._src.predict.train_kernels import TrainKernels
  >>> y = jnp.array([[1.], [2.]])
  >>> k = jnp.array([[2., 1.], [1., 2.]])
  >>> train = TrainKernels(y, output_layout(y, (-1,)), solve_options(),
  ...                      lambda names: {name: k for name in names})
  >>> factor, weights = train.weights('nngp')
  >>> [round(float(w), 4) for w in weights.ravel()]
  [0.0, 1.0]
  >>> train.solve_info['nngp'].solver
  'cholesky'
"""
import contextlib
from typing import Any, Callable, Iterator, Optional, Sequence

import jax

from neural_tangents._src.predict import solve
from neural_tangents._src.predict.layout import Array
from neural_tangents._src.predict.layout import check_finite
from neural_tangents._src.predict.layout import OutputLayout
from neural_tangents._src.predict.layout import outputs_to_matrix
from neural_tangents._src.predict.options import SolveOptions
from neural_tangents._src.utils.typing import Axes


Load = Callable[[tuple[str, ...]], dict[str, Any]]


def _is_concrete(tree: Any) -> bool:
  return not any(isinstance(leaf, jax.core.Tracer)
                 for leaf in jax.tree_util.tree_leaves(tree))


class TrainKernels:
  """The train-train kernels, targets and cached factorizations of one
  prediction function.

  Args:
    y_train: targets, `(N, O_1, ..., O_d)`.
    layout: which output axes of `y_train` the kernels trace.
    options: the checked `SolveOptions` of the entry point.
    load: `load(kernels)` returns the checked `(n, n)` matrices (or host
      kernels, `KernelRows`) of the named kernels, e.g. `{'ntk': k}`.
    trace_axes: the entry point's `trace_axes` (for the checks of kernels).
    name: the kernels' argument name in messages, `name.format(kernel)`
      (e.g. `'kernel_fn(x_train, None, "{}")'`).
    checked_finite: whether `load` already checks that the kernels are
      finite; if not, a kernel is checked before its first factorization.
  """

  def __init__(self, y_train: Array, layout: OutputLayout,
               options: SolveOptions, load: Load, trace_axes: Axes = (-1,),
               name: str = 'k_train_train', checked_finite: bool = True):
    self.y_train = y_train
    self.layout = layout
    self.trace_axes = trace_axes
    self.options = options
    self._load = load
    self._name = name
    self._checked_finite = checked_finite
    self._cache: dict[Any, Any] = {}
    self._call_cache: Optional[dict[Any, Any]] = None
    self.solve_info: dict[str, solve.SolveInfo] = {}
    self.last_info: Optional[solve.SolveInfo] = None

  def name(self, kernel: str) -> str:
    """The argument name of `kernel` in messages."""
    return self._name.format(kernel)

  @contextlib.contextmanager
  def one_call(self) -> Iterator[None]:
    """The scope of one prediction call: values computed in it are reused
    until it ends, and kept after it only if concrete."""
    outer = self._call_cache
    self._call_cache = {} if outer is None else outer
    try:
      yield
    finally:
      self._call_cache = outer

  def _keep(self, key: Any, value: Any, concrete: bool) -> None:
    if concrete:
      self._cache[key] = value
    elif self._call_cache is not None:
      self._call_cache[key] = value

  def _kept(self, key: Any) -> bool:
    return key in self._cache or (self._call_cache is not None and
                                  key in self._call_cache)

  def _get(self, key: Any) -> Any:
    return self._cache[key] if key in self._cache else self._call_cache[key]

  def _cached(self, key: Any, compute: Callable[[], Any],
              *depends_on: Any) -> Any:
    """`compute()`, kept if it and what it `depends_on` are concrete."""
    if self._kept(key):
      return self._get(key)
    value = compute()
    self._keep(key, value, _is_concrete((value, depends_on)) and
               self.options.concrete)
    return value

  def missing(self, kernels: Sequence[str]) -> tuple[str, ...]:
    """The `kernels` whose matrices are not kept yet."""
    return tuple(k for k in kernels if not self._kept(('matrix', k)))

  def matrices(self, kernels: Sequence[str],
               load: Optional[Load] = None) -> dict[str, Any]:
    """The train-train matrices of `kernels`, the missing ones from one call
    of `load` (default: the constructor's)."""
    missing = self.missing(kernels)
    fresh = (load or self._load)(missing) if missing else {}
    for kernel, k in fresh.items():
      self._keep(('matrix', kernel), k, _is_concrete(k))
    return {k: fresh[k] if k in fresh else self._get(('matrix', k))
            for k in kernels}

  def matrix(self, kernel: str) -> Any:
    """The train-train matrix of `kernel`."""
    return self.matrices((kernel,))[kernel]

  def targets(self, dtype: Any) -> Array:
    """`y_train` as a `(rows, traced)` matrix of `dtype`."""
    return outputs_to_matrix(self.y_train.astype(dtype), self.layout)

  def record(self, kernel: str, factor: solve.Solver) -> None:
    """Keeps the `SolveInfo` of `factor`'s last solve."""
    self.solve_info[kernel] = self.last_info = factor.info

  def solver(self, kernel: str, solver: Optional[str] = None
             ) -> solve.Solver:
    """The factorization of `K + r I` by `solver` (default: the options')."""
    solver = solver or self.options.solver
    k = self.matrix(kernel)

    def compute():
      if not (self._checked_finite or isinstance(k, solve.KernelRows)):
        check_finite(solve.host_view(k), self.name(kernel))
      factor = solve.factorize_with(k, self.options.replace(solver=solver),
                                    self.name(kernel))
      self.record(kernel, factor)
      return factor
    return self._cached(('solver', kernel, solver), compute, k)

  def weights(self, kernel: str) -> tuple[solve.Solver, Array]:
    """The solver of `K + r I` and `(K + r I)^{-1} y`, computed once."""
    def compute():
      factor = self.solver(kernel)
      dtype = solve.compute_dtype(self.matrix(kernel).dtype)
      with jax.ensure_compile_time_eval():  # Cached even when under `jit`.
        alpha = factor.solve(self.targets(dtype))
      self.record(kernel, factor)
      return factor, alpha
    return self._cached(('weights', kernel), compute, self.matrix(kernel))

  def eigen(self, kernel: str) -> tuple[solve.Eigen, Array]:
    """The eigendecomposition of `K + r I` and `V^T y`, computed once."""
    def compute():
      eig = self.solver(kernel, 'eigh').eig
      dtype = solve.compute_dtype(self.matrix(kernel).dtype)
      return eig, eig.evecs.T @ self.targets(dtype)
    return self._cached(('eigen', kernel), compute, self.matrix(kernel))

  def prior_in_eigenbasis(self, flow: str, prior: str) -> Array:
    """`V^T P V`, `V` the eigenvectors of the flow kernel, `P` the prior."""
    def compute():
      evecs = self.eigen(flow)[0].evecs
      return evecs.T @ self.matrix(prior) @ evecs
    return self._cached(('prior', flow, prior), compute)
