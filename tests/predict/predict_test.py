"""Tests for `neural_tangents.predict` against independent computations.

References are written out here from first principles: explicit gradient
steps on a linearized finite network (`jax.jvp`), kernel ridge regression and
textbook GP posteriors (`jnp.linalg.solve`), matrix exponentials
(`jax.scipy.linalg.expm`), and Monte Carlo ensembles of wide networks.
"""
import collections
import functools
import math

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsp_linalg

import neural_tangents as nt
from neural_tangents import predict
from neural_tangents import stax

from tests import test_utils


_W_STD = 1.5
_B_STD = 0.1


# A two-layer ReLU network in NTK parameterization, written out by hand.


def _init_params(key, in_dim, width, out_dim):
  keys = jax.random.split(key, 4)
  return {
      'w1': jax.random.normal(keys[0], (in_dim, width)),
      'b1': jax.random.normal(keys[1], (width,)),
      'w2': jax.random.normal(keys[2], (width, out_dim)),
      'b2': jax.random.normal(keys[3], (out_dim,)),
  }


def _apply(params, x):
  in_dim, width = params['w1'].shape
  h = (_W_STD / math.sqrt(in_dim) * x @ params['w1'] +
       _B_STD * params['b1'][None])
  return (_W_STD / math.sqrt(width) * jax.nn.relu(h) @ params['w2'] +
          _B_STD * params['b2'][None])


def _jacobian(params, x, trainable):
  """`(N, O, P)` Jacobian of the outputs w.r.t. the `trainable` params."""
  def f(sub):
    return _apply({**params, **sub}, x)
  jac = jax.jacobian(f)({k: params[k] for k in trainable})
  leaves = jax.tree_util.tree_leaves(jac)
  return jnp.concatenate([l.reshape(l.shape[:2] + (-1,)) for l in leaves], -1)


def _empirical_ntk(params, x1, x2, trainable=('w1', 'b1', 'w2', 'b2')):
  """`(N1, N2, O, O)` finite-width NTK `J(x1) J(x2)^T`."""
  return jnp.einsum('iap,jbp->ijab', _jacobian(params, x1, trainable),
                    _jacobian(params, x2, trainable))


@functools.partial(jax.jit, static_argnames=('trainable', 'n_steps'))
def _train_linearized(params, x_train, y_train, x_test, total_time,
                      trainable, n_steps):
  """Outputs after `n_steps` gradient steps adding up to `total_time`.

  The model is the first-order Taylor expansion of `_apply` in the
  `trainable` params around `params`; the loss is
  `0.5 * mean((f(x_train) - y_train)**2)`.
  """
  sub_0 = {k: params[k] for k in trainable}

  def f_lin(sub, x):
    delta = jax.tree_util.tree_map(lambda a, b: a - b, sub, sub_0)
    f_0, df = jax.jvp(lambda p: _apply({**params, **p}, x), (sub_0,), (delta,))
    return f_0 + df

  def loss(sub):
    return 0.5 * jnp.mean((f_lin(sub, x_train) - y_train)**2)

  step_size = total_time / n_steps

  def step(sub, _):
    grads = jax.grad(loss)(sub)
    return jax.tree_util.tree_map(lambda p, g: p - step_size * g, sub,
                                  grads), None

  sub, _ = jax.lax.scan(step, sub_0, None, length=n_steps)
  return f_lin(sub, x_train), f_lin(sub, x_test)


@functools.partial(jax.jit, static_argnames=('trainable', 'n_steps'))
def _train_linearized_extrapolated(params, x_train, y_train, x_test,
                                   total_times, trainable, n_steps):
  """Euler gradient steps, Richardson-extrapolated to zero step size.

  One compiled function for all `total_times` (a vector; outputs get a
  leading time axis).
  """
  def at(total_time):
    args = (params, x_train, y_train, x_test, total_time, trainable)
    coarse = _train_linearized(*args, n_steps=n_steps)
    fine = _train_linearized(*args, n_steps=2 * n_steps)
    return jax.tree_util.tree_map(lambda c, f: 2 * f - c, coarse, fine)
  return jax.vmap(at)(total_times)


# The infinite-width kernels of the same network (arc-cosine formulas).

_Kernels = collections.namedtuple('_Kernels', ['nngp', 'ntk'])


def _relu_kernels(x1, x2):
  """NNGP and NTK of `_apply` at infinite width, per output (traced)."""
  in_dim = x1.shape[1]
  def first_layer(a, b):
    return _W_STD**2 / in_dim * a @ b.T + _B_STD**2
  q12 = first_layer(x1, x2)
  q11 = jnp.diag(first_layer(x1, x1))[:, None]
  q22 = jnp.diag(first_layer(x2, x2))[None, :]
  norms = jnp.sqrt(q11 * q22)
  angle = jnp.arccos(jnp.clip(q12 / norms, -1., 1.))
  e_relu = norms * (jnp.sin(angle) + (jnp.pi - angle) * jnp.cos(angle)) / (
      2 * jnp.pi)
  e_step = (jnp.pi - angle) / (2 * jnp.pi)
  nngp = _W_STD**2 * e_relu + _B_STD**2
  ntk = nngp + _W_STD**2 * e_step * q12
  return _Kernels(nngp, ntk)


def _relu_kernel_fn(x1, x2=None, get=None, **kwargs):
  """A stax-style `kernel_fn` for `_apply`."""
  del kwargs
  kernels = _relu_kernels(x1, x1 if x2 is None else x2)
  if isinstance(get, str):
    return getattr(kernels, get)
  return kernels


def _data(key, n_train=6, n_test=3, in_dim=3, out_dim=1):
  k1, k2, k3 = jax.random.split(key, 3)
  x_train = jax.random.normal(k1, (n_train, in_dim))
  x_test = jax.random.normal(k2, (n_test, in_dim))
  y_train = jax.random.normal(k3, (n_train, out_dim))
  return x_train, y_train, x_test


def _random_psd(key, n, rank=None, scale=1.):
  features = jax.random.normal(key, (n, rank or 2 * n))
  return scale * features @ features.T / features.shape[1]


def _kron_identity(k, size):
  """`(N1, N2, ...)` kernel -> `(N1, N2, ..., size, size)` times identity."""
  return k[..., None, None] * jnp.eye(size).reshape((1,) * k.ndim +
                                                     (size, size))


