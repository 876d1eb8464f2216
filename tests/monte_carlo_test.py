"""Tests of `nt.monte_carlo_kernel_fn`: convergence, sampling, errors.

Convergence is checked against the analytic kernels of the same network: the
NTK with a narrow readout (its Jacobian is cheap, and its per-sample noise is
already small), the NNGP with a wide readout (its noise falls as
`1 / sqrt(readout width * n_samples)`). Each check also verifies that the
tolerance is tight enough to reject the kernel of a slightly different
network (`b_std` 0.3 instead of 0.1).
"""
import functools
import sys
import types

from absl.testing import absltest
from absl.testing import parameterized
import jax
from jax import random
import jax.numpy as jnp
import numpy as np

import neural_tangents as nt
from neural_tangents import stax
from neural_tangents._src import monte_carlo
from tests import test_utils

_KEY = random.PRNGKey(42)
# The params keys of the first samples drawn from `_KEY` (the published chain).
_INIT_KEYS = monte_carlo.published_key_chain(_KEY, 8)[0]
_COUNTS = (4, 64)
# Relative max errors (to the kernel's largest entry) at 64 samples; the
# measured errors are ~0.5% (NTK) and ~1.1% (NNGP), the wrong network's
# kernels are 3.1% and 4.7% away.
_NTK_TOL = 0.015
_NNGP_TOL = 0.03
# The NNGP of the narrow network, read from the same estimates as its NTK,
# only has to be in the right range (~5% at 64 samples): `_NNGP_TOL` is
# checked on the wide one.
_NARROW_NNGP_TOL = 0.1


def _network(readout, b_std=0.1):
  return stax.serial(stax.Dense(512, W_std=1.5, b_std=b_std), stax.Relu(),
                     stax.Dense(readout, W_std=1.5, b_std=b_std))


def _inputs():
  # Rows of different norms, so that normalization errors show.
  return test_utils.stax_inputs((5, 4), (3, 4), row_scale_denominator=3)


@functools.lru_cache(maxsize=None)
def _narrow_estimates(implementation, vmap_axes):
  """Estimates at `_COUNTS` samples of both kernels of the narrow network."""
  init_fn, apply_fn, _ = _network(16)
  kernel_fn = nt.monte_carlo_kernel_fn(init_fn, apply_fn, _KEY, _COUNTS,
                                       vmap_axes=vmap_axes,
                                       implementation=implementation)
  return list(kernel_fn(*_inputs(), None))


@functools.lru_cache(maxsize=None)
def _analytic(readout, b_std=0.1):
  return _network(readout, b_std)[2](*_inputs(), ('nngp', 'ntk'))


_IMPLEMENTATIONS_AND_VMAP_AXES = [
    dict(testcase_name=f'_implementation{i}_vmap_axes{v}', implementation=i,
         vmap_axes=v) for i in range(4) for v in (None, 0)]
# The reference (the convergence test's), and each implementation and
# `vmap_axes` once besides; every pair (AUTO too, which compiles all three
# and picks one) in the full tier. Compiling each estimate dominates.
_REFERENCE, _DEFAULT_CASES = _IMPLEMENTATIONS_AND_VMAP_AXES[2], [
    _IMPLEMENTATIONS_AND_VMAP_AXES[k] for k in (3, 5, 6)]
_CHECKED_CASES = test_utils.full_tier_cases(
    _DEFAULT_CASES, [c for c in _IMPLEMENTATIONS_AND_VMAP_AXES
                     if c not in _DEFAULT_CASES])


