"""Tests of `nt.experimental.features` against the `stax` kernels.

Exact feature layers reproduce `stax`'s NNGP and NTK to rounding; random
features and sketches reproduce them within a relative Frobenius error that
falls as the feature dimension grows.
"""
import subprocess
import sys

from absl.testing import absltest
import jax
from jax import random
import jax.numpy as jnp
import numpy as np

from neural_tangents import stax
from neural_tangents.experimental import features as ft
from tests import test_utils


def stax_layout_kernel(feat: jax.Array) -> jax.Array:
  """`sum_c feat[n, s, c] feat[n', s', c]` in `stax`'s layout
  `(N, N', S_1, S_1', ..., S_d, S_d')`, for channels-last features."""
  n_spatial = feat.ndim - 2
  out = jnp.tensordot(feat, feat, axes=(-1, -1))
  order = [0, 1 + n_spatial]
  for i in range(n_spatial):
    order += [1 + i, 2 + n_spatial + i]
  return jnp.transpose(out, order)


def relative_frobenius(actual, expected) -> float:
  return float(jnp.linalg.norm(jnp.ravel(actual - expected)) /
               jnp.linalg.norm(jnp.ravel(expected)))


def feature_kernels(layer, x, key, jit=False):
  """The NNGP and NTK of the features of `x` under `layer`, stax layout."""
  init_fn, feature_fn = layer
  shapes, params = init_fn(key, x.shape)
  f = (jax.jit(feature_fn) if jit else feature_fn)(x, params)
  assert f.nngp_feat.shape == shapes[0], (f.nngp_feat.shape, shapes)
  assert f.ntk_feat.shape == shapes[1], (f.ntk_feat.shape, shapes)
  standard = lambda a: jnp.moveaxis(jnp.moveaxis(a, f.channel_axis, -1),
                                    f.batch_axis, 0)
  return (stax_layout_kernel(standard(f.nngp_feat)),
          stax_layout_kernel(standard(f.ntk_feat)))


_STAX_KERNELS = {}


def stax_kernels(name, x):
  """The stax NNGP and NTK of `EXACT_NETWORKS[name]`, computed once."""
  if name not in _STAX_KERNELS:
    _STAX_KERNELS[name] = EXACT_NETWORKS[name][2]()[2](x, None,
                                                      ('nngp', 'ntk'))
  return _STAX_KERNELS[name]


def fcn_inputs():
  """Examples of different norms (0.5 to 1.6 times standard normal)."""
  return test_utils.graded_inputs((6, 5), (1, 5), np.float64)[0]


def image_inputs():
  return test_utils.graded_inputs((3, 6, 5, 2), (1, 1), np.float64)[0]


# Pairs of (feature layer, stax layer) builders on (inputs) of the exact
# layers, with the same hyperparameters.
EXACT_NETWORKS = {
    'dense': (
        fcn_inputs,
        lambda: ft.DenseFeatures(1, 1.5, 0.3),
        lambda: stax.Dense(1, 1.5, 0.3)),
    'dense_relu_dense': (
        fcn_inputs,
        lambda: ft.serial(ft.DenseFeatures(1, 1.3, 0.2),
                          ft.ReluFeatures(method='EXACT'),
                          ft.DenseFeatures(1, 0.8)),
        lambda: stax.serial(stax.Dense(1, 1.3, 0.2), stax.Relu(),
                            stax.Dense(1, 0.8))),
    'deep_relu_no_bias': (
        fcn_inputs,
        lambda: ft.serial(*[ft.DenseFeatures(1), ft.ReluFeatures('EXACT')] * 3,
                          ft.DenseFeatures(1)),
        lambda: stax.serial(*[stax.Dense(1), stax.Relu()] * 3, stax.Dense(1))),
    'conv_relu_conv_global_avg_pool': (
        image_inputs,
        lambda: ft.serial(ft.ConvFeatures(1, (3, 3), W_std=1.2, b_std=0.1),
                          ft.ReluFeatures('EXACT'),
                          ft.ConvFeatures(1, (2, 3), (1, 2), b_std=0.2),
                          ft.GlobalAvgPoolFeatures()),
        lambda: stax.serial(stax.Conv(1, (3, 3), padding='SAME', W_std=1.2,
                                      b_std=0.1), stax.Relu(),
                            stax.Conv(1, (2, 3), (1, 2), 'SAME', b_std=0.2),
                            stax.GlobalAvgPool())),
    'conv_circular_flatten': (
        image_inputs,
        lambda: ft.serial(ft.ConvFeatures(1, (3, 2), padding='CIRCULAR'),
                          ft.ReluFeatures('EXACT'), ft.FlattenFeatures(),
                          ft.DenseFeatures(1, b_std=0.3)),
        lambda: stax.serial(stax.Conv(1, (3, 2), padding='CIRCULAR'),
                            stax.Relu(), stax.Flatten(),
                            stax.Dense(1, b_std=0.3))),
    'conv_valid_nchw': (
        lambda: jnp.moveaxis(image_inputs(), -1, 1),
        lambda: ft.ConvFeatures(1, (2, 2), padding='VALID', b_std=0.1,
                                dimension_numbers=('NCHW', 'OIHW', 'NCHW')),
        lambda: stax.Conv(1, (2, 2), padding='VALID', b_std=0.1,
                          dimension_numbers=('NCHW', 'OIHW', 'NCHW'))),
    'avg_pool': (
        image_inputs,
        lambda: ft.serial(ft.ConvFeatures(1, (2, 2)),
                          ft.AvgPoolFeatures((2, 2), (1, 2), 'SAME',
                                             normalize_edges=True),
                          ft.ReluFeatures('EXACT')),
        lambda: stax.serial(stax.Conv(1, (2, 2), padding='SAME'),
                            stax.AvgPool((2, 2), (1, 2), 'SAME', True),
                            stax.Relu())),
    'layer_norm': (
        image_inputs,
        lambda: ft.serial(ft.ConvFeatures(1, (2, 2), b_std=0.5),
                          ft.LayerNormFeatures(axis=(1, 2, 3)),
                          ft.ReluFeatures('EXACT'), ft.DenseFeatures(1),
                          ft.LayerNormFeatures()),
        lambda: stax.serial(stax.Conv(1, (2, 2), padding='SAME', b_std=0.5),
                            stax.LayerNorm(axis=(1, 2, 3)), stax.Relu(),
                            stax.Dense(1), stax.LayerNorm())),
    'dense_relu_on_positions_3d': (
        lambda: image_inputs()[:, :, 0],
        lambda: ft.serial(ft.DenseFeatures(1, 1.2, 0.1),
                          ft.ReluFeatures('EXACT'), ft.DenseFeatures(1, 0.9),
                          ft.GlobalAvgPoolFeatures()),
        lambda: stax.serial(stax.Dense(1, 1.2, 0.1), stax.Relu(),
                            stax.Dense(1, 0.9), stax.GlobalAvgPool())),
    'conv_1d_avg_pool_1d': (
        lambda: image_inputs()[:, :, 0],
        lambda: ft.serial(ft.ConvFeatures(1, (3,), (2,), b_std=0.2),
                          ft.ReluFeatures('EXACT'),
                          ft.AvgPoolFeatures((2,), padding='SAME'),
                          ft.FlattenFeatures()),
        lambda: stax.serial(stax.Conv(1, (3,), (2,), 'SAME', b_std=0.2),
                            stax.Relu(), stax.AvgPool((2,), padding='SAME'),
                            stax.Flatten())),
    'channels_first_dense_pool': (
        lambda: jnp.moveaxis(image_inputs(), -1, 1),
        lambda: ft.serial(ft.DenseFeatures(1, 1.1, 0.2, channel_axis=1),
                          ft.LayerNormFeatures(axis=1, channel_axis=1),
                          ft.ReluFeatures('EXACT', channel_axis=1),
                          ft.AvgPoolFeatures((2, 2), channel_axis=1),
                          ft.GlobalAvgPoolFeatures(channel_axis=1)),
        lambda: stax.serial(stax.Dense(1, 1.1, 0.2, channel_axis=1),
                            stax.LayerNorm(axis=1, channel_axis=1),
                            stax.Relu(),
                            stax.AvgPool((2, 2), channel_axis=1),
                            stax.GlobalAvgPool(channel_axis=1))),
    'conv_3d_layer_norm_spatial': (
        lambda: image_inputs()[:2, :3, :3, :, None],
        lambda: ft.serial(ft.ConvFeatures(1, (2, 2, 1), W_std=1.3,
                                          padding='CIRCULAR'),
                          ft.LayerNormFeatures(axis=(1, 2, 3, 4)),
                          ft.GlobalAvgPoolFeatures()),
        lambda: stax.serial(stax.Conv(1, (2, 2, 1), padding='CIRCULAR',
                                      W_std=1.3),
                            stax.LayerNorm(axis=(1, 2, 3, 4)),
                            stax.GlobalAvgPool())),
}