class GradientDescentMseTest(test_utils.NeuralTangentsTestCase):

  @parameterized.named_parameters(
      ('full_network_untraced', ('w1', 'b1', 'w2', 'b2'), (), 2, 0.7),
      ('readout_traced', ('w2', 'b2'), (-1,), 3, 1.3),
  )
  def test_equals_explicitly_trained_linearized_network(
      self, trainable, trace_axes, out_dim, learning_rate):
    x_train, y_train, x_test = _data(jax.random.PRNGKey(0), out_dim=out_dim)
    params = _init_params(jax.random.PRNGKey(1), 3, 32, out_dim)
    k_train_train = _empirical_ntk(params, x_train, x_train, trainable)
    k_test_train = _empirical_ntk(params, x_test, x_train, trainable)
    if trace_axes:
      # Readout-only training: the NTK is exactly diagonal in the outputs.
      k_train_train = k_train_train[:, :, 0, 0]
      k_test_train = k_test_train[:, :, 0, 0]
    fx_train_0, fx_test_0 = _apply(params, x_train), _apply(params, x_test)

    predict_fn = predict.gradient_descent_mse(
        k_train_train, y_train, learning_rate, trace_axes=trace_axes)
    times = jnp.array([4., 15.])
    fx_train_t, fx_test_t = predict_fn(times, fx_train_0, fx_test_0,
                                       k_test_train)
    self.assertEqual(fx_train_t.shape, (2,) + y_train.shape)
    self.assertEqual(fx_test_t.shape, (2, x_test.shape[0], out_dim))

    expected = _train_linearized_extrapolated(
        params, x_train, y_train, x_test, learning_rate * times, trainable,
        n_steps=2000)
    self.assertAllClose((fx_train_t, fx_test_t), expected, rtol=1e-6,
                        atol=1e-6)
    # The network has moved: the test is not comparing initial outputs.
    self.assertGreater(float(jnp.abs(fx_test_t[-1] - fx_test_0).max()), 0.1)

  @parameterized.named_parameters(
      ('no_reg', 0., False),
      ('relative_reg', 0.1, False),
      ('absolute_reg', 0.3, True),
  )
  def test_infinite_time_is_kernel_ridge_regression(self, diag_reg, absolute):
    keys = jax.random.split(jax.random.PRNGKey(2), 4)
    k_all = _random_psd(keys[0], 10)
    k_train_train, k_test_train = k_all[:7, :7], k_all[7:, :7]
    y_train = jax.random.normal(keys[1], (7, 2))
    fx_train_0 = jax.random.normal(keys[2], (7, 2))
    fx_test_0 = jax.random.normal(keys[3], (3, 2))

    predict_fn = predict.gradient_descent_mse(
        k_train_train, y_train, diag_reg=diag_reg,
        diag_reg_absolute_scale=absolute)
    fx_train_inf, fx_test_inf = predict_fn(None, fx_train_0, fx_test_0,
                                           k_test_train)

    reg = diag_reg if absolute else diag_reg * jnp.trace(k_train_train) / 7
    alpha = jnp.linalg.solve(k_train_train + reg * jnp.eye(7),
                             y_train - fx_train_0)
    self.assertAllClose(fx_test_inf, fx_test_0 + k_test_train @ alpha,
                        rtol=1e-9, atol=1e-9)
    # The flow on the (regularized) train kernel reaches the targets.
    self.assertAllClose(fx_train_inf, y_train, rtol=1e-9, atol=1e-9)
    # `t=inf` is the same limit.
    self.assertAllClose(
        predict_fn(jnp.inf, fx_train_0, fx_test_0, k_test_train),
        (fx_train_inf, fx_test_inf), rtol=1e-9, atol=1e-9)

  def test_finite_time_equals_matrix_exponential(self):
    keys = jax.random.split(jax.random.PRNGKey(3), 2)
    k = _random_psd(keys[0], 5)
    y_train = jax.random.normal(keys[1], (5, 2))
    t, learning_rate = 3., 2.
    predict_fn = predict.gradient_descent_mse(k, y_train, learning_rate)
    decay = jsp_linalg.expm(-k * learning_rate * t / y_train.size)
    self.assertAllClose(predict_fn(t), y_train - decay @ y_train, rtol=1e-10,
                        atol=1e-10)

  def test_returns_train_outputs_only_without_test_kernel(self):
    k = _random_psd(jax.random.PRNGKey(4), 4)
    y_train = jnp.ones((4, 1))
    predict_fn = predict.gradient_descent_mse(k, y_train)
    self.assertEqual(predict_fn(1.).shape, (4, 1))
    self.assertEqual(predict_fn(jnp.ones((2, 3))).shape, (2, 3, 4, 1))
    fx_train, fx_test = predict_fn(0., 0., 0., k[:2])
    self.assertAllClose(fx_test, jnp.zeros((2, 1)))
    self.assertAllClose(fx_train, jnp.zeros((4, 1)))

  @parameterized.named_parameters(('last_axis', (-1,)), ('middle_axis', (1,)),
                                  ('two_axes', (1, 2)))
  def test_traced_kernel_equals_full_kernel_times_identity(self, trace_axes):
    """Tracing an axis means the kernel is the identity on it."""
    n, n_test, h, c = 5, 2, 3, 2
    keys = jax.random.split(jax.random.PRNGKey(5), 3)
    features = jax.random.normal(keys[0], (n + n_test, 4, 6))
    k_full_pairs = jnp.einsum('ihp,jgp->ijhg', features, features) / 6
    y_train = jax.random.normal(keys[1], (n, h, c))
    fx_test_0 = jax.random.normal(keys[2], (n_test, h, c))

    if trace_axes == (-1,):  # Kernel on (N, H): identity over C.
      k = k_full_pairs[..., :h, :h]
      full = _kron_identity(k, c)
    elif trace_axes == (1,):  # Kernel on (N, C): identity over H.
      k = k_full_pairs[..., :c, :c]
      full = jnp.einsum('ijab,hg->ijhgab', k, jnp.eye(h))
    else:  # Kernel on N only.
      k = k_full_pairs[..., 0, 0]
      full = jnp.einsum('ij,hg,ab->ijhgab', k, jnp.eye(h), jnp.eye(c))

    traced = predict.gradient_descent_mse(k[:n, :n], y_train,
                                          trace_axes=trace_axes)
    untraced = predict.gradient_descent_mse(full[:n, :n], y_train,
                                            trace_axes=())
    for t in (2., None):
      self.assertAllClose(
          traced(t, 0., fx_test_0, k[n:, :n]),
          untraced(t, 0., fx_test_0, full[n:, :n]), rtol=1e-9, atol=1e-9)

    gp_traced = predict.gp_inference(k[:n, :n], y_train, 0.1,
                                     trace_axes=trace_axes)
    gp_untraced = predict.gp_inference(full[:n, :n], y_train, 0.1,
                                       trace_axes=())
    out_traced = gp_traced('nngp', k[n:, :n], k[n:, n:])
    out_untraced = gp_untraced('nngp', full[n:, :n], full[n:, n:])
    self.assertAllClose(out_traced.mean, out_untraced.mean, rtol=1e-9,
                        atol=1e-9)
    # The untraced covariance holds the traced one on the identity's diagonal.
    cov = out_untraced.covariance
    if trace_axes == (-1,):
      cov = cov[..., 0, 0]
    elif trace_axes == (1,):
      cov = cov[:, :, 0, 0]
    else:
      cov = cov[:, :, 0, 0, 0, 0]
    self.assertAllClose(out_traced.covariance, cov, rtol=1e-9, atol=1e-9)

  def test_jit_matches_eager(self):
    k = _random_psd(jax.random.PRNGKey(6), 6)
    y_train = jnp.ones((6, 2))
    predict_fn = predict.gradient_descent_mse(k, y_train, diag_reg=1e-3)
    jitted = jax.jit(lambda t: predict_fn(t, 0., 0., k[:3]))
    self.assertAllClose(jitted(jnp.array([1., 5.])),
                        predict_fn(jnp.array([1., 5.]), 0., 0., k[:3]))


