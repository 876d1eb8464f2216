"""Tests of `nt.batch`: blockwise kernels equal unbatched ones, exactly.

Every test compares `nt.batch(kernel_fn, ...)(x1, x2, ...)` with
`kernel_fn(x1, x2, ...)` leaf by leaf, and, for `Kernel`s, attribute by
attribute, for analytic, empirical and Monte Carlo kernel functions; batch
sizes that do and do not divide the numbers of examples; `x2=None` and given;
host and device storage; one device here and four simulated devices in a
subprocess.
"""
import json
import os
import subprocess
import sys
import textwrap
import types

from absl.testing import absltest
from absl.testing import parameterized
import jax
from jax import random
import jax.numpy as jnp
import numpy as np

import neural_tangents as nt
from neural_tangents import stax
from neural_tangents._src import empirical
from tests import test_utils

_STATIC_FIELDS = ('x1_is_x2', 'is_gaussian', 'is_reversed', 'is_input',
                  'diagonal_batch', 'diagonal_spatial', 'shape1', 'shape2',
                  'batch_axis', 'channel_axis')


def _network(width=64, out=4):
  return stax.serial(stax.Dense(width, W_std=1.5, b_std=0.1), stax.Relu(),
                     stax.Dense(out, W_std=1.5, b_std=0.1))


def _inputs(n1, n2, feature_shape=(3,)):
  return test_utils.random_inputs((n1,) + feature_shape, (n2,) + feature_shape)


class BatchTestCase(test_utils.NeuralTangentsTestCase):

  def assertSameKernel(self, actual, desired, host=False):
    """Same pytree, leaves close, same `Kernel` attributes, storage as asked."""
    self.assertEqual(jax.tree_util.tree_structure(actual),
                     jax.tree_util.tree_structure(desired))
    # Relu's arc-cosine kernel is ill-conditioned at equal inputs, so jitted
    # blocks and the eager call differ by a few float32 ulps times that.
    self.assertAllClose(actual, desired, rtol=test_utils.tolerance(cpu=2e-4),
                        atol=test_utils.tolerance(cpu=2e-5))
    for a, d in zip(*(jax.tree_util.tree_leaves(
        t, is_leaf=lambda x: isinstance(x, nt.Kernel))
                      for t in (actual, desired))):
      if isinstance(d, nt.Kernel):
        for name in _STATIC_FIELDS:
          self.assertEqual(getattr(a, name), getattr(d, name), name)
    for leaf in jax.tree_util.tree_leaves(actual):
      self.assertIsInstance(leaf, np.ndarray if host else jax.Array)


