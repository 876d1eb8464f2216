"""Shared test fixtures: backend-dependent tolerances, a base test case, input
batches, and Monte Carlo / empirical estimates of kernels of finite networks.

Import it as `from tests import test_utils` (the repository root is on
`sys.path` under `python -m pytest`).
"""
import enum
import itertools
import os
import random
import re
from typing import Any, Callable, Optional, Sequence
import zlib

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

import neural_tangents as nt
from neural_tangents._src.utils import kernel as kernel_lib

# The default tier runs a seeded subset of each parameter cross product that
# covers every pair of option values (`sample_product`); `NT_TEST_FULL=1` runs
# every case, and `NT_TEST_CASES=N` at least `N` cases of each product.
FULL = os.environ.get('NT_TEST_FULL', '') not in ('', '0')
_CASES = int(os.environ.get('NT_TEST_CASES', '0') or 0)
_SEED = int(os.environ.get('NT_TEST_SEED', '0') or 0)


def case_label(value: Any) -> str:
  """A short, stable name for a parameter value, used in test names."""
  if isinstance(value, enum.Enum):
    return value.name.lower()
  if value is None or isinstance(value, (bool, int, float, str)):
    return re.sub(r'[^0-9A-Za-z.+-]+', '_', str(value)).strip('_') or 'empty'
  if isinstance(value, type) or callable(value):
    return getattr(value, '__name__', type(value).__name__)
  if isinstance(value, np.dtype):
    return value.name
  if isinstance(value, (tuple, list)):
    return 'x'.join(case_label(v) for v in value) or 'empty'
  if isinstance(value, dict):
    return '_'.join(case_label(v) for v in value.values()) or 'empty'
  return type(value).__name__


def _labelled(values: Any) -> list[tuple[str, Any]]:
  """`(label, value)` pairs of a factor: a dict is `{label: value}`."""
  if isinstance(values, dict):
    return list(values.items())
  values = list(values)
  labels = [case_label(v) for v in values]
  if len(set(labels)) < len(labels):  # Ambiguous labels: number them.
    labels = [f'{label}{i}' for i, label in enumerate(labels)]
  return list(zip(labels, values))


def covering_subset(sizes: Sequence[int], seed: int,
                    n_cases: int = 0) -> list[tuple[int, ...]]:
  """Indices of a seeded subset of a cross product covering all pairs.

  Greedy construction: starting from a random case, repeatedly add the case
  of the product that covers the most not yet covered pairs
  `(factor i = value a, factor j = value b)` (ties broken by a seeded
  shuffle), until every pair is covered and at least `n_cases` are taken.

  Args:
    sizes: the number of values of each factor.
    seed: the seed of the shuffle (the same subset on every process, which
      pytest-xdist requires of a collection).
    n_cases: the least number of cases to take (capped at the product).

  Returns:
    The chosen index tuples, in the product's order.
  """
  product = list(itertools.product(*(range(n) for n in sizes)))
  rng = random.Random(seed)
  rng.shuffle(product)

  def pairs_of(case):
    # Every value of each factor, and every pair of values of two factors.
    return {(i, case[i], j, case[j])
            for i, j in itertools.combinations_with_replacement(
                range(len(case)), 2)}

  uncovered = set().union(*(pairs_of(c) for c in product)) if product else set()
  chosen, rest = [], list(product)
  while rest and (uncovered or len(chosen) < n_cases):
    best = max(range(len(rest)),
               key=lambda k: len(pairs_of(rest[k]) & uncovered))
    case = rest.pop(best)
    uncovered -= pairs_of(case)
    chosen.append(case)
  return sorted(chosen)


def sample_cases(*factors: Any, seed_name: str = '',
                 **named_factors: Any) -> list[dict[str, Any]]:
  """Test cases of a cross product: all with `NT_TEST_FULL=1`, else a seeded
  subset covering every pair of option values (as JAX's `sample_product`).

  Args:
    *factors: factors whose values are dicts of keyword arguments (coupled
      parameters), as a list of dicts or a `{label: dict}`.
    seed_name: mixed into the seed, so that tests with the same factors get
      different subsets.
    **named_factors: `name=values`, the values a sequence (labelled by
      `case_label`) or a `{label: value}` dict.

  Returns:
    `named_parameters` cases: dicts with a `testcase_name` and the keyword
    arguments of the test.
  """
  columns = [_labelled(f) for f in factors]
  columns += [[(f'{n}_{label}' if len(named_factors) > 1 else label, {n: v})
               for label, v in _labelled(values)]
              for n, values in named_factors.items()]
  sizes = [len(c) for c in columns]
  if FULL:
    indices = list(itertools.product(*(range(n) for n in sizes)))
  else:
    key = seed_name + '|' + ','.join(named_factors) + f'|{sizes}|{_SEED}'
    indices = covering_subset(sizes, zlib.crc32(key.encode()), _CASES)
  cases = []
  for index in indices:
    picks = [columns[f][i] for f, i in enumerate(index)]
    case = {'testcase_name': '_'.join(label for label, _ in picks)}
    for _, kwargs in picks:
      case.update(kwargs)
    cases.append(case)
  return cases