class SingularAndBadInputTest(test_utils.NeuralTangentsTestCase):

  def test_singular_kernel_gives_least_squares_answer(self):
    """Rank-deficient kernels: finite flow, pseudo-inverse at infinity."""
    keys = jax.random.split(jax.random.PRNGKey(7), 3)
    features = jax.random.normal(keys[0], (9, 3))  # Rank 3 on 6 train points.
    k_all = features @ features.T
    k_train_train, k_test_train = k_all[:6, :6], k_all[6:, :6]
    y_train = jax.random.normal(keys[1], (6, 1))  # Not in the kernel's range.

    predict_fn = predict.gradient_descent_mse(k_train_train, y_train)
    fx_train, fx_test = predict_fn(None, 0., 0., k_test_train)
    pinv = jnp.linalg.pinv(k_train_train, hermitian=True)
    self.assertAllClose(fx_test, k_test_train @ pinv @ y_train, rtol=1e-8,
                        atol=1e-8)
    self.assertAllClose(fx_train, k_train_train @ pinv @ y_train, rtol=1e-8,
                        atol=1e-8)

    # Finite times: the flow agrees with the minimum-norm linear model trained
    # in parameter space (closed form through its parameter-space Gram).
    times = jnp.array([0.5, 50.])
    fx_train_t, fx_test_t = predict_fn(times, 0., 0., k_test_train)
    gram = features[:6].T @ features[:6] / y_train.size
    for i, t in enumerate(times):
      decay = jsp_linalg.expm(-gram * t)
      w_inf = jnp.linalg.pinv(features[:6]) @ y_train
      w_t = w_inf - decay @ w_inf
      self.assertAllClose(fx_train_t[i], features[:6] @ w_t, rtol=1e-7,
                          atol=1e-7)
      self.assertAllClose(fx_test_t[i], features[6:] @ w_t, rtol=1e-7,
                          atol=1e-7)
    # Very long times: finite, and at the infinite-time answer.
    self.assertAllClose(predict_fn(1e12, 0., 0., k_test_train),
                        (fx_train, fx_test), rtol=1e-8, atol=1e-8)

  def test_ill_conditioned_kernel_stays_finite(self):
    evecs, _ = jnp.linalg.qr(jax.random.normal(jax.random.PRNGKey(8), (6, 6)))
    evals = jnp.array([1., 1e-3, 1e-9, 1e-17, 0., -1e-16])
    k = (evecs * evals[None]) @ evecs.T
    y_train = jnp.ones((6, 1))
    predict_fn = predict.gradient_descent_mse(k, y_train)
    out = predict_fn(jnp.array([1., 1e20]), 0., 0., k[:2])
    self.assertFinite(out)
    self.assertFinite(predict_fn(None, 0., 0., k[:2]))
    gp = predict.gp_inference(k, y_train)('nngp', k[:2], k[:2, :2])
    self.assertFinite(gp)

  def test_duplicated_training_points_match_unique_ones(self):
    """Duplicates make the kernel singular; the interpolant is unchanged."""
    x_train, y_train, x_test = _data(jax.random.PRNGKey(9))
    x_dup = jnp.concatenate([x_train, x_train[:2]])
    y_dup = jnp.concatenate([y_train, y_train[:2]])
    unique = predict.gradient_descent_mse_ensemble(_relu_kernel_fn, x_train,
                                                   y_train)
    dup = predict.gradient_descent_mse_ensemble(_relu_kernel_fn, x_dup, y_dup)
    for get in ('nngp', 'ntk'):
      self.assertAllClose(dup(None, x_test, get, compute_cov=True),
                          unique(None, x_test, get, compute_cov=True),
                          rtol=1e-6, atol=1e-6)

  def test_mismatched_rows_raise_naming_arguments(self):
    k = _random_psd(jax.random.PRNGKey(10), 5)
    with self.assertRaisesRegex(ValueError, r'`y_train` has 4 rows.*'
                                r'`k_train_train`'):
      predict.gradient_descent_mse(k, jnp.ones((4, 1)))
    with self.assertRaisesRegex(ValueError, '`y_train`.*`k_train_train`'):
      predict.gradient_descent(lambda f, y: jnp.sum(f), k, jnp.ones((4, 1)))
    with self.assertRaisesRegex(ValueError, '`y_train`.*`k_train_train`'):
      predict.gp_inference(k, jnp.ones((4, 1)))()
    predict_fn = predict.gradient_descent_mse(k, jnp.ones((5, 1)))
    with self.assertRaisesRegex(ValueError, '`k_test_train`'):
      predict_fn(1., 0., 0., k[:2, :4])

  def test_trace_axes_mismatch_raises(self):
    k = _random_psd(jax.random.PRNGKey(11), 5)
    with self.assertRaisesRegex(ValueError, 'trace_axes'):
      predict.gradient_descent_mse(k, jnp.ones((5, 2)), trace_axes=())
    with self.assertRaisesRegex(ValueError, 'batch axis'):
      predict.gradient_descent_mse(k, jnp.ones((5,)))

  def test_other_bad_arguments_raise(self):
    k = _random_psd(jax.random.PRNGKey(12), 5)
    y_train = jnp.ones((5, 1))
    predict_fn = predict.gradient_descent_mse(k, y_train)
    with self.assertRaisesRegex(ValueError, '`fx_test_0`.*`k_test_train`'):
      predict_fn(1., 0., jnp.ones((2, 1)))
    with self.assertRaisesRegex(ValueError, '`fx_train_0`'):
      predict_fn(1., jnp.ones((3, 1)))
    with self.assertRaisesRegex(ValueError, r'\.ntk'):
      predict.gradient_descent_mse(_Kernels(k, k), y_train)
    with self.assertRaisesRegex(ValueError, 'NaN'):
      predict.gradient_descent_mse(k.at[0, 0].set(jnp.nan), y_train)
    with self.assertRaisesRegex(ValueError, 'momentum'):
      predict.gradient_descent(lambda f, y: jnp.sum(f), k, y_train,
                               momentum=1.5)
    with self.assertRaisesRegex(ValueError, 'momentum'):
      predict.max_learning_rate(k, momentum=-0.1)
    with self.assertRaisesRegex(ValueError, 'infinite time'):
      predict.gradient_descent(lambda f, y: jnp.sum(f), k, y_train)(None)
    with self.assertRaisesRegex(ValueError, "`get='nntk'`"):
      predict.gp_inference(_Kernels(k, k), y_train)('nntk')
    with self.assertRaisesRegex(ValueError, '"ntk"'):
      predict.gp_inference(_Kernels(k, None), y_train)('ntk')

  def test_unknown_get_message_says_it_once_with_the_choices(self):
    k = _random_psd(jax.random.PRNGKey(13), 5)
    predict_fn = predict.gp_inference(_Kernels(k, k), jnp.ones((5, 1)))
    with self.assertRaises(ValueError) as e:
      predict_fn('ntkk')
    self.assertEqual(
        str(e.exception),
        "`get='ntkk'` asks for 'ntkk', which is not available here (did you "
        "mean 'ntk'?). Pass one of ('nngp', 'ntk', 'ntkgp'), a tuple of "
        "them, e.g. get=('nngp', 'ntk'), or None for all.")

  def test_forgotten_flatten_names_the_cause_and_the_fix(self):
    # `Dense` on (n, 2, 2, 3) images acts on the channel axis: the kernel
    # keeps the two spatial axes of both inputs, (n, n, 2, 2, 2, 2), where
    # `y_train` of shape (n, 2) needs (n, n).
    _, _, kernel_fn = stax.serial(stax.Dense(4), stax.Relu(), stax.Dense(1))
    x_train = jax.random.normal(jax.random.PRNGKey(0), (3, 2, 2, 3))
    y_train = jnp.ones((3, 2))
    fix = (r'\(3, 3, 2, 2, 2, 2\).*needs a kernel of shape \(3, 3\).*Its 4 '
           r'extra axes are likely the spatial axes.*add `stax\.Flatten\(\)` '
           r'\(or a pooling layer')
    with self.assertRaisesRegex(ValueError, fix):
      predict.gradient_descent_mse_ensemble(kernel_fn, x_train, y_train)(
          None, x_train, 'ntk')
    with self.assertRaisesRegex(ValueError, fix):
      predict.gradient_descent_mse(kernel_fn(x_train, None, 'ntk'), y_train)
    # With `Flatten`, the same call works.
    _, _, kernel_fn = stax.serial(stax.Flatten(), stax.Dense(4), stax.Relu(),
                                  stax.Dense(1))
    mean = predict.gradient_descent_mse_ensemble(kernel_fn, x_train, y_train,
                                                 diag_reg=1e-3)(
                                                     None, x_train, 'ntk')
    self.assertEqual(mean.shape, (3, 2))

  def test_error_messages_name_argument_value_and_fix(self):
    k = _random_psd(jax.random.PRNGKey(13), 5)
    y_train = jnp.ones((5, 1))
    loss = lambda f, y: jnp.sum(f)
    with self.assertRaisesRegex(
        ValueError, r'`momentum` must be in \[0, 1\); got momentum=-0\.1\. '
        r'Pass 0\. for plain'):
      predict.max_learning_rate(k, momentum=-0.1)
    with self.assertRaisesRegex(
        ValueError, r'`momentum`.*got momentum=1\.5\. Pass None'):
      predict.gradient_descent(loss, k, y_train, momentum=1.5)
    with self.assertRaisesRegex(
        ValueError, r'`t` must be >= 0.*smallest entry is -2\.0\. Pass times'):
      predict.gradient_descent(loss, k, y_train)(jnp.array([1., -2.]))
    with self.assertRaisesRegex(
        ValueError, r'`ntk_train_train`.*got \(5, 4\)\. Pass the '
        r'train-train NTK'):
      predict.max_learning_rate(k[:, :4])
    with self.assertRaisesRegex(
        ValueError, r'`trace_axes=\(2,\)` has 2, not an int axis of '
        r'`y_train` of shape \(5, 1\): pass int axes in \[-2, 2\)'):
      predict.gradient_descent_mse(k, y_train, trace_axes=(2,))
    with self.assertRaisesRegex(
        ValueError, r'scalar of shape \(\)\. Pass an array of shape'):
      predict.gradient_descent_mse(k, jnp.float32(1.))
    with self.assertRaisesRegex(
        ValueError, r'`k_train_train` contains NaN.*pass a finite kernel'):
      predict.gradient_descent_mse(k.at[0, 0].set(jnp.inf), y_train)
    with self.assertRaisesRegex(
        ValueError, r"asks for 'nntk'.*\(did you mean 'ntk'\?\)\. Pass one "
        r"of \('nngp', 'ntk', 'ntkgp'\)"):
      predict.gp_inference(_Kernels(k, k), y_train)('nntk')
    with self.assertRaisesRegex(
        ValueError, r'`k_test_train` has no "ntk" kernel \(got a _Kernels '
        r'whose `ntk` is None\).*Pass a `k_test_train` that contains "ntk"'):
      predict.gp_inference(_Kernels(k, k), y_train)(
          'ntk', _Kernels(k[:2], None))
    with self.assertRaisesRegex(
        ValueError, r'`kernel_fn` did not return the "ntk" kernel.*returned '
        r'a dict without it\. Pass a `kernel_fn'):
      predict.gradient_descent_mse_ensemble(
          lambda x1, x2, get, **kw: {'nngp': k}, jnp.zeros((5, 2)),
          y_train)(None, jnp.zeros((2, 2)), 'ntk')

    def bad_test_test_kernel_fn(x1, x2, get, **kwargs):
      del get, kwargs
      if x2 is None and x1.shape[0] == 2:  # The test-test kernel.
        return {'nngp': k[:2, :2, None]}
      return {'nngp': k[:x1.shape[0]]}

    with self.assertRaisesRegex(
        ValueError, r'`kernel_fn\(x_test, None, "nngp"\)` has shape '
        r'\(2, 2, 1\).*Pass a kernel computed with the same `trace_axes`'):
      predict.gradient_descent_mse_ensemble(
          bad_test_test_kernel_fn, jnp.zeros((5, 2)), y_train)(
              None, jnp.zeros((2, 2)), 'nngp', compute_cov=True)


