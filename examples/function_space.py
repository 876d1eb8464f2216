"""Closed-form function-space predictions vs a trained finite network.

Trains a wide fully connected network by full-batch gradient descent on mean
squared error and compares its outputs with those that
`nt.predict.gradient_descent_mse` gives in closed form from the empirical NTK
at initialization (the outputs of the linearized network after the same
number of steps). Prints the train and test losses and accuracies of both and
the largest difference between their test outputs.

One network's test accuracy is low (about 0.5 with the defaults, where
`infinite_fcn.py` reaches 0.98): its test outputs keep the random function
`f_0` it computes at initialization, which training on the train set corrects
only near the training points. The script also prints the accuracy of the
same prediction averaged over initializations (`f_0 = 0`, the mean that
`nt.predict.gradient_descent_mse_ensemble` gives), about 0.95.

Usage:
  python examples/function_space.py [--width=1024] [--steps=200]
"""
from absl import app
from absl import flags
import jax
from jax import random
import jax.numpy as jnp

import tqdm

import datasets
import neural_tangents as nt
from neural_tangents import stax

_DATASET = flags.DEFINE_enum('dataset', 'digits', datasets.NAMES,
                             'Dataset, see examples/datasets.py.')
_TRAIN_SIZE = flags.DEFINE_integer('train_size', 256, 'Training examples.')
_TEST_SIZE = flags.DEFINE_integer('test_size', 256, 'Test examples.')
_WIDTH = flags.DEFINE_integer('width', 1024, 'Hidden layer width.')
_STEPS = flags.DEFINE_integer('steps', 200, 'Gradient descent steps.')


def run(dataset: str, train_size: int, test_size: int, width: int,
        steps: int) -> dict[str, float]:
  """Prints and returns losses, accuracies and the output difference."""
  data = datasets.load(dataset, train_size, test_size)
  init_fn, apply_fn, _ = stax.serial(
      stax.Flatten(),
      stax.Dense(width, W_std=1.5, b_std=0.05), stax.Relu(),
      stax.Dense(data.y_train.shape[-1], W_std=1.5, b_std=0.05))
  _, params = init_fn(random.PRNGKey(0), data.x_train.shape)

  print(f'Empirical NTK of the width-{width} network on {len(data.x_train)} '
        f'train and {len(data.x_test)} test examples...', flush=True)
  ntk_fn = jax.jit(nt.empirical_ntk_fn(apply_fn, vmap_axes=0))
  k_train_train = ntk_fn(data.x_train, None, params)
  k_test_train = ntk_fn(data.x_test, data.x_train, params)
  learning_rate = 0.5 * nt.predict.max_learning_rate(k_train_train,
                                                     data.y_train.size)
  predict_fn = nt.predict.gradient_descent_mse(k_train_train, data.y_train,
                                               learning_rate=learning_rate)
  fx_train_0 = apply_fn(params, data.x_train)
  fx_test_0 = apply_fn(params, data.x_test)
  pred_train, pred_test = predict_fn(steps, fx_train_0, fx_test_0,
                                     k_test_train)

  @jax.jit
  def step(p):
    grads = jax.grad(lambda q: datasets.mse(apply_fn(q, data.x_train),
                                            data.y_train))(p)
    return jax.tree_util.tree_map(lambda w, g: w - learning_rate * g, p, grads)

  for _ in tqdm.trange(steps, desc='gradient descent', unit='step'):
    params = jax.block_until_ready(step(params))
  net_train = apply_fn(params, data.x_train)
  net_test = apply_fn(params, data.x_test)

  print(f'Learning rate {learning_rate:.3f}, {steps} steps.')
  print(f'{"":>10} {"train loss":>10} {"test loss":>10} {"test acc":>8}')
  for name, train, test in (('network', net_train, net_test),
                            ('predict', pred_train, pred_test)):
    print(f'{name:>10} {float(datasets.mse(train, data.y_train)):10.6f} '
          f'{float(datasets.mse(test, data.y_test)):10.6f} '
          f'{datasets.accuracy(test, data.y_test):8.4f}')
  result = {
      'test_accuracy_network': datasets.accuracy(net_test, data.y_test),
      'test_accuracy_predict': datasets.accuracy(pred_test, data.y_test),
      'max_test_output_difference': float(jnp.max(jnp.abs(net_test -
                                                          pred_test))),
      'test_output_scale': float(jnp.max(jnp.abs(net_test))),
  }
  print(f'max |network - predict| test output: '
        f'{result["max_test_output_difference"]:.6f} '
        f'(max |output| {result["test_output_scale"]:.4f})')
  # The mean over initializations: E[f_0] = 0 at every point.
  _, mean_test = predict_fn(steps, jnp.zeros_like(fx_train_0),
                            jnp.zeros_like(fx_test_0), k_test_train)
  result['test_accuracy_mean'] = datasets.accuracy(mean_test, data.y_test)
  print(f'One network keeps its random initial function at the test points; '
        f'averaged over initializations (f_0 = 0) predict reaches test '
        f'accuracy {result["test_accuracy_mean"]:.4f}.')
  return result


def main(argv) -> None:
  del argv
  run(_DATASET.value, _TRAIN_SIZE.value, _TEST_SIZE.value, _WIDTH.value,
      _STEPS.value)


if __name__ == '__main__':
  # JAX logs at INFO level each backend it probes ("Unable to initialize
  # backend 'tpu'"): show its warnings and errors only
  # (`--logger_levels=jax:INFO` shows all).
  flags.FLAGS.set_default('logger_levels', 'jax:WARNING')
  app.run(main)