def sample_product(*factors: Any, **named_factors: Any) -> Callable:
  """Decorator: `parameterized.named_parameters` of `sample_cases(...)`.

  Example:
    @test_utils.sample_product(implementation=IMPLEMENTATIONS,
                               vmap_axes=(None, 0), axes=AXES)
    def test_matches_jacobian(self, implementation, vmap_axes, axes): ...
  """
  def decorator(test_fn):
    cases = sample_cases(*factors, seed_name=test_fn.__name__, **named_factors)
    return parameterized.named_parameters(*cases)(test_fn)
  return decorator


def full_tier_cases(representative: Sequence[Any],
                    extra: Sequence[Any]) -> list[Any]:
  """The representative cases, and the extra ones with `NT_TEST_FULL=1`.

  For hand-picked sweeps where pairwise sampling does not apply; the extra
  cases are not collected at all in the default tier.
  """
  return list(representative) + (list(extra) if FULL else [])


def full_tier_only(test: Callable) -> Optional[Callable]:
  """A whole test that exists only with `NT_TEST_FULL=1` (a heavier
  repetition of what a default test checks).

  In the default tier the decorated name is bound to `None`, so the test is
  not collected at all (not even as a skip). Use it outermost, above any
  `parameterized` decorator.
  """
  return test if FULL else None


# The repository root (child processes get it as PYTHONPATH).
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

try:
  import zarr  # pylint: disable=g-import-not-at-top,unused-import
  HAVE_ZARR = True
except ImportError:  # The `store` extra (in the `test` extra) is missing.
  HAVE_ZARR = False

# Skips a test of the on-disk kernel store when zarr is missing.
needs_zarr = absltest.skipIf(not HAVE_ZARR,
                             'needs zarr: pip install ".[store]"')


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


# XLA's defaults, for `optimized_jit`: `conftest.py` turns them off for the
# suite's thousands of short programs, which compile 2x faster without them.
_XLA_DEFAULT_OPTIONS = {'xla_backend_optimization_level': 3,
                        'xla_cpu_use_fusion_emitters': True}


def optimized_jit(fn: Callable, **jit_kwargs) -> Callable:
  """`jax.jit` with XLA's default optimizations, for long-running programs.

  A Monte Carlo estimate runs one program for seconds, where the unoptimized
  code of `conftest.py`'s flags is 2-3x slower (the ensemble's Monte Carlo
  test took 50 s with them). Where those flags are set, this compiles `fn`
  with XLA's defaults instead (`compiler_options` override them per
  program); elsewhere it is `jax.jit`.
  """
  if '--xla_backend_optimization_level=0' in os.environ.get('XLA_FLAGS', ''):
    jit_kwargs['compiler_options'] = dict(_XLA_DEFAULT_OPTIONS)
  return jax.jit(fn, **jit_kwargs)


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
    nngp = pair_covariance(f1, f2)
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
  fn = optimized_jit(jax.vmap(one_sample))
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


def pair_covariance(f1, f2):
  """Channel-averaged covariance of `(N, S..., C)` activations, in the
  `Kernel` layout `(N1, N2, S_1, S_1', ..., S_d, S_d')`."""
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


def random_inputs(shape1, shape2, x2_scale=1., seed=1):
  """Standard normal `x1` (key `seed`) and `x2_scale` times a standard normal
  `x2` (key `seed + 1`)."""
  x1 = jax.random.normal(jax.random.PRNGKey(seed), shape1)
  x2 = jax.random.normal(jax.random.PRNGKey(seed + 1), shape2)
  return x1, x2 if x2_scale == 1. else x2_scale * x2