def relu_fcn(method, dim, depth, poly_degree=8):
  """`depth` hidden Dense-Relu layers and a Dense readout, as features (the
  ReLU by `method`, all dimensions `dim`)."""
  features = []
  for _ in range(depth):
    features += [ft.DenseFeatures(1, 1.4, 0.1),
                 ft.ReluFeatures(method, feature_dim0=dim, feature_dim1=dim,
                                 sketch_dim=dim, poly_degree=poly_degree,
                                 poly_sketch_dim=dim)]
  return ft.serial(*features, ft.DenseFeatures(1))


_RELU_FCN_KERNELS = {}


def relu_fcn_kernels(depth, x):
  """The stax NNGP and NTK of `relu_fcn`'s network, computed once per depth
  (`x` is always `fcn_inputs()` or a slice of it)."""
  key = (depth, x.shape)
  if key not in _RELU_FCN_KERNELS:
    layers = [stax.Dense(1, 1.4, 0.1), stax.Relu()] * depth
    kernel_fn = stax.serial(*layers, stax.Dense(1))[2]
    _RELU_FCN_KERNELS[key] = kernel_fn(x, None, ('nngp', 'ntk'))
  return _RELU_FCN_KERNELS[key]


def mean_errors(method, dim, depth, x, keys, **kwargs):
  """Mean relative Frobenius errors `(nngp, ntk)` over `keys`."""
  layer = relu_fcn(method, dim, depth, **kwargs)
  k = relu_fcn_kernels(depth, x)
  errors = []
  for key in keys:
    nngp, ntk = feature_kernels(layer, x, key)
    errors.append((relative_frobenius(nngp, k.nngp),
                   relative_frobenius(ntk, k.ntk)))
  return np.mean(errors, axis=0)


DIMS = (256, 1024, 4096)
APPROXIMATE_METHODS = ('RANDFEAT', 'POLYSKETCH', 'PSRF')


class ExactFeaturesTest(test_utils.NeuralTangentsTestCase):

  @test_utils.sample_product(network=list(EXACT_NETWORKS), jit=(False, True))
  def test_matches_stax_kernels(self, network, jit):
    inputs, feature_layer, _ = EXACT_NETWORKS[network]
    x = inputs()
    nngp, ntk = feature_kernels(feature_layer(), x, random.PRNGKey(0), jit)
    k = stax_kernels(network, x)
    self.assertAllClose(nngp, k.nngp, rtol=1e-9, atol=1e-9)
    self.assertAllClose(ntk, k.ntk, rtol=1e-9, atol=1e-9)

  def test_input_features(self):
    x = fcn_inputs()
    f = ft.ReluFeatures('EXACT')[1](x, ())
    # `Dense(1)` leaves the NNGP of the inputs unchanged.
    k = stax.serial(stax.Dense(1), stax.Relu())[2](x, None, 'nngp')
    self.assertAllClose(f.nngp_feat @ f.nngp_feat.T, k)
    # The inputs' NTK is 0: no channels, and none after a nonlinearity.
    self.assertEqual(f.ntk_feat.shape, (6, 0))
    f = ft.DenseFeatures(1)[1](x, ())
    self.assertAllClose(f.nngp_feat, x / np.sqrt(5))
    self.assertAllClose(f.ntk_feat, f.nngp_feat)

  def test_features_is_a_pytree(self):
    f = ft.Features(jnp.ones((2, 3)), jnp.zeros((2, 0)))
    leaves, treedef = jax.tree_util.tree_flatten(f)
    self.assertLen(leaves, 2)
    g = jax.jit(lambda f: f.replace(nngp_feat=2 * f.nngp_feat))(f)
    self.assertIsInstance(g, ft.Features)
    self.assertAllClose(g.nngp_feat, 2 * jnp.ones((2, 3)))
    self.assertEqual(jax.tree_util.tree_unflatten(treedef, leaves), f)

  def test_batch_axis_out(self):
    x = image_inputs()
    f = ft.FlattenFeatures(batch_axis_out=1)[1](x, ())
    g = ft.FlattenFeatures()[1](x, ())
    self.assertEqual((f.batch_axis, f.channel_axis), (1, 0))
    self.assertAllClose(f.nngp_feat.T, g.nngp_feat)


