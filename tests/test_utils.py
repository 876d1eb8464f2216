"""Shared test fixtures: backend-dependent tolerances and a base test case."""
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import parameterized

# Relative tolerances per (backend, dtype). GPU/TPU matmuls may use reduced
# precision internally, so their float32 tolerances are looser.
_TOLERANCES = {
    ('cpu', np.float32): 1e-4,
    ('cpu', np.float64): 1e-10,
    ('gpu', np.float32): 5e-3,
    ('gpu', np.float64): 1e-10,
    ('tpu', np.float32): 2e-2,
    ('tpu', np.float64): 1e-5,
}


def backend() -> str:
  """The default JAX backend: 'cpu', 'gpu' or 'tpu'."""
  return jax.default_backend()


def tolerance(dtype=None, cpu=None, gpu=None, tpu=None) -> float:
  """Relative tolerance for `dtype` on the current backend.

  Args:
    dtype: dtype of the computation (defaults to JAX's default float).
    cpu, gpu, tpu: per-backend overrides.
  """
  override = {'cpu': cpu, 'gpu': gpu, 'tpu': tpu}.get(backend())
  if override is not None:
    return override
  dtype = np.dtype(dtype or jnp.zeros(()).dtype).type
  return _TOLERANCES.get((backend(), dtype), 1e-4)


class NeuralTangentsTestCase(parameterized.TestCase):
  """Base test case with array assertions using per-backend tolerances."""

  def assertAllClose(self, actual, desired, rtol=None, atol=None, msg=''):
    """Asserts two pytrees of arrays are close (tolerance from the backend)."""
    actual_leaves = jax.tree_util.tree_leaves(actual)
    desired_leaves = jax.tree_util.tree_leaves(desired)
    self.assertEqual(len(actual_leaves), len(desired_leaves), msg)
    for a, d in zip(actual_leaves, desired_leaves):
      a, d = np.asarray(a), np.asarray(d)
      self.assertEqual(a.shape, d.shape, msg)
      tol = tolerance(a.dtype) if rtol is None else rtol
      np.testing.assert_allclose(a, d, rtol=tol,
                                 atol=tol if atol is None else atol,
                                 err_msg=msg)

  def assertFinite(self, tree, msg=''):
    """Asserts every array in a pytree is free of NaN and inf."""
    for leaf in jax.tree_util.tree_leaves(tree):
      self.assertTrue(np.all(np.isfinite(np.asarray(leaf))),
                      f'{msg} non-finite values: {leaf}')


def monte_carlo_kernels(init_fn, apply_fn, x1, x2, n_samples, key,
                        compute_ntk=True, batch_size=None, apply_kwargs=None):
  """Monte Carlo NNGP and NTK of a finite stax network, from first principles.

  NNGP: mean over initializations and output channels of `f(x1) f(x2)^T`.
  NTK: mean over initializations of `J(x1) J(x2)^T` for output channel 0, with
  the Jacobians w.r.t. all params taken with `jax.jacobian` (no library code).
  Every output channel has the same distribution, so channel 0 is unbiased,
  and a wide readout (many channels) only reduces the NNGP's variance.

  Args:
    init_fn, apply_fn: the finite network.
    x1, x2: inputs `(N1, ..., C)` and `(N2, ..., C)`; the output's last axis
      is its channel axis.
    n_samples: number of random initializations.
    key: PRNG key.
    compute_ntk: whether to estimate the NTK too.
    batch_size: number of samples vmapped at once (all when None).
    apply_kwargs: function of the sample's key returning kwargs for
      `apply_fn` (e.g. an `rng`), or None.

  Returns:
    `(nngp, ntk)` estimates with layout `(N1, N2, ...)` (all output positions
    paired as `(S_1, S_1', ...)`); `ntk` is None if not computed.
  """
  def one_sample(k):
    k_init, k_apply = jax.random.split(k)
    _, params = init_fn(k_init, x1.shape)
    kwargs = {} if apply_kwargs is None else apply_kwargs(k_apply)
    f = lambda p, x: apply_fn(p, x, **kwargs)
    f1 = f(params, x1)
    f2 = f(params, x2)
    nngp = _pair_mean(f1, f2)
    if not compute_ntk:
      return nngp, jnp.zeros_like(nngp)
    f0 = lambda p, x: f(p, x)[..., 0]
    j1 = jax.jacobian(f0)(params, x1)
    j2 = jax.jacobian(f0)(params, x2)
    ntk = sum(_pair_jac(a, b, f1.ndim - 1) for a, b in zip(
        jax.tree_util.tree_leaves(j1), jax.tree_util.tree_leaves(j2)))
    return nngp, ntk

  keys = jax.random.split(key, n_samples)
  batch_size = batch_size or n_samples
  nngp, ntk = 0., 0.
  fn = jax.jit(jax.vmap(one_sample))
  for i in range(0, n_samples, batch_size):
    nngp_i, ntk_i = fn(keys[i:i + batch_size])
    nngp += nngp_i.sum(0)
    ntk += ntk_i.sum(0)
  return nngp / n_samples, (ntk / n_samples if compute_ntk else None)