class AnalyticTest(BatchTestCase):

  @parameterized.named_parameters(
      # name, n1, n2 (None: x2=None), batch_size, get, diagonal_batch, host
      ('divides', 6, 4, 2, None, True, False),
      ('divides_symmetric', 6, None, 3, None, True, True),
      ('not_divides', 7, 5, 3, None, True, True),
      ('not_divides_symmetric', 7, None, 3, None, True, False),
      ('full_cov', 7, 5, 3, None, False, False),
      ('full_cov_symmetric', 7, None, 2, None, False, True),
      ('ntk', 7, None, 3, 'ntk', True, False),
      ('covs', 5, 7, 3, ('nngp', 'cov1', 'cov2'), True, True),
      ('cov2_symmetric', 5, None, 2, 'cov2', False, False),
      ('larger_than_inputs', 3, 2, 8, None, True, False),
  )
  def test_fully_connected(self, n1, n2, batch_size, get, diagonal_batch,
                           host):
    _, _, kernel_fn = _network()
    x1, x2 = _inputs(n1, n2 or 1)
    x2 = None if n2 is None else x2
    batched = nt.batch(kernel_fn, batch_size, store_on_device=not host)
    actual = batched(x1, x2, get, diagonal_batch=diagonal_batch)
    self.assertSameKernel(actual, kernel_fn(x1, x2, get,
                                            diagonal_batch=diagonal_batch),
                          host)

  @parameterized.named_parameters(
      # name, x2 given, diagonal_spatial, diagonal_batch, host
      ('diagonal_spatial_symmetric', False, True, True, False),
      ('diagonal_spatial_full_cov', True, True, False, True),
      ('full_spatial', True, False, True, False),
      ('full_spatial_full_cov_symmetric', False, False, False, True),
  )
  def test_spatial(self, has_x2, diagonal_spatial, diagonal_batch, host):
    # Spatial pairs (S1, S1', S2, S2') must be swapped when a block below the
    # diagonal is filled by transposing one above it.
    _, _, kernel_fn = _network(width=16)
    x1, x2 = _inputs(5, 3, (3, 2, 2))
    x2 = x2 if has_x2 else None
    kwargs = dict(diagonal_spatial=diagonal_spatial,
                  diagonal_batch=diagonal_batch)
    actual = nt.batch(kernel_fn, 2, store_on_device=not host)(x1, x2,
                                                              **kwargs)
    desired = kernel_fn(x1, x2, **kwargs)
    self.assertSameKernel(actual, desired, host)
    n_spatial = 2 if diagonal_spatial else 4
    self.assertEqual(actual.nngp.ndim, 2 + n_spatial)

  def test_transposed_blocks_swap_spatial_pairs(self):
    # A spatial kernel is symmetric under swapping examples *and* positions:
    # nngp[i, j, s, t] == nngp[j, i, t, s]; only swapping the examples is not.
    _, _, kernel_fn = _network(width=16)
    x1, _ = _inputs(4, 1, (3, 2))
    k = nt.batch(kernel_fn, 1)(x1, None, 'nngp')
    np.testing.assert_allclose(k, np.transpose(k, (1, 0, 3, 2)), rtol=1e-5)
    self.assertGreater(np.abs(k - np.transpose(k, (1, 0, 2, 3))).max(), 1e-3)

  def test_batch_axis_of_the_network(self):
    # Inputs are split along the batch axis the network declares (1 here).
    _, _, kernel_fn = stax.serial(
        stax.Dense(32, batch_axis=1, channel_axis=0), stax.Relu(),
        stax.Dense(2, batch_axis=1, channel_axis=0))
    x1, x2 = _inputs(5, 3)
    x1, x2 = x1.T, x2.T
    actual = nt.batch(kernel_fn, 2)(x1, x2)
    self.assertSameKernel(actual, kernel_fn(x1, x2))
    self.assertEqual(actual.shape1, (2, 5))  # (channels, batch).

  def test_several_inputs(self):
    _, _, kernel_fn = stax.serial(
        stax.parallel(stax.Dense(16), stax.Dense(16)), stax.FanInSum(),
        stax.Relu(), stax.Dense(1))
    x1 = list(_inputs(5, 5, (3,)))
    x2 = list(_inputs(3, 3, (3,)))
    for x2_ in (None, x2):
      self.assertSameKernel(nt.batch(kernel_fn, 2)(x1, x2_),
                            kernel_fn(x1, x2_))

  def test_masked_inputs(self):
    _, _, kernel_fn = stax.serial(stax.Dense(16), stax.Relu(),
                                  stax.Dense(2))
    x1, x2 = _inputs(5, 3, (4, 2))
    x1 = x1.at[1, 2].set(10.)
    x2 = x2.at[0, 0].set(10.)
    for x2_ in (None, x2):
      actual = nt.batch(kernel_fn, 2)(x1, x2_, mask_constant=10.)
      desired = kernel_fn(x1, x2_, mask_constant=10.)
      self.assertSameKernel(actual, desired)
      self.assertIsNotNone(actual.mask1)
      self.assertTrue(np.asarray(actual.mask1)[1, 2].all())

  def test_nested_tuple_inputs(self):
    _, _, kernel_fn = stax.parallel(
        stax.parallel(stax.Dense(3, 1.5), stax.Dense(3)), stax.Dense(3))
    a1, a2 = _inputs(5, 3, (2,))
    b1, b2 = _inputs(5, 3, (4,))
    x1, x2 = ((a1, b1), a1), ((a2, b2), a2)
    for x2_ in (None, x2):
      self.assertSameKernel(nt.batch(kernel_fn, 2)(x1, x2_),
                            kernel_fn(x1, x2_))

  @parameterized.parameters(
      ('symmetric', True, False), ('given', True, False),
      ('symmetric', False, False), ('given', True, True))
  def test_kernel_input(self, which, diagonal_batch, host):
    first = stax.serial(stax.Conv(4, (2,), padding='SAME', W_std=1.5,
                                  b_std=0.1), stax.Relu())
    _, _, kernel_fn = stax.serial(stax.Conv(3, (2,), b_std=0.2), stax.Erf())
    x1, x2 = _inputs(5, 3, (4, 2))
    k = first[2](x1, None if which == 'symmetric' else x2,
                 diagonal_batch=diagonal_batch)
    batched = nt.batch(kernel_fn, 2, store_on_device=not host)
    for get in (None, 'ntk', ('nngp', 'cov1')):
      self.assertSameKernel(batched(k, None, get), kernel_fn(k, None, get),
                            host)

  def test_kernel_tree_input(self):
    _, _, kernel_fn = stax.serial(stax.parallel(stax.Dense(3), stax.Relu()),
                                  stax.FanInSum())
    x1, _ = _inputs(5, 1)
    ks = stax.serial(stax.Dense(3), stax.FanOut(2))[2](x1, None)
    self.assertSameKernel(nt.batch(kernel_fn, 2)(ks, None),
                          kernel_fn(ks, None))

  def test_batch_size_zero_is_unbatched(self):
    _, _, kernel_fn = _network()
    x1, x2 = _inputs(5, 3)
    self.assertSameKernel(nt.batch(kernel_fn, 0)(x1, x2),
                          kernel_fn(x1, x2))
    self.assertSameKernel(
        nt.batch(kernel_fn, 0, store_on_device=False)(x1, x2),
        kernel_fn(x1, x2), host=True)

  def test_under_jit(self):
    _, _, kernel_fn = _network()
    x1, x2 = _inputs(5, 3)
    batched = jax.jit(nt.batch(kernel_fn, 2, store_on_device=False),
                      static_argnums=2)
    self.assertAllClose(batched(x1, None, 'ntk'), kernel_fn(x1, None, 'ntk'),
                        rtol=2e-4, atol=2e-5)

  def test_device_count_one(self):
    _, _, kernel_fn = _network()
    x1, x2 = _inputs(5, 3)
    for device_count in (1, -1):
      self.assertSameKernel(
          nt.batch(kernel_fn, 2, device_count=device_count)(x1, x2, 'nngp'),
          kernel_fn(x1, x2, 'nngp'))


