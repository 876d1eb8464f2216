"""Low-rank train kernels `K = F F^T` (`LowRankKernel`) and predictions that
solve them in feature space (`low_rank_gp_inference`,
`low_rank_gradient_descent_mse`).

With `F` the `(n, D)` factor of the train kernel (e.g. the NTK features of
`nt.experimental.features`), `G = F^T F = V diag(s^2) V^T` and `r` the
regularizer, every prediction of the published MSE dynamics and GP posterior
needs only `G` and `F^T y` (push-through identity `F^T (F F^T + r)^{-1} =
(F^T F + r)^{-1} F^T`):

  test mean at time t = F_* V diag(h(s^2 + r) / (s^2 + r)) V^T F^T y,
  GP covariance       = K_** - F_* V diag(s^2 / (s^2 + r)) V^T F_*^T,

with `h(l) = 1 - exp(-l tau)` (`tau = learning_rate * t / y_train.size`) and
`h = 1` at `t=None`. `G`, `F^T y` and `F^T 1` are accumulated in one pass
over row blocks of `F` (each block's product in the factor's dtype, by BLAS,
the blocks summed in float64, so that the error of `G` stays at the
float32 round-off of one block, `eps sqrt(block_rows)`, not of all `n` rows),
so `F` never has to be held whole: `O(D^2)` memory and `O(n D^2)` time
instead of the `O(n^2)` memory and `O(n^3)` time of the exact kernel.
"""
import functools
import math
from typing import Any, Callable, Iterator, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg

from neural_tangents._src.predict import solve
from neural_tangents._src.predict.layout import Array
from neural_tangents._src.predict.layout import ArrayOrScalar
from neural_tangents._src.predict.layout import broadcast_initial_outputs
from neural_tangents._src.predict.layout import check_initial_outputs
from neural_tangents._src.predict.layout import matrix_to_outputs
from neural_tangents._src.predict.layout import output_layout
from neural_tangents._src.predict.layout import OutputLayout
from neural_tangents._src.predict.layout import outputs_to_matrix
from neural_tangents._src.predict.options import check_diag_reg
from neural_tangents._src.predict.posterior import Gaussian
from neural_tangents._src.predict.posterior import parse_posterior_get
from neural_tangents._src.predict.posterior import POSTERIORS
from neural_tangents._src.predict.posterior import results_by_get
from neural_tangents._src.utils.typing import Axes, Get

_FEATURE_KERNELS = ('nngp', 'ntk')


