"""Tests of `Aggregate`: exact on inputs, Monte Carlo, sparse edges, masks."""
from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

import neural_tangents as nt
from neural_tangents import stax
from neural_tangents._src.stax import inputs
from tests import test_utils
from tests import upstream_reference

def _graphs(n, nodes=(4,), n_chan=3, seed=1):
  """Node features `(n, *nodes, C)` and random dense weights `(n, *S, *S)`."""
  kx, kp = jax.random.split(jax.random.PRNGKey(seed))
  x = jax.random.normal(kx, (n,) + nodes + (n_chan,))
  pattern = jax.random.uniform(kp, (n,) + nodes + nodes) < 0.5
  return x, pattern.astype(jnp.float32)


def _edges(dense):
  """Edge list `(N, n_edges, 2)` of a 0/1 `(N, V, V)` pattern, padded with
  -1 and with one duplicated edge per graph counted twice in `dense`."""
  dense = np.asarray(dense)
  lists = [np.argwhere(d > 0) for d in dense]
  n_edges = max(len(e) for e in lists) + 2
  out = -np.ones((len(lists), n_edges, 2), np.int32)
  counts = dense.copy()
  for i, e in enumerate(lists):
    out[i, :len(e)] = e
    if len(e):
      out[i, len(e)] = e[0]
      counts[i][tuple(e[0])] += 1
  return jnp.asarray(out), jnp.asarray(counts)