class EmpiricalTest(BatchTestCase):

  def _setup(self, out=3):
    init_fn, apply_fn, _ = _network(width=32, out=out)
    x1, x2 = _inputs(5, 3)
    _, params = init_fn(random.PRNGKey(3), x1.shape)
    return apply_fn, params, x1, x2

  @parameterized.named_parameters(
      ('symmetric', False, (-1,)),
      ('given', True, (-1,)),
      # Untraced outputs: (N1, N2, C, C). Blocks below the diagonal are
      # computed, not transposed, for kernels of unknown layout.
      ('untraced_symmetric', False, ()),
      ('untraced_given', True, ()),
  )
  def test_empirical_kernel_fn(self, has_x2, trace_axes):
    apply_fn, params, x1, x2 = self._setup()
    kernel_fn = empirical.empirical_kernel_fn(apply_fn, trace_axes=trace_axes)
    x2 = x2 if has_x2 else None
    desired = kernel_fn(x1, x2, ('nngp', 'ntk'), params)
    actual = nt.batch(kernel_fn, 2)(x1, x2, ('nngp', 'ntk'), params)
    self.assertEqual(actual.ntk.shape, (5, 3 if has_x2 else 5) +
                     ((3, 3) if trace_axes == () else ()))
    self.assertAllClose(actual, desired, rtol=1e-4, atol=1e-5)

  def test_empirical_ntk_fn_without_get(self):
    apply_fn, params, x1, _ = self._setup()
    ntk_fn = empirical.empirical_ntk_fn(apply_fn, vmap_axes=0)
    actual = nt.batch(ntk_fn, 2, store_on_device=False)(x1, None, params)
    self.assertIsInstance(actual, np.ndarray)
    self.assertAllClose(actual, ntk_fn(x1, None, params), rtol=1e-4,
                        atol=1e-5)


  def test_symmetric_blocks_share_the_rng_key(self):
    # With x2=None, f(x1) and f(x2) both get `rng`; a block off the diagonal
    # sees different slices of x1, so batch passes the keys as a pair. (The
    # dropout masks of a block are not slices of the whole batch's masks, so
    # the blocks are compared with the calls they stand for.)
    init_fn, apply_fn, _ = stax.serial(stax.Dense(16), stax.Dropout(0.5),
                                       stax.Dense(2))
    x1, _ = _inputs(4, 3)
    _, params = init_fn(random.PRNGKey(3), x1.shape)
    kernel_fn = empirical.empirical_kernel_fn(apply_fn)
    rng = random.PRNGKey(7)
    actual = nt.batch(kernel_fn, 2)(x1, None, 'ntk', params, rng=rng)
    for rows, cols in ((slice(0, 2), slice(2, 4)), (slice(2, 4), slice(0, 2))):
      self.assertAllClose(
          actual[rows, cols],
          kernel_fn(x1[rows], x1[cols], 'ntk', params, rng=(rng, rng)),
          rtol=1e-4, atol=1e-5)


