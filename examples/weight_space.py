"""A finite network and its linearization trained side by side.

Trains a wide fully connected network and its first-order Taylor expansion in
the parameters around initialization (`nt.linearize`) with the same
full-batch gradient descent on mean squared error, and prints both training
losses and their difference over training. Wide networks train like their
linearization (Lee et al. 2019, "Wide neural networks of any depth evolve as
linear models under gradient descent"), so the difference stays small.

Usage:
  python examples/weight_space.py [--width=1024] [--steps=200]
"""
from absl import app
from absl import flags
import jax
from jax import random
import jax.numpy as jnp

import datasets
import neural_tangents as nt
from neural_tangents import stax

_DATASET = flags.DEFINE_enum('dataset', 'digits', datasets.NAMES,
                             'Dataset, see examples/datasets.py.')
_TRAIN_SIZE = flags.DEFINE_integer('train_size', 256, 'Training examples.')
_TEST_SIZE = flags.DEFINE_integer('test_size', 256, 'Test examples.')
_WIDTH = flags.DEFINE_integer('width', 1024, 'Hidden layer width.')
_STEPS = flags.DEFINE_integer('steps', 200, 'Gradient descent steps.')
_LEARNING_RATE = flags.DEFINE_float('learning_rate', 10., 'Learning rate.')
_PRINT_EVERY = flags.DEFINE_integer('print_every', 50,
                                    'Print the losses every this many steps.')


def run(dataset: str, train_size: int, test_size: int, width: int,
        steps: int, learning_rate: float, print_every: int) -> dict[str, float]:
  """Prints the losses over training; returns the final ones and accuracies."""
  data = datasets.load(dataset, train_size, test_size)
  init_fn, apply_fn, _ = stax.serial(
      stax.Flatten(),
      stax.Dense(width, W_std=1.5, b_std=0.05), stax.Relu(),
      stax.Dense(data.y_train.shape[-1], W_std=1.5, b_std=0.05))
  _, params = init_fn(random.PRNGKey(0), data.x_train.shape)
  apply_lin = nt.linearize(apply_fn, params)

  def step_fn(apply):
    loss_fn = lambda p: datasets.mse(apply(p, data.x_train), data.y_train)

    @jax.jit
    def step(p):
      loss, grads = jax.value_and_grad(loss_fn)(p)
      return jax.tree_util.tree_map(lambda w, g: w - learning_rate * g, p,
                                    grads), loss
    return step

  step, step_lin = step_fn(apply_fn), step_fn(apply_lin)
  params_net, params_lin = params, params
  print(f'{"step":>6} {"network":>10} {"linearized":>10} {"|difference|":>12}')
  for i in range(steps + 1):
    new_net, loss_net = step(params_net)
    new_lin, loss_lin = step_lin(params_lin)
    if i % print_every == 0 or i == steps:
      print(f'{i:6d} {float(loss_net):10.6f} {float(loss_lin):10.6f} '
            f'{abs(float(loss_net - loss_lin)):12.2e}')
    if i < steps:
      params_net, params_lin = new_net, new_lin

  out_net = apply_fn(params_net, data.x_test)
  out_lin = apply_lin(params_lin, data.x_test)
  result = {
      'train_loss_network': float(loss_net),
      'train_loss_linearized': float(loss_lin),
      'test_loss_network': float(datasets.mse(out_net, data.y_test)),
      'test_loss_linearized': float(datasets.mse(out_lin, data.y_test)),
      'test_accuracy_network': datasets.accuracy(out_net, data.y_test),
      'test_accuracy_linearized': datasets.accuracy(out_lin, data.y_test),
      'max_test_output_difference': float(jnp.max(jnp.abs(out_net -
                                                          out_lin))),
  }
  for name, value in result.items():
    print(f'{name}: {value:.6f}')
  return result


def main(argv) -> None:
  del argv
  run(_DATASET.value, _TRAIN_SIZE.value, _TEST_SIZE.value, _WIDTH.value,
      _STEPS.value, _LEARNING_RATE.value, _PRINT_EVERY.value)


if __name__ == '__main__':
  # JAX logs at INFO level each backend it probes ("Unable to initialize
  # backend 'tpu'"): show its warnings and errors only
  # (`--logger_levels=jax:INFO` shows all).
  flags.FLAGS.set_default('logger_levels', 'jax:WARNING')
  app.run(main)