class AggregateTest(test_utils.NeuralTangentsTestCase):

  def assertKernelIsOutputCovariance(self, layer, x1, x2, p1, p2):
    """On raw inputs the kernel is exactly the outputs' covariance."""
    _, apply_fn, kernel_fn = layer
    y1, y2 = apply_fn((), x1, pattern=p1), apply_fn((), x2, pattern=p2)
    # Both representations of each kind of axis, in two calls.
    for diagonal_batch, diagonal_spatial in ((True, False), (False, True)):
      k = kernel_fn(x1, x2, pattern=(p1, p2), diagonal_batch=diagonal_batch,
                    diagonal_spatial=diagonal_spatial)
      expected = inputs.inputs_to_kernel(
          y1, y2, diagonal_batch=diagonal_batch,
          diagonal_spatial=diagonal_spatial, compute_ntk=True)
      for name in ('nngp', 'cov1', 'cov2'):
        self.assertAllClose(getattr(k, name), getattr(expected, name),
                            rtol=1e-4, atol=1e-5)

  @parameterized.named_parameters(
      ('one_axis', (5,), None),
      ('two_axes', (3, 2), None),
      ('first_of_two', (3, 2), 1),
      ('second_of_two', (3, 2), (2,)),
  )
  def test_dense_kernel_is_output_covariance(self, nodes, aggregate_axis):
    layer = stax.Aggregate(aggregate_axis=aggregate_axis)
    agg = [1, 2][:len(nodes)] if aggregate_axis is None else (
        [aggregate_axis] if isinstance(aggregate_axis, int) else
        list(aggregate_axis))
    agg_nodes = tuple(nodes[a - 1] for a in agg)
    x1, _ = _graphs(2, nodes)
    x2, _ = _graphs(3, nodes, seed=2)
    p1 = jax.random.normal(jax.random.PRNGKey(3), (2,) + agg_nodes * 2)
    p2 = jax.random.normal(jax.random.PRNGKey(4), (3,) + agg_nodes * 2)
    self.assertKernelIsOutputCovariance(layer, x1, x2, p1, p2)

  def test_sums_over_first_node_axis_of_pattern(self):
    # As published: out[n, j] = sum_i pattern[n, i, j] x[n, i]; for sparse
    # edges `(i, j)` (the nonzero entries of the dense pattern) alike.
    x = jnp.arange(6.).reshape(1, 3, 2)
    pattern = jnp.zeros((1, 3, 3)).at[0, 0, 2].set(1.)  # Node 0 -> node 2.
    expected = jnp.zeros_like(x).at[0, 2].set(x[0, 0])
    self.assertAllClose(stax.Aggregate()[1]((), x, pattern=pattern), expected)
    edges = jnp.array([[[0, 2]]])
    self.assertAllClose(
        stax.Aggregate(implementation='SPARSE')[1]((), x, pattern=edges),
        expected)
    for impl, p in (('DENSE', pattern), ('SPARSE', edges)):
      nngp = stax.Aggregate(implementation=impl)[2](
          x, None, 'nngp', pattern=(p, None))
      self.assertAllClose(nngp[0, 0],
                          jnp.zeros((3, 3)).at[2, 2].set(x[0, 0] @ x[0, 0] / 2))

  def test_matches_reference(self):
    # Case `aggregate` / `aggregate_net` of `upstream_reference`.
    ref = upstream_reference.load()
    self.assertAllClose(
        stax.Aggregate()[1]((), ref['seq1'], pattern=ref['pattern1']),
        ref['aggregate/apply'], rtol=upstream_reference.RTOL, atol=0)
    _, _, kernel_fn = stax.serial(stax.Dense(4), stax.Aggregate(), stax.Relu(),
                                  stax.GlobalSumPool(), stax.Dense(2))
    k = kernel_fn(ref['seq1'], ref['seq2'], ('nngp', 'ntk'),
                  pattern=(ref['pattern1'], ref['pattern2']))
    self.assertAllClose(k.nngp, ref['aggregate_net/nngp_diff'],
                        rtol=upstream_reference.RTOL, atol=0)
    self.assertAllClose(k.ntk, ref['aggregate_net/ntk_diff'],
                        rtol=upstream_reference.RTOL, atol=0)

  def test_shared_pattern_and_none(self):
    x1, _ = _graphs(2)
    x2, _ = _graphs(3, seed=2)
    shared = jax.random.normal(jax.random.PRNGKey(3), (1, 4, 4))
    self.assertKernelIsOutputCovariance(stax.Aggregate(), x1, x2, shared,
                                        None)
    _, apply_fn, kernel_fn = stax.Aggregate()
    self.assertAllClose(apply_fn((), x1), x1)
    self.assertAllClose(kernel_fn(x1, x2, 'nngp'),
                        stax.Identity()[2](x1, x2, 'nngp'))

  @parameterized.named_parameters(('one_axis', (5,)), ('two_axes', (3, 2)))
  def test_sparse_equals_dense(self, nodes):
    x1, dense1 = _graphs(2, nodes)
    x2, dense2 = _graphs(3, nodes, seed=2)
    v = int(np.prod(nodes))
    flat_edges1, counts1 = _edges(dense1.reshape(2, v, v))
    flat_edges2, counts2 = _edges(dense2.reshape(3, v, v))

    def unravel(edges):  # Flat node indices -> multi-indices (K > 1 axes).
      if len(nodes) == 1:
        return edges
      multi = jnp.stack(jnp.unravel_index(jnp.maximum(edges, 0), nodes), -1)
      return jnp.where(edges[..., None] < 0, -1, multi)

    e1, e2 = unravel(flat_edges1), unravel(flat_edges2)
    counts1 = counts1.reshape((2,) + nodes * 2)
    counts2 = counts2.reshape((3,) + nodes * 2)
    _, apply_sparse, kernel_sparse = stax.Aggregate(implementation='SPARSE')
    _, apply_dense, kernel_dense = stax.Aggregate()
    self.assertAllClose(apply_sparse((), x1, pattern=e1),
                        apply_dense((), x1, pattern=counts1))
    k_sparse = kernel_sparse(x1, x2, pattern=(e1, e2))
    k_dense = kernel_dense(x1, x2, pattern=(counts1, counts2))
    self.assertAllClose(k_sparse.nngp, k_dense.nngp)
    self.assertAllClose(k_sparse.cov2, k_dense.cov2)
    self.assertKernelIsOutputCovariance(
        stax.Aggregate(implementation=stax.AggregateImplementation.SPARSE),
        x1, x2, e1, e2)

  def test_to_dense(self):
    x1, dense = _graphs(2)
    _, apply_fn, kernel_fn = stax.Aggregate(to_dense=lambda p: p['adj'])
    self.assertAllClose(apply_fn((), x1, pattern={'adj': dense}),
                        jnp.einsum('nij,nic->njc', dense, x1))
    self.assertAllClose(
        kernel_fn(x1, None, 'nngp', pattern=({'adj': dense}, None)),
        stax.Aggregate()[2](x1, None, 'nngp', pattern=(dense, None)))

  def _joint_and_cross_kernels(self):
    """The kernel of [x1; x2] (one pattern, as Monte Carlo needs), and that
    its off-diagonal block is the kernel of (x1, x2)."""
    x1, p1 = _graphs(2, (4,))
    x2, p2 = _graphs(2, (4,), seed=2)
    x, p = jnp.concatenate([x1, x2]), jnp.concatenate([p1, p2])
    network = stax.serial(
        stax.Dense(512, W_std=1.5, b_std=0.2), stax.Relu(),
        stax.Aggregate(), stax.Dense(512, W_std=1.2), stax.Relu(),
        stax.Aggregate(), stax.Dense(256))
    kernel_fn = network[2]
    k = kernel_fn(x, x, ('nngp', 'ntk'), pattern=(p, p))
    k12 = kernel_fn(x1, x2, ('nngp', 'ntk'), pattern=(p1, p2))
    self.assertAllClose(k.nngp[:2, 2:], k12.nngp)
    self.assertAllClose(k.ntk[:2, 2:], k12.ntk)
    return network, x, p, k

  def test_joint_kernel_block_is_the_cross_kernel(self):
    self._joint_and_cross_kernels()

  # Exact: `test_matches_reference` (Dense -> Aggregate -> Relu -> pooling,
  # NNGP and NTK) and `test_dense_kernel_is_output_covariance`; the default
  # tier estimates `test_masked_matches_monte_carlo_and_smaller_graphs`.
  @test_utils.full_tier_only
  def test_matches_monte_carlo(self):
    (init_fn, apply_fn, kernel_fn), x, p, k = self._joint_and_cross_kernels()
    apply_kwargs = lambda key: dict(pattern=p)
    key = jax.random.PRNGKey(0)
    nngp, _ = test_utils.monte_carlo_kernels(
        init_fn, apply_fn, x, x, 128, key, compute_ntk=False, batch_size=32,
        apply_kwargs=apply_kwargs)
    _, ntk = test_utils.monte_carlo_kernels(
        init_fn, apply_fn, x, x, 24, key, batch_size=8,
        apply_kwargs=apply_kwargs)
    self.assertLess(test_utils.relative_error(nngp, k.nngp),
                    test_utils.MC_TOL)
    self.assertLess(test_utils.relative_error(ntk, k.ntk),
                    test_utils.MC_TOL)
    # A kernel ignoring the graph is far off.
    k_no_graph = kernel_fn(x, x, 'nngp')
    self.assertGreater(test_utils.relative_error(nngp, k_no_graph),
                       2 * test_utils.MC_TOL)

  def test_masked_matches_monte_carlo_and_smaller_graphs(self):
    # Graphs padded to 5 nodes: masked nodes neither send nor receive.
    x, dense = _graphs(3, (5,))
    x = jnp.asarray(x, jnp.float32)
    n_nodes = jnp.array([5, 3, 4])
    mask = jnp.arange(5)[None, :, None] >= n_nodes[:, None, None]
    edges, counts = _edges(dense)
    init_fn, apply_fn, kernel_fn = stax.serial(
        stax.Dense(512, W_std=1.5, b_std=0.2), stax.Erf(),
        stax.Aggregate(implementation='SPARSE'), stax.Dense(256, b_std=0.1))
    masked = stax.MaskedArray(x, mask)
    k = kernel_fn(masked, masked, ('nngp', 'ntk'), pattern=(edges, edges))
    values = lambda prm, x_, **kw: apply_fn(prm, x_, **kw).masked_value
    apply_kwargs = lambda key: dict(pattern=edges)
    key = jax.random.PRNGKey(0)
    with jax.enable_x64(False):  # Float32 params (and inputs).
      nngp, _ = test_utils.monte_carlo_kernels(
          init_fn, values, masked, masked, 128, key, compute_ntk=False,
          batch_size=32, apply_kwargs=apply_kwargs)
      _, ntk = test_utils.monte_carlo_kernels(
          init_fn, values, masked, masked, 24, key, batch_size=8,
          apply_kwargs=apply_kwargs)
    self.assertLess(test_utils.relative_error(nngp, k.nngp),
                    test_utils.MC_TOL)
    self.assertLess(test_utils.relative_error(ntk, k.ntk),
                    test_utils.MC_TOL)
    # Graph 1 (3 nodes): as if its padding did not exist.
    small = counts[1:2, :3, :3]
    _, _, kernel_fn_dense = stax.serial(
        stax.Dense(512, W_std=1.5, b_std=0.2), stax.Erf(), stax.Aggregate(),
        stax.Dense(256, b_std=0.1))
    k_small = kernel_fn_dense(x[1:2, :3], None, ('nngp', 'ntk'),
                              pattern=(small, None))
    self.assertAllClose(k.nngp[1, 1, :3, :3], k_small.nngp[0, 0])
    self.assertAllClose(k.ntk[1, 1, :3, :3], k_small.ntk[0, 0])
    self.assertAllClose(k.nngp[1, :, 3:], jnp.zeros_like(k.nngp[1, :, 3:]))

  def test_wrong_pattern_raises(self):
    x1, p1 = _graphs(2)
    _, apply_fn, kernel_fn = stax.Aggregate()
    with self.assertRaisesRegex(ValueError,
                                r'`pattern`.*shape \(2, 3, 3\).*\(2, 4, 4\)'):
      apply_fn((), x1, pattern=p1[:, :3, :3])
    with self.assertRaisesRegex(ValueError, r'`pattern\[1\]`.*shape'):
      kernel_fn(x1, x1, pattern=(p1, p1[:1, :, :2]))
    with self.assertRaisesRegex(ValueError, '`pattern`.*pair'):
      kernel_fn(x1, None, pattern=p1)
    with self.assertRaisesRegex(ValueError, r'`pattern\[1\]` must be None'):
      kernel_fn(x1, None, pattern=(p1, p1 + 1))
    _, apply_fn, kernel_fn = stax.Aggregate(implementation='SPARSE')
    edges, _ = _edges(p1)
    with self.assertRaisesRegex(ValueError, r'`pattern`.*\(2, n_edges, 2\)'):
      apply_fn((), x1, pattern=edges[..., :1])
    with self.assertRaisesRegex(ValueError, r'`pattern\[0\]`.*integer'):
      kernel_fn(x1, None, pattern=(edges.astype(jnp.float32), None))
    with self.assertRaisesRegex(ValueError, '`aggregate_axis`'):
      stax.Aggregate(aggregate_axis=0)[0](None, x1.shape)
    with self.assertRaisesRegex(ValueError, '`implementation`'):
      stax.Aggregate(implementation='COO')

  def test_shapes(self):
    x1, p1 = _graphs(2, (3, 2))
    init_fn, apply_fn, kernel_fn = stax.Aggregate(aggregate_axis=1)
    out_shape, params = init_fn(None, (-1, 3, 2, 3))
    self.assertEqual(out_shape, (-1, 3, 2, 3))
    p = jnp.ones((2, 3, 3))
    self.assertEqual(apply_fn(params, x1, pattern=p).shape, x1.shape)
    self.assertEqual(kernel_fn(x1, None, 'nngp', pattern=(p, None)).shape,
                     (2, 2, 3, 3, 2, 2))

  def test_empirical_ntk_converges(self):
    if not hasattr(nt, 'empirical_ntk_fn'):
      self.skipTest('`nt.empirical_ntk_fn` is not available.')
    x1, p1 = _graphs(2, (4,))
    x2, p2 = _graphs(3, (4,), seed=2)

    def network(width):
      return stax.serial(stax.Dense(width, W_std=1.5), stax.Relu(),
                         stax.Aggregate(), stax.Dense(width), stax.Relu(),
                         stax.Dense(1))

    exact = network(1)[2](x1, x2, 'ntk', pattern=(p1, p2))
    errors = []
    for width in (32, 1024):
      init_fn, apply_fn, _ = network(width)
      ntk_fn = nt.empirical_ntk_fn(apply_fn, trace_axes=(-1,))
      errors.append(np.mean([
          test_utils.relative_error(
              ntk_fn(x1, x2, init_fn(jax.random.PRNGKey(seed), x1.shape)[1],
                     pattern=(p1, p2)), exact) for seed in range(3)]))
    self.assertLess(errors[1], errors[0] / 2)
    self.assertLess(errors[1], 0.2)


if __name__ == '__main__':
  absltest.main()