class EnsembleTest(test_utils.NeuralTangentsTestCase):

  def _monte_carlo(self, x_train, y_train, x_test, taus, readout_only,
                   width=2048, n_pairs=512):
    """Outputs of trained linearized networks, `(2 n_pairs, T, N_test)`.

    Each network is trained in closed form through its own finite-width
    tangent kernel `Theta = V diag(lambda) V^T` (an eigendecomposition):
    `f_t(x_test) = f_0(x_test) + Theta_* V diag((1 - exp(-lambda tau)) /
    lambda) V^T (y - f_0(x_train))`. Each has an antithetic partner with
    negated readout, whose initial outputs are negated and kernel unchanged
    (so it costs no second Jacobian), which cancels the prior's noise in the
    mean. In float32: its rounding is far below the finite-width noise.
    """
    trainable = ('w2', 'b2') if readout_only else ('w1', 'b1', 'w2', 'b2')
    x = jnp.concatenate([x_train, x_test]).astype(jnp.float32)
    y = y_train[:, 0].astype(jnp.float32)
    n = x_train.shape[0]

    def trained_pair(key):
      params = _init_params(key, x.shape[1], width, 1)
      params = {k: v.astype(jnp.float32) for k, v in params.items()}
      jac = _jacobian(params, x, trainable)[:, 0]
      ntk = jac @ jac.T
      evals, evecs = jnp.linalg.eigh(ntk[:n, :n])
      to_test = ntk[n:, :n] @ evecs
      f_0 = _apply(params, x)[:, 0]
      pair = []
      for f in (f_0, -f_0):  # The network and its antithetic partner.
        residual = evecs.T @ (y - f[:n])
        gains = [1 / evals if tau is None else -jnp.expm1(-evals * tau) / evals
                 for tau in taus]
        pair.append(jnp.stack([f[n:] + to_test @ (gain * residual)
                               for gain in gains]))
      return jnp.stack(pair)

    batch = test_utils.optimized_jit(jax.vmap(trained_pair))
    keys = jax.random.split(jax.random.PRNGKey(13), n_pairs)
    samples = jnp.concatenate([batch(chunk) for chunk in jnp.split(keys, 4)])
    return samples.reshape((2 * n_pairs,) + samples.shape[2:])

  # Trained networks have no exact reference: one Monte Carlo representative,
  # the NTK (all layers trained); the readout-only NNGP flow (with the
  # NTK's, in closed form in `DiagRegTest` and `NtkGpTest`) in the full tier.
  @parameterized.named_parameters(*test_utils.full_tier_cases(
      [('ntk', 'ntk')], [('nngp', 'nngp')]))
  def test_mean_and_covariance_match_monte_carlo(self, get):
    x_train, y_train, x_test = _data(jax.random.PRNGKey(14), n_train=8,
                                     n_test=4)
    times = (2., 20., None)
    taus = tuple(None if t is None else t / y_train.size for t in times)
    samples = self._monte_carlo(x_train, y_train, x_test, taus,
                                readout_only=get == 'nngp')
    n_samples = samples.shape[0]
    mc_mean = samples.mean(0)
    centered = samples - mc_mean[None]
    mc_cov = jnp.einsum('sti,stj->tij', centered, centered) / (n_samples - 1)

    predict_fn = predict.gradient_descent_mse_ensemble(
        _relu_kernel_fn, x_train, y_train)
    for i, t in enumerate(times):
      out = predict_fn(t, x_test, get, compute_cov=True)
      self.assertEqual(out.mean.shape, (4, 1))
      self.assertEqual(out.covariance.shape, (4, 4))
      # Antithetic pairs leave only finite-width kernel noise in the mean.
      self.assertAllClose(out.mean[:, 0], mc_mean[i], rtol=1e-2, atol=5e-3)
      var = jnp.diag(out.covariance)
      cov_std_err = jnp.sqrt((var[:, None] * var[None] + out.covariance**2) /
                             n_samples)
      self.assertTrue(
          bool(jnp.all(jnp.abs(out.covariance - mc_cov[i]) <
                       5 * cov_std_err + 2e-3)),
          f't={t}: {out.covariance} vs Monte Carlo {mc_cov[i]}')

    # The check has power: NNGP and NTK training give different answers.
    other = 'nngp' if get == 'ntk' else 'ntk'
    self.assertGreater(
        float(jnp.abs(predict_fn(20., x_test, other).ravel() -
                      mc_mean[1]).max()), 5e-2)

  def test_time_zero_is_prior_and_train_set_predictions(self):
    x_train, y_train, x_test = _data(jax.random.PRNGKey(15))
    predict_fn = predict.gradient_descent_mse_ensemble(
        _relu_kernel_fn, x_train, y_train)
    out = predict_fn(0., x_test, compute_cov=True)
    self.assertEqual(out._fields, ('nngp', 'ntk'))
    for gaussian in out:
      self.assertAllClose(gaussian.mean, jnp.zeros((3, 1)))
      self.assertAllClose(gaussian.covariance,
                          _relu_kernels(x_test, x_test).nngp)
    # `x_test=None` predicts on the training set, as `x_test=x_train` does.
    times = jnp.array([[1., 10.], [100., 1000.]])
    on_train = predict_fn(times, None, ('ntk',), compute_cov=True)
    self.assertEqual(on_train.ntk.mean.shape, (2, 2, 6, 1))
    self.assertEqual(on_train.ntk.covariance.shape, (2, 2, 6, 6))
    self.assertAllClose(on_train,
                        predict_fn(times, x_train, ('ntk',), compute_cov=True),
                        rtol=1e-8, atol=1e-8)
    # Interpolation: at infinite time train outputs are the targets, surely.
    out = predict_fn(None, None, 'nngp', compute_cov=True)
    self.assertAllClose(out.mean, y_train, rtol=1e-7, atol=1e-7)
    self.assertAllClose(out.covariance, jnp.zeros((6, 6)), rtol=0, atol=1e-7)

  def test_mean_matches_gradient_descent_mse(self):
    x_train, y_train, x_test = _data(jax.random.PRNGKey(16), out_dim=2)
    k_train_train = _relu_kernels(x_train, x_train)
    k_test_train = _relu_kernels(x_test, x_train)
    ensemble = predict.gradient_descent_mse_ensemble(
        _relu_kernel_fn, x_train, y_train, learning_rate=0.5, diag_reg=1e-2)
    times = jnp.array([3., 30., 300.])
    for get in ('nngp', 'ntk'):
      single = predict.gradient_descent_mse(
          getattr(k_train_train, get), y_train, learning_rate=0.5,
          diag_reg=1e-2)
      _, expected = single(times, 0., 0., getattr(k_test_train, get))
      self.assertAllClose(ensemble(times, x_test, get), expected, rtol=1e-9,
                          atol=1e-9)

  def test_infinite_time_equals_gp_inference(self):
    x_train, y_train, x_test = _data(jax.random.PRNGKey(17))
    ensemble = predict.gradient_descent_mse_ensemble(
        _relu_kernel_fn, x_train, y_train, diag_reg=1e-2)
    gp = predict.gp_inference(_relu_kernels(x_train, x_train), y_train,
                              diag_reg=1e-2)
    self.assertAllClose(
        ensemble(None, x_test, compute_cov=True),
        gp(None, _relu_kernels(x_test, x_train),
           _relu_kernels(x_test, x_test)), rtol=1e-9, atol=1e-9)

  def test_train_kernel_is_computed_and_decomposed_once(self):
    x_train, y_train, x_test = _data(jax.random.PRNGKey(18))
    calls = collections.Counter()

    def counting_kernel_fn(x1, x2=None, get=None, **kwargs):
      calls['train' if x1 is x_train and x2 is None else 'other'] += 1
      return _relu_kernel_fn(x1, x2, get, **kwargs)

    predict_fn = predict.gradient_descent_mse_ensemble(
        counting_kernel_fn, x_train, y_train)
    first = predict_fn(jnp.array([1., 2.]), x_test, compute_cov=True)
    predict_fn(5., x_test, 'ntk')
    jitted = jax.jit(lambda t, x: predict_fn(t, x, compute_cov=True))
    self.assertAllClose(jitted(jnp.array([1., 2.]), x_test), first,
                        rtol=1e-9, atol=1e-9)
    # Eager calls after tracing still work: no tracer was cached.
    self.assertAllClose(predict_fn(jnp.array([1., 2.]), x_test,
                                   compute_cov=True), first)
    self.assertEqual(calls['train'], 1)

  def test_with_stax_kernel_fn_and_kernel_objects(self):
    stax = nt.stax
    _, _, kernel_fn = stax.serial(stax.Dense(64, _W_STD, _B_STD), stax.Relu(),
                                  stax.Dense(1, _W_STD, _B_STD))
    # Jitted: one compilation per input shape instead of many eager ops.
    kernel_fn = jax.jit(kernel_fn, static_argnames='get')
    x_train, y_train, x_test = _data(jax.random.PRNGKey(19))
    ensemble = predict.gradient_descent_mse_ensemble(kernel_fn, x_train,
                                                     y_train, diag_reg=1e-3)
    gp = predict.gp_inference(kernel_fn(x_train, None), y_train,
                              diag_reg=1e-3)
    expected = gp(None, kernel_fn(x_test, x_train), kernel_fn(x_test, None))
    self.assertAllClose(ensemble(None, x_test, compute_cov=True), expected,
                        rtol=1e-8, atol=1e-8)
    self.assertFinite(ensemble(jnp.array([1., 10.]), x_test, compute_cov=True))


