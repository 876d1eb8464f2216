"""Kernel hyperparameters fitted by marginal likelihood, on the digits.

Fits `W_std`, `b_std` and the observation noise `diag_reg` of an infinitely
wide ReLU network's NNGP to the handwritten digits that ship with
scikit-learn (no download), by maximizing the exact log marginal likelihood
(`nt.predict.fit_hyperparameters`, L-BFGS in log space, gradients through
`kernel_fn`), and compares the test negative log predictive density (NLL per
test target, the GP's predictive variance plus the noise) and accuracy with
the network's default hyperparameters and with a plain RBF-kernel GP fitted
the same way.

Usage:
  python examples/fit_hyperparameters.py [--train_size=500] [--maxiter=30]
"""
import math
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

import datasets
import neural_tangents as nt
from neural_tangents import stax

_TRAIN_SIZE = flags.DEFINE_integer('train_size', 500, 'Training examples.')
_TEST_SIZE = flags.DEFINE_integer('test_size', 500, 'Test examples.')
_MAXITER = flags.DEFINE_integer('maxiter', 30, 'L-BFGS iterations per fit.')


def relu_network(hp):
  return stax.serial(
      stax.Flatten(),
      stax.Dense(1, hp['W_std'], hp['b_std']), stax.Relu(),
      stax.Dense(1, hp['W_std'], hp['b_std']), stax.Relu(),
      stax.Dense(1, hp['W_std'], hp['b_std']))[2]


def rbf_gp(hp):
  """`scale^2 exp(-gamma |x - x'|^2 / d)`: `Rbf` after `Dense(W_std=1)`."""
  return stax.serial(stax.Flatten(), stax.Dense(1, 1., None),
                     stax.Rbf(hp['gamma']), stax.Dense(1, hp['scale'], None)
                     )[2]


def test_metrics(kernel_fn, hp, data) -> dict[str, float]:
  """Test NLL per target (predictive variance plus noise) and accuracy."""
  k_train = kernel_fn(data.x_train, None, 'nngp')
  predict_fn = nt.predict.gp_inference(k_train, data.y_train,
                                       diag_reg=hp['diag_reg'])
  mean, cov = predict_fn('nngp', kernel_fn(data.x_test, data.x_train, 'nngp'),
                         kernel_fn(data.x_test, None, 'nngp'))
  noise = hp['diag_reg'] * float(jnp.mean(jnp.diagonal(k_train)))
  variance = jnp.diagonal(cov)[:, None] + noise
  nll = 0.5 * (jnp.log(2 * math.pi * variance) +
               (data.y_test - mean)**2 / variance)
  return {'nll': float(jnp.mean(nll)),
          'accuracy': datasets.accuracy(mean, data.y_test)}


def run(train_size: int, test_size: int, maxiter: int) -> dict[str, dict]:
  """Prints and returns test NLL and accuracy of each model."""
  jax.config.update('jax_enable_x64', True)  # Likelihoods of ~1e3 nats.
  data = datasets.load('digits', train_size, test_size)
  data = data._replace(**{k: np.asarray(v, np.float64) for k, v in
                          data._asdict().items() if k.startswith(('x', 'y'))})
  defaults = {'W_std': 1.5, 'b_std': 0.05, 'diag_reg': 1e-4}
  results = {'relu_defaults': test_metrics(relu_network(defaults), defaults,
                                           data)}
  results['relu_defaults']['seconds'] = 0.
  for name, kernel_fn_of, init in (
      ('relu_fitted', relu_network, defaults),
      ('rbf_fitted', rbf_gp, {'gamma': 1., 'scale': 1., 'diag_reg': 1e-2})):
    print(f'Fitting {name} ...', flush=True)
    start = time.perf_counter()
    fit = nt.predict.fit_hyperparameters(kernel_fn_of, data.x_train,
                                         data.y_train, init, maxiter=maxiter,
                                         progress=True)
    seconds = time.perf_counter() - start
    print(f'  log likelihood {fit.initial_log_likelihood:.1f} -> '
          f'{fit.log_likelihood:.1f} in {fit.iterations} iterations, '
          f'{seconds:.1f} s; ' + ', '.join(
              f'{k}={v:.4g}' for k, v in fit.hyperparameters.items()))
    results[name] = test_metrics(kernel_fn_of(fit.hyperparameters),
                                 fit.hyperparameters, data)
    results[name]['seconds'] = seconds
  print(f'Train size {len(data.x_train)}, test size {len(data.x_test)}.')
  for name, r in results.items():
    print(f'{name}: test NLL {r["nll"]:.4f}, accuracy {r["accuracy"]:.4f}')
  return results


def main(argv) -> None:
  del argv
  run(_TRAIN_SIZE.value, _TEST_SIZE.value, _MAXITER.value)


if __name__ == '__main__':
  # JAX logs at INFO level each backend it probes ("Unable to initialize
  # backend 'tpu'"): show its warnings and errors only
  # (`--logger_levels=jax:INFO` shows all).
  flags.FLAGS.set_default('logger_levels', 'jax:WARNING')
  app.run(main)