class ApproximateFeaturesTest(test_utils.NeuralTangentsTestCase):

  @test_utils.sample_product(method=APPROXIMATE_METHODS)
  def test_error_falls_with_dimension(self, method):
    x = fcn_inputs()
    keys = [random.PRNGKey(1), random.PRNGKey(2)]
    # Rows: dims; columns: nngp, ntk.
    errors = np.array([mean_errors(method, dim, 2, x, keys) for dim in DIMS])
    # Errors scale as dim^(-1/2), halving from one dimension to the next in
    # expectation: the mean of both falls at each step, each one over all.
    combined = np.mean(errors, axis=1)
    self.assertTrue(np.all(combined[1:] < combined[:-1]), errors)
    self.assertTrue(np.all(errors[-1] < errors[0]), errors)
    self.assertLess(np.max(errors[-1]), 0.1, errors)

  @test_utils.sample_product(method=APPROXIMATE_METHODS)
  def test_error_is_small_at_every_depth(self, method):
    x = fcn_inputs()
    keys = [random.PRNGKey(1), random.PRNGKey(2)]
    for depth in test_utils.full_tier_cases([1, 4], [3]):
      errors = mean_errors(method, DIMS[-1], depth, x, keys)
      self.assertLess(np.max(errors), 0.1, f'depth {depth}: {errors}')

  def test_poly_error_falls_with_degree(self):
    x = fcn_inputs()[:, :3]
    errors = np.array([mean_errors('POLY_EXPLICIT', 1, 1, x, [None],
                                   poly_degree=p)
                       for p in (1, 2, 8)])
    self.assertTrue(np.all(errors[1:] < errors[:-1]), errors)
    self.assertLess(np.max(errors[-1]), 0.02, errors)

  @test_utils.sample_product(method=APPROXIMATE_METHODS)
  def test_deterministic_given_key_and_jit(self, method):
    init_fn, feature_fn = relu_fcn(method, 32, 1, poly_degree=4)
    x = fcn_inputs()
    _, params = init_fn(random.PRNGKey(3), x.shape)
    f = feature_fn(x, params)
    again = feature_fn(x, init_fn(random.PRNGKey(3), x.shape)[1])
    jitted = jax.jit(feature_fn)(x, params)
    other = feature_fn(x, init_fn(random.PRNGKey(4), x.shape)[1])
    self.assertAllClose(again, f, rtol=0, atol=0)
    self.assertAllClose(jitted, f, rtol=1e-12, atol=1e-12)
    self.assertGreater(float(jnp.max(jnp.abs(other.ntk_feat - f.ntk_feat))),
                       1e-3)

  @test_utils.sample_product(method=APPROXIMATE_METHODS)
  def test_keys_in_params_give_the_same_features(self, method):
    x = fcn_inputs()
    layer = lambda generate: ft.serial(
        ft.DenseFeatures(1, 1.4, 0.1),
        ft.ReluFeatures(method, 32, 32, 32, 4, 32,
                        generate_rand_mtx=generate))
    key = random.PRNGKey(5)
    stored = layer(True)[1](x, layer(True)[0](key, x.shape)[1])
    init_fn, feature_fn = layer(False)
    _, params = init_fn(key, x.shape)
    self.assertEqual(params[1].shape, key.shape)
    self.assertAllClose(feature_fn(x, params), stored)

  def test_spatial_random_features(self):
    x = image_inputs()[:2, :3, :3]
    layer = ft.serial(ft.ConvFeatures(1, (2, 2), b_std=0.1),
                      ft.ReluFeatures('PSRF', 256, 256, 256, 8, 256),
                      ft.ConvFeatures(1, (2, 2)), ft.GlobalAvgPoolFeatures())
    nngp, ntk = feature_kernels(layer, x, random.PRNGKey(0))
    k = stax.serial(stax.Conv(1, (2, 2), padding='SAME', b_std=0.1),
                    stax.Relu(), stax.Conv(1, (2, 2), padding='SAME'),
                    stax.GlobalAvgPool())[2](x, None, ('nngp', 'ntk'))
    self.assertLess(relative_frobenius(nngp, k.nngp), 0.15)
    self.assertLess(relative_frobenius(ntk, k.ntk), 0.15)


def _gelu(x):
  return jax.nn.gelu(x, approximate=False)


ELEMENTWISE = {'erf': (jax.scipy.special.erf, stax.Erf),
               'gelu': (_gelu, stax.Gelu),
               'sin': (jnp.sin, stax.Sin)}


class ElementwiseFeaturesTest(test_utils.NeuralTangentsTestCase):

  @test_utils.sample_product(
      case=test_utils.full_tier_cases(
          [('erf', 'EXACT'), ('gelu', 'EXACT'), ('sin', 'EXACT'),
           ('gelu', 'POLYSKETCH')],
          [('erf', 'POLYSKETCH'), ('sin', 'POLYSKETCH')]))
  def test_matches_stax(self, case):
    name, method = case
    fn, stax_layer = ELEMENTWISE[name]
    x = fcn_inputs() / 2
    layer = ft.serial(
        ft.DenseFeatures(1, 1., 0.2),
        ft.ElementwiseFeatures(fn, method, 24, 1024, 1024),
        ft.DenseFeatures(1, 1., 0.1),
        ft.ElementwiseFeatures(fn, method, 24, 1024, 1024),
        ft.DenseFeatures(1))
    kernel_fn = stax.serial(stax.Dense(1, 1., 0.2), stax_layer(),
                            stax.Dense(1, 1., 0.1), stax_layer(),
                            stax.Dense(1))[2]
    nngp, ntk = feature_kernels(layer, x, random.PRNGKey(0))
    k = kernel_fn(x, None, ('nngp', 'ntk'))
    tol = 1e-3 if method == 'EXACT' else 0.1
    self.assertLess(relative_frobenius(nngp, k.nngp), tol)
    self.assertLess(relative_frobenius(ntk, k.ntk), tol)

  def test_truncation_error_falls_with_degree(self):
    x = fcn_inputs()[:, :3]
    kernel_fn = stax.serial(stax.Dense(1), stax.Erf(), stax.Dense(1))[2]
    k = kernel_fn(x, None, 'ntk')
    errors = []
    for method, degree in (('EXACT', 2), ('EXACT', 8), ('POLY_EXPLICIT', 8)):
      layer = ft.serial(
          ft.DenseFeatures(1),
          ft.ElementwiseFeatures(jax.scipy.special.erf, method, degree),
          ft.DenseFeatures(1))
      errors.append(relative_frobenius(feature_kernels(layer, x, None)[1], k))
    self.assertLess(errors[1], errors[0] / 2)
    # Explicit tensor powers give the same truncated series.
    self.assertAllClose(errors[2], errors[1], rtol=1e-6)


