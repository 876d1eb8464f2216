"""Infinite-width NNGP and NTK regression on a small real dataset.

Fits the infinitely wide fully connected network `Dense -> Relu -> Dense ->
Relu -> Dense` to the handwritten digits that ship with scikit-learn (8x8
images, 10 classes; no download), by exact Bayesian inference (NNGP) and by
gradient descent to convergence (NTK), and prints the test accuracy of both.

Usage:
  python examples/infinite_fcn.py [--train_size 1000]
"""
import argparse

import jax.numpy as jnp
import numpy as np
from sklearn import datasets

import neural_tangents as nt
from neural_tangents import stax


def load_digits(train_size: int):
  """Standardized digit images and one-hot (zero-mean) labels."""
  digits = datasets.load_digits()
  x = digits.data.astype(np.float32)
  x = (x - x.mean(0)) / (x.std(0) + 1e-6)
  # Unit-norm inputs, as is usual for kernels of fully connected networks.
  x = x / np.linalg.norm(x, axis=1, keepdims=True) * np.sqrt(x.shape[1])
  y = np.eye(10, dtype=np.float32)[digits.target] - 0.1
  order = np.random.RandomState(0).permutation(len(x))
  x, y = x[order], y[order]
  return (x[:train_size], y[:train_size]), (x[train_size:], y[train_size:])


def accuracy(predictions, labels) -> float:
  return float(jnp.mean(jnp.argmax(predictions, 1) == jnp.argmax(labels, 1)))


def main(train_size: int) -> dict[str, float]:
  (x_train, y_train), (x_test, y_test) = load_digits(train_size)
  _, _, kernel_fn = stax.serial(
      stax.Dense(512, W_std=1.5, b_std=0.05), stax.Relu(),
      stax.Dense(512, W_std=1.5, b_std=0.05), stax.Relu(),
      stax.Dense(1, W_std=1.5, b_std=0.05))

  predict_fn = nt.predict.gradient_descent_mse_ensemble(
      kernel_fn, x_train, y_train, diag_reg=1e-4)
  # `t=None`: the infinitely long trained (NTK) / exact posterior (NNGP) mean.
  means = predict_fn(x_test=x_test, get=('nngp', 'ntk'))
  result = {'nngp': accuracy(means.nngp, y_test),
            'ntk': accuracy(means.ntk, y_test)}
  print(f'Train size {len(x_train)}, test size {len(x_test)}.')
  for name, acc in result.items():
    print(f'{name.upper()} test accuracy: {acc:.4f}')
  return result


if __name__ == '__main__':
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--train_size', type=int, default=1000)
  main(parser.parse_args().train_size)