class GpInferenceTest(test_utils.NeuralTangentsTestCase):

  def _kernels(self, key, n_train=7, n_test=3):
    keys = jax.random.split(key, 3)
    nngp = _random_psd(keys[0], n_train + n_test)
    ntk = nngp + _random_psd(keys[1], n_train + n_test)
    y_train = jax.random.normal(keys[2], (n_train, 2))
    split = lambda k: (k[:n_train, :n_train], k[n_train:, :n_train],
                       k[n_train:, n_train:])
    return split(nngp), split(ntk), y_train

  @parameterized.named_parameters(('no_noise', 0.), ('noise', 0.2))
  def test_nngp_is_textbook_posterior(self, noise):
    (k, k_s, k_ss), _, y_train = self._kernels(jax.random.PRNGKey(20))
    predict_fn = predict.gp_inference(k, y_train, diag_reg=noise,
                                      diag_reg_absolute_scale=True)
    mean, cov = predict_fn('nngp', k_s, k_ss)
    k_noisy = k + noise * jnp.eye(7)
    self.assertAllClose(mean, k_s @ jnp.linalg.solve(k_noisy, y_train),
                        rtol=1e-9, atol=1e-9)
    self.assertAllClose(cov, k_ss - k_s @ jnp.linalg.solve(k_noisy, k_s.T),
                        rtol=1e-9, atol=1e-9)
    # Array kernels and `get=None`: one Gaussian; no `k_test_test`: the mean.
    self.assertAllClose(predict_fn(None, k_s, k_ss), (mean, cov))
    self.assertAllClose(predict_fn(None, k_s), mean, rtol=0, atol=0)

  def test_get_names_in_any_case(self):
    nngp, ntk, y_train = self._kernels(jax.random.PRNGKey(22))
    predict_fn = predict.gp_inference(_Kernels(nngp[0], ntk[0]), y_train,
                                      0.05)
    test = (_Kernels(nngp[1], ntk[1]), _Kernels(nngp[2], ntk[2]))
    upper = predict_fn(('NTK', 'NNGP'), *test)
    self.assertEqual(upper._fields, ('ntk', 'nngp'))
    lower = predict_fn(('ntk', 'nngp'), *test)
    self.assertAllClose(upper, lower)
    self.assertAllClose(predict_fn('NtkGp', *test), predict_fn('ntkgp', *test))

  def test_ntk_is_infinitely_trained_network_posterior(self):
    nngp, ntk, y_train = self._kernels(jax.random.PRNGKey(21))
    reg = 0.05
    train = _Kernels(nngp[0], ntk[0])
    predict_fn = predict.gp_inference(train, y_train, reg,
                                      diag_reg_absolute_scale=True)
    out = predict_fn(None, _Kernels(nngp[1], ntk[1]),
                     _Kernels(nngp[2], ntk[2]))
    self.assertEqual(out._fields, ('nngp', 'ntk'))

    # Trained networks of Lee et al. 2019 at t = inf, written out with solves:
    # only the inverted NTK is regularized, the prior NNGP is used as is.
    theta = ntk[0] + reg * jnp.eye(7)
    a = jnp.linalg.solve(theta, ntk[1].T).T
    expected_cov = (nngp[2] - a @ nngp[1].T - nngp[1] @ a.T +
                    a @ nngp[0] @ a.T)
    self.assertAllClose(out.ntk.mean, a @ y_train, rtol=1e-9, atol=1e-9)
    self.assertAllClose(out.ntk.covariance, expected_cov, rtol=1e-9,
                        atol=1e-9)
    # Predictions on the training set interpolate: `diag_reg` is ignored.
    self.assertAllClose(predict_fn('ntk'), y_train, rtol=0, atol=0)


class GradientDescentTest(test_utils.NeuralTangentsTestCase):

  @parameterized.named_parameters(('traced', (-1,)), ('untraced', ()))
  def test_mse_loss_equals_gradient_descent_mse(self, trace_axes):
    keys = jax.random.split(jax.random.PRNGKey(22), 3)
    n, n_test, out = 6, 3, 2
    if trace_axes:
      k_all = _random_psd(keys[0], n + n_test)
    else:
      features = jax.random.normal(keys[0], (n + n_test, out, 20))
      k_all = jnp.einsum('iap,jbp->ijab', features, features) / 20
    y_train = jax.random.normal(keys[1], (n, out))
    fx_train_0 = jax.random.normal(keys[2], (n, out))
    k, k_s = k_all[:n, :n], k_all[n:, :n]

    mse = lambda fx, y_hat: 0.5 * jnp.mean((fx - y_hat)**2)
    ode_fn = predict.gradient_descent(mse, k, y_train, learning_rate=0.5,
                                      trace_axes=trace_axes)
    exact_fn = predict.gradient_descent_mse(k, y_train, learning_rate=0.5,
                                            trace_axes=trace_axes)
    times = jnp.array([10., 0., 3., 30.])  # Unsorted on purpose.
    self.assertAllClose(ode_fn(times, fx_train_0, 0., k_s),
                        exact_fn(times, fx_train_0, 0., k_s), rtol=1e-6,
                        atol=1e-6)
    self.assertAllClose(ode_fn(times, fx_train_0),
                        exact_fn(times, fx_train_0), rtol=1e-6, atol=1e-6)
    state = ode_fn(times, predict.ODEState(fx_train_0, jnp.zeros((3, out))),
                   None, k_s)
    self.assertIsInstance(state, predict.ODEState)
    self.assertAllClose(state.fx_test, exact_fn(times, fx_train_0, 0., k_s)[1],
                        rtol=1e-6, atol=1e-6)

  def _momentum_problem(self):
    keys = jax.random.split(jax.random.PRNGKey(23), 3)
    k_all = _random_psd(keys[0], 8, scale=4.)
    y_train = jax.random.normal(keys[1], (5, 1))
    return k_all[:5, :5], k_all[5:, :5], y_train

  def test_momentum_equals_second_order_linear_ode(self):
    k, k_s, y_train = self._momentum_problem()
    learning_rate, momentum, t = 0.04, 0.8, 25.
    mse = lambda fx, y_hat: 0.5 * jnp.mean((fx - y_hat)**2)
    predict_fn = predict.gradient_descent(mse, k, y_train, learning_rate,
                                          momentum)
    fx_train, fx_test = predict_fn(t, 0., 0., k_s)

    # State (f - y, f_test, q, q_test) of the linear ODE
    # f' = q, q' = -(1 - m) / sqrt(lr) q - Theta (f - y) / n, time sqrt(lr) t.
    n, n_test = 5, 3
    friction = (1 - momentum) / learning_rate**0.5
    a = jnp.block([
        [jnp.zeros((n, n)), jnp.zeros((n, n_test)), jnp.eye(n),
         jnp.zeros((n, n_test))],
        [jnp.zeros((n_test, n)), jnp.zeros((n_test, n_test)),
         jnp.zeros((n_test, n)), jnp.eye(n_test)],
        [-k / n, jnp.zeros((n, n_test)), -friction * jnp.eye(n),
         jnp.zeros((n, n_test))],
        [-k_s / n, jnp.zeros((n_test, n_test)), jnp.zeros((n_test, n)),
         -friction * jnp.eye(n_test)],
    ])
    z_0 = jnp.concatenate([-y_train[:, 0], jnp.zeros(n_test + n + n_test)])
    z_t = jsp_linalg.expm(a * learning_rate**0.5 * t) @ z_0
    self.assertAllClose(fx_train[:, 0], z_t[:n] + y_train[:, 0], rtol=1e-6,
                        atol=1e-6)
    self.assertAllClose(fx_test[:, 0], z_t[n:n + n_test], rtol=1e-6,
                        atol=1e-6)

  def test_momentum_is_limit_of_heavy_ball_steps(self):
    k, k_s, y_train = self._momentum_problem()
    learning_rate, momentum, n_steps = 1e-4, 0.99, 600
    mse = lambda fx, y_hat: 0.5 * jnp.mean((fx - y_hat)**2)
    fx_train, fx_test = predict.gradient_descent(
        mse, k, y_train, learning_rate, momentum)(float(n_steps), 0., 0., k_s)

    # Heavy ball on a linear model, in function space: v <- m v - lr grad.
    def step(state, _):
      f, f_test, v, v_test = state
      grad = (f - y_train) / y_train.size
      v, v_test = momentum * v - learning_rate * k @ grad, (
          momentum * v_test - learning_rate * k_s @ grad)
      return (f + v, f_test + v_test, v, v_test), None
    zeros = jnp.zeros_like(y_train), jnp.zeros((3, 1))
    (f, f_test, _, _), _ = jax.lax.scan(step, zeros + zeros, None,
                                        length=n_steps)
    self.assertGreater(float(jnp.abs(f).max()), 0.1)
    self.assertAllClose((fx_train, fx_test), (f, f_test), rtol=0, atol=3e-2)


class MaxLearningRateTest(test_utils.NeuralTangentsTestCase):

  def _final_loss_ratio(self, features, y_train, learning_rate, momentum):
    """Final / initial MSE of heavy-ball descent on a linear model."""
    def loss(w):
      return 0.5 * jnp.mean((jnp.einsum('iap,p->ia', features, w) -
                             y_train)**2)

    def step(state, _):
      w, v = state
      v = momentum * v - learning_rate * jax.grad(loss)(w)
      return (w + v, v), None

    w_0 = jnp.zeros(features.shape[-1])
    (w, _), _ = jax.lax.scan(step, (w_0, w_0), None, length=3000)
    return float(loss(w) / loss(w_0))

  @test_utils.sample_product(momentum=(0., 0.5), traced=(True, False))
  def test_is_threshold_of_divergence(self, momentum, traced):
    keys = jax.random.split(jax.random.PRNGKey(24), 2)
    n, out, n_features = 6, 2, 10
    features = jax.random.normal(keys[0], (n, out, n_features))
    y_train = jax.random.normal(keys[1], (n, out))
    if traced:
      # Each output has the same features on its own weights: the kernel is
      # the identity on the output axis, `features @ features.T` on the batch.
      base = features[:, 0]
      features = jnp.einsum('ip,ab->iapb', base, jnp.eye(out)).reshape(
          n, out, -1)
      lr = predict.max_learning_rate(base @ base.T, y_train.size, momentum)
    else:
      ntk = jnp.einsum('iap,jbp->ijab', features, features)
      lr = predict.max_learning_rate(ntk, momentum=momentum)
    self.assertIsInstance(lr, float)
    self.assertLess(self._final_loss_ratio(features, y_train, 0.95 * lr,
                                           momentum), 1.)
    self.assertGreater(self._final_loss_ratio(features, y_train, 1.05 * lr,
                                              momentum), 1e10)


# Regularization, NTK-GP, kernel_fn kwargs (the published release's case 4 is
# in tests/compat_test.py).


def _flow_map(theta_reg, theta_test_train, tau):
  """`Theta_* Theta^-1 (I - exp(-Theta tau))`; `Theta_* Theta^-1` at None."""
  n = theta_reg.shape[0]
  relaxed = jnp.eye(n) if tau is None else (
      jnp.eye(n) - jsp_linalg.expm(-tau * theta_reg))
  return jnp.linalg.solve(theta_reg, theta_test_train.T).T @ relaxed