def graph_inputs():
  """3 graphs of 4 nodes with 2 features, and a random dense pattern."""
  x = test_utils.graded_inputs((3, 4, 2), (1, 1), np.float64)[0]
  pattern = np.random.RandomState(1).rand(3, 4, 4) > 0.5
  return x, pattern


def dense_to_edges(pattern):
  """The `(N, n_edges, 2)` edge lists of boolean `(N, V, V)` patterns,
  padded with -1."""
  edges = [np.argwhere(p) for p in pattern]
  most = max(len(e) for e in edges)
  return jnp.asarray(np.stack([
      np.concatenate([e, -np.ones((most - len(e), 2), int)]) for e in edges]))


class AggregateFeaturesTest(test_utils.NeuralTangentsTestCase):

  @test_utils.sample_product(case=test_utils.full_tier_cases(
      [('DENSE', True), ('SPARSE', False)],
      [('DENSE', False), ('SPARSE', True)]))
  def test_matches_stax(self, case):
    implementation, jit = case
    x, dense = graph_inputs()
    x2, dense2 = x[:2] * 1.3, dense[1:]
    to_pattern = (lambda p: jnp.asarray(p, jnp.float64)
                  if implementation == 'DENSE' else dense_to_edges(p))
    init_fn, feature_fn = ft.serial(
        ft.DenseFeatures(1, 1.2, 0.1), ft.ReluFeatures('EXACT'),
        ft.AggregateFeatures(implementation=implementation),
        ft.DenseFeatures(1),
        ft.AggregateFeatures(aggregate_axis=1, implementation=implementation),
        ft.GlobalAvgPoolFeatures())
    kernel_fn = stax.serial(
        stax.Dense(1, 1.2, 0.1), stax.Relu(),
        stax.Aggregate(implementation=implementation), stax.Dense(1),
        stax.Aggregate(aggregate_axis=1, implementation=implementation),
        stax.GlobalAvgPool())[2]
    xs = jnp.concatenate([x, x2])
    _, params = init_fn(None, xs.shape)
    if jit:
      feature_fn = jax.jit(feature_fn)
    # 'EXACT' features are of one batch: both inputs at once.
    f = feature_fn(xs, params, pattern=to_pattern(
        np.concatenate([dense, dense2])))
    k = kernel_fn(x, x2, ('nngp', 'ntk'),
                  pattern=(to_pattern(dense), to_pattern(dense2)))
    self.assertAllClose(f.nngp_feat[:3] @ f.nngp_feat[3:].T, k.nngp,
                        rtol=1e-9, atol=1e-9)
    self.assertAllClose(f.ntk_feat[:3] @ f.ntk_feat[3:].T, k.ntk,
                        rtol=1e-9, atol=1e-9)

  def test_no_pattern_is_the_identity_and_bad_patterns_raise(self):
    x, _ = graph_inputs()
    _, feature_fn = ft.AggregateFeatures()
    f = feature_fn(x, ())
    self.assertAllClose(f.nngp_feat, x / np.sqrt(2))
    with self.assertRaisesRegex(ValueError, 'pattern'):
      feature_fn(x, (), pattern=jnp.ones((3, 4, 3)))
    with self.assertRaisesRegex(ValueError, 'AggregateFeatures.*aggregate'):
      ft.AggregateFeatures(aggregate_axis=0)[0](None, x.shape)


def relu_network(depth, W_std=1., b_std=0.):
  """The stax network whose kernels `ReluNTKFeatures(depth, W_std=...,
  b_std=...)` sketch: every dense layer with the same `W_std`, `b_std`."""
  dense = lambda: stax.Dense(1, W_std, b_std)
  return stax.serial(*[dense(), stax.Relu()] * depth, dense())


_RELU_NTK_CASES = [(1., 0.), (2**0.5, 0.), (1.5, 0.3)]


class ReluNTKFeaturesTest(test_utils.NeuralTangentsTestCase):

  def relu_ntk_errors(self, x, depth, dim, keys, W_std, b_std):
    k = relu_network(depth, W_std, b_std)[2](x, None, ('nngp', 'ntk'))
    errors = []
    for key in keys:
      layer = ft.ReluNTKFeatures(depth, 8, dim, W_std=W_std, b_std=b_std)
      nngp, ntk = feature_kernels(layer, x, key)
      errors.append((relative_frobenius(nngp, k.nngp),
                     relative_frobenius(ntk, k.ntk)))
    return np.mean(errors, axis=0)

  @test_utils.sample_product(
      std=_RELU_NTK_CASES,
      depth=test_utils.full_tier_cases([1, 3], [2, 4]))
  def test_error_is_small_and_falls_with_dimension(self, std, depth):
    keys = [random.PRNGKey(1)]
    errors = np.array([self.relu_ntk_errors(fcn_inputs(), depth, dim, keys,
                                            *std)
                       for dim in (256, 4096)])
    self.assertTrue(np.all(errors[1] < errors[0]), errors)
    self.assertLess(np.max(errors[1]), 0.1, errors)

  def test_default_network_on_wide_inputs(self):
    # 4 inputs of 256 features, the default `W_std=1`, `b_std=0`: the network
    # of `stax.Dense(1)` and `stax.Relu()` layers (the features of a
    # He-scaled network were 2^depth times its kernels: relative error 1).
    x = test_utils.graded_inputs((4, 256), (1, 256), np.float64)[0]
    init_fn, feature_fn = ft.ReluNTKFeatures(2, 8, 4096)
    _, params = init_fn(random.PRNGKey(2), x.shape)
    f = feature_fn(x, params)
    k = relu_network(2)[2](x, None, ('nngp', 'ntk'))
    self.assertLess(relative_frobenius(f.nngp_feat @ f.nngp_feat.T, k.nngp),
                    0.05)
    self.assertLess(relative_frobenius(f.ntk_feat @ f.ntk_feat.T, k.ntk),
                    0.05)
    # The diagonal is exact (to stax's rounding).
    self.assertAllClose(jnp.sum(f.ntk_feat**2, axis=1), jnp.diagonal(k.ntk),
                        rtol=1e-7, atol=1e-7)

  def test_channels_and_jit(self):
    x = image_inputs()  # Every position is a row, as for `stax.Dense`.
    init_fn, feature_fn = ft.ReluNTKFeatures(2, 4, 64)
    shapes, _ = init_fn(random.PRNGKey(0), x.shape)
    self.assertEqual(shapes, ((3, 6, 5, 65), (3, 6, 5, 129)))
    # A bias adds a channel to both.
    init_fn, feature_fn = ft.ReluNTKFeatures(2, 4, 64, W_std=1.3, b_std=0.2)
    shapes, params = init_fn(random.PRNGKey(0), x.shape)
    self.assertEqual(shapes, ((3, 6, 5, 66), (3, 6, 5, 130)))
    f = feature_fn(x, params)
    self.assertAllClose(jax.jit(feature_fn)(x, params), f, rtol=1e-12,
                        atol=1e-12)
    # The diagonal is exact: `q' = W_std^2 q / 2 + b_std^2` and
    # `ntk' = q' + W_std^2 ntk / 2` (`kappa_0(1) = kappa_1(1) = 1`). (Not
    # stax's: its dual of the step at `rho = 1 - 1e-16` is off by 3e-9.)
    q = 1.3**2 * jnp.sum(x**2, axis=-1) / 2 + 0.2**2
    ntk = q
    for _ in range(2):
      q = 1.3**2 * q / 2 + 0.2**2
      ntk = q + 1.3**2 * ntk / 2
    ntk_diagonal = jnp.einsum('nhwc,nhwc->nhw', f.ntk_feat, f.ntk_feat)
    self.assertAllClose(ntk_diagonal, ntk, rtol=1e-12, atol=1e-12)
    with self.assertRaisesRegex(ValueError, 'ReluNTKFeatures.*NTK channels'):
      feature_fn(ft.DenseFeatures(1)[1](x, ()), params)

  def test_bad_standard_deviations_raise(self):
    with self.assertRaisesRegex(TypeError, 'W_std.*ReluNTKFeatures'):
      ft.ReluNTKFeatures(2, W_std='1')
    with self.assertRaisesRegex(ValueError, 'b_std.*finite.*nan'):
      ft.ReluNTKFeatures(2, b_std=float('nan'))
    with self.assertRaises(TypeError):  # Keyword only.
      ft.ReluNTKFeatures(2, 8, 64, 0, -1, 1.)


