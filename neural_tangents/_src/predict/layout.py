"""The kernel and output layout of `predict`: which output axes are traced,
kernels and outputs as matrices and back, and checks of user kernels."""
import math
from typing import Any, NamedTuple, Union

import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.utils.typing import Axes


Array = jax.Array
ArrayOrScalar = Union[Array, float, np.ndarray]


class OutputLayout(NamedTuple):
  """Which axes of `y_train` are kept in the kernel, and which traced.

  Attributes:
    untraced: output axes (>= 1) kept in the kernel, as pairs of axes.
    traced: traced axes, on which the kernel is the identity; the batch axis 0
      may be one of them, and then the kernel has no batch axes and each
      training example evolves on its own.
  """
  untraced: tuple[int, ...]
  traced: tuple[int, ...]

  @property
  def kept(self) -> tuple[int, ...]:
    """Axes with a pair of kernel axes, in kernel order (the batch first)."""
    return ((0,) if 0 not in self.traced else ()) + self.untraced


def output_layout(y_train: Array, trace_axes: Axes) -> OutputLayout:
  """Splits the axes of `y_train` into untraced and traced ones."""
  ndim = y_train.ndim
  if ndim < 1:
    raise ValueError('`y_train` must have a leading batch axis (one row per '
                     f'training point); got a scalar of shape {y_train.shape}. '
                     'Pass an array of shape (N, O_1, ...), e.g. '
                     '`jnp.reshape(y_train, (1, 1))` for one scalar target.')
  if y_train.shape[0] == 0:
    raise ValueError(
        f'`y_train` has shape {y_train.shape}: no training points. Pass at '
        'least one training point (with no data, the predictions are the '
        'outputs at initialization: the prior).')
  axes = (trace_axes,) if isinstance(trace_axes, int) else tuple(trace_axes)
  for axis in axes:
    if not isinstance(axis, (int, np.integer)) or not -ndim <= axis < ndim:
      raise ValueError(f'`trace_axes={trace_axes}` has {axis!r}, not an int '
                       f'axis of `y_train` of shape {y_train.shape}: pass int '
                       f'axes in [{-ndim}, {ndim}).')
  traced = tuple(sorted({int(axis) % ndim for axis in axes}))
  untraced = tuple(i for i in range(1, ndim) if i not in traced)
  return OutputLayout(untraced, traced)


def kernel_to_matrix(k: Array, n_pairs: int, name: str = 'kernel') -> Array:
  """`(A, B, a_1, b_1, ..., a_n, b_n)` -> `(A * a_1 * ... , B * b_1 * ...)`.

  Args:
    k: a kernel of pairs of axes.
    n_pairs: its number of pairs of output axes: `k.ndim // 2 - 1`, or
      `k.ndim // 2` when the batch axis is traced (no batch pair).
    name: the kernel's argument name, for the error message.

  Returns:
    The kernel as a matrix, rows from the first axis of each pair.
  """
  if k.ndim not in (2 * n_pairs, 2 * n_pairs + 2):
    raise ValueError(
        f'`{name}` has shape {k.shape}, which is not {n_pairs} pair(s) of '
        'output axes (after the two batch axes, unless the batch axis is '
        'traced). Pass a kernel computed with the same `trace_axes` as the '
        'other kernels, with a pair of axes per output axis not in '
        '`trace_axes`.')
  if k.ndim == 2:  # Already a matrix (host arrays stay uncopied).
    return k
  rows, cols = tuple(range(0, k.ndim, 2)), tuple(range(1, k.ndim, 2))
  k = jnp.transpose(k, rows + cols)
  n_rows = math.prod(k.shape[:len(rows)])
  return k.reshape(n_rows, math.prod(k.shape[len(rows):]))


def matrix_to_covariance(m: Array, row_shape: tuple[int, ...]) -> Array:
  """`(..., R, R)`, `R = prod(row_shape)` -> `(..., n, n, a_1, a_1, ...)`."""
  lead = m.shape[:-2]
  if len(row_shape) == 1:  # Already in the kernel layout.
    return m
  n_lead, n_row = len(lead), len(row_shape)
  m = m.reshape(lead + row_shape + row_shape)
  pairs = tuple(axis for i in range(n_row)
                for axis in (n_lead + i, n_lead + n_row + i))
  return jnp.transpose(m, tuple(range(n_lead)) + pairs)