def stax_inputs(shape1=(3, 6), shape2=(2, 6), row_scale_denominator=2):
  """Inputs `x1`, `x2` whose rows have different norms.

  Rows of `x1` are scaled by 1/d, 2/d, 3/d, ... (`d = row_scale_denominator`)
  and `x2` by 2, so that a kernel that wrongly assumes unit-norm inputs fails.
  """
  x1 = jax.random.normal(jax.random.PRNGKey(1), shape1)
  x1 = x1 * jnp.arange(1, shape1[0] + 1).reshape((-1,) + (1,) * (
      len(shape1) - 1)) / row_scale_denominator
  x2 = 2 * jax.random.normal(jax.random.PRNGKey(2), shape2)
  return x1, x2


def graded_inputs(shape1, shape2, dtype=np.float32):
  """Examples of different norms (0.5 to 1.6 times standard normal), drawn
  with NumPy so that they are the same in float32 and float64."""
  rng = np.random.RandomState(0)
  x1 = rng.randn(*shape1) * np.linspace(0.5, 1.6, shape1[0]).reshape(
      (-1,) + (1,) * (len(shape1) - 1))
  x2 = rng.randn(*shape2)
  return jnp.asarray(x1, dtype), jnp.asarray(x2, dtype)


def correlated_inputs(shape1, shape2, seed=1):
  """Two input batches, with examples of different norms.

  `x2` is correlated with `x1`, so that covariances between them are as large
  as variances and Monte Carlo errors relative to the largest entry are
  meaningful.
  """
  x1 = jax.random.normal(jax.random.PRNGKey(seed), shape1)
  scale = 1 + 0.5 * jnp.arange(shape1[0])
  x1 = x1 * scale.reshape((-1,) + (1,) * (len(shape1) - 1))
  noise = jax.random.normal(jax.random.PRNGKey(seed + 1), shape2)
  return x1, 0.9 * x1[:shape2[0]] + 0.5 * noise


# Monte Carlo checks of layers in wide networks (convolutions, pooling, ...).

MC_TOL = 0.05  # Max error relative to the kernel's largest entry.
WIDTH = 512  # Hidden channels of the finite networks.
READOUT = 512  # Output channels averaged over for the NNGP estimate.
N_SAMPLES = 64
MASK = 1e3  # `mask_constant` of masked tests: leaking it would show.
EMPIRICAL_TOL = 0.1  # Relative NTK error of the widest network.


def fast_key(seed: int) -> jax.Array:
  """A PRNG key whose random draws compile fast.

  The 'rbg' generator compiles several times faster than threefry on CPU,
  which dominates the cost of small Monte Carlo estimates.
  """
  return jax.random.key(seed, impl='rbg')


def kernels(kernel_fn, x1, x2, get=('nngp', 'ntk'), **kwargs):
  """`kernel_fn(x1, x2, get, **kwargs)`, jitted.

  One compilation of the whole kernel is several times faster than running
  its many small ops eagerly, each compiled on first use.
  """
  fn = jax.jit(kernel_fn, static_argnames=('get', 'diagonal_batch',
                                           'diagonal_spatial',
                                           'mask_constant'))
  return fn(x1, x2, get=get, **kwargs)


def plain_outputs(apply_fn, mask_constant):
  """`apply_fn` with `mask_constant=`, returning the masked outputs' values
  (zero where masked) as plain arrays, for the Monte Carlo estimator."""
  def fn(params, x, **kwargs):
    out = apply_fn(params, x, mask_constant=mask_constant, **kwargs)
    return getattr(out, 'masked_value', out)
  return fn


def mask_positions(x, masked):
  """`x` with `MASK` at the positions (all channels) where `masked` is True.

  Args:
    x: `(N, S..., C)` inputs.
    masked: boolean `(N, S...)`.
  """
  return jnp.where(masked[..., None], MASK, x)


def trailing_mask(x, first_masked):
  """Masks example `n` from position `first_masked[n]` of the first spatial
  axis on: variable-length sequences, or images padded with rows."""
  size = x.shape[1]
  position = jnp.arange(size).reshape((1, size) + (1,) * (x.ndim - 3))
  first = jnp.array(first_masked).reshape((-1,) + (1,) * (x.ndim - 2))
  return mask_positions(x, jnp.broadcast_to(position >= first, x.shape[:-1]))


def maybe_masked_inputs(shapes, masked):
  """`correlated_inputs(*shapes)`, with trailing positions masked if
  `masked`: the last one and last three of `x1`'s examples, the last two of
  `x2`'s. Returns `(x1, x2, mask_constant or None)`."""
  x1, x2 = correlated_inputs(*shapes)
  if not masked:
    return x1, x2, None
  size = x1.shape[1]
  return (trailing_mask(x1, (size - 1, size - 3)),
          trailing_mask(x2, (size - 2,)), MASK)