def _relative_reg(k, diag_reg):
  """The published scaling: `diag_reg * trace(k) / n` added to the diagonal."""
  n = k.shape[0]
  return k + diag_reg * jnp.trace(k) / n * jnp.eye(n)


def _train_test_kernels(x_train, x_test):
  """Train-train, test-train and test-test kernels of `_relu_kernels`."""
  return (_relu_kernels(x_train, x_train), _relu_kernels(x_test, x_train),
          _relu_kernels(x_test, x_test))


class DiagRegTest(test_utils.NeuralTangentsTestCase):

  def test_only_the_inverted_kernel_is_regularized(self):
    """'ntk' covariances use the NNGP as is; 'nngp' the regularized NNGP."""
    x_train, y_train, x_test = _data(jax.random.PRNGKey(30), out_dim=2)
    diag_reg = 0.05
    k, k_s, k_ss = _train_test_kernels(x_train, x_test)
    theta_reg = _relative_reg(k.ntk, diag_reg)
    k_reg = _relative_reg(k.nngp, diag_reg)
    predict_fn = predict.gradient_descent_mse_ensemble(
        _relu_kernel_fn, x_train, y_train, diag_reg=diag_reg)
    gp = predict.gp_inference(k, y_train, diag_reg=diag_reg)
    for t in (0., 4., None):
      tau = None if t is None else t / y_train.size
      out = predict_fn(t, x_test, compute_cov=True)
      # Trained networks: f_0 has the NNGP prior, unregularized.
      a = _flow_map(theta_reg, k_s.ntk, tau)
      self.assertAllClose(out.ntk.mean, a @ y_train, rtol=1e-9, atol=1e-9)
      self.assertAllClose(
          out.ntk.covariance,
          k_ss.nngp - a @ k_s.nngp.T - k_s.nngp @ a.T + a @ k.nngp @ a.T,
          rtol=1e-9, atol=1e-9)
      # Readout only: the noisy-observation posterior of the NNGP.
      a = _flow_map(k_reg, k_s.nngp, tau)
      self.assertAllClose(out.nngp.mean, a @ y_train, rtol=1e-9, atol=1e-9)
      self.assertAllClose(
          out.nngp.covariance,
          k_ss.nngp - a @ k_s.nngp.T - k_s.nngp @ a.T + a @ k_reg @ a.T,
          rtol=1e-9, atol=1e-9)
    self.assertAllClose(gp(None, k_s, k_ss), out, rtol=1e-9, atol=1e-9)


  @parameterized.named_parameters(('relative', False), ('absolute', True))
  def test_traced_kernel_gets_the_same_regularizer(self, absolute):
    """Under `jax.jit` the kernel is traced and the regularizer is computed
    on device: the same `diag_reg * trace(k) / n` as on the host."""
    keys = jax.random.split(jax.random.PRNGKey(32), 2)
    k_all = _random_psd(keys[0], 10)
    k, k_s = k_all[:7, :7], k_all[7:, :7]
    y_train = jax.random.normal(keys[1], (7, 2))
    diag_reg = 0.3
    k_reg = (k + diag_reg * jnp.eye(7) if absolute
             else _relative_reg(k, diag_reg))
    expected = k_s @ jnp.linalg.solve(k_reg, y_train)

    def gp_mean(k, k_s):
      return predict.gp_inference(k, y_train, diag_reg=diag_reg,
                                  diag_reg_absolute_scale=absolute)(
                                      'nngp', k_s)

    def flow_mean(k, k_s):
      zeros = jnp.zeros_like(y_train)
      return predict.gradient_descent_mse(
          k, y_train, diag_reg=diag_reg,
          diag_reg_absolute_scale=absolute)(None, zeros, zeros[:3], k_s)[1]

    for fn in (gp_mean, flow_mean):
      with self.subTest(fn.__name__):
        self.assertAllClose(jax.jit(fn)(k, k_s), expected, rtol=1e-9,
                            atol=1e-9)
        self.assertAllClose(fn(k, k_s), expected, rtol=1e-9, atol=1e-9)


class NtkGpTest(test_utils.NeuralTangentsTestCase):

  def test_gp_inference_is_posterior_with_ntk_prior(self):
    keys = jax.random.split(jax.random.PRNGKey(31), 3)
    nngp = _random_psd(keys[0], 10)
    ntk = nngp + _random_psd(keys[1], 10)
    y_train = jax.random.normal(keys[2], (7, 2))
    diag_reg = 0.1
    theta_reg = _relative_reg(ntk[:7, :7], diag_reg)
    theta_s, theta_ss = ntk[7:, :7], ntk[7:, 7:]

    predict_fn = predict.gp_inference(_Kernels(nngp[:7, :7], ntk[:7, :7]),
                                      y_train, diag_reg=diag_reg)
    out = predict_fn(('ntkgp', 'nngp'), _Kernels(nngp[7:, :7], theta_s),
                     _Kernels(nngp[7:, 7:], theta_ss))
    self.assertEqual(out._fields, ('ntkgp', 'nngp'))
    self.assertAllClose(out.ntkgp.mean,
                        theta_s @ jnp.linalg.solve(theta_reg, y_train),
                        rtol=1e-9, atol=1e-9)
    self.assertAllClose(
        out.ntkgp.covariance,
        theta_ss - theta_s @ jnp.linalg.solve(theta_reg, theta_s.T),
        rtol=1e-9, atol=1e-9)
    self.assertAllClose(
        out.nngp, predict_fn('nngp', _Kernels(nngp[7:, :7], theta_s),
                             _Kernels(nngp[7:, 7:], theta_ss)))
    # 'ntkgp' needs only the NTK.
    ntk_only = predict.gp_inference(_Kernels(None, ntk[:7, :7]), y_train,
                                    diag_reg=diag_reg)
    self.assertAllClose(
        ntk_only('ntkgp', _Kernels(None, theta_s), _Kernels(None, theta_ss)),
        out.ntkgp, rtol=1e-12, atol=1e-12)

  def test_ensemble_is_gradient_flow_with_ntk_prior(self):
    """`cov = Theta** - Theta* Theta^-1 (I - exp(-2 Theta tau)) Theta*^T`."""
    x_train, y_train, x_test = _data(jax.random.PRNGKey(32), out_dim=2)
    diag_reg = 0.02
    k, k_s, k_ss = _train_test_kernels(x_train, x_test)
    theta_reg = _relative_reg(k.ntk, diag_reg)
    predict_fn = predict.gradient_descent_mse_ensemble(
        _relu_kernel_fn, x_train, y_train, diag_reg=diag_reg)
    times = jnp.array([0., 3., 30.])
    out = predict_fn(times, x_test, ('ntkgp', 'ntk'), compute_cov=True)
    self.assertEqual(out._fields, ('ntkgp', 'ntk'))
    self.assertEqual(out.ntkgp.covariance.shape, (3, 3, 3))
    self.assertAllClose(out.ntk.mean, out.ntkgp.mean, rtol=1e-12, atol=1e-12)
    for i, t in enumerate(times):
      tau = t / y_train.size
      theta_inv_theta_s = jnp.linalg.solve(theta_reg, k_s.ntk.T)
      relaxed = jnp.eye(6) - jsp_linalg.expm(-tau * theta_reg)
      relaxed_twice = jnp.eye(6) - jsp_linalg.expm(-2 * tau * theta_reg)
      self.assertAllClose(out.ntkgp.mean[i],
                          theta_inv_theta_s.T @ relaxed @ y_train,
                          rtol=1e-9, atol=1e-9)
      self.assertAllClose(
          out.ntkgp.covariance[i],
          k_ss.ntk - theta_inv_theta_s.T @ relaxed_twice @ k_s.ntk.T,
          rtol=1e-9, atol=1e-9)
    # Infinite time is the GP posterior; and the NNGP answer differs.
    gp = predict.gp_inference(k, y_train, diag_reg=diag_reg)
    at_infinity = predict_fn(None, x_test, 'ntkgp', compute_cov=True)
    self.assertAllClose(at_infinity, gp('ntkgp', k_s, k_ss), rtol=1e-9,
                        atol=1e-9)
    self.assertGreater(
        test_utils.relative_error(
            at_infinity.covariance,
            predict_fn(None, x_test, 'ntk', compute_cov=True).covariance),
        1e-2)

  def test_ntkgp_does_not_compute_the_nngp(self):
    x_train, y_train, x_test = _data(jax.random.PRNGKey(33))
    gets = []

    def recording_kernel_fn(x1, x2=None, get=None, **kwargs):
      gets.append(get)
      return _relu_kernel_fn(x1, x2, get, **kwargs)

    predict_fn = predict.gradient_descent_mse_ensemble(
        recording_kernel_fn, x_train, y_train)
    predict_fn(2., x_test, 'ntkgp', compute_cov=True)
    self.assertEqual(gets, [('ntk',)] * 3)

  def test_unknown_get_raises(self):
    x_train, y_train, _ = _data(jax.random.PRNGKey(34))
    predict_fn = predict.gradient_descent_mse_ensemble(
        _relu_kernel_fn, x_train, y_train)
    with self.assertRaisesRegex(ValueError,
                                r"asks for 'ntk_gp'.*did you mean 'ntkgp'"):
      predict_fn(1., None, 'ntk_gp')
    with self.assertRaisesRegex(ValueError, 'ntkgp'):
      predict.gp_inference(jnp.eye(6), y_train)(('nngp', 'gp'))


