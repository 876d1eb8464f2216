"""Infinite-width NNGP and NTK regression on a small real dataset.

Fits the infinitely wide fully connected network `Dense -> Relu -> Dense ->
Relu -> Dense` to the handwritten digits that ship with scikit-learn (8x8
images, 10 classes; no download), by exact Bayesian inference (NNGP) and by
gradient descent to convergence (NTK), and prints the test accuracy of both.

Usage:
  python examples/infinite_fcn.py [--train_size=1000] [--dataset=digits]
"""
from absl import app
from absl import flags

import datasets
import neural_tangents as nt
from neural_tangents import stax

_DATASET = flags.DEFINE_enum('dataset', 'digits', datasets.NAMES,
                             'Dataset, see examples/datasets.py.')
_TRAIN_SIZE = flags.DEFINE_integer('train_size', 1000, 'Training examples.')
_TEST_SIZE = flags.DEFINE_integer('test_size', 797, 'Test examples.')
_BATCH_SIZE = flags.DEFINE_integer(
    'batch_size', 0, 'Kernel block size for `nt.batch` (0: one block).')


def run(dataset: str, train_size: int, test_size: int,
        batch_size: int) -> dict[str, float]:
  """Prints and returns the NNGP and NTK test accuracies."""
  data = datasets.load(dataset, train_size, test_size)
  _, _, kernel_fn = stax.serial(
      stax.Flatten(),
      stax.Dense(512, W_std=1.5, b_std=0.05), stax.Relu(),
      stax.Dense(512, W_std=1.5, b_std=0.05), stax.Relu(),
      stax.Dense(1, W_std=1.5, b_std=0.05))
  kernel_fn = nt.batch(kernel_fn, batch_size=batch_size,
                       progress=batch_size > 0)

  predict_fn = nt.predict.gradient_descent_mse_ensemble(
      kernel_fn, data.x_train, data.y_train, diag_reg=1e-4)
  # `t=None`: the infinitely long trained (NTK) / exact posterior (NNGP) mean.
  means = predict_fn(x_test=data.x_test, get=('nngp', 'ntk'))
  result = {'nngp': datasets.accuracy(means.nngp, data.y_test),
            'ntk': datasets.accuracy(means.ntk, data.y_test)}
  print(f'Train size {len(data.x_train)}, test size {len(data.x_test)}.')
  for name, acc in result.items():
    print(f'{name.upper()} test accuracy: {acc:.4f}')
  return result


def main(argv) -> None:
  del argv
  run(_DATASET.value, _TRAIN_SIZE.value, _TEST_SIZE.value, _BATCH_SIZE.value)


if __name__ == '__main__':
  # JAX logs at INFO level each backend it probes ("Unable to initialize
  # backend 'tpu'"): show its warnings and errors only
  # (`--logger_levels=jax:INFO` shows all).
  flags.FLAGS.set_default('logger_levels', 'jax:WARNING')
  app.run(main)