class ConvergenceTest(test_utils.NeuralTangentsTestCase):

  # One representative converges; the others give the same estimates
  # (`test_identical_across_implementations`, exact).
  @parameterized.named_parameters(*test_utils.full_tier_cases(
      [_REFERENCE], [c for c in _IMPLEMENTATIONS_AND_VMAP_AXES
                     if c is not _REFERENCE]))
  def test_converges_to_analytic_kernels(self, implementation, vmap_axes):
    estimates = _narrow_estimates(implementation, vmap_axes)
    exact = _analytic(16)
    self.assertLen(estimates, len(_COUNTS))
    for k in estimates:
      self.assertEqual(type(k)._fields, ('nngp', 'ntk'))
      self.assertEqual(k.ntk.shape, (5, 3))
      self.assertEqual(k.nngp.shape, (5, 3))
    few, many = estimates
    ntk_few = test_utils.relative_error(few.ntk, exact.ntk)
    ntk_many = test_utils.relative_error(many.ntk, exact.ntk)
    self.assertLess(ntk_many, _NTK_TOL)
    self.assertLess(ntk_many, ntk_few)
    nngp_few = test_utils.relative_error(few.nngp, exact.nngp)
    nngp_many = test_utils.relative_error(many.nngp, exact.nngp)
    self.assertLess(nngp_many, _NARROW_NNGP_TOL)
    self.assertLess(nngp_many, nngp_few)

  def test_ntk_tolerance_rejects_a_wrong_kernel(self):
    many = _narrow_estimates(1, None)[-1]
    wrong = _analytic(16, b_std=0.3)
    self.assertGreater(test_utils.relative_error(many.ntk, wrong.ntk),
                       _NTK_TOL)

  def test_identical_across_implementations(self):
    reference = _narrow_estimates(_REFERENCE['implementation'],
                                  _REFERENCE['vmap_axes'])
    for case in _CHECKED_CASES:
      estimates = _narrow_estimates(case['implementation'], case['vmap_axes'])
      for a, b in zip(estimates, reference):
        self.assertAllClose(a, b, rtol=test_utils.tolerance(cpu=1e-5),
                            atol=test_utils.tolerance(cpu=1e-6),
                            msg=case['testcase_name'])

  def test_nngp_converges_with_wide_readout(self):
    init_fn, apply_fn, _ = _network(256)
    kernel_fn = nt.monte_carlo_kernel_fn(init_fn, apply_fn, _KEY, _COUNTS)
    few, many = kernel_fn(*_inputs(), 'nngp')
    exact = _analytic(256).nngp
    self.assertEqual(many.shape, (5, 3))
    self.assertLess(test_utils.relative_error(many, exact), _NNGP_TOL)
    self.assertLess(test_utils.relative_error(many, exact),
                    test_utils.relative_error(few, exact))
    wrong = _analytic(256, b_std=0.3).nngp
    self.assertGreater(test_utils.relative_error(many, wrong), _NNGP_TOL)


def _linear_init(key, input_shape):
  return input_shape[:-1] + (3,), {'w': random.normal(key, (input_shape[-1],
                                                            3))}


def _noisy_linear_apply(params, x, rng=None):
  noise = 1. if rng is None else 1. + random.normal(rng, (1, 3))
  return (x @ params['w']) * noise


