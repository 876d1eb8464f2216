"""A depth-1000 residual network's kernel with `stax.repeat` vs `serial`.

`stax.repeat(block, depth)` computes what `stax.serial(*[block] * depth)`
computes, compiled as one `lax.scan`: compile time does not grow with depth.
This script compiles the NTK of a residual ReLU network of `--depth` blocks
with `repeat` (and with `serial(..., fold_repeats=False)`, which unrolls every
layer, up to `--serial_depth` blocks), prints the compile times, and the max
difference between the two kernels at the depth where both are computed.

Usage:
  python examples/deep_repeat.py [--depth=1000] [--serial_depth=100]
"""
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp

import datasets
from neural_tangents import stax

_DATASET = flags.DEFINE_enum('dataset', 'digits', datasets.NAMES,
                             'Dataset, see examples/datasets.py.')
_TRAIN_SIZE = flags.DEFINE_integer('train_size', 32, 'Inputs.')
_DEPTH = flags.DEFINE_integer('depth', 1000, 'Depth of the repeat network.')
_SERIAL_DEPTH = flags.DEFINE_integer(
    'serial_depth', 100, 'Depth at which repeat and unrolled serial are '
    'compared (compile time of serial grows with it).')


def residual_block(depth: int):
  """`x + Dense(Relu(x))`, scaled so that the variance stays bounded."""
  return stax.serial(
      stax.FanOut(2),
      stax.parallel(stax.serial(stax.Relu(),
                                stax.Dense(64, W_std=2**0.5 / depth**0.5,
                                           b_std=0.)),
                    stax.Identity()),
      stax.FanInSum())


def kernel_fns(depth: int):
  """`(repeat kernel_fn, unrolled serial kernel_fn)` of the same network."""
  block = residual_block(depth)
  stem = stax.serial(stax.Flatten(), stax.Dense(64))
  head = stax.serial(stax.Relu(), stax.Dense(1))
  _, _, repeat_fn = stax.serial(stem, stax.repeat(block, depth), head)
  _, _, serial_fn = stax.serial(stem, *[block] * depth, head,
                                fold_repeats=False)
  return repeat_fn, serial_fn


def compile_ntk(kernel_fn, x):
  """`(compiled ntk function, seconds to compile)`."""
  start = time.perf_counter()
  compiled = jax.jit(lambda x: kernel_fn(x, None, 'ntk')).lower(x).compile()
  return compiled, time.perf_counter() - start


def run(dataset: str, train_size: int, depth: int,
        serial_depth: int) -> dict[str, float]:
  """Prints and returns compile times and the repeat / serial difference."""
  x = datasets.load(dataset, train_size, 1).x_train
  repeat_fn, _ = kernel_fns(depth)
  compiled, seconds = compile_ntk(repeat_fn, x)
  ntk = compiled(x)
  print(f'repeat, depth {depth}: compiled in {seconds:.2f} s; '
        f'NTK diagonal mean {float(jnp.mean(jnp.diag(ntk))):.4f}')
  result = {'repeat_compile_seconds': seconds}

  repeat_fn, serial_fn = kernel_fns(serial_depth)
  compiled_repeat, repeat_seconds = compile_ntk(repeat_fn, x)
  print(f'depth {serial_depth}: compiling the unrolled serial network (its '
        'compile time grows with depth)...', flush=True)
  compiled_serial, serial_seconds = compile_ntk(serial_fn, x)
  a, b = compiled_repeat(x), compiled_serial(x)
  difference = float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))
  print(f'depth {serial_depth}: repeat compiled in {repeat_seconds:.2f} s, '
        f'serial (unrolled) in {serial_seconds:.2f} s')
  print(f'relative max |repeat - serial| NTK: {difference:.2e}')
  result.update(serial_compile_seconds=serial_seconds,
                relative_difference=difference)
  return result


def main(argv) -> None:
  del argv
  run(_DATASET.value, _TRAIN_SIZE.value, _DEPTH.value, _SERIAL_DEPTH.value)


if __name__ == '__main__':
  # JAX logs at INFO level each backend it probes ("Unable to initialize
  # backend 'tpu'"): show its warnings and errors only
  # (`--logger_levels=jax:INFO` shows all).
  flags.FLAGS.set_default('logger_levels', 'jax:WARNING')
  app.run(main)