class MonteCarloTest(BatchTestCase):

  def test_batch_of_monte_carlo(self):
    init_fn, apply_fn, _ = stax.Dense(2)
    x1, x2 = _inputs(5, 3)
    mc = nt.monte_carlo_kernel_fn(init_fn, apply_fn, random.PRNGKey(4), 3)
    for x2_ in (None, x2):
      self.assertAllClose(
          nt.batch(mc, 2, store_on_device=False)(x1, x2_, ('nngp', 'ntk')),
          mc(x1, x2_, ('nngp', 'ntk')), rtol=1e-4, atol=1e-5)

  def test_monte_carlo_batch_size(self):
    init_fn, apply_fn, _ = stax.serial(stax.Dense(8), stax.Relu(),
                                       stax.Dense(2))
    x1, x2 = _inputs(5, 3)
    key = random.PRNGKey(4)
    unbatched = nt.monte_carlo_kernel_fn(init_fn, apply_fn, key, 3)
    batched = nt.monte_carlo_kernel_fn(init_fn, apply_fn, key, 3,
                                       batch_size=2, store_on_device=False)
    actual = batched(x1, x2, 'ntk')
    self.assertIsInstance(actual, np.ndarray)
    self.assertAllClose(actual, unbatched(x1, x2, 'ntk'), rtol=1e-4,
                        atol=1e-5)


def _pattern_kernel_fn(x1, x2=None, get=None, *, pattern=None, weights=None,
                       rng=None):
  """A kernel taking per-example `pattern`s, shared `weights` and `rng`.

  `K[n, m] = (p1[n] x1[n]) . (p2[m] x2[m] * weights) + pattern-independent
  noise from `rng``: splitting `pattern` wrongly, or `weights` / `rng` at
  all, changes the result.
  """
  del get
  p1, p2 = pattern if isinstance(pattern, tuple) else (pattern, pattern)
  if x2 is None:
    x2 = x1
    p2 = p1 if p2 is None else p2
  w = 1. if weights is None else jnp.expand_dims(weights, 0)
  k = jnp.einsum('nf,mf->nm', x1 * p1[:, None], x2 * p2[:, None] * w)
  if rng is not None:
    k += random.uniform(rng)
  return k