class SamplingTest(test_utils.NeuralTangentsTestCase):

  def test_get(self):
    x1, x2 = _inputs()
    kernel_fn = nt.monte_carlo_kernel_fn(_linear_init, _noisy_linear_apply,
                                         _KEY, 3)
    both = kernel_fn(x1, x2, ('nngp', 'ntk'))
    self.assertEqual(type(both)._fields, ('nngp', 'ntk'))
    default = kernel_fn(x1, x2)
    self.assertEqual(type(default)._fields, ('nngp', 'ntk'))
    self.assertAllClose(default, both)
    self.assertAllClose(kernel_fn(x1, x2, 'ntk'), both.ntk)
    self.assertAllClose(kernel_fn(x1, x2, 'nngp'), both.nngp)
    symmetric = kernel_fn(x1, None, 'ntk')
    self.assertEqual(symmetric.shape, (5, 5))
    self.assertAllClose(symmetric, symmetric.T)

  def test_generator_samples_each_network_once(self):
    init_fn, apply_fn = _linear_init, _noisy_linear_apply
    calls = []

    def counting_init_fn(key, input_shape):
      # Runs once per sample drawn, also inside compiled loops.
      jax.debug.callback(lambda: calls.append(1))
      return init_fn(key, input_shape)

    x1, x2 = _inputs()
    counts = (2, 5, 9)
    kernel_fn = nt.monte_carlo_kernel_fn(counting_init_fn, apply_fn, _KEY,
                                         counts)
    estimates = list(kernel_fn(x1, x2, 'nngp'))
    jax.effects_barrier()
    self.assertLen(estimates, 3)
    self.assertLen(calls, 9)
    # The last estimate sums three partial sums; the one-shot sum agrees.
    for n, estimate in list(zip(counts, estimates))[1:]:
      separate = nt.monte_carlo_kernel_fn(init_fn, apply_fn, _KEY, n)
      self.assertAllClose(estimate, separate(x1, x2, 'nngp'), msg=str(n))
    self.assertGreater(np.abs(estimates[0] - estimates[-1]).max(), 1e-3)

  def test_samples_and_rng_keys(self):
    # Sample `s` uses params from the published chain's `init_key_s`; with a
    # caller's `rng`, `apply_fn(x1)` gets `fold_in(rng, s)` and `apply_fn(x2)`
    # `fold_in(fold_in(rng, 1), s)` (the published convention: x2's key is
    # `fold_in(rng, 1)`), or the same key as x1 when x2 is None.
    x1, x2 = _inputs()
    rng = random.PRNGKey(7)
    n = 4
    kernel_fn = nt.monte_carlo_kernel_fn(_linear_init, _noisy_linear_apply,
                                         _KEY, n)
    for second in (x2, None):
      k = kernel_fn(x1, second, None, rng=rng)
      x = x1 if second is None else second
      nngp, ntk = 0., 0.
      init_keys, _ = monte_carlo.published_key_chain(_KEY, n)
      for s in range(n):
        _, params = _linear_init(init_keys[s], x1.shape)
        rng1 = random.fold_in(rng, s)
        rng2 = rng1 if second is None else random.fold_in(
            random.fold_in(rng, 1), s)
        f1 = _noisy_linear_apply(params, x1, rng1)
        f2 = _noisy_linear_apply(params, x, rng2)
        nngp += f1 @ f2.T / 3
        # d f[:, c] / d w[:, c] = x * noise[c]; mean over the 3 channels.
        noise1 = 1. + random.normal(rng1, (3,))
        noise2 = 1. + random.normal(rng2, (3,))
        ntk += x1 @ x.T * jnp.mean(noise1 * noise2)
      self.assertAllClose(k.nngp, nngp / n)
      self.assertAllClose(k.ntk, ntk / n)
    without_rng = kernel_fn(x1, None, 'nngp')
    self.assertGreater(np.abs(without_rng - k.nngp).max(), 1e-3)

  @parameterized.parameters(None, 'x1_copy')
  def test_rng_keys_agree_across_blocks(self, second):
    # The convention is decided once for the whole inputs: blocks of a
    # batched estimate (x1's rows against other rows of x1) use the keys of
    # the unbatched one.
    x1, _ = _inputs()
    x2 = None if second is None else jnp.array(x1)
    rng = random.PRNGKey(7)
    whole = nt.monte_carlo_kernel_fn(_linear_init, _noisy_linear_apply, _KEY,
                                     2)(x1, x2, None, rng=rng)
    blocks = nt.monte_carlo_kernel_fn(_linear_init, _noisy_linear_apply,
                                      _KEY, 2, batch_size=1)(x1, x2, None,
                                                             rng=rng)
    self.assertAllClose(blocks, whole)
    self.assertAllClose(whole.ntk, whole.ntk.T)

  @parameterized.parameters(0, 1)
  def test_nested_tuple_inputs(self, batch_size):
    # x = ((a, b), c) into parallel(parallel(Dense, Dense), Dense): the
    # estimate is the mean of the empirical kernels of the sampled networks.
    init_fn, apply_fn, _ = stax.parallel(
        stax.parallel(stax.Dense(3), stax.Dense(4)), stax.Dense(2))
    normal = lambda seed, shape: random.normal(random.PRNGKey(seed), shape)
    x1 = ((normal(1, (3, 5)), normal(2, (3, 6))), normal(3, (3, 2)))
    x2 = ((normal(4, (2, 5)), normal(5, (2, 6))), normal(6, (2, 2)))
    n = 2
    kernel_fn = nt.monte_carlo_kernel_fn(init_fn, apply_fn, _KEY, n,
                                         batch_size=batch_size, vmap_axes=0)
    empirical_fn = nt.empirical_kernel_fn(apply_fn)
    shapes = jax.tree_util.tree_map(jnp.shape, x1)
    for second in (None, x2):
      expected = jax.tree_util.tree_map(
          lambda *k: sum(k) / n, *[
              empirical_fn(x1, second, ('nngp', 'ntk'),
                           init_fn(_INIT_KEYS[s], shapes)[1])
              for s in range(n)])
      self.assertAllClose(kernel_fn(x1, second, ('nngp', 'ntk')), expected)

  @parameterized.parameters(((0,), ()), ((), (0,)), ((-1,), (0,)))
  def test_traced_or_diagonal_batch_axis(self, trace_axes, diagonal_axes):
    # The batch axis (output axis 0) may be traced or diagonal, as in
    # `nt.empirical_kernel_fn`.
    x1, _ = _inputs()
    x2 = 2 * x1[::-1]
    n = 2
    # An `apply_fn` without `rng`: Monte Carlo passes no key to it.
    linear_apply = lambda params, x: _noisy_linear_apply(params, x)
    kernel_fn = nt.monte_carlo_kernel_fn(_linear_init, linear_apply,
                                         _KEY, n, trace_axes=trace_axes,
                                         diagonal_axes=diagonal_axes)
    empirical_fn = nt.empirical_kernel_fn(linear_apply, trace_axes,
                                          diagonal_axes)
    expected = jax.tree_util.tree_map(
        lambda *k: sum(k) / n, *[
            empirical_fn(x1, x2, ('nngp', 'ntk'),
                         _linear_init(_INIT_KEYS[s], x1.shape)[1])
            for s in range(n)])
    actual = kernel_fn(x1, x2, ('nngp', 'ntk'))
    self.assertAllClose(actual, expected)
    self.assertEqual(actual.ntk.shape, expected.ntk.shape)
    # The NNGP from its definition: f(x1)[n, c] f(x2)[n', c'].
    outputs = [(linear_apply(p, x1), linear_apply(p, x2))
               for p in (_linear_init(_INIT_KEYS[s], x1.shape)[1]
                         for s in range(n))]
    full = sum(jnp.einsum('ab,cd->abcd', f1, f2) for f1, f2 in outputs) / n
    nngp = {((0,), ()): jnp.einsum('abad->bd', full) / 5,
            ((), (0,)): jnp.einsum('abad->abd', full),
            ((-1,), (0,)): jnp.einsum('abab->a', full) / 3}[
                (trace_axes, diagonal_axes)]
    self.assertAllClose(actual.nngp, nngp)

  def test_store_on_host(self):
    init_fn, apply_fn = _linear_init, _noisy_linear_apply
    x1, x2 = _inputs()
    on_device = nt.monte_carlo_kernel_fn(init_fn, apply_fn, _KEY, 2)
    on_host = nt.monte_carlo_kernel_fn(init_fn, apply_fn, _KEY, 2,
                                       store_on_device=False)
    k = on_host(x1, x2, 'ntk')
    self.assertIsInstance(k, np.ndarray)
    self.assertAllClose(k, on_device(x1, x2, 'ntk'))