class LowRankKernel:
  """A kernel `K = F F^T` given by its factor `F`, `(n, D)`, never `n x n`.

  Pass it as `k_train_train` (and the factor of the test points, with the
  same feature map, as `k_test_train`) to `nt.predict.gp_inference` or
  `nt.predict.gradient_descent_mse` to solve in feature space: the `D x D`
  Gram matrix `F^T F` replaces the `n x n` kernel. `F` is an array, or a
  function of row blocks, `rows(start, stop) -> F[start:stop]`, called block
  by block (`F` is then never held whole). See `docs/predict.md`.

  Args:
    factor: `F`, an `(n, D)` array (numpy or JAX), or a callable
      `rows(start, stop)` returning rows `start:stop` of `F`.
    n: number of rows of `F` (the number of points); needed for a callable,
      checked against an array.
    block_rows: rows per block when streaming over `F`.

  Attributes:
    shape: `(n, n)`, the shape of the kernel it stands for.

  Example:
    >>> import numpy as np
    >>> import neural_tangents as nt
    >>> f = np.random.RandomState(0).randn(50, 8)
    >>> k = nt.predict.LowRankKernel(lambda a, b: f[a:b], n=50, block_rows=16)
    >>> k.shape, bool(np.allclose(k.dense(), f @ f.T))
    ((50, 50), True)
  """

  def __init__(self, factor: Union[Array, Callable[[int, int], Any]],
               n: Optional[int] = None, *, block_rows: int = 4096):
    if (not isinstance(block_rows, (int, np.integer)) or
        isinstance(block_rows, bool) or block_rows < 1):
      raise ValueError(f'`block_rows` must be an int >= 1; got {block_rows!r}. '
                       'Pass the rows per block, e.g. block_rows=4096.')
    self.block_rows = int(block_rows)
    if callable(factor):
      if (not isinstance(n, (int, np.integer)) or isinstance(n, bool) or
          n < 1):
        raise ValueError(
            f'`n` must be a positive int when `factor` is a callable; got '
            f'n={n!r}. Pass the number of rows of the factor (the number of '
            'points), e.g. `LowRankKernel(rows, n=len(x))`.')
      self._rows_fn, self._array, self.n = factor, None, int(n)
      return
    if not hasattr(factor, 'shape'):
      factor = np.asarray(factor)
    if len(factor.shape) != 2 or factor.shape[0] < 1 or factor.shape[1] < 1:
      raise ValueError(
          f'`factor` must be an (n, D) array with n, D >= 1 (the kernel is '
          f'factor @ factor.T); got shape {tuple(factor.shape)}. Flatten '
          'spatial features first (e.g. `FlattenFeatures` or '
          '`GlobalAvgPoolFeatures`), or pass a callable `rows(start, stop)`.')
    if n is not None and n != factor.shape[0]:
      raise ValueError(f'`n`={n} but `factor` has {factor.shape[0]} rows. '
                       'Leave `n` out for an array factor.')
    _check_real(np.dtype(factor.dtype), 'factor')
    self._rows_fn, self._array, self.n = None, factor, int(factor.shape[0])

  @classmethod
  def from_features(cls, feature_fn: Callable[..., Any], params: Any,
                    x: Union[Array, Callable[[int, int], Any]],
                    n: Optional[int] = None, *, batch_size: int = 4096,
                    kernel: str = 'ntk', dtype: Any = np.float32
                    ) -> 'LowRankKernel':
    """The kernel of `feature_fn`'s features, computed by batches of rows.

    Args:
      feature_fn: `feature_fn(x, params)` returning `Features` (a
        `nt.experimental.features` layer), each row's features independent
        of the other rows (not the 'EXACT' methods).
      params: its params (from `init_fn`); the same for train and test.
      x: inputs, an array (numpy, JAX or `np.memmap`), or a callable
        `x(start, stop)` returning inputs `start:stop` (then pass `n`).
      n: number of inputs, needed when `x` is a callable.
      batch_size: inputs per `feature_fn` call (the last batch is padded, so
        `feature_fn` compiles once).
      kernel: 'ntk' (`ntk_feat`) or 'nngp' (`nngp_feat`).
      dtype: dtype of the features (float32 by default).

    Returns:
      A `LowRankKernel` whose factor rows are computed batch by batch, under
      `jax.jit`, each time the factor is streamed.

    Raises:
      ValueError: if the features' dimension depends on the batch size
        (traced for 2 and 3 inputs): the 'EXACT' methods factor each batch in
        its own basis, and rows of different batches are not one factor.
    """
    if kernel not in _FEATURE_KERNELS:
      raise ValueError(f'`kernel` must be one of {_FEATURE_KERNELS}; got '
                       f'{kernel!r}. Pass "ntk" for `ntk_feat`, "nngp" for '
                       '`nngp_feat`.')
    if callable(x):
      inputs = x
    else:
      if n is not None and n != x.shape[0]:
        raise ValueError(f'`n`={n} but `x` has {x.shape[0]} rows. Leave `n` '
                         'out for an array `x`.')
      n, inputs = x.shape[0], lambda a, b: x[a:b]

    @jax.jit
    def features(xb: Array, p: Any) -> Array:
      f = feature_fn(xb, p)
      feat = getattr(f, f'{kernel}_feat')
      feat = jnp.moveaxis(feat, (f.batch_axis, f.channel_axis), (0, -1))
      return feat.astype(dtype)

    def rows(start: int, stop: int) -> np.ndarray:
      xb = np.asarray(inputs(start, stop))
      if stop - start < batch_size:  # One shape: one compilation.
        pad = [(0, batch_size - (stop - start))] + [(0, 0)] * (xb.ndim - 1)
        xb = np.pad(xb, pad, mode='edge')
      feat = features(xb, params)
      if feat.ndim != 2:
        raise ValueError(
            f'`feature_fn` returned {kernel}_feat of shape {feat.shape}; a '
            'LowRankKernel needs one feature vector per input, (N, D). End '
            'the feature network with `FlattenFeatures()` or '
            '`GlobalAvgPoolFeatures()`.')
      return np.asarray(feat)[:stop - start]

    low_rank = cls(rows, n, block_rows=batch_size)
    _check_row_wise(features, params, np.asarray(inputs(0, 1)), kernel)
    return low_rank

  @property
  def shape(self) -> tuple[int, int]:
    return (self.n, self.n)

  @property
  def is_streamed(self) -> bool:
    """Whether the factor is given by row blocks (not held whole)."""
    return self._array is None

  def rows(self, start: int, stop: int) -> np.ndarray:
    """Rows `start:stop` of `F`, `(stop - start, D)`, as numpy."""
    if self._array is not None:
      block = np.asarray(self._array[start:stop])
    else:
      block = np.asarray(self._rows_fn(start, stop))
      if block.ndim != 2 or block.shape[0] != stop - start:
        raise ValueError(
            f'`factor({start}, {stop})` of a LowRankKernel with n={self.n} '
            f'must return rows {start}:{stop} of the factor, of shape '
            f'({stop - start}, D); got shape {block.shape}. Check `n` and '
            'that the callable slices its rows.')
    _check_real(block.dtype, 'factor')
    if not np.issubdtype(block.dtype, np.floating):
      block = block.astype(np.float64)
    return block

  def blocks(self) -> Iterator[tuple[int, int, np.ndarray]]:
    """Yields `(start, stop, F[start:stop])` over all rows, as numpy."""
    for start in range(0, self.n, self.block_rows):
      stop = min(start + self.block_rows, self.n)
      yield start, stop, self.rows(start, stop)

  def dense(self) -> np.ndarray:
    """`F F^T`, `(n, n)` float64: for small `n` (tests, exact comparisons)."""
    f = np.concatenate([b.astype(np.float64) for _, _, b in self.blocks()])
    return f @ f.T

  def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
    raise TypeError(
        'A LowRankKernel (K = F F^T) is not converted to an n x n array. It '
        'can be used only where `k_train_train` is a LowRankKernel too (in '
        '`gp_inference` and `gradient_descent_mse`); pass exact kernels '
        'everywhere, or LowRankKernels for the train and test kernels alike '
        '(or `k.dense()` to build the n x n kernel of a small one).')