def pooled_image_inputs():
  """3 images of 32 x 28 x 2."""
  return test_utils.graded_inputs((3, 32, 28, 2), (1, 1), np.float64)[0]


class PoolingAndFlattenTest(test_utils.NeuralTangentsTestCase):

  @test_utils.sample_product(case=test_utils.full_tier_cases(
      [(((2, 2), (2, 2), 'VALID', False), 2),
       (((3, 3), None, 'SAME', True), 1),
       (((3, 2), (2, 1), 'SAME', False), 2),
       (((2, 3), (1, 2), 'CIRCULAR', False), 1)],
      [(((2, 2), (2, 2), 'VALID', False), 1),
       (((3, 3), None, 'SAME', True), 2),
       (((3, 2), (2, 1), 'SAME', False), 1),
       (((2, 3), (1, 2), 'CIRCULAR', False), 2)]))
  def test_avg_pool_then_flatten_is_exact(self, case):
    pool, n_layers = case
    x = pooled_image_inputs()
    layer = ft.serial(*[ft.AvgPoolFeatures(*pool)] * n_layers,
                      ft.FlattenFeatures())
    nngp, _ = feature_kernels(layer, x, None)
    k = stax.serial(*[stax.AvgPool(*pool) for _ in range(n_layers)],
                    stax.Flatten())[2](x, None, 'nngp')
    self.assertAllClose(nngp, k, rtol=1e-9, atol=1e-9)

  @test_utils.sample_product(
      shape=[(4, 12), (4, 48, 3), (4, 6, 8, 3)],
      before=('raw', 'dense_relu'))
  def test_flatten_is_exact(self, shape, before):
    x = test_utils.graded_inputs(shape, (1,) * len(shape), np.float64)[0]
    if before == 'raw':
      features, layers = [], []
    else:
      features = [ft.DenseFeatures(1, 1.2, 0.1), ft.ReluFeatures('EXACT')]
      layers = [stax.Dense(1, 1.2, 0.1), stax.Relu()]
    nngp, ntk = feature_kernels(
        ft.serial(*features, ft.FlattenFeatures(), ft.DenseFeatures(1)), x,
        None)
    k = stax.serial(*layers, stax.Flatten(), stax.Dense(1))[2](
        x, None, ('nngp', 'ntk'))
    self.assertAllClose(nngp, k.nngp, rtol=1e-9, atol=1e-9)
    self.assertAllClose(ntk, k.ntk, rtol=1e-9, atol=1e-9)


  def test_flatten_of_no_examples(self):
    # The size of an empty array does not give the flattened width (a
    # `reshape` with -1 divided by 0: "integer modulo by zero").
    layer = ft.serial(ft.AvgPoolFeatures((2, 2)), ft.FlattenFeatures())
    for shape in ((0, 6, 5, 2), (3, 6, 5, 2)):
      shapes, params = layer[0](None, shape)
      f = layer[1](jnp.ones(shape), params)
      self.assertEqual((f.nngp_feat.shape, f.ntk_feat.shape), shapes)
      self.assertEqual(shapes, ((shape[0], 40), (shape[0], 0)))


class ConvolutionMemoryTest(test_utils.NeuralTangentsTestCase):

  @test_utils.sample_product(case=[('SAME', (3, 3)), ('CIRCULAR', (3, 2)),
                                   ('VALID', (1, 2))])
  def test_four_convolutions_on_small_images(self, case):
    padding, filter_shape = case
    x = test_utils.graded_inputs((3, 4, 5, 2), (1, 1, 1, 1), np.float64)[0]
    init_fn, feature_fn = ft.serial(
        *[ft.ConvFeatures(1, filter_shape, padding=padding, W_std=1.3,
                          b_std=0.2)] * 4, ft.FlattenFeatures())
    _, params = init_fn(None, x.shape)
    compiled = jax.jit(feature_fn).lower(x, params).compile()
    memory = compiled.memory_analysis()
    if memory is not None:
      # The features themselves (34 MB for 'SAME'), and as much again: the
      # patches of `jax.lax` took 15.6 GB (their identity filter).
      self.assertLess(memory.temp_size_in_bytes + memory.output_size_in_bytes,
                      100e6)
    f = compiled(x, params)
    k = stax.serial(*[stax.Conv(1, filter_shape, padding=padding, W_std=1.3,
                                b_std=0.2) for _ in range(4)],
                    stax.Flatten())[2](x, None, ('nngp', 'ntk'))
    self.assertAllClose(f.nngp_feat @ f.nngp_feat.T, k.nngp, rtol=1e-9,
                        atol=1e-9)
    self.assertAllClose(f.ntk_feat @ f.ntk_feat.T, k.ntk, rtol=1e-9,
                        atol=1e-9)

  def test_too_many_channels_raise_saying_how_many(self):
    init_fn, feature_fn = ft.serial(*[ft.ConvFeatures(1, (3, 3))] * 4)
    shape = (16, 256, 256, 3)
    # `init_fn` gives the shapes (of a data set computed by batches).
    shapes, params = init_fn(None, shape)
    self.assertEqual(shapes[0], (16, 256, 256, 3 * 9**4))
    with self.assertRaisesRegex(
        ValueError, r'ConvFeatures.*would form 1048576 rows of 729 '
        r'channels.*ReluFeatures'):
      # Shapes only: nothing allocated.
      jax.eval_shape(feature_fn, jax.ShapeDtypeStruct(shape, jnp.float32),
                     params)