class PublishedConventionsTest(test_utils.NeuralTangentsTestCase):

  def test_dropout_gets_a_key_derived_from_the_sampling_key(self):
    # As published, `apply_fn` gets a per-sample `rng` without the user
    # passing one: the chain's `rng_s`, with the convention of
    # `nt.empirical_kernel_fn` for x2's key (`fold_in(rng_s, 1)`).
    init_fn, apply_fn, _ = stax.serial(
        stax.Dense(8), stax.Dropout(0.5, mode='train'), stax.Dense(1))
    x1, x2 = _inputs()
    n = 2
    kernel_fn = nt.monte_carlo_kernel_fn(init_fn, apply_fn, _KEY, n)
    empirical_fn = nt.empirical_kernel_fn(apply_fn)
    init_keys, rngs = monte_carlo.published_key_chain(_KEY, n)
    for second in (None, x2):
      expected = 0.
      for s in range(n):
        _, params = init_fn(init_keys[s], x1.shape)
        rng1 = rngs[s]
        rng2 = rng1 if second is None else random.fold_in(rng1, 1)
        expected += np.array(empirical_fn(x1, second, ('nngp', 'ntk'), params,
                                          rng=(rng1, rng2))) / n
      self.assertAllClose(kernel_fn(x1, second, ('nngp', 'ntk')),
                          tuple(expected))

  def test_apply_fn_without_rng_is_not_given_one(self):
    apply_fn = lambda params, x: x @ params['w']
    x1, x2 = _inputs()
    kernel_fn = nt.monte_carlo_kernel_fn(_linear_init, apply_fn, _KEY, 2)
    self.assertEqual(kernel_fn(x1, x2, 'ntk').shape, (x1.shape[0],
                                                      x2.shape[0]))

  def test_nan_example_stays_in_its_row_and_column(self):
    x1, _ = _inputs()
    x1 = x1.at[1, 0].set(jnp.nan)
    kernel_fn = nt.monte_carlo_kernel_fn(*_network(4)[:2], _KEY, 2)
    expected = np.zeros((x1.shape[0],) * 2, bool)
    expected[1] = expected[:, 1] = True
    k = kernel_fn(x1, None)
    np.testing.assert_array_equal(np.isnan(k.ntk), expected)
    np.testing.assert_array_equal(np.isnan(k.nngp), expected)
    rows = np.array([0, 2, 3, 4])
    self.assertAllClose(k.ntk[np.ix_(rows, rows)],
                        kernel_fn(x1[rows], None, 'ntk'))

  def test_x2_of_only_nones_is_none(self):
    init_fn, apply_fn, _ = stax.parallel(stax.Dense(2), stax.Dense(3))
    x1, _ = _inputs()
    x = (x1, 2. * x1)
    kernel_fn = nt.monte_carlo_kernel_fn(init_fn, apply_fn, _KEY, 2)
    self.assertAllClose(kernel_fn(x, (None, None), ('nngp', 'ntk')),
                        kernel_fn(x, None, ('nngp', 'ntk')))

  def test_get_names_in_any_case(self):
    x1, x2 = _inputs()
    kernel_fn = nt.monte_carlo_kernel_fn(_linear_init, _noisy_linear_apply,
                                         _KEY, 2)
    upper = kernel_fn(x1, x2, ('NTK', 'NNGP'))
    self.assertEqual(upper._fields, ('ntk', 'nngp'))
    self.assertAllClose(upper.ntk, kernel_fn(x1, x2, 'ntk'))

  def test_no_examples_give_empty_kernels(self):
    """Issue 21 item 13: 0 examples give correctly shaped empty kernels."""
    x1, x2 = _inputs()
    kernel_fn = nt.monte_carlo_kernel_fn(_linear_init, _noisy_linear_apply,
                                         _KEY, 2)
    empty = x1[:0]
    same = kernel_fn(empty, None, ('nngp', 'ntk'))
    self.assertEqual([k.shape for k in same], [(0, 0), (0, 0)])
    mixed = kernel_fn(empty, x2, ('nngp', 'ntk'))
    self.assertEqual([k.shape for k in mixed],
                     [(0, x2.shape[0]), (0, x2.shape[0])])


