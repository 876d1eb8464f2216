"""Gradient descent on any loss (`gradient_descent`): the function-space ODE
of a linearized network, with or without momentum, solved by `odeint`."""
import functools
from typing import Any, Callable, NamedTuple, Optional, Union

import jax
from jax.experimental import ode
import jax.numpy as jnp

from neural_tangents._src.predict.layout import Array
from neural_tangents._src.predict.layout import ArrayOrScalar
from neural_tangents._src.predict.layout import as_array_kernel
from neural_tangents._src.predict.layout import broadcast_initial_outputs
from neural_tangents._src.predict.layout import check_kernel
from neural_tangents._src.predict.layout import checked_train_kernel
from neural_tangents._src.predict.layout import kernel_to_matrix
from neural_tangents._src.predict.layout import matrix_to_outputs
from neural_tangents._src.predict.layout import outputs_to_matrix
from neural_tangents._src.predict.layout import shape_of_test_outputs
from neural_tangents._src.utils import precision
from neural_tangents._src.utils.typing import Axes


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


# Gradient descent on any loss.


@precision.library_precision
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
    `(fx_train_t, fx_test_t)` when `fx_test_0` and `k_test_train` are given
    (as `gradient_descent_mse`: with `fx_test_0=None` only `fx_train_t`), or
    an `ODEState` when one was passed. `fx_train_0` is accepted as a keyword alias.

  Raises:
    ValueError: if `t` is None (no closed form at infinite time), or shapes do
      not match.

  Example:
    >>> import jax
    >>> from jax import random
    >>> import jax.numpy as jnp
    >>> import neural_tangents as nt
    >>> from neural_tangents import stax
    >>> _, _, kernel_fn = stax.serial(stax.Dense(512), stax.Relu(),
    ...                               stax.Dense(3))
    >>> x_train = random.normal(random.PRNGKey(1), (3, 4))
    >>> x_test = random.normal(random.PRNGKey(2), (2, 4))
    >>> y_train = jax.nn.one_hot(jnp.arange(3), 3)
    >>> cross_entropy = lambda fx, y_hat: -jnp.mean(
    ...     jax.nn.log_softmax(fx) * y_hat)
    >>> predict_fn = nt.predict.gradient_descent(
    ...     cross_entropy, kernel_fn(x_train, None, 'ntk'), y_train, 1.,
    ...     momentum=0.9)
    >>> fx_train_t, fx_test_t = predict_fn(
    ...     10., 0., 0., kernel_fn(x_test, x_train, 'ntk'))
    >>> fx_train_t.shape, fx_test_t.shape
    ((3, 3), (2, 3))
  """
  y_train, k_train_train, layout = checked_train_kernel(
      k_train_train, y_train, trace_axes)
  if momentum is not None and not 0. <= momentum < 1.:
    raise ValueError(f'`momentum` must be in [0, 1) or None; got '
                     f'momentum={momentum}. Pass None for plain gradient '
                     'descent, or e.g. 0.9 for heavy-ball momentum.')
  dtype = jnp.result_type(k_train_train.dtype, y_train.dtype, float)
  n_pairs = len(layout.untraced)
  k_train = kernel_to_matrix(k_train_train.astype(dtype), n_pairs)
  y = y_train.astype(dtype)
  grad_loss = jax.grad(lambda fx: loss(fx, y))

  if momentum is None:
    time_scale = learning_rate
  else:
    time_scale = learning_rate ** 0.5
    friction = (1. - momentum) / time_scale

  def apply_kernel(k: Array, g: Array, shape: tuple[int, ...]) -> Array:
    return matrix_to_outputs(k @ outputs_to_matrix(g, layout), shape, layout)

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

  @precision.library_precision
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
    fx_train = broadcast_initial_outputs(
        0. if state.fx_train is None else state.fx_train, y_train.shape,
        'fx_train_0').astype(dtype)
    k_test, test_shape, fx_test = None, (), None
    # As `gradient_descent_mse`: without `fx_test_0` (and without an
    # `ODEState` carrying test outputs) only the train outputs are returned,
    # whatever `k_test_train` is.
    if k_test_train is not None and (return_state or
                                     state.fx_test is not None):
      k_test_train = as_array_kernel(k_test_train, 'k_test_train')
      check_kernel(k_test_train, 'k_test_train', y_train, layout, trace_axes,
                   square=False)
      test_shape = shape_of_test_outputs(k_test_train, y_train, layout)
      k_test = kernel_to_matrix(k_test_train.astype(dtype), n_pairs)
      fx_test = broadcast_initial_outputs(
          0. if state.fx_test is None else state.fx_test, test_shape,
          'fx_test_0').astype(dtype)
    state = ODEState(fx_train, fx_test)
    if momentum is not None:
      state = state._replace(
          qx_train=_initial_velocity(fx_train_or_state_0, 'qx_train',
                                     fx_train),
          qx_test=(None if fx_test is None else
                   _initial_velocity(fx_train_or_state_0, 'qx_test', fx_test)))

    t = jnp.asarray(t, dtype)
    if not isinstance(t, jax.core.Tracer) and bool(jnp.any(t < 0)):
      raise ValueError(
          f'`t` must be >= 0 (numbers of gradient descent steps); got t={t}, '
          f'whose smallest entry is {float(jnp.min(t))}. Pass times >= 0.')
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
    if fx_test is None:
      return path.fx_train
    return path.fx_train, path.fx_test

  return predict_fn


def _initial_velocity(state: Any, field: str, fx: Array) -> Array:
  value = getattr(state, field, None) if isinstance(state, ODEState) else None
  return jnp.zeros_like(fx) if value is None else jnp.broadcast_to(
      jnp.asarray(value, fx.dtype), fx.shape)