class PolyMethodTest(test_utils.NeuralTangentsTestCase):

  def test_poly_on_wide_inputs_is_within_the_fit(self):
    # 'POLY' (the polynomial fits factored on the batch) takes any number of
    # channels; 'POLY_EXPLICIT' would form 256^8 of them.
    x = test_utils.graded_inputs((4, 256), (1, 256), np.float64)[0]
    layers = [stax.Dense(1, 1.4, 0.1), stax.Relu(), stax.Dense(1, 1.2),
              stax.Relu(), stax.Dense(1)]
    nngp, ntk = feature_kernels(
        ft.from_stax(*layers, relu_method='POLY', poly_degree=8), x, None)
    k = stax.serial(*layers)[2](x, None, ('nngp', 'ntk'))
    self.assertLess(relative_frobenius(nngp, k.nngp), 1e-3)
    self.assertLess(relative_frobenius(ntk, k.ntk), 0.01)
    self.assertGreater(relative_frobenius(ntk, k.ntk), 1e-6)  # Not 'EXACT'.
    with self.assertRaisesRegex(ValueError, "POLY_EXPLICIT.*method='POLY'"):
      ft.ReluFeatures('POLY_EXPLICIT')[0](None, x.shape)

  def test_poly_myrtle(self):
    # The Myrtle-5-like CNN of `MyrtleTest` on 3 images of 4x4x3: 'POLY'
    # factors the batch's kernel matrices of 48 rows.
    x = test_utils.graded_inputs((3, 4, 4, 3), (1, 1), np.float64)[0]
    network = myrtle5()
    nngp, ntk = feature_kernels(ft.from_stax(network, relu_method='POLY'), x,
                                None, jit=True)
    k = network[2](x, None, ('nngp', 'ntk'))
    self.assertLess(relative_frobenius(nngp, k.nngp), 1e-3)
    self.assertLess(relative_frobenius(ntk, k.ntk), 0.02)

  @test_utils.sample_product(relu=(True, False))
  def test_poly_is_the_kernel_of_the_explicit_powers(self, relu):
    x = fcn_inputs()[:, :3]
    if relu:
      make = lambda method: ft.ReluFeatures(method, poly_degree=4)
    else:
      make = lambda method: ft.ElementwiseFeatures(jnp.sin, method, 4)
    kernels = [
        feature_kernels(ft.serial(ft.DenseFeatures(1, 1., 0.3), make(method),
                                  ft.DenseFeatures(1)), x, None)
        for method in ('POLY', 'POLY_EXPLICIT')]
    self.assertAllClose(kernels[0], kernels[1], rtol=1e-9, atol=1e-9)


def fcn_erf_network():
  return stax.serial(stax.Dense(1, 1., 0.1), stax.Erf(), stax.Dense(1, 1.5),
                     stax.Erf(a=2., b=0.5), stax.Dense(1))


# Stax networks of layers with features, and their inputs.
STAX_NETWORKS = {
    'fcn_relu': (fcn_inputs, lambda: stax.serial(
        stax.Dense(1, 1.3, 0.2), stax.Relu(),
        stax.repeat(stax.serial(stax.Dense(1, 0.8, 0.1), stax.Relu()), 2),
        stax.Dense(1))),
    'fcn_erf': (lambda: fcn_inputs() / 2, fcn_erf_network),
    'cnn': (lambda: image_inputs()[:2, :5, :4], lambda: stax.serial(
        stax.Conv(1, (3, 3), padding='SAME', b_std=0.1), stax.Relu(),
        stax.AvgPool((2, 2), padding='SAME'), stax.Identity(),
        stax.Conv(1, (2, 2), W_std=1.2), stax.LayerNorm(), stax.Relu(),
        stax.GlobalAvgPool(), stax.Dense(1))),
    'cnn_nchw': (lambda: jnp.moveaxis(image_inputs(), -1, 1),
                 lambda: stax.serial(
                     stax.Conv(1, (3, 3), padding='CIRCULAR',
                               dimension_numbers=('NCHW', 'OIHW', 'NCHW')),
                     stax.Relu(), stax.Flatten(), stax.Dense(1))),
}


class FromStaxTest(test_utils.NeuralTangentsTestCase):

  @test_utils.sample_product(network=list(STAX_NETWORKS))
  def test_exact_methods_match_stax(self, network):
    inputs, make = STAX_NETWORKS[network]
    x, net = inputs(), make()
    layer = ft.from_stax(net, relu_method='EXACT', elementwise_method='EXACT',
                         poly_degree=48)
    nngp, ntk = feature_kernels(layer, x, random.PRNGKey(0), jit=True)
    k = net[2](x, None, ('nngp', 'ntk'))
    # `Erf`'s features truncate its Hermite series.
    tol = 1e-5 if network == 'fcn_erf' else 1e-9
    self.assertAllClose(nngp, k.nngp, rtol=tol, atol=tol)
    self.assertAllClose(ntk, k.ntk, rtol=tol, atol=tol)

  def test_random_features_of_several_layers(self):
    x = fcn_inputs()
    first, rest = stax.Dense(1, 1.4, 0.1), [stax.Relu(), stax.Dense(1)]
    layer = ft.from_stax(first, *rest, relu_method='PSRF', feature_dim=2048)
    nngp, ntk = feature_kernels(layer, x, random.PRNGKey(0))
    k = stax.serial(first, *rest)[2](x, None, ('nngp', 'ntk'))
    self.assertLess(relative_frobenius(nngp, k.nngp), 0.1)
    self.assertLess(relative_frobenius(ntk, k.ntk), 0.1)

  def test_unsupported_layers_raise_naming_them(self):
    by_hand = (lambda key, shape: (shape, ()), lambda p, x, **kw: x,
               lambda k, **kw: k)
    cases = [
        (stax.serial(stax.Dense(1), stax.Dropout(0.5)),
         r'`stax.Dropout` \(argument 0, serial layer 1\)'),
        (stax.serial(stax.FanOut(2), stax.parallel(stax.Dense(1),
                                                   stax.Relu())),
         '`stax.FanOut`.*branching'),
        (stax.GlobalSelfAttention(1, 1, 1, 1), '`stax.GlobalSelfAttention`'),
        (stax.serial(stax.Dense(1), by_hand),
         'argument 0, serial layer 1.*layer_spec'),
        (stax.Elementwise(nngp_fn=lambda c, q1, q2: c), 'fn='),
    ]
    for network, message in cases:
      with self.assertRaisesRegex(ValueError, message):
        ft.from_stax(network)
    with self.assertRaisesRegex(ValueError, 'relu_method'):
      ft.from_stax(stax.Relu(), relu_method='FOO')