def diagonal_of(k):
  """The spatial diagonal of a `(nngp, ntk)` namedtuple in full layout."""
  return [kernel_lib.spatial_diagonal(x, 2) for x in k]


def assert_matches_monte_carlo(test, net, x1, x2, wrong_net=None,
                               readout=READOUT, n_samples=N_SAMPLES,
                               batch_size=16, seed=0, mask_constant=None):
  """Checks the analytic NNGP / NTK of `net` against Monte Carlo.

  Args:
    test: the test case.
    net: `net(out_chan)` -> the layer whose last layer has `out_chan` output
      channels (last axis). The analytic kernels do not depend on it; the NNGP
      estimate averages over `readout` channels, and the NTK estimate (the
      Jacobian of output channel 0) uses 1 channel, to keep it cheap.
    x1, x2: inputs.
    wrong_net: optionally, a slightly different network whose kernel the
      estimates must *not* match, to show the tolerance discriminates.
    readout: output channels for the NNGP estimate.
    n_samples: number of random initializations.
    batch_size: initializations vmapped at once.
    seed: PRNG seed.
    mask_constant: if not None, input entries equal to it are masked, in the
      finite and the infinite network.
  """
  kwargs = {} if mask_constant is None else dict(mask_constant=mask_constant)
  kernel_fn = net(1)[2]
  k = kernels(kernel_fn, x1, x2, **kwargs)
  init_fn, apply_fn, _ = net(readout)
  nngp, _ = monte_carlo_kernels(
      init_fn, plain_outputs(apply_fn, mask_constant), x1, x2, n_samples,
      fast_key(seed), compute_ntk=False, batch_size=batch_size)
  init_fn, apply_fn, _ = net(1)
  _, ntk = monte_carlo_kernels(
      init_fn, plain_outputs(apply_fn, mask_constant), x1, x2, n_samples,
      fast_key(seed + 1), batch_size=batch_size)
  test.assertEqual(nngp.shape, k.nngp.shape)
  nngp_err = relative_error(nngp, k.nngp)
  ntk_err = relative_error(ntk, k.ntk)
  test.assertLess(nngp_err, MC_TOL, 'NNGP')
  test.assertLess(ntk_err, MC_TOL, 'NTK')
  if wrong_net is not None:
    wrong = kernels(wrong_net(1)[2], x1, x2, **kwargs)
    test.assertGreater(
        max(relative_error(nngp, wrong.nngp),
            relative_error(ntk, wrong.ntk)), 2 * MC_TOL,
        'a wrong kernel would pass the Monte Carlo tolerance')
  if k.nngp.ndim > 2:
    # The spatially diagonal representation holds the same diagonal.
    diag = kernels(kernel_fn, x1, x2, diagonal_spatial=True, **kwargs)
    test.assertAllClose(list(diag), diagonal_of(k))


def empirical_ntk_errors(test, net, x1, x2, widths=(64, 1024), n_inits=3):
  """Checks that the empirical NTK of `net(width)` converges to the analytic.

  Args:
    test: the test case.
    net: `net(width)` -> a layer; the analytic NTK does not depend on `width`.
    x1, x2: inputs.
    widths: increasing widths; the error must decrease between the first and
      the last, and be below `EMPIRICAL_TOL` at the last.
    n_inits: initializations the error is averaged over.

  Returns:
    The mean relative error at each width.
  """
  analytic = kernels(net(1)[2], x1, x2, 'ntk')
  errors = []
  for width in widths:
    init_fn, apply_fn, _ = net(width)
    ntk_fn = jax.jit(nt.empirical_ntk_fn(apply_fn, trace_axes=(-1,),
                                         vmap_axes=0))
    errors.append(np.mean([
        relative_error(
            ntk_fn(x1, x2, init_fn(fast_key(seed), x1.shape)[1]), analytic)
        for seed in range(n_inits)]))
  test.assertLess(errors[-1], errors[0])
  test.assertLess(errors[-1], EMPIRICAL_TOL)
  return errors


def hand_written_layer(seen: list) -> tuple:
  """A layer written by hand: `kernel_fn` has neither `@requires` nor `@layer`."""
  def init_fn(rng, input_shape):
    return input_shape, ()

  def apply_fn(params, x, **kwargs):
    return 2 * x

  def kernel_fn(k):
    seen.append((k.diagonal_batch, k.diagonal_spatial))
    return k.replace(nngp=4 * k.nngp, cov1=4 * k.cov1,
                     cov2=None if k.cov2 is None else 4 * k.cov2,
                     ntk=None if k.ntk is None else 4 * k.ntk)

  return init_fn, apply_fn, kernel_fn