def outputs_to_matrix(fx: Array, layout: OutputLayout) -> Array:
  """`(N, O_1, ..., O_d)` -> `(kept sizes, traced sizes)`."""
  kept = layout.kept
  if fx.ndim == 2 and kept == (0,) and layout.traced == (1,):  # A matrix.
    return fx
  fx = jnp.transpose(fx, kept + layout.traced)
  return fx.reshape(math.prod(fx.shape[:len(kept)]),
                    math.prod(fx.shape[len(kept):]))


def matrix_to_outputs(m: Array, shape: tuple[int, ...],
                      layout: OutputLayout) -> Array:
  """Inverse of `outputs_to_matrix` on `(..., R, T)`, keeping leading axes."""
  lead = m.shape[:-2]
  order = layout.kept + layout.traced
  if not lead and m.shape == tuple(shape) and order == tuple(range(len(shape))):
    return m
  m = m.reshape(lead + tuple(shape[i] for i in order))
  inverse = tuple(int(i) for i in np.argsort(order))
  n_lead = len(lead)
  return jnp.transpose(m, tuple(range(n_lead)) +
                       tuple(n_lead + i for i in inverse))


def shape_of_test_outputs(k_test_train: Array, y_train: Array,
                          layout: OutputLayout) -> tuple[int, ...]:
  """Shape of the test outputs: test sizes of kept axes, else train's.

  With the batch axis traced, the test-train kernel relates each test point to
  the training point of the same index, so there are as many of each.
  """
  shape = list(y_train.shape)
  for i, axis in enumerate(layout.kept):
    shape[axis] = k_test_train.shape[2 * i]
  return tuple(shape)


def matrix_row_shape(test_shape: tuple[int, ...],
                     layout: OutputLayout) -> tuple[int, ...]:
  """Sizes of the kept axes of outputs of shape `test_shape`: the axes that
  `outputs_to_matrix` flattens into rows, and `matrix_to_covariance` splits."""
  return tuple(test_shape[i] for i in layout.kept)


# Argument checks.


def is_kernel_like(k: Any) -> bool:
  """Whether `k` is an `nt.Kernel` or a namedtuple with `nngp` / `ntk`."""
  return hasattr(k, 'nngp') or hasattr(k, 'ntk')


def as_array_kernel(k: Any, name: str) -> Array:
  """`k` as a JAX array; raises `ValueError` on a kernel-like `k` (argument
  `name`), saying which field to pass."""
  if is_kernel_like(k):
    raise ValueError(
        f'`{name}` must be an array, got a {type(k).__name__} with `nngp` / '
        f'`ntk` fields. Pass `{name}.ntk` to train the whole network, or '
        f'`{name}.nngp` to train only its readout layer.')
  return jnp.asarray(k)


def _expected_kernel_shape(rows: Union[int, str], y_train: Array,
                           layout: OutputLayout) -> tuple[Any, ...]:
  """The kernel shape for `y_train`, with `rows` test points ('*': any)."""
  shape = []
  for axis in layout.kept:
    size = y_train.shape[axis]
    shape += [rows if axis == 0 else ('*' if rows == '*' else size), size]
  return tuple(shape)


