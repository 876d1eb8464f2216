"""Gradients through `stax.repeat` (a `lax.scan`) against unrolled `serial`.

Usage (from the repository root):

  python benchmarks/scan_gradients.py

Prints one JSON line per (network, derivative): the median seconds per call
after compilation of `jit(grad)` (one VJP) and `jit(jacrev)` (all output
entries) of `apply_fn` with two blocks as `serial(block, block)` and as
`repeat(block, 2)`, and `repeat_over_serial`, their ratio in this run. The
networks: residual 3x3 conv blocks (32 channels, 8 images of 16x16) and
Dense(512) + Relu blocks (32 inputs of 100 features).
"""
import json
import time

import jax
import numpy as np

from neural_tangents import stax


def conv_network(mid):
  return stax.serial(stax.Conv(32, (3, 3), padding='SAME'), stax.Relu(), mid,
                     stax.GlobalAvgPool(), stax.Dense(10))


def conv_block():
  return stax.serial(
      stax.FanOut(2),
      stax.parallel(
          stax.serial(stax.Conv(32, (3, 3), padding='SAME', b_std=0.1),
                      stax.Relu(),
                      stax.Conv(32, (3, 3), padding='SAME', b_std=0.1)),
          stax.Identity()),
      stax.FanInSum(), stax.Relu())


def dense_network(mid):
  return stax.serial(stax.Dense(512), stax.Relu(), mid, stax.Dense(10))


def dense_block():
  return stax.serial(stax.Dense(512), stax.Relu())


NETWORKS = {
    'conv_residual': (conv_network, conv_block, (8, 16, 16, 3)),
    'dense': (dense_network, dense_block, (32, 100)),
}


def median_time(fn, *args, reps=7):
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(reps):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def derivatives(apply_fn):
  return {
      'grad': jax.jit(lambda p, x: jax.grad(
          lambda p: apply_fn(p, x).sum())(p)),
      'jacrev': jax.jit(jax.jacrev(apply_fn)),
  }


def main():
  for name, (network, block, shape) in NETWORKS.items():
    x = jax.random.normal(jax.random.PRNGKey(0), shape)
    seconds = {}
    for construction, mid in (('serial', stax.serial(block(), block())),
                              ('repeat', stax.repeat(block(), 2))):
      init_fn, apply_fn, _ = network(mid)
      _, params = init_fn(jax.random.PRNGKey(1), x.shape)
      for kind, fn in derivatives(apply_fn).items():
        seconds[construction, kind] = median_time(fn, params, x)
    for kind in ('grad', 'jacrev'):
      print(json.dumps(dict(
          network=name, derivative=kind,
          serial_seconds=round(seconds['serial', kind], 5),
          repeat_seconds=round(seconds['repeat', kind], 5),
          repeat_over_serial=round(
              seconds['repeat', kind] / seconds['serial', kind], 2))),
            flush=True)


if __name__ == '__main__':
  main()