def _check_real(dtype: np.dtype, arg: str) -> None:
  """Raises a `TypeError` for a complex (or non-numeric) factor dtype."""
  if np.issubdtype(dtype, np.complexfloating) or not (
      np.issubdtype(dtype, np.number) or dtype == np.bool_):
    raise TypeError(
        f'`{arg}` of a LowRankKernel must be real; got dtype {dtype}. The '
        'kernel is F F^T over real features: for complex features z pass '
        '`np.concatenate([z.real, z.imag], axis=1)`, whose F F^T is the '
        'real part of z conj(z)^T.')


def _check_row_wise(features: Callable[[Any, Any], Array], params: Any,
                    row: np.ndarray, kernel: str) -> None:
  """Raises if `features`' dimension depends on the batch size.

  Features that factor each batch's kernel matrix (the 'EXACT' methods) have
  as many channels as rows, each batch in its own basis: rows of different
  batches do not make one factor `F`. Traced only (`jax.eval_shape`).
  """
  dims = []
  for batch in (2, 3):
    spec = jax.ShapeDtypeStruct((batch,) + row.shape[1:], row.dtype)
    try:
      dims.append(jax.eval_shape(features, spec, params).shape[-1])
    except Exception:  # pylint: disable=broad-except
      return  # The first real call raises what it raises.
  if dims[0] != dims[1]:
    raise ValueError(
        f'`feature_fn` gives {kernel}_feat of dimension {dims[0]} for 2 '
        f'inputs and {dims[1]} for 3: its features depend on the whole '
        "batch (the 'EXACT' methods factor each batch's kernel matrix in its "
        'own basis), so rows of different batches do not make one factor '
        '`F`. Use row-wise methods (e.g. `relu_method="RANDFEAT"` or '
        '"POLYSKETCH" in `from_stax`), or the exact kernel (`stax`) for a '
        'small dataset.')