def _interleave_pairs(x, n_spatial):
  # (N1, S..., N2, S'...) -> (N1, N2, S1, S1', ...)
  order = [0, 1 + n_spatial]
  for i in range(n_spatial):
    order += [1 + i, 2 + n_spatial + i]
  return jnp.transpose(x, order)


def _pair_mean(f1, f2):
  n_spatial = f1.ndim - 2
  out = jnp.tensordot(f1, f2, axes=(-1, -1)) / f1.shape[-1]
  return _interleave_pairs(out, n_spatial)


def _pair_jac(j1, j2, out_ndim):
  """Contracts Jacobians `(N, S..., P...)` over params into the pair layout."""
  p_axes = tuple(range(out_ndim, j1.ndim))
  out = jnp.tensordot(j1, j2, axes=(p_axes, p_axes))
  return _interleave_pairs(out, out_ndim - 1)


def relative_error(actual, expected) -> float:
  """Max absolute error relative to the largest entry of `expected`."""
  actual, expected = np.asarray(actual), np.asarray(expected)
  return float(np.max(np.abs(actual - expected)) / np.max(np.abs(expected)))


def monte_carlo_errors(init_fn, apply_fn, kernel_fn, x1, x2, key=None,
                       n_nngp=256, n_ntk=64, batch_size=16, **kernel_kwargs):
  """Relative errors of the analytic NNGP and NTK against Monte Carlo.

  The NNGP estimate (forward passes only) is cheap, so it uses more samples
  than the NTK's (Jacobians).

  Returns:
    `(nngp_error, ntk_error)` as `relative_error(monte_carlo, analytic)`.
  """
  key = jax.random.PRNGKey(0) if key is None else key
  k = kernel_fn(x1, x2, ('nngp', 'ntk'), **kernel_kwargs)
  nngp, _ = monte_carlo_kernels(init_fn, apply_fn, x1, x2, n_nngp, key,
                                compute_ntk=False, batch_size=4 * batch_size)
  _, ntk = monte_carlo_kernels(init_fn, apply_fn, x1, x2, n_ntk, key,
                               batch_size=batch_size)
  return relative_error(nngp, k.nngp), relative_error(ntk, k.ntk)


def stax_inputs(shape1=(3, 6), shape2=(2, 6)):
  """Inputs `x1`, `x2` whose rows have different norms.

  Rows of `x1` are scaled by 1/2, 1, 3/2, ... and `x2` by 2, so that a kernel
  that wrongly assumes unit-norm inputs fails.
  """
  x1 = jax.random.normal(jax.random.PRNGKey(1), shape1)
  x1 = x1 * jnp.arange(1, shape1[0] + 1).reshape((-1,) + (1,) * (
      len(shape1) - 1)) / 2
  x2 = 2 * jax.random.normal(jax.random.PRNGKey(2), shape2)
  return x1, x2