class KeywordArgumentsTest(BatchTestCase):

  @parameterized.named_parameters(
      ('single_symmetric', 6, None, 'single'),
      ('single_given', 6, 6, 'single'),
      ('pair_given', 6, 4, 'pair'),
      ('pair_symmetric', 6, None, 'pair_none'),
  )
  def test_pattern_is_split_rng_and_weights_shared(self, n1, n2, form):
    x1, x2 = _inputs(n1, n2 or 1)
    x2 = None if n2 is None else x2
    p1 = jnp.arange(1., n1 + 1)
    p2 = None if n2 is None else -jnp.arange(1., n2 + 1)
    pattern = {'single': p1, 'pair': (p1, p2), 'pair_none': (p1, None)}[form]
    kwargs = dict(pattern=pattern, weights=jnp.array([1., 2., 3.]),
                  rng=random.PRNGKey(5))
    desired = _pattern_kernel_fn(x1, x2, **kwargs)
    actual = nt.batch(_pattern_kernel_fn, 4)(x1, x2, **kwargs)
    self.assertAllClose(actual, desired)

  def test_aggregate_pattern(self):
    _, _, kernel_fn = stax.serial(stax.Dense(16), stax.Relu(),
                                  stax.Aggregate(), stax.Dense(1))
    x1, x2 = _inputs(5, 3, (4, 2))
    p1 = random.bernoulli(random.PRNGKey(6), 0.5, (5, 4, 4)).astype(float)
    p2 = random.bernoulli(random.PRNGKey(7), 0.5, (3, 4, 4)).astype(float)
    batched = nt.batch(kernel_fn, 2)
    self.assertSameKernel(batched(x1, None, pattern=(p1, None)),
                          kernel_fn(x1, None, pattern=(p1, None)))
    self.assertSameKernel(batched(x1, x2, pattern=(p1, p2)),
                          kernel_fn(x1, x2, pattern=(p1, p2)))


def _fake_tqdm(events: list) -> types.ModuleType:
  """A `tqdm` module whose bars append each `update(n)`'s `n` to `events`."""

  class FakeBar:

    def __init__(self, total, **kwargs):
      del total, kwargs

    def update(self, n):
      events.append(n)

    def refresh(self):
      pass

    def close(self):
      pass

  fake = types.ModuleType('tqdm')
  fake.tqdm = FakeBar
  return fake


class ProgressTest(BatchTestCase):

  def test_progress_counts_blocks(self):
    updates = []
    _, _, kernel_fn = _network()
    x1, _ = _inputs(7, 1)
    with absltest.mock.patch.dict(sys.modules, {'tqdm': _fake_tqdm(updates)}):
      nt.batch(kernel_fn, 3, progress=True)(x1, None, 'nngp')
    self.assertEqual(sum(updates), 6)  # 3 diagonal + 3 upper blocks of 3x3.

  def test_progress_counts_computed_blocks(self):
    # JAX dispatches asynchronously: each update must follow a wait for the
    # block it counts, or the bar ends before the blocks are computed.
    events = []
    ready = jax.block_until_ready

    def wait(x):
      events.append('ready')
      return ready(x)

    _, _, kernel_fn = _network()
    x1, _ = _inputs(7, 1)
    with absltest.mock.patch.dict(sys.modules, {'tqdm': _fake_tqdm(events)}), \
        absltest.mock.patch.object(jax, 'block_until_ready', wait):
      nt.batch(kernel_fn, 3, progress=True)(x1, None, 'nngp')
    updates = [i for i, e in enumerate(events) if isinstance(e, int)]
    self.assertLen(updates, 6)
    for i in updates:
      self.assertEqual(events[i - 1], 'ready', msg=events)

  def test_progress_without_tqdm_is_an_import_error(self):
    _, _, kernel_fn = _network()
    with absltest.mock.patch.dict(sys.modules, {'tqdm': None}):
      with self.assertRaisesRegex(ImportError, 'pip install tqdm'):
        nt.batch(kernel_fn, 3, progress=True)


