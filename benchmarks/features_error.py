"""Error and time of `nt.experimental.features` against the exact stax kernels.

For a ReLU network `[Dense(1, 1.4, 0.1), Relu()] * depth + [Dense(1)]` on 6
inputs of 5 features with norms 0.5 to 1.6 (float64), prints one JSON line per
(method, depth, feature dimension): the relative Frobenius errors of the NNGP
and NTK of the features against `stax`'s exact kernels, averaged over keys,
and the seconds of one (compiled) feature computation. 'POLY_EXPLICIT'
(explicit tensor powers) is measured on 3 input features by polynomial
degree instead of dimension.

Section 'relu_ntk': `ReluNTKFeatures(depth, 16, dim, W_std=w, b_std=b)`
against its stax network `[Dense(1, w, b), Relu()] * depth + [Dense(1, w, b)]`
on the same inputs, for `(w, b)` = (1, 0) (the default; without biases the
relative errors do not depend on `w`) and (1.5, 0.3). Section 'myrtle': a Myrtle-5-like CNN (three 3x3 'SAME' convolutions
with ReLUs, two 2x2 average poolings, global average pooling, a dense
readout) converted by `ft.from_stax`, on 3 random 8x8x3 images (one key, run
op by op: about a minute per measurement on 2 cores at dimension 4096).

Usage: python benchmarks/features_error.py [n_keys] [section ...]
  (sections: 'relu', 'relu_ntk', 'myrtle'; all by default)
"""
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents import stax
from neural_tangents.experimental import features as ft

jax.config.update('jax_enable_x64', True)


def inputs():
  rng = np.random.RandomState(0)
  x = rng.randn(6, 5) * np.linspace(0.5, 1.6, 6)[:, None]
  return jnp.asarray(x)


def relative_frobenius(actual, expected):
  return float(jnp.linalg.norm(actual - expected) /
               jnp.linalg.norm(expected))


def network(method, dim, depth, degree=8):
  features, layers = [], []
  for _ in range(depth):
    features += [ft.DenseFeatures(1, 1.4, 0.1),
                 ft.ReluFeatures(method, dim, dim, dim, degree, dim)]
    layers += [stax.Dense(1, 1.4, 0.1), stax.Relu()]
  return (ft.serial(*features, ft.DenseFeatures(1)),
          stax.serial(*layers, stax.Dense(1))[2])


def measure(method, dim, depth, x, n_keys, degree=8):
  return measure_layer(*network(method, dim, depth, degree), x, n_keys,
                       dict(method=method, depth=depth, dim=dim,
                            degree=degree))


def measure_layer(feature_layer, kernel_fn, x, n_keys, description,
                  jit=True):
  """Errors and seconds of `feature_layer` against `kernel_fn` on `x`
  (`jit=False`: run op by op, which holds fewer large buffers at once)."""
  init_fn, feature_fn = feature_layer
  k = kernel_fn(x, None, ('nngp', 'ntk'))
  if jit:
    feature_fn = jax.jit(feature_fn)
  errors, seconds = [], []
  for seed in range(n_keys):
    _, params = init_fn(jax.random.PRNGKey(seed), x.shape)
    if jit:
      jax.block_until_ready(feature_fn(x, params))  # Compiles.
    start = time.perf_counter()
    f = jax.block_until_ready(feature_fn(x, params))
    seconds.append(time.perf_counter() - start)
    errors.append((relative_frobenius(f.nngp_feat @ f.nngp_feat.T, k.nngp),
                   relative_frobenius(f.ntk_feat @ f.ntk_feat.T, k.ntk)))
  nngp, ntk = np.mean(errors, axis=0)
  return dict(**description,
              n_keys=n_keys, nngp_error=round(float(nngp), 4),
              ntk_error=round(float(ntk), 4),
              seconds=round(float(np.median(seconds)), 4))


def myrtle5():
  conv = lambda: stax.Conv(1, (3, 3), padding='SAME')
  return stax.serial(conv(), stax.Relu(), conv(), stax.Relu(),
                     stax.AvgPool((2, 2), (2, 2)), conv(), stax.Relu(),
                     stax.AvgPool((2, 2), (2, 2)), stax.GlobalAvgPool(),
                     stax.Dense(1))


def main():
  n_keys = int(sys.argv[1]) if len(sys.argv) > 1 else 3
  sections = sys.argv[2:] or ['relu', 'relu_ntk', 'myrtle']
  x = inputs()
  if 'relu' in sections:
    for method in ('RANDFEAT', 'POLYSKETCH', 'PSRF'):
      for depth in (1, 2, 3, 4):
        for dim in (256, 1024, 4096):
          print(json.dumps(measure(method, dim, depth, x, n_keys)),
                flush=True)
    for degree in (2, 4, 8):
      print(json.dumps(measure('POLY_EXPLICIT', 1, 1, x[:, :3], 1,
                               degree)), flush=True)
  if 'relu_ntk' in sections:
    for w_std, b_std in ((1., 0.), (1.5, 0.3)):
      for depth in (1, 2, 3, 4):
        kernel_fn = stax.serial(
            *[stax.Dense(1, w_std, b_std), stax.Relu()] * depth,
            stax.Dense(1, w_std, b_std))[2]
        for dim in (256, 1024, 4096):
          layer = ft.ReluNTKFeatures(depth, 16, dim, W_std=w_std, b_std=b_std)
          print(json.dumps(measure_layer(
              layer, kernel_fn, x, n_keys,
              dict(network='relu_ntk', W_std=w_std, b_std=b_std, depth=depth,
                   dim=dim, degree=16))), flush=True)
  if 'myrtle' in sections:
    images = jnp.asarray(np.random.RandomState(0).randn(3, 8, 8, 3))
    network = myrtle5()
    for method in ('RANDFEAT', 'POLYSKETCH', 'PSRF'):
      for dim in (1024, 4096):
        layer = ft.from_stax(network, relu_method=method, feature_dim=dim)
        # Not compiled: the compiled network (its `d x D` random matrices
        # of `d = 9 (D + 1)` rows cast to float64) ran out of memory
        # on a 24 GB machine at D = 4096.
        print(json.dumps(measure_layer(
            layer, network[2], images, 1,
            dict(network='myrtle5', method=method, dim=dim), jit=False)),
              flush=True)


if __name__ == '__main__':
  main()
