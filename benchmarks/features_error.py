"""Error and time of `nt.experimental.features` against the exact stax kernels.

For a ReLU network `[Dense(1, 1.4, 0.1), Relu()] * depth + [Dense(1)]` on 6
inputs of 5 features with norms 0.5 to 1.6 (float64), prints one JSON line per
(method, depth, feature dimension): the relative Frobenius errors of the NNGP
and NTK of the features against `stax`'s exact kernels, averaged over keys,
and the seconds of one (compiled) feature computation. 'POLY' (explicit
tensor powers) is measured on 3 input features by polynomial degree instead
of dimension.

Usage: python benchmarks/features_error.py [n_keys]
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
  (init_fn, feature_fn), kernel_fn = network(method, dim, depth, degree)
  k = kernel_fn(x, None, ('nngp', 'ntk'))
  feature_fn = jax.jit(feature_fn)
  errors, seconds = [], []
  for seed in range(n_keys):
    _, params = init_fn(jax.random.PRNGKey(seed), x.shape)
    jax.block_until_ready(feature_fn(x, params))  # Compiles.
    start = time.perf_counter()
    f = jax.block_until_ready(feature_fn(x, params))
    seconds.append(time.perf_counter() - start)
    errors.append((relative_frobenius(f.nngp_feat @ f.nngp_feat.T, k.nngp),
                   relative_frobenius(f.ntk_feat @ f.ntk_feat.T, k.ntk)))
  nngp, ntk = np.mean(errors, axis=0)
  return dict(method=method, depth=depth, dim=dim, degree=degree,
              n_keys=n_keys, nngp_error=round(float(nngp), 4),
              ntk_error=round(float(ntk), 4),
              seconds=round(float(np.median(seconds)), 4))


def main():
  n_keys = int(sys.argv[1]) if len(sys.argv) > 1 else 3
  x = inputs()
  for method in ('RANDFEAT', 'POLYSKETCH', 'PSRF'):
    for depth in (1, 2, 3, 4):
      for dim in (256, 1024, 4096):
        print(json.dumps(measure(method, dim, depth, x, n_keys)), flush=True)
  for degree in (2, 4, 8):
    print(json.dumps(measure('POLY', 1, 1, x[:, :3], 1, degree)), flush=True)


if __name__ == '__main__':
  main()
