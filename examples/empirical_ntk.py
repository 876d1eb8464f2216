"""Finite-width NTK: every `nt.NtkImplementation`, with and without `vmap_axes`.

Computes the empirical NTK of a small convolutional network on digit images
with each implementation of `nt.empirical_ntk_fn` (`JACOBIAN_CONTRACTION`,
`NTK_VECTOR_PRODUCTS`, `STRUCTURED_DERIVATIVES`, and `AUTO`, which picks the
cheapest) and `vmap_axes` `None` or `0`, prints a table of compile and run
times, and the max difference of every kernel from the first one (all compute
the same kernel).

Usage:
  python examples/empirical_ntk.py [--train_size=16] [--width=16]
"""
import time

from absl import app
from absl import flags
import jax
from jax import random
import jax.numpy as jnp

import datasets
import neural_tangents as nt
from neural_tangents import stax

_DATASET = flags.DEFINE_enum('dataset', 'digit_images', datasets.NAMES,
                             'Dataset, see examples/datasets.py.')
_TRAIN_SIZE = flags.DEFINE_integer('train_size', 16, 'Inputs (x1 and x2).')
_WIDTH = flags.DEFINE_integer('width', 16, 'Channels of the convolutions.')


def network(width: int, classes: int):
  return stax.serial(
      stax.Conv(width, (3, 3), padding='SAME'), stax.Relu(),
      stax.Conv(width, (3, 3), strides=(2, 2), padding='SAME'), stax.Relu(),
      stax.Flatten(), stax.Dense(classes))


def timed(fn, *args):
  """`(result, seconds)` of a call, waiting for the result."""
  start = time.perf_counter()
  out = jax.block_until_ready(fn(*args))
  return out, time.perf_counter() - start


def run(dataset: str, train_size: int, width: int) -> dict[str, float]:
  """Prints the table; returns `{'max_difference': ..., 'relative': ...}`."""
  data = datasets.load(dataset, train_size, train_size)
  x1, x2 = data.x_train, data.x_test
  init_fn, apply_fn, _ = network(width, data.y_train.shape[-1])
  _, params = init_fn(random.PRNGKey(0), x1.shape)
  print(f'NTK of a {width}-channel CNN, x1 {x1.shape}, x2 {x2.shape}:')
  print(f'{"implementation":>24} {"vmap_axes":>9} {"compile+run s":>13} '
        f'{"run s":>7} {"max |diff|":>10}')
  reference, max_difference = None, 0.
  for implementation in nt.NtkImplementation:
    for vmap_axes in (None, 0):
      ntk_fn = jax.jit(nt.empirical_ntk_fn(apply_fn, vmap_axes=vmap_axes,
                                           implementation=implementation))
      ntk, first = timed(ntk_fn, x1, x2, params)
      _, second = timed(ntk_fn, x1, x2, params)
      if reference is None:
        reference = ntk
      difference = float(jnp.max(jnp.abs(ntk - reference)))
      max_difference = max(max_difference, difference)
      print(f'{implementation.name:>24} {str(vmap_axes):>9} {first:13.3f} '
            f'{second:7.4f} {difference:10.2e}')
  relative = max_difference / float(jnp.max(jnp.abs(reference)))
  print(f'max difference between implementations: {max_difference:.2e} '
        f'(relative {relative:.2e})')
  return {'max_difference': max_difference, 'relative': relative}


def main(argv) -> None:
  del argv
  run(_DATASET.value, _TRAIN_SIZE.value, _WIDTH.value)


if __name__ == '__main__':
  # JAX logs at INFO level each backend it probes ("Unable to initialize
  # backend 'tpu'"): show its warnings and errors only
  # (`--logger_levels=jax:INFO` shows all).
  flags.FLAGS.set_default('logger_levels', 'jax:WARNING')
  app.run(main)