class EdgeCasesTest(BatchTestCase):

  @parameterized.named_parameters(('float64', np.float64, 1e-15),
                                  ('float32', np.float32, 1e-6))
  def test_symmetric_blocks_equal_unbatched_on_the_batch_diagonal(
      self, dtype, rtol):
    # Diagonal blocks are `x1 is x2` blocks: the NNGP and NTK of an example
    # with itself have the exact angle 0, as in the unbatched kernel (a
    # jitted block used to give arccos(1 - eps): 5.6e-9 relative in float64).
    _, _, kernel_fn = _network()
    x = np.random.default_rng(0).standard_normal((7, 3)).astype(dtype)
    desired = kernel_fn(x, None, ('nngp', 'ntk'))
    actual = nt.batch(kernel_fn, 3)(x, None, ('nngp', 'ntk'))
    for name in ('nngp', 'ntk'):
      a, d = np.asarray(getattr(actual, name)), np.asarray(getattr(desired,
                                                                   name))
      self.assertEqual(a.dtype, dtype)
      np.testing.assert_allclose(np.diag(a), np.diag(d), rtol=rtol, atol=0)
      np.testing.assert_allclose(a, d, rtol=rtol, atol=rtol * np.abs(d).max())

  def test_symmetric_pair_keyword_of_equal_arrays(self):
    # `x2=None` with `pattern=(p, p)` is `pattern=(p, None)`.
    _, _, kernel_fn = stax.serial(stax.Dense(16), stax.Relu(),
                                  stax.Aggregate(), stax.Dense(1))
    x, _ = _inputs(5, 1, (4, 2))
    p = random.bernoulli(random.PRNGKey(6), 0.5, (5, 4, 4)).astype(float)
    desired = kernel_fn(x, None, 'ntk', pattern=(p, p))
    self.assertAllClose(nt.batch(kernel_fn, 2)(x, None, 'ntk',
                                               pattern=(p, p)), desired)
    self.assertAllClose(nt.batch(kernel_fn, 2)(x, None, 'ntk',
                                               pattern=(p, None)), desired)

  def test_no_examples_give_an_empty_kernel(self):
    _, _, kernel_fn = _network()
    x1 = np.zeros((0, 3))
    for x2, store_on_device, shape in ((None, True, (0, 0)),
                                       (np.ones((2, 3)), False, (0, 2))):
      k = nt.batch(kernel_fn, 2, store_on_device=store_on_device)(
          x1, x2, 'ntk')
      self.assertEqual(k.shape, shape)
      self.assertIsInstance(k, jax.Array if store_on_device else np.ndarray)


class ErrorsTest(BatchTestCase):

  def test_negative_batch_size(self):
    _, _, kernel_fn = _network()
    with self.assertRaisesRegex(ValueError, r'`batch_size` must be a '
                                r'non-negative int; got -1\. Pass'):
      nt.batch(kernel_fn, -1)

  def test_batch_size_type(self):
    _, _, kernel_fn = _network()
    with self.assertRaisesRegex(TypeError,
                                '`batch_size` must be a non-negative int'):
      nt.batch(kernel_fn, 2.5)

  def test_too_many_devices(self):
    _, _, kernel_fn = _network()
    n = jax.local_device_count()
    with self.assertRaisesRegex(
        ValueError, rf'`device_count`={n + 1} is larger than the {n} '
        r'device\(s\) of all 1 process\(es\).*Pass -1 to use every device, '
        rf'or a number up to {n}'):
      nt.batch(kernel_fn, 2, device_count=n + 1)
    with self.assertRaisesRegex(ValueError, '`device_count` must be -1'):
      nt.batch(kernel_fn, 2, device_count=-2)

  def test_kernel_input_with_x2(self):
    _, _, kernel_fn = _network()
    x1, _ = _inputs(3, 1)
    k = stax.Identity()[2](x1)
    with self.assertRaisesRegex(TypeError, 'takes `x2=None`'):
      nt.batch(kernel_fn, 2)(k, x1)

  def test_output_not_indexed_by_examples(self):
    with self.assertRaisesRegex(ValueError, 'cannot assemble'):
      nt.batch(lambda x1, x2=None: jnp.sum(x1) * jnp.ones((4,)), 2)(
          jnp.ones((5, 3)), jnp.ones((3, 3)))