def check_kernel(k: Array, name: str, y_train: Array, layout: OutputLayout,
                 trace_axes: Axes, square: bool) -> None:
  """Raises `ValueError` unless `k` relates points to the `y_train` points."""
  n = y_train.shape[0]
  expected = _expected_kernel_shape(n if square else '*', y_train, layout)
  if k.ndim != len(expected):
    pairs = ('the two batch axes, then a pair of axes for each output axis '
             'not in `trace_axes`' if 0 not in layout.traced else
             'no batch axes (the batch axis 0 is traced), a pair of axes for '
             'each output axis not in `trace_axes`')
    fix = ('Compute the kernel with these `trace_axes`, or change '
           '`trace_axes`.')
    if k.ndim > len(expected) and (k.ndim - len(expected)) % 2 == 0:
      fix = (f'Its {k.ndim - len(expected)} extra axes are likely the '
             'spatial axes of image-like inputs that reached a `Dense` layer, '
             'which acts on the last axis only: add `stax.Flatten()` (or a '
             'pooling layer such as `stax.GlobalAvgPool()`) before the '
             'readout `Dense`. If the outputs do have these axes, give '
             '`y_train` them too, or average over them with `trace_axes`.')
    raise ValueError(
        f'`{name}` has shape {k.shape}, but `y_train` of shape '
        f'{y_train.shape} with `trace_axes={trace_axes}` needs a kernel of '
        f'shape {expected}: {pairs}. {fix}')
  if 0 not in layout.traced and (k.shape[1] != n or
                                 (square and k.shape[0] != n)):
    raise ValueError(
        f'`y_train` has {n} rows (shape {y_train.shape}) but `{name}` has '
        f'shape {k.shape}; expected {expected}. The kernel must relate the '
        'same training points that `y_train` labels: pass one `y_train` row '
        'per training point of the kernel.')
  for i, (got, want) in enumerate(zip(k.shape, expected)):
    if want != '*' and got != want:
      axis = layout.kept[i // 2]
      raise ValueError(
          f'`{name}` has shape {k.shape} but `y_train` has shape '
          f'{y_train.shape}: output axis {axis} of size {y_train.shape[axis]} '
          f'needs kernel axes of shape {expected}. Check `trace_axes`.')


def check_finite(k: Array, name: str) -> None:
  """Raises `ValueError` on NaN / inf, when `k` is concrete (not traced)."""
  if isinstance(k, jax.core.Tracer):
    return
  if all(d.platform == 'cpu' for d in getattr(k, 'devices', set)()):
    k = np.asarray(k)  # A view: numpy checks it without compiling.
  if isinstance(k, np.ndarray) and k.ndim:  # Host kernels: no device copy.
    step = max(1, 2**24 // max(1, k[0].size))
    finite = all(np.isfinite(k[i:i + step]).all()
                 for i in range(0, k.shape[0], step))
  else:
    finite = bool(np.all(np.isfinite(k)) if isinstance(k, np.ndarray) else
                  jnp.all(jnp.isfinite(k)))
  if not finite:
    raise ValueError(
        f'`{name}` contains NaN or inf values; the kernel must be finite. '
        'Check how it was computed (NaN inputs, overflow in float16/float32: '
        'try float64 with `jax.config.update("jax_enable_x64", True)`) and '
        'pass a finite kernel.')


def broadcast_initial_outputs(fx: Any, shape: tuple[int, ...],
                              name: str) -> Array:
  """Broadcasts initial outputs `fx` to `shape`, or raises `ValueError`."""
  fx = jnp.asarray(fx)
  try:
    return jnp.broadcast_to(fx, shape)
  except ValueError:
    raise ValueError(f'`{name}` has shape {fx.shape}, but the outputs have '
                     f'shape {shape}: pass a scalar or an array of shape '
                     f'{shape}.') from None


def checked_train_kernel(k_train_train: Any, y_train: Any, trace_axes: Axes
                          ) -> tuple[Array, Array, OutputLayout]:
  """`(y_train, k_train_train, layout)` as arrays, after checking that the
  kernel is a finite array relating the `y_train` points."""
  y_train = jnp.asarray(y_train)
  if not (isinstance(k_train_train, np.ndarray) and k_train_train.ndim == 2):
    # 2D host kernels (and memmaps) stay on the host, uncopied.
    k_train_train = as_array_kernel(k_train_train, 'k_train_train')
  layout = output_layout(y_train, trace_axes)
  check_kernel(k_train_train, 'k_train_train', y_train, layout, trace_axes,
               square=True)
  check_finite(k_train_train, 'k_train_train')
  return y_train, k_train_train, layout


def check_initial_outputs(fx_train_0: Any, fx_test_0: Any,
                          k_test_train: Any) -> None:
  """The checks of `gradient_descent_mse`'s `predict_fn` arguments: test
  outputs need `k_test_train`, and something must be predicted."""
  if fx_test_0 is not None and k_test_train is None:
    raise ValueError('`fx_test_0` was given without `k_test_train`: pass '
                     '`k_test_train` to predict on the test set.')
  if fx_train_0 is None and fx_test_0 is None:
    raise ValueError(
        '`fx_train_0` and `fx_test_0` are both None: nothing to predict. '
        'Pass `fx_train_0` (e.g. 0.) for the train outputs, and '
        '`fx_test_0` with `k_test_train` for the test outputs.')
