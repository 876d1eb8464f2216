"""Empirical NTK speed on stax networks, per implementation and `vmap_axes`.

Usage (from the repository root):

  python benchmarks/empirical_ntk.py            # all networks
  python benchmarks/empirical_ntk.py fcn        # some networks

Prints one JSON line per measurement: the network, the implementation,
`vmap_axes`, the median seconds per call after compilation, and `speedup`,
the median of `JACOBIAN_CONTRACTION` with `vmap_axes=None` (measured first,
in the same process) divided by this one's. Speedups, not seconds, are what
compare across machines.
"""
import json
import sys
import time

import jax
import numpy as np

import neural_tangents as nt
from neural_tangents import stax


def fcn():
  """The fully connected network users write first."""
  return stax.serial(stax.Dense(512), stax.Relu(), stax.Dense(512),
                     stax.Relu(), stax.Dense(10)), (32, 100)


def resnet():
  """A small ResNet: two residual blocks as one `stax.repeat` (a scan)."""
  block = stax.serial(
      stax.FanOut(2),
      stax.parallel(
          stax.serial(stax.Conv(32, (3, 3), padding='SAME', b_std=0.1),
                      stax.Relu(),
                      stax.Conv(32, (3, 3), padding='SAME', b_std=0.1)),
          stax.Identity()),
      stax.FanInSum(), stax.Relu())
  return stax.serial(stax.Conv(32, (3, 3), padding='SAME'), stax.Relu(),
                     stax.repeat(block, 2), stax.GlobalAvgPool(),
                     stax.Dense(10)), (8, 16, 16, 3)


def fcn_repeat():
  """The FCN with its hidden layers as one `stax.repeat` (a `lax.scan`)."""
  return stax.serial(stax.Dense(512), stax.Relu(),
                     stax.repeat(stax.serial(stax.Dense(512), stax.Relu()), 2),
                     stax.Dense(10)), (32, 100)


NETWORKS = {'fcn': fcn, 'resnet': resnet, 'fcn_repeat': fcn_repeat}


def median_time(fn, *args, reps=5):
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(reps):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def run(name):
  (init_fn, apply_fn, _), shape = NETWORKS[name]()
  _, params = init_fn(jax.random.PRNGKey(0), shape)
  x1 = jax.random.normal(jax.random.PRNGKey(1), shape)
  x2 = jax.random.normal(jax.random.PRNGKey(2), shape)
  cells = [(nt.NtkImplementation.JACOBIAN_CONTRACTION, None)]
  cells += [(i, v) for i in nt.NtkImplementation for v in (None, 0)
            if (i, v) != cells[0]]
  baseline = None
  for implementation, vmap_axes in cells:
    fn = jax.jit(nt.empirical_ntk_fn(apply_fn, vmap_axes=vmap_axes,
                                     implementation=implementation))
    seconds = median_time(fn, x1, x2, params)
    baseline = baseline or seconds
    print(json.dumps(dict(network=name, implementation=implementation.name,
                          vmap_axes=vmap_axes, seconds=round(seconds, 5),
                          speedup=round(baseline / seconds, 2))),
          flush=True)


if __name__ == '__main__':
  for network in sys.argv[1:] or list(NETWORKS):
    run(network)