class ErrorsTest(test_utils.NeuralTangentsTestCase):

  def test_kernel_for_an_array_is_a_type_error(self):
    x1, _ = _inputs()
    init_fn, apply_fn, kernel_fn = _network(4)
    k = kernel_fn(x1, None)
    mc_kernel_fn = nt.monte_carlo_kernel_fn(init_fn, apply_fn, _KEY, 2)
    for args in ((k, None), (x1, k)):
      name = 'x1' if args[0] is k else 'x2'
      with self.assertRaisesRegex(TypeError, f'`{name}` is .*`nt.Kernel`.*'
                                  'Pass the inputs themselves'):
        mc_kernel_fn(*args, 'ntk')

  def _kernel_fn(self, n_samples, **kwargs):
    init_fn, apply_fn, _ = _network(4)
    return nt.monte_carlo_kernel_fn(init_fn, apply_fn, _KEY, n_samples,
                                    **kwargs)

  def test_zero_samples(self):
    with self.assertRaisesRegex(
        ValueError, r'`n_samples` must be >= 1; got 0\. Pass a positive int'):
      self._kernel_fn(0)

  def test_zero_in_sequence(self):
    with self.assertRaisesRegex(ValueError,
                                r'counts >= 1; got 0 in \[0, 4\]\. Pass'):
      self._kernel_fn([0, 4])

  def test_decreasing_sequence(self):
    with self.assertRaisesRegex(
        ValueError, r'must be increasing.*Sort it, e\.g\. \[4, 8\]'):
      self._kernel_fn([8, 4])

  def test_empty_sequence(self):
    with self.assertRaisesRegex(ValueError, 'must not be empty'):
      self._kernel_fn([])

  def test_non_int(self):
    with self.assertRaisesRegex(TypeError, '`n_samples` must be an int'):
      self._kernel_fn(2.5)

  def test_bad_get(self):
    x1, x2 = _inputs()
    with self.assertRaisesRegex(
        ValueError, r"^`get='cov1'` asks for 'cov1', which is not available "
        r"here\. A Monte Carlo estimate has 'nngp' and 'ntk': pass one of "
        r"them, a tuple of them, or None for both\.$"):
      self._kernel_fn(2)(x1, x2, 'cov1')

  def test_batch_size_and_device_count(self):
    with self.assertRaisesRegex(ValueError,
                                '`batch_size` must be a non-negative int'):
      self._kernel_fn(2, batch_size=-3)
    n = jax.local_device_count()
    with self.assertRaisesRegex(ValueError, f'`device_count`={n + 1} is '
                                'larger'):
      self._kernel_fn(2, device_count=n + 1)

  def test_unknown_implementation(self):
    with self.assertRaisesRegex(ValueError, 'implementation=7'):
      self._kernel_fn(2, implementation=7)