def myrtle5():
  """A Myrtle-5-like CNN: 3 convolutions of 3x3 with ReLUs, 2 average poolings
  and a readout."""
  conv = lambda: stax.Conv(1, (3, 3), padding='SAME')
  return stax.serial(conv(), stax.Relu(), conv(), stax.Relu(),
                     stax.AvgPool((2, 2), (2, 2)), conv(), stax.Relu(),
                     stax.AvgPool((2, 2), (2, 2)), stax.GlobalAvgPool(),
                     stax.Dense(1))


class MyrtleTest(test_utils.NeuralTangentsTestCase):

  # About a minute per method on 2 cores (the 3x3 convolutions' features
  # have 9 (4096 + 1) channels); errors measured in `docs/features.md`. Not
  # compiled: op by op holds fewer of the large random matrices at once.
  @test_utils.full_tier_only
  @test_utils.sample_product(relu_method=('POLYSKETCH', 'RANDFEAT'))
  def test_error_at_dimension_4096(self, relu_method):
    x = test_utils.graded_inputs((3, 8, 8, 3), (1, 1), np.float64)[0]
    network = myrtle5()
    nngp, ntk = feature_kernels(
        ft.from_stax(network, relu_method=relu_method, feature_dim=4096), x,
        random.PRNGKey(0))
    k = network[2](x, None, ('nngp', 'ntk'))
    self.assertLess(relative_frobenius(nngp, k.nngp), 0.1)
    self.assertLess(relative_frobenius(ntk, k.ntk), 0.1)


class MessyInputsTest(test_utils.NeuralTangentsTestCase):
  """Each input a user might feed: the right answer or a clear error
  (issue 52)."""

  @test_utils.sample_product(step=('Sign', 'RectifiedMonomial'))
  def test_steps_have_zero_derivative_as_in_stax(self, step):
    x = fcn_inputs()
    layer = stax.Sign() if step == 'Sign' else stax.RectifiedMonomial(0)
    network = stax.serial(stax.Dense(1, 1., 0.1), layer, stax.Dense(1, 1.2))
    k = network[2](x, None, ('nngp', 'ntk'))
    errors = []
    for degree in (8, 32):
      nngp, ntk = feature_kernels(
          ft.from_stax(network, elementwise_method='EXACT',
                       poly_degree=degree), x, None)
      errors.append((relative_frobenius(nngp, k.nngp),
                     relative_frobenius(ntk, k.ntk)))
    errors = np.array(errors)
    # The series of a jump converges slowly, but converges (the derivative
    # as a delta was 2 to 5 times off, worse with the degree).
    self.assertTrue(np.all(errors[1] < errors[0]), errors)
    self.assertLess(np.max(errors[1]), 0.1, errors)

  def test_layer_norm_eps(self):
    with self.assertRaisesRegex(ValueError, 'eps.*nan'):
      ft.LayerNormFeatures(eps=float('nan'))
    x = fcn_inputs()
    nngp, _ = feature_kernels(
        ft.serial(ft.DenseFeatures(1), ft.LayerNormFeatures(
            eps=np.float32(0.5))), x, None)
    k = stax.serial(stax.Dense(1), stax.LayerNorm(eps=0.5))[2](x, None,
                                                               'nngp')
    self.assertAllClose(nngp, k, rtol=1e-9, atol=1e-9)

  def test_inputs_stax_rejects_raise(self):
    _, feature_fn = ft.serial(ft.DenseFeatures(1), ft.ReluFeatures('EXACT'))
    cases = [(jnp.ones(3), ValueError, r'rank 2.*shape \(3,\).*x\[None\]'),
             (jnp.ones((3, 2)) + 1j, TypeError, 'real.*complex'),
             (jnp.ones((3, 0)), ValueError, '0 channels')]
    for x, error, message in cases:
      with self.assertRaisesRegex(error, message):
        feature_fn(x, [(), ()])
    with self.assertRaisesRegex(ValueError, '0 channels'):
      ft.ReluNTKFeatures(2, 4, 16)[0](random.PRNGKey(0), (3, 0))

  @test_utils.sample_product(bad=('nan', 'zero_row_layer_norm'),
                             method=('EXACT', 'POLY'))
  def test_one_bad_row_leaves_the_others_finite(self, bad, method):
    x = np.array(fcn_inputs())
    x[2] = np.nan if bad == 'nan' else 0
    norm = bad != 'nan'
    network = stax.serial(stax.Dense(1, 1.2),
                          *([stax.LayerNorm(eps=0.)] if norm else []),
                          stax.Relu(), stax.Dense(1, b_std=0.1), stax.Relu(),
                          stax.Dense(1))
    layer = ft.from_stax(network, relu_method=method)
    # 'POLY' is exact for the polynomial fits, not for the ReLU.
    tol = 1e-9 if method == 'EXACT' else 0.02
    nngp, ntk = feature_kernels(layer, x, None)
    k = network[2](x, None, ('nngp', 'ntk'))
    # The other rows' kernels are stax's (they were all NaN); a zero row's
    # too. A NaN row's NTK is NaN, as stax's (its NNGP after a ReLU is NaN
    # with 'POLY', 0 with 'EXACT' and in stax).
    rows = [0, 1, 3, 4, 5] if bad == 'nan' else list(range(6))
    for actual, expected in ((nngp, k.nngp), (ntk, k.ntk)):
      self.assertAllClose(actual[np.ix_(rows, rows)],
                          expected[np.ix_(rows, rows)], rtol=tol, atol=tol)
    if bad == 'nan':
      self.assertTrue(np.all(np.isnan(ntk[2])) and
                      np.all(np.isnan(k.ntk[2])))

  @test_utils.sample_product(method=('EXACT', 'POLY'))
  def test_float16_inputs_to_batch_methods(self, method):
    x = fcn_inputs()
    layer = ft.serial(ft.DenseFeatures(1), ft.ReluFeatures(method),
                      ft.DenseFeatures(1))
    f = layer[1](x.astype(np.float16), [(), (), ()])
    k = stax.serial(stax.Dense(1), stax.Relu(), stax.Dense(1))[2](
        x, None, 'ntk')
    ntk = np.asarray(f.ntk_feat, np.float64)
    self.assertLess(relative_frobenius(ntk @ ntk.T, k), 0.02)

  def test_params_drawn_for_other_inputs_or_methods_raise(self):
    x = fcn_inputs()
    init_fn, feature_fn = ft.serial(ft.DenseFeatures(1),
                                    ft.ReluFeatures('RANDFEAT', 16, 16, 16))
    _, params = init_fn(random.PRNGKey(0), (6, 2))
    with self.assertRaisesRegex(ValueError,
                                'ReluFeatures.*params.*input width'):
      feature_fn(x, params)
    _, other = ft.ReluFeatures('PSRF', 16, 16, 16, 4, 16)[0](
        random.PRNGKey(0), (6, 5))
    with self.assertRaisesRegex(ValueError, 'ReluFeatures.*params'):
      ft.ReluFeatures('POLYSKETCH', 16, 16, 16, 4, 16)[1](x, other)
    _, other = ft.ElementwiseFeatures(jnp.sin, 'POLYSKETCH', 4, 16, 16)[0](
        random.PRNGKey(0), (6, 17))
    with self.assertRaisesRegex(ValueError, 'ElementwiseFeatures.*params'):
      ft.ElementwiseFeatures(jnp.sin, 'POLYSKETCH', 4, 16, 16)[1](x, other)
    _, other = ft.ReluNTKFeatures(2, 4, 16)[0](random.PRNGKey(0), (6, 17))
    with self.assertRaisesRegex(ValueError, 'ReluNTKFeatures.*params'):
      ft.ReluNTKFeatures(2, 4, 16)[1](x, other)