# Run in a subprocess with 4 simulated CPU devices: XLA fixes the device
# count when the backend starts.
_FOUR_DEVICES_SCRIPT = textwrap.dedent('''
    import json
    import jax
    from jax import random
    import numpy as np
    import neural_tangents as nt
    from neural_tangents import stax

    init_fn, apply_fn, kernel_fn = stax.serial(
        stax.Dense(32, W_std=1.5, b_std=0.1), stax.Relu(), stax.Dense(2))
    x1 = random.normal(random.PRNGKey(1), (7, 3))
    x2 = random.normal(random.PRNGKey(2), (5, 3))
    errors = {}

    def error(a, d):
      return max(float(np.max(np.abs(np.asarray(p) - np.asarray(q)))
                     / np.max(np.abs(np.asarray(q))))
                 for p, q in zip(jax.tree_util.tree_leaves(a),
                                 jax.tree_util.tree_leaves(d)))

    for store in (True, False):
      batched = nt.batch(kernel_fn, 2, device_count=4, store_on_device=store)
      for name, x2_ in (('symmetric', None), ('given', x2)):
        for db in (True, False):
          errors[f'analytic_{name}_{store}_{db}'] = error(
              batched(x1, x2_, diagonal_batch=db),
              kernel_fn(x1, x2_, diagonal_batch=db))
    mc = nt.monte_carlo_kernel_fn(init_fn, apply_fn, random.PRNGKey(3), 2)
    mc4 = nt.monte_carlo_kernel_fn(init_fn, apply_fn, random.PRNGKey(3), 2,
                                   batch_size=3, device_count=-1)
    errors['monte_carlo'] = error(mc4(x1, x2, None), mc(x1, x2, None))
    print(json.dumps({'devices': jax.local_device_count(), 'errors': errors}))
''')


class FourDevicesTest(BatchTestCase):

  def test_four_simulated_devices(self):
    env = dict(os.environ)
    env['XLA_FLAGS'] = (env.get('XLA_FLAGS', '') +
                        ' --xla_force_host_platform_device_count=4')
    env['JAX_PLATFORMS'] = 'cpu'
    result = subprocess.run([sys.executable, '-c', _FOUR_DEVICES_SCRIPT],
                            env=env, capture_output=True, text=True,
                            timeout=300, check=False)
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    out = json.loads(result.stdout.strip().splitlines()[-1])
    self.assertEqual(out['devices'], 4)
    self.assertLen(out['errors'], 9)
    for name, err in out['errors'].items():
      self.assertLess(err, 2e-4, name)


class ModuleLayoutTest(BatchTestCase):

  def test_the_package_exports_batch(self):
    from neural_tangents._src import batching  # pylint: disable=g-import-not-at-top
    self.assertIs(nt.batch, batching.batch)

  def test_monte_carlo_uses_only_public_batching_names(self):
    import inspect  # pylint: disable=g-import-not-at-top
    import re  # pylint: disable=g-import-not-at-top
    from neural_tangents._src import monte_carlo  # pylint: disable=g-import-not-at-top
    source = inspect.getsource(monte_carlo)
    self.assertEqual(re.findall(r'batching\._\w+', source), [])
    self.assertIn('batching.batched(', source)

  def test_transposed_blocks_only_for_layer_kernel_fns(self):
    from neural_tangents._src.batching import call  # pylint: disable=g-import-not-at-top
    _, _, kernel_fn = stax.serial(stax.Dense(2), stax.Relu())
    x = jnp.ones((4, 3))
    analytic = call.Call(kernel_fn, x, None, (), {}, 2)
    self.assertTrue(analytic.analytic)
    plain = lambda x1, x2=None, get=None: kernel_fn(x1, x2, get)
    other = call.Call(plain, x, None, (), {}, 2)
    self.assertFalse(other.analytic)


class BatchArgumentTest(absltest.TestCase):

  def test_kernel_fn_none_raises(self):
    with self.assertRaisesRegex(TypeError, r'`kernel_fn` must be callable; '
                                r'got None.*stax\.serial'):
      nt.batch(None)


if __name__ == '__main__':
  absltest.main()