class KernelFnKwargsTest(test_utils.NeuralTangentsTestCase):

  def _graph_data(self, key):
    """Sequences `(4, 5, 3)` with random dense adjacency patterns.

    Train and test sets have the same shapes, so that `kernel_fn` compiles its
    pieces once for all three kernels.
    """
    keys = jax.random.split(key, 5)
    x_train = jax.random.normal(keys[0], (4, 5, 3))
    x_test = jax.random.normal(keys[1], (4, 5, 3))
    p_train = jax.random.bernoulli(keys[2], 0.5, (4, 5, 5)).astype(float)
    p_test = jax.random.bernoulli(keys[3], 0.5, (4, 5, 5)).astype(float)
    y_train = jax.random.normal(keys[4], (4, 1))
    return x_train, x_test, p_train, p_test, y_train

  def test_pattern_reaches_every_kernel_of_an_aggregate_network(self):
    stax = nt.stax
    _, _, kernel_fn = stax.serial(stax.Dense(8), stax.Aggregate(), stax.Relu(),
                                  stax.GlobalSumPool(), stax.Dense(1))
    x_train, x_test, p_train, p_test, y_train = self._graph_data(
        jax.random.PRNGKey(35))
    k = kernel_fn(x_train, None, pattern=(p_train, None))
    k_s = kernel_fn(x_test, x_train, pattern=(p_test, p_train))
    k_ss = kernel_fn(x_test, None, pattern=(p_test, p_test))

    predict_fn = predict.gradient_descent_mse_ensemble(
        kernel_fn, x_train, y_train, diag_reg=1e-3, pattern=(p_train, None))
    out = predict_fn(None, x_test, compute_cov=True, pattern=(p_test, None))
    expected = predict.gp_inference(k, y_train, diag_reg=1e-3)(None, k_s, k_ss)
    self.assertAllClose(out, expected, rtol=1e-9, atol=1e-9)
    # The second entry of a self pair may be `None` or repeat the first.
    times = jnp.array([1., 10.])
    _, expected_mean = predict.gradient_descent_mse(
        k.ntk, y_train, diag_reg=1e-3)(times, 0., 0., k_s.ntk)
    self.assertAllClose(
        predict_fn(times, x_test, 'ntk', pattern=(p_test, p_test)),
        expected_mean, rtol=1e-9, atol=1e-9)
    # The check has power: the identity pattern gives another answer.
    identity_s = kernel_fn(x_test, x_train, pattern=(p_test, None))
    self.assertGreater(test_utils.relative_error(identity_s.ntk, k_s.ntk),
                       1e-2)

  def test_each_kernel_gets_its_kwargs(self):
    x_train, y_train, x_test = _data(jax.random.PRNGKey(36))
    calls = []

    def recording_kernel_fn(x1, x2=None, get=None, **kwargs):
      calls.append((x1 is x_test, x2 is x_train, kwargs))
      return _relu_kernel_fn(x1, x2, get)

    key = jax.random.PRNGKey(1)
    predict_fn = predict.gradient_descent_mse_ensemble(
        recording_kernel_fn, x_train, y_train, pattern=('train', None),
        rng=key, scale=2.)
    predict_fn(1., x_test, 'nngp', compute_cov=True, pattern=('test', None),
               rng=jax.random.PRNGKey(1), extra='test only')
    train_train, test_train, test_test = calls
    self.assertEqual(train_train[:2], (False, False))
    self.assertEqual(train_train[2].keys(), {'pattern', 'rng', 'scale'})
    self.assertEqual(train_train[2]['pattern'], ('train', None))
    self.assertEqual(test_train[:2], (True, True))
    self.assertEqual(test_train[2]['pattern'], ('test', 'train'))
    self.assertEqual((test_train[2]['scale'], test_train[2]['extra']),
                     (2., 'test only'))
    self.assertEqual(test_test[:2], (True, False))
    self.assertEqual(test_test[2]['pattern'], ('test', None))
    self.assertEqual((test_test[2]['scale'], test_test[2]['extra']),
                     (2., 'test only'))
    for _, _, kwargs in calls:
      self.assertAllClose(kwargs['rng'], key)

  def test_conflicting_single_values_raise(self):
    x_train, y_train, x_test = _data(jax.random.PRNGKey(37))
    predict_fn = predict.gradient_descent_mse_ensemble(
        _relu_kernel_fn, x_train, y_train, rng=jax.random.PRNGKey(1))
    with self.assertRaisesRegex(ValueError, '`rng`.*same `rng`'):
      predict_fn(1., x_test, rng=jax.random.PRNGKey(2))