class ArgumentsTest(test_utils.NeuralTangentsTestCase):

  def test_bad_arguments_name_the_argument(self):
    cases = [
        (lambda: ft.ReluFeatures('FOO'), ValueError, 'method'),
        (lambda: ft.ReluFeatures(feature_dim0=0), ValueError, 'feature_dim0'),
        (lambda: ft.ReluFeatures(sketch_dim=2.), TypeError, 'sketch_dim'),
        (lambda: ft.ReluFeatures(generate_rand_mtx='yes'), TypeError,
         'generate_rand_mtx'),
        (lambda: ft.DenseFeatures(1, W_std='1'), TypeError, 'W_std'),
        (lambda: ft.DenseFeatures(1, W_std=float('nan')), ValueError,
         'W_std.*DenseFeatures.*finite'),
        (lambda: ft.ConvFeatures(1, (2,), b_std=float('inf')), ValueError,
         'b_std.*ConvFeatures.*finite'),
        (lambda: ft.DenseFeatures(1, parameterization='standard'),
         NotImplementedError, 'parameterization'),
        (lambda: ft.ConvFeatures(1, (3, 3), padding='FULL'), ValueError,
         'padding'),
        (lambda: ft.FlattenFeatures(batch_axis_out=2), ValueError,
         'batch_axis_out'),
        (lambda: ft.LayerNormFeatures(eps=-1.), ValueError, 'eps'),
        (lambda: ft.ElementwiseFeatures(3.), TypeError, 'fn'),
        (lambda: ft.ElementwiseFeatures(jnp.sin, n_quadrature=4), ValueError,
         'n_quadrature'),
        (lambda: ft.serial(ft.DenseFeatures), TypeError, 'serial'),
        (lambda: ft.LayerNormFeatures(axis=0)[1](jnp.ones((2, 3)), ()),
         ValueError, 'axis'),
        (lambda: ft.AvgPoolFeatures((0, 2)), ValueError, 'window_shape'),
        (lambda: ft.AvgPoolFeatures((5, 5))[1](jnp.ones((1, 3, 3, 2)), ()),
         ValueError, 'AvgPoolFeatures'),
        (lambda: ft.ConvFeatures(1, (3, 3), padding='VALID')[1](
            jnp.ones((1, 2, 2, 2)), ()), ValueError, 'filter_shape'),
        (lambda: ft.ConvFeatures(1, (3,))[1](jnp.ones((1, 3, 3, 2)), ()),
         ValueError, 'filter_shape'),
        (lambda: ft.ReluFeatures('POLY_EXPLICIT', poly_degree=8)[0](
            None, (2, 100)), ValueError, 'POLYSKETCH'),
        (lambda: ft.ReluFeatures('RANDFEAT', 4, 4, 4)[0](0, (2, 3)),
         TypeError, 'key'),
        (lambda: ft.DenseFeatures(1, channel_axis=0)[1](
            ft.Features(jnp.ones((2, 3)), jnp.ones((2, 0))), ()),
         ValueError, 'channel_axis'),
        (lambda: ft.AggregateFeatures(implementation='CSR'), ValueError,
         'implementation'),
        (lambda: ft.ReluNTKFeatures(0), ValueError, 'num_layers'),
        (lambda: ft.ReluNTKFeatures(2, poly_sketch_dim=1.5), TypeError,
         'poly_sketch_dim'),
        (lambda: ft.from_stax(stax.Relu(), feature_dim=0), ValueError,
         'feature_dim'),
    ]
    for make, error, name in cases:
      with self.assertRaisesRegex(error, name):
        make()

  def test_import_neural_tangents_does_not_import_features(self):
    # `nt.experimental` itself is a small module of lazy names.
    code = ('import sys, neural_tangents as nt; '
            'print(any(m.startswith("neural_tangents.experimental.") or '
            'm.startswith("neural_tangents._src.experimental") '
            'for m in sys.modules), '
            'nt.experimental.features.DenseFeatures is not None)')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True,
                         text=True, check=True, cwd=test_utils.REPO_ROOT,
                         timeout=120,
                         env={'PYTHONPATH': test_utils.REPO_ROOT,
                              'JAX_PLATFORMS': 'cpu'})
    self.assertEqual(out.stdout.strip(), 'False True')

if __name__ == '__main__':
  absltest.main()