class ProgressTest(test_utils.NeuralTangentsTestCase):

  def _fake_tqdm(self, updates):

    class FakeBar:

      def __init__(self, total, **kwargs):
        del kwargs
        updates.append(('total', total))

      def update(self, n):
        updates.append(n)

      def close(self):
        updates.append('closed')

    fake = types.ModuleType('tqdm')
    fake.tqdm = FakeBar
    return absltest.mock.patch.dict(sys.modules, {'tqdm': fake})

  def test_progress_counts_samples_and_keeps_the_estimate(self):
    x1, x2 = _inputs()
    n = 45  # Chunks of 3 samples (45 / 20 rounded up): 15 updates.
    plain = nt.monte_carlo_kernel_fn(_linear_init, _noisy_linear_apply, _KEY,
                                     n)(x1, x2, None)
    updates = []
    with self._fake_tqdm(updates):
      with_bar = nt.monte_carlo_kernel_fn(_linear_init, _noisy_linear_apply,
                                          _KEY, n, progress=True)
      k = with_bar(x1, x2, None)
    self.assertEqual(updates[0], ('total', n))
    self.assertEqual(updates[1:-1], [3] * 15)
    self.assertEqual(updates[-1], 'closed')
    self.assertAllClose(k.nngp, plain.nngp)
    self.assertAllClose(k.ntk, plain.ntk)

  def test_progress_counts_computed_samples(self):
    # JAX dispatches asynchronously: each update must follow a wait for the
    # samples it counts, or the bar ends before they are computed.
    x1, x2 = _inputs()
    events = []
    ready = jax.block_until_ready

    def wait(x):
      events.append('ready')
      return ready(x)

    with self._fake_tqdm(events), absltest.mock.patch.object(
        jax, 'block_until_ready', wait):
      nt.monte_carlo_kernel_fn(_linear_init, _noisy_linear_apply, _KEY, 6,
                               progress=True)(x1, x2, 'ntk')
    updates = [i for i, e in enumerate(events) if isinstance(e, int)]
    self.assertLen(updates, 6)
    for i in updates:
      self.assertEqual(events[i - 1], 'ready', msg=events)

  def test_progress_over_a_generator(self):
    x1, x2 = _inputs()
    counts = (2, 5)
    updates = []
    with self._fake_tqdm(updates):
      kernel_fn = nt.monte_carlo_kernel_fn(_linear_init, _noisy_linear_apply,
                                           _KEY, counts, progress=True)
      estimates = list(kernel_fn(x1, x2, 'ntk'))
    self.assertEqual(updates[0], ('total', 5))
    self.assertEqual(sum(u for u in updates if isinstance(u, int)), 5)
    self.assertEqual(updates[-1], 'closed')
    for n, estimate in zip(counts, estimates):
      separate = nt.monte_carlo_kernel_fn(_linear_init, _noisy_linear_apply,
                                          _KEY, n)
      self.assertAllClose(estimate, separate(x1, x2, 'ntk'), msg=str(n))

  def test_progress_without_tqdm_is_an_import_error(self):
    with absltest.mock.patch.dict(sys.modules, {'tqdm': None}):
      with self.assertRaisesRegex(ImportError, 'pip install tqdm'):
        nt.monte_carlo_kernel_fn(_linear_init, _noisy_linear_apply, _KEY, 2,
                                 progress=True)


if __name__ == '__main__':
  absltest.main()