class _NormalEquations:
  """One pass over `F`: `G = F^T F`, `F^T Y`, `F^T 1` in float64."""

  def __init__(self, k: LowRankKernel, y: np.ndarray):
    gram = f_y = f_ones = None
    dtype = None
    for start, stop, block in k.blocks():
      if gram is None:
        d = block.shape[1]
        gram = np.zeros((d, d))
        f_y = np.zeros((d, y.shape[1]))
        f_ones = np.zeros(d)
        dtype = block.dtype
      elif block.shape[1] != gram.shape[0]:
        raise ValueError(
            f'`k_train_train`\'s factor has {block.shape[1]} columns in rows '
            f'{start}:{stop} but {gram.shape[0]} before: every block of `F` '
            'must have the same feature dimension D.')
      # float32 BLAS within a block (at least: float16 products overflow
      # at 65504), float64 across blocks.
      wide = block.astype(np.promote_types(block.dtype, np.float32))
      gram += wide.T @ wide
      block64 = block.astype(np.float64)
      f_y += block64.T @ y[start:stop]
      f_ones += block64.sum(0)
    gram += gram.T  # Symmetric to the last bit, in place (D^2 floats).
    gram /= 2
    self.gram = gram
    self.f_y, self.f_ones = f_y, f_ones
    self.dtype = np.dtype(dtype)
    if not (np.all(np.isfinite(self.gram)) and np.all(np.isfinite(f_y))):
      raise ValueError(
          '`k_train_train`\'s factor `F` has NaN or inf entries, or entries '
          'so large that its Gram matrix F^T F overflows float64. Check the '
          'features (e.g. inputs of huge norm, or a NaN in `x_train`).')