class PublishedParityTest(test_utils.NeuralTangentsTestCase):
  """Published Neural Tangents 0.6.5 behaviour of `predict` (issue 20,
  items 12-17; issue 21, item 13)."""

  def _gp_kernels(self, key, n_train=6, n_test=3):
    keys = jax.random.split(key, 3)
    nngp = _random_psd(keys[0], n_train + n_test)
    ntk = nngp + _random_psd(keys[1], n_train + n_test)
    y_train = jax.random.normal(keys[2], (n_train, 2))
    split = lambda k: (k[:n_train, :n_train], k[n_train:, :n_train],
                       k[n_train:, n_train:])
    (k, k_s, k_ss), (t, t_s, t_ss) = split(nngp), split(ntk)
    return _Kernels(k, t), _Kernels(k_s, t_s), _Kernels(k_ss, t_ss), y_train

  def _assert_equal(self, actual, desired):
    self.assertAllClose(actual, desired, rtol=0, atol=0)

  def test_gp_inference_without_k_test_test_returns_means(self):
    k, k_s, k_ss, y_train = self._gp_kernels(jax.random.PRNGKey(40))
    predict_fn = predict.gp_inference(k, y_train, diag_reg=0.1)
    full = predict_fn(('ntk', 'nngp'), k_s, k_ss)
    # A string `get`: the mean array itself.
    mean = predict_fn('ntk', k_s)
    self.assertIsInstance(mean, jax.Array)
    self.assertAllClose(mean, full.ntk.mean, rtol=1e-12, atol=1e-12)
    theta = _relative_reg(k.ntk, 0.1)
    self.assertAllClose(mean, k_s.ntk @ jnp.linalg.solve(theta, y_train),
                        rtol=1e-9, atol=1e-9)
    # A tuple `get`: a `Gaussians` namedtuple of mean arrays.
    means = predict_fn(('ntk', 'nngp'), k_s)
    self.assertEqual(type(means).__name__, 'Gaussians')
    self.assertEqual(means._fields, ('ntk', 'nngp'))
    for name in ('ntk', 'nngp'):
      self.assertIsInstance(getattr(means, name), jax.Array)
      self.assertAllClose(getattr(means, name), getattr(full, name).mean,
                          rtol=1e-12, atol=1e-12)
    # Array kernels, `get=None`: the NNGP mean.
    self.assertAllClose(
        predict.gp_inference(k.nngp, y_train, diag_reg=0.1)(None, k_s.nngp),
        full.nngp.mean, rtol=1e-12, atol=1e-12)
    # With `k_test_test`: `Gaussian(mean, covariance)` as before.
    self.assertIsInstance(full.ntk, predict.Gaussian)
    self.assertEqual(full.ntk.covariance.shape, (3, 3))

  def test_gp_inference_on_training_set_ignores_diag_reg(self):
    """`k_test_train=None`: mean `y_train`, zero covariance, NTK only."""
    k, _, _, y_train = self._gp_kernels(jax.random.PRNGKey(41))
    predict_fn = predict.gp_inference(k, y_train, diag_reg=0.1)
    out = predict_fn(('nngp', 'ntk', 'ntkgp'), None, True)
    for gaussian in out:
      self._assert_equal(gaussian.mean, y_train)
      self._assert_equal(gaussian.covariance, jnp.zeros((6, 6)))
    self._assert_equal(predict_fn('ntk'), y_train)
    # 'ntk' on the training set needs no NNGP, and `k_test_test` is a flag.
    ntk_only = predict.gp_inference(_Kernels(None, k.ntk), y_train,
                                    diag_reg=0.1)
    self._assert_equal(ntk_only('ntk', None, True).covariance,
                          jnp.zeros((6, 6)))
    # The kernel is still checked against `y_train`.
    with self.assertRaisesRegex(ValueError, '`y_train` has 5 rows'):
      predict.gp_inference(k, y_train[:5])('ntk')

  def test_ensemble_on_training_set(self):
    x_train, y_train, _ = _data(jax.random.PRNGKey(42), out_dim=2)
    gets = []

    def recording_kernel_fn(x1, x2=None, get=None, **kwargs):
      gets.append(get)
      return _relu_kernel_fn(x1, x2, get, **kwargs)

    regularized = predict.gradient_descent_mse_ensemble(
        recording_kernel_fn, x_train, y_train, diag_reg=0.5)
    # Infinite time: exactly the targets, zero covariance, no NNGP computed.
    out = regularized(None, None, 'ntk', compute_cov=True)
    self.assertEqual(gets, [('ntk',)])
    self._assert_equal(out.mean, y_train)
    self._assert_equal(out.covariance, jnp.zeros((6, 6)))
    out = regularized(None, None, ('nngp', 'ntkgp'))
    self._assert_equal(out.nngp, y_train)
    self._assert_equal(out.ntkgp, y_train)
    # Finite times: as published, the flow of the regularized kernel
    # `Theta + r I` (`r = 0.5 trace(Theta) / 6`), `y - exp(-Theta_r t / n) y`
    # (`tests/predict/published_conventions_test.py` checks the covariances).
    ntk = _relu_kernels(x_train, x_train).ntk
    tau = 3. / y_train.size
    expected = y_train - jsp_linalg.expm(
        -tau * (ntk + 0.5 * jnp.trace(ntk) / 6 * jnp.eye(6))) @ y_train
    self.assertAllClose(regularized(3., None, 'ntk'), expected, rtol=1e-9,
                        atol=1e-9)
    # The check has power: the unregularized flow differs.
    unregularized = y_train - jsp_linalg.expm(-tau * ntk) @ y_train
    self.assertGreater(test_utils.relative_error(unregularized, expected),
                       1e-2)

  def test_traced_batch_axis_scalar_kernel_closed_form(self):
    """`f_t = y + exp(-lr t k / y.size) (f_0 - y)` for a scalar kernel."""
    keys = jax.random.split(jax.random.PRNGKey(43), 2)
    y_train = jax.random.normal(keys[0], (5, 2))
    fx_train_0 = jax.random.normal(keys[1], (5, 2))
    k, lr = jnp.array(3.), 0.7
    times = jnp.array([0.5, 2., 10.])
    decay = jnp.exp(-lr * times * k / y_train.size)[:, None, None]
    expected = y_train[None] + decay * (fx_train_0 - y_train)[None]
    mse = predict.gradient_descent_mse(k, y_train, lr, trace_axes=(0, -1))
    self.assertAllClose(mse(times, fx_train_0), expected, rtol=1e-12,
                        atol=1e-12)
    self.assertAllClose(mse(None, fx_train_0), y_train, rtol=1e-12,
                        atol=1e-12)
    loss = lambda fx, y: 0.5 * jnp.mean((fx - y)**2)
    ode = predict.gradient_descent(loss, k, y_train, lr, trace_axes=(-1, 0))
    self.assertAllClose(ode(times, fx_train_0), expected, rtol=1e-6,
                        atol=1e-6)

    def scalar_kernel_fn(x1, x2=None, get=None, **kwargs):
      del x1, x2, kwargs
      return _Kernels(k / 3, k) if get is None else k
    x_train = jnp.zeros((5, 1))
    ensemble = predict.gradient_descent_mse_ensemble(
        scalar_kernel_fn, x_train, y_train, lr, trace_axes=(0, 1))
    self.assertAllClose(ensemble(times, None, 'ntk'),
                        expected - decay * fx_train_0[None], rtol=1e-12,
                        atol=1e-12)
    self._assert_equal(ensemble(None, None, 'ntk'), y_train)

  def test_traced_batch_axis_is_identity_across_examples(self):
    """With repeated axes `(0, 0, -3)`, the same as `I_N (x) k` untraced."""
    n, h, c = 4, 3, 2
    keys = jax.random.split(jax.random.PRNGKey(44), 4)
    features = jax.random.normal(keys[0], (2, h, c, 12))
    k_all = jnp.einsum('ihap,jgbp->ijhgab', features, features) / 12
    k, k_s = k_all[0, 0], k_all[1, 0]  # (h, h, c, c)
    y_train = jax.random.normal(keys[1], (n, h, c))
    fx_train_0 = jax.random.normal(keys[2], (n, h, c))
    fx_test_0 = jax.random.normal(keys[3], (n, h, c))
    eye = jnp.eye(n).reshape(n, n, 1, 1, 1, 1)
    full, full_s = eye * k[None, None], eye * k_s[None, None]
    traced = predict.gradient_descent_mse(k, y_train, 0.5,
                                          trace_axes=(0, 0, -3))
    untraced = predict.gradient_descent_mse(full, y_train, 0.5, trace_axes=())
    for t in (2., None):
      self.assertAllClose(traced(t, fx_train_0, fx_test_0, k_s),
                          untraced(t, fx_train_0, fx_test_0, full_s),
                          rtol=1e-9, atol=1e-9)

  def test_traced_batch_axis_with_empirical_kernel(self):
    stax = nt.stax
    init_fn, apply_fn, _ = stax.serial(stax.Dense(16), stax.Relu(),
                                       stax.Dense(2))
    x_train, y_train, _ = _data(jax.random.PRNGKey(45), n_train=4, out_dim=2)
    _, params = init_fn(jax.random.PRNGKey(46), x_train.shape)
    k = nt.empirical_ntk_fn(apply_fn, trace_axes=(0, -1))(x_train, None,
                                                          params)
    self.assertEqual(k.shape, ())
    fx_train_0 = apply_fn(params, x_train)
    predict_fn = predict.gradient_descent_mse(k, y_train, trace_axes=(0, -1))
    self.assertEqual(predict_fn(1., fx_train_0).shape, y_train.shape)
    self.assertAllClose(predict_fn(None, fx_train_0), y_train, rtol=1e-9,
                        atol=1e-9)

  def test_ensemble_passes_constructor_kwargs_unchanged(self):
    stax = nt.stax
    init_fn, apply_fn, _ = stax.Dense(1, 1.5, 0.1)
    x_train, y_train, x_test = _data(jax.random.PRNGKey(47), n_train=4,
                                     n_test=2)
    _, params = init_fn(jax.random.PRNGKey(48), x_train.shape)
    self.assertIsInstance(params, tuple)
    self.assertLen(params, 2)  # `(W, b)`, not a pair of per-side values.
    calls = []
    empirical = nt.empirical_kernel_fn(apply_fn)

    def recording_kernel_fn(x1, x2=None, get=None, **kwargs):
      calls.append(kwargs['params'])
      return empirical(x1, x2, get, **kwargs)

    ensemble = predict.gradient_descent_mse_ensemble(
        recording_kernel_fn, x_train, y_train, diag_reg=1e-2, params=params)
    out = ensemble(None, x_test, 'ntk', compute_cov=True)
    self.assertLen(calls, 3)
    for value in calls:
      self.assertIs(value, params)
    kernels = lambda a, b: empirical(a, b, ('nngp', 'ntk'), params=params)
    expected = predict.gp_inference(kernels(x_train, None), y_train,
                                    diag_reg=1e-2)(
                                        'ntk', kernels(x_test, x_train),
                                        kernels(x_test, None))
    self.assertAllClose(out, expected, rtol=1e-9, atol=1e-9)

  def test_mse_skips_outputs_whose_initial_values_are_none(self):
    k = _random_psd(jax.random.PRNGKey(49), 7)
    y_train = jax.random.normal(jax.random.PRNGKey(50), (5, 1))
    predict_fn = predict.gradient_descent_mse(k[:5, :5], y_train)
    both = predict_fn(2., 0.5, 0.25, k[5:, :5])
    train_only = predict_fn(2., 0.5, None, k[5:, :5])
    self.assertIsInstance(train_only, jax.Array)
    self.assertAllClose(train_only, both[0], rtol=1e-12, atol=1e-12)
    test_only = predict_fn(2., None, 0.25, k[5:, :5])
    self.assertIsInstance(test_only, jax.Array)
    self.assertAllClose(test_only, predict_fn(2., 0., 0.25, k[5:, :5])[1],
                        rtol=1e-12, atol=1e-12)
    with self.assertRaisesRegex(ValueError, '`fx_train_0` and `fx_test_0`'):
      predict_fn(2., None, None, k[5:, :5])

  def test_ntk_covariance_of_bare_arrays_raises(self):
    k, k_s, k_ss, y_train = self._gp_kernels(jax.random.PRNGKey(51))
    predict_fn = predict.gp_inference(k.ntk, y_train)
    with self.assertRaisesRegex(ValueError,
                                '`k_train_train` is a bare array.*nngp.*ntk'):
      predict_fn('ntk', k_s.ntk, k_ss.ntk)
    with self.assertRaisesRegex(ValueError, '`k_test_train` is a bare array'):
      predict.gp_inference(k, y_train)('ntk', k_s.ntk, k_ss)
    # A bare `k_test_test` is the NNGP test-test kernel, as published.
    self.assertAllClose(predict.gp_inference(k, y_train)('ntk', k_s, k_ss.nngp),
                        predict.gp_inference(k, y_train)('ntk', k_s, k_ss))
    # Means, and the one-kernel posteriors, still take arrays.
    self.assertEqual(predict_fn('ntk', k_s.ntk).shape, (3, 2))
    self.assertEqual(predict_fn('ntkgp', k_s.ntk, k_ss.ntk).covariance.shape,
                     (3, 3))

  def test_empty_inputs(self):
    """No training points: an error; no test points: empty outputs."""
    k, _, _, _ = self._gp_kernels(jax.random.PRNGKey(52))
    with self.assertRaisesRegex(ValueError,
                                r'`y_train` has shape \(0, 2\).*at least one'):
      predict.gp_inference(k.ntk[:0, :0], jnp.zeros((0, 2)))
    x_train, y_train, x_test = _data(jax.random.PRNGKey(53), out_dim=2)
    ensemble = predict.gradient_descent_mse_ensemble(
        _relu_kernel_fn, x_train, y_train, diag_reg=1e-3)
    out = ensemble(jnp.array([1., 2.]), x_test[:0], compute_cov=True)
    for gaussian in out:
      self.assertEqual(gaussian.mean.shape, (2, 0, 2))
      self.assertEqual(gaussian.covariance.shape, (2, 0, 0))
    self.assertEqual(ensemble(None, x_test[:0], 'ntk').shape, (0, 2))


if __name__ == '__main__':
  absltest.main()