class _FeatureSpaceFlow:
  """Solves with `G + r I`, `G = F^T F`, `r` the regularizer of `K = F F^T`.

  Infinite-time means with `r > 0` need only a Cholesky factorization of
  `G + r I` (`D^3 / 3` flops); covariances, finite times and `r = 0` the
  eigendecomposition of `G`, computed on first use.
  """

  def __init__(self, eq: _NormalEquations, n: int, diag_reg: float,
               absolute: bool):
    self.eq, self.n = eq, n
    trace = float(np.trace(eq.gram))
    self.reg = float(diag_reg) if absolute else float(diag_reg) * trace / n
    self._cholesky = None
    self._eig = None

  @property
  def solver(self) -> str:
    """'cholesky' once `ridge_solve` factored `G + r I`, else 'eigh'."""
    return 'cholesky' if self._cholesky else 'eigh'

  def eig(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(s2, V, positive)`: eigenvalues of `G` (0 where masked), eigenvectors,
    and the mask of the eigenvalues above round-off."""
    if self._eig is None:
      evals, evecs = np.linalg.eigh(self.eq.gram)
      lambda_max = max(float(evals[-1]), 0.)
      # Round-off level of `G` from factors of `eq.dtype` (as `solve` uses
      # for n x n kernels): eigenvalues below it are zero, as for an exact
      # kernel.
      cutoff = (solve.NOISE_FLOOR * math.sqrt(max(self.n, len(evals))) *
                float(np.finfo(self.eq.dtype).eps) * lambda_max)
      positive = evals > cutoff
      self._eig = (np.where(positive, evals, 0.), evecs, positive)
    return self._eig

  def ridge_solve(self, b: np.ndarray) -> np.ndarray:
    """`(G + r I)^{-1} b`; the pseudo-inverse (masked) when `r = 0` or `G +
    r I` is not positive definite to working precision."""
    if self.reg > 0 and self._cholesky is None and self._eig is None:
      g_reg = self.eq.gram.copy()
      g_reg[np.diag_indices_from(g_reg)] += self.reg
      try:
        self._cholesky = scipy.linalg.cho_factor(g_reg, lower=True,
                                                 overwrite_a=True)
      except np.linalg.LinAlgError:
        self._cholesky = False
    if self._cholesky:
      return scipy.linalg.cho_solve(self._cholesky, b)
    _, evecs, _ = self.eig()
    return evecs @ (self.test_weights(None)[0][:, None] * (evecs.T @ b))

  def test_weights(self, tau: Optional[np.ndarray]) -> np.ndarray:
    """`h(s^2 + r) / (s^2 + r)` per time (rows) and eigenvalue, 0 where masked.

    `tau=None`: infinite time, `1 / (s^2 + r)`.
    """
    s2, _, positive = self.eig()
    lam = np.where(positive, s2 + self.reg, 1.)
    if tau is None:
      w = (1. / lam)[None]
    else:
      w = -np.expm1(-lam[None] * tau[:, None]) / lam[None]
    return np.where(positive[None], w, 0.)

  def train_weights(self, tau: Optional[np.ndarray]
                    ) -> tuple[np.ndarray, np.ndarray]:
    """`c` and `h(r)` with `(I - exp(-K_reg tau)) = F V diag(c) V^T F^T +
    h(r) I` on the train outputs: `c = (h(s^2 + r) - h(r)) / s^2`."""
    s2, _, positive = self.eig()
    s2 = np.where(positive, s2, 1.)
    if tau is None:
      h_r = np.full((1,), 1. if self.reg > 0 else 0.)
      c = np.full((1, len(s2)), 0. if self.reg > 0 else 1.) / s2[None]
    else:
      # `r tau` is 0 at `r = 0` even for `tau = inf` (not 0 * inf = NaN).
      r_tau = np.zeros_like(tau) if self.reg == 0 else self.reg * tau
      h_r = -np.expm1(-r_tau)
      c = (np.exp(-r_tau)[:, None] *
           -np.expm1(-s2[None] * tau[:, None]) / s2[None])
    return np.where(positive[None], c, 0.), h_r


def _check_layout(y_train: Array, trace_axes: Axes) -> OutputLayout:
  layout = output_layout(y_train, trace_axes)
  if layout.untraced or 0 in layout.traced:
    axes = tuple(range(1, y_train.ndim))
    raise ValueError(
        f'A LowRankKernel `k_train_train` is an (n, n) kernel acting alike on '
        f'every output, so `trace_axes` must hold every output axis of '
        f'`y_train` (shape {y_train.shape}) and not the batch axis 0; got '
        f'trace_axes={trace_axes}. Pass trace_axes={axes} (the default '
        '(-1,) for `y_train` of shape (n, outputs)), or exact kernels.')
  return layout


def _check_train(k: Any, y_train: Array) -> None:
  if k.n != y_train.shape[0]:
    raise ValueError(
        f'`k_train_train` is a LowRankKernel of {k.n} points but `y_train` '
        f'has {y_train.shape[0]} rows (shape {y_train.shape}). Pass the '
        'factor of the training inputs of `y_train`, one row each.')


def _test_factor(k: Any, arg: str) -> LowRankKernel:
  if not isinstance(k, LowRankKernel):
    raise ValueError(
        f'`k_train_train` is a LowRankKernel (K = F F^T), so `{arg}` must be '
        f'one too, the factor of the test points by the same feature map '
        f'(e.g. `LowRankKernel.from_features(feature_fn, params, x_test)` '
        f'with the train params); got a {type(k).__name__}. An exact kernel '
        'of the test points does not match the train features.')
  return k


def _matmul(k: LowRankKernel, w: np.ndarray, arg: str) -> np.ndarray:
  """`F @ w` by row blocks of `F`, float64, `(n, w.shape[1])`."""
  out = np.empty((k.n, w.shape[1]))
  for start, stop, block in k.blocks():
    if block.shape[1] != w.shape[0]:
      raise ValueError(
          f'`{arg}`\'s factor has {block.shape[1]} columns but the train '
          f'factor has {w.shape[0]}: test and train features must come from '
          'the same feature map (same layers and params).')
    out[start:stop] = block.astype(np.float64) @ w
  return out


def _finite_targets(y: Array) -> np.ndarray:
  """`y` (targets as an `(n, k)` matrix) in float64, or raises if not finite."""
  y = np.asarray(y, np.float64)
  bad = ~np.isfinite(y)
  if bad.any():
    rows = np.unique(np.nonzero(bad)[0])
    raise ValueError(
        f'`y_train` has {int(bad.sum())} NaN or inf entries (in rows '
        f'{rows[:5].tolist()}{"..." if len(rows) > 5 else ""}); the '
        'prediction of a LowRankKernel is linear in every target, so one '
        'would make all outputs NaN. Drop or impute those rows (and the '
        'same rows of the factor).')
  return y


def _out_dtype(dtype: Any, y_train: Array) -> Any:
  return jnp.result_type(jnp.dtype(dtype), y_train.dtype, float)


def _lazy_flow(k: 'LowRankKernel', y: np.ndarray, diag_reg: float,
               absolute: bool) -> Callable[[], '_FeatureSpaceFlow']:
  """`flow()`: the feature-space flow of `k` and targets `y`, built (one pass
  over `F`) on the first call and cached."""
  return functools.cache(lambda: _FeatureSpaceFlow(
      _NormalEquations(k, y), k.n, diag_reg, absolute))


def low_rank_gp_inference(
    k_train_train: LowRankKernel,
    y_train: Array,
    diag_reg: float = 0.,
    diag_reg_absolute_scale: bool = False,
    trace_axes: Axes = (-1,),
) -> Callable[..., Any]:
  """`gp_inference` with a `LowRankKernel` train kernel (see its docstring).

  The kernel is used for any `get` (as a bare array is): 'nngp' and 'ntkgp'
  give `mean = F_* (F^T F + r)^{-1} F^T y` and
  `cov = K_** - F_* (F^T F + r)^{-1} F^T F F_*^T` (`r F_* (F^T F + r)^{-1}
  F_*^T` when `K_** = F_* F_*^T`, pseudo-inverses for `r = 0`); 'ntk' gives
  the same mean, and its covariance (which needs the NNGP as well) raises.
  `k_test_train` must be a `LowRankKernel` of the test points;
  `k_test_test` one too (its factor's Gram `F_** F_**^T`), an
  `(n_test, n_test)` array, or `True` on the training points.
  """
  y_train = jnp.asarray(y_train)
  layout = _check_layout(y_train, trace_axes)
  _check_train(k_train_train, y_train)
  check_diag_reg(diag_reg)
  y = _finite_targets(outputs_to_matrix(y_train, layout))
  solve_info = {}
  flow = _lazy_flow(k_train_train, y, diag_reg, diag_reg_absolute_scale)

  def predict_fn(get: Get = None, k_test_train: Any = None,
                 k_test_test: Any = None) -> Any:
    names, single = parse_posterior_get(get)
    if get is None:
      names, single = ('nngp',), True
    compute_cov = k_test_test is not None
    out, call = {}, {}
    for name in names:
      posterior = POSTERIORS[name]
      if compute_cov and posterior.prior != posterior.flow:
        raise ValueError(
            f'The covariance of `get={name!r}` needs two train kernels, the '
            'NTK that drives training and the NNGP prior, but '
            '`k_train_train` is one LowRankKernel. Ask for `get="ntkgp"` or '
            '"nngp" (one kernel), leave out `k_test_test` for the mean, or '
            'pass exact `nt.Kernel`s.')
      if k_test_train is None:  # On the training points: y, no variance.
        dtype = jnp.result_type(y_train.dtype, float)
        mean = y_train.astype(dtype)
        out[name] = (Gaussian(mean, jnp.zeros((y.shape[0],) * 2, dtype))
                     if compute_cov else mean)
        continue
      test = _test_factor(k_test_train, 'k_test_train')
      fl = flow()
      dtype = _out_dtype(fl.eq.dtype, y_train)
      test_shape = (test.n,) + tuple(y_train.shape[1:])
      if 'mean' not in call:  # The same for every `get`.
        w = fl.ridge_solve(fl.eq.f_y)
        call['mean'] = matrix_to_outputs(
            jnp.asarray(_matmul(test, w, 'k_test_train'), dtype),
            test_shape, layout)
      solve_info[posterior.flow] = solve.SolveInfo(fl.solver)
      mean = call['mean']
      if not compute_cov:
        out[name] = mean
        continue
      if isinstance(k_test_test, LowRankKernel):
        k_tt = k_test_test.dense()
      else:
        k_tt = np.asarray(k_test_test, np.float64)
      if k_tt.shape != (test.n, test.n):
        raise ValueError(
            f'`k_test_test` has shape {k_tt.shape} but `k_test_train` has '
            f'{test.n} test points, which need a ({test.n}, {test.n}) '
            'test-test kernel: pass the LowRankKernel of the same test '
            'points (or their exact test-test kernel).')
      s2, evecs, _ = fl.eig()
      scale = np.sqrt(s2 * fl.test_weights(None)[0])
      a = _matmul(test, evecs * scale[None], 'k_test_train')
      cov = k_tt - a @ a.T
      out[name] = Gaussian(mean, jnp.asarray((cov + cov.T) / 2, dtype))
    return results_by_get(out, names, single, 'Gaussians')

  predict_fn.solve_info = solve_info
  return predict_fn


def low_rank_gradient_descent_mse(
    k_train_train: LowRankKernel,
    y_train: Array,
    learning_rate: float = 1.,
    diag_reg: float = 0.,
    diag_reg_absolute_scale: bool = False,
    trace_axes: Axes = (-1,),
) -> Callable[..., Any]:
  """`gradient_descent_mse` with a `LowRankKernel` train kernel.

  With `tau = learning_rate * t / y_train.size`, `r` the regularizer and `h`
  as in the module docstring, the outputs are those of the exact flow on
  `K = F F^T` (`P` the projection off the range of `F`):

    f_test(t)  = f_test(0) + F_* V diag(h(s^2 + r) / (s^2 + r)) V^T F^T res,
    f_train(t) = f_train(0) + F V diag((h(s^2 + r) - h(r)) / s^2) V^T F^T res
                 + h(r) res,

  `res = y - f_train(0)`. Train outputs, and `f_train(0)` varying by row,
  cost one more pass over `F`; test outputs only the test factor.
  """
  y_train = jnp.asarray(y_train)
  layout = _check_layout(y_train, trace_axes)
  _check_train(k_train_train, y_train)
  check_diag_reg(diag_reg)
  y = _finite_targets(outputs_to_matrix(y_train, layout))
  rate = learning_rate / y_train.size
  flow = _lazy_flow(k_train_train, y, diag_reg, diag_reg_absolute_scale)

  def predict_fn(t: Optional[ArrayOrScalar] = None,
                 fx_train_0: Optional[ArrayOrScalar] = 0.,
                 fx_test_0: Optional[ArrayOrScalar] = None,
                 k_test_train: Optional[Any] = None) -> Any:
    check_initial_outputs(fx_train_0, fx_test_0, k_test_train)
    test = (None if fx_test_0 is None else
            _test_factor(k_test_train, 'k_test_train'))
    fl = flow()
    dtype = _out_dtype(fl.eq.dtype, y_train)
    if t is None:
      tau, t_shape = None, ()
    else:
      t_arr = np.asarray(t, np.float64)
      tau, t_shape = t_arr.reshape(-1) * rate, t_arr.shape
    n_times = 1 if tau is None else len(tau)
    k = y.shape[1]

    # `F^T res` and `res`, with `res = y - f_train(0)`.
    f0 = (np.zeros(()) if fx_train_0 is None else np.asarray(
        broadcast_initial_outputs(fx_train_0, y_train.shape, 'fx_train_0'),
        np.float64))
    f0_rows = np.asarray(outputs_to_matrix(jnp.asarray(f0), layout)
                         ) if f0.ndim else None
    if f0_rows is None:
      f_res = fl.eq.f_y
    elif np.all(f0_rows == f0_rows[:1]):  # Equal rows: no pass over F.
      f_res = fl.eq.f_y - np.outer(fl.eq.f_ones, f0_rows[0])
    else:
      f_res = fl.eq.f_y - _matmul_t(k_train_train, f0_rows)
    ridge = t is None and fl.reg > 0  # Cholesky; train outputs reach y.

    def by_time(m: np.ndarray, n_rows: int, shape: tuple[int, ...]) -> Array:
      """`(n_rows, T * k)` -> outputs with leading time axes."""
      m = m.reshape(n_rows, n_times, k).transpose(1, 0, 2)
      m = matrix_to_outputs(jnp.asarray(m, dtype), shape, layout)
      return m.reshape(t_shape + tuple(shape)) if t is not None else m[0]

    def weights(scales: np.ndarray) -> np.ndarray:
      """`V diag(scales[i]) V^T F^T res` stacked: `(D, T * k)`."""
      _, evecs, _ = fl.eig()
      scaled = scales[:, :, None] * (evecs.T @ f_res)[None]  # (T, D, k)
      return evecs @ scaled.transpose(1, 0, 2).reshape(len(evecs), -1)

    def with_initial(fx_0: Any, shape: tuple[int, ...], name: str,
                     change: Array) -> Array:
      fx_0 = jnp.asarray(broadcast_initial_outputs(fx_0, shape, name), dtype)
      return fx_0.reshape((1,) * len(t_shape) + fx_0.shape) + change

    fx_train_t = None
    if fx_train_0 is not None:
      res = y - (f0_rows if f0_rows is not None else f0)
      if ridge:
        change = res
      else:
        c, h_r = fl.train_weights(tau)
        change = _matmul(k_train_train, weights(c), 'k_train_train')
        change = (change.reshape(y.shape[0], n_times, k) +
                  h_r[None, :, None] * res[:, None, :]).reshape(
                      y.shape[0], -1)
      fx_train_t = with_initial(fx_train_0, y_train.shape, 'fx_train_0',
                                by_time(change, y.shape[0], y_train.shape))
    predict_fn.solve_info = solve.SolveInfo(fl.solver)
    if test is None:
      return fx_train_t
    test_shape = (test.n,) + tuple(y_train.shape[1:])
    w = (fl.ridge_solve(f_res) if ridge else
         weights(fl.test_weights(tau)))
    change = _matmul(test, w, 'k_test_train')
    fx_test_t = with_initial(fx_test_0, test_shape, 'fx_test_0',
                             by_time(change, test.n, test_shape))
    predict_fn.solve_info = solve.SolveInfo(fl.solver)
    if fx_train_t is None:
      return fx_test_t
    return fx_train_t, fx_test_t

  predict_fn.solve_info = None
  return predict_fn


def _matmul_t(k: LowRankKernel, v: np.ndarray) -> np.ndarray:
  """`F^T v` by row blocks of `F`, float64."""
  out = None
  for start, stop, block in k.blocks():
    part = block.astype(np.float64).T @ v[start:stop]
    out = part if out is None else out + part
  return out
