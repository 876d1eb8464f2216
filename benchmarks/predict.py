"""Benchmark: one eigendecomposition for many times vs a fresh solve per time.

`gradient_descent_mse_ensemble` on 2,000 training points, predicting at 10
times `t` with a single call (one kernel evaluation and one eigendecomposition
shared by all times) against two naive baselines measured in the same run:

* `refit`: 10 independent `gradient_descent_mse_ensemble` constructions and
  calls, one per time, each recomputing the kernels and the decomposition.
* `expm`: kernels computed once, then for each time the NTK-GP mean (and
  covariance) from `jax.scipy.linalg.expm` and `jnp.linalg.solve`, written out.

Prints one JSON line per measurement, then one per configuration with the
ratios `naive / batched` and the largest difference between their outputs.

Usage:
  python benchmarks/predict.py [--n_train 2000] [--n_test 200] [--repeats 2]
"""
import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsp_linalg

import neural_tangents as nt
from neural_tangents import stax


def _timed(fn, repeats):
  """Median wall time of `fn()` after one warm-up call, and its output."""
  out = jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    out = jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return statistics.median(times), out


def _batched(kernel_fn, x_train, y_train, x_test, ts, compute_cov):
  predict_fn = nt.predict.gradient_descent_mse_ensemble(kernel_fn, x_train,
                                                        y_train)
  return predict_fn(ts, x_test, 'ntk', compute_cov=compute_cov)


def _refit(kernel_fn, x_train, y_train, x_test, ts, compute_cov):
  outs = []
  for t in ts:
    predict_fn = nt.predict.gradient_descent_mse_ensemble(kernel_fn, x_train,
                                                          y_train)
    outs.append(predict_fn(t, x_test, 'ntk', compute_cov=compute_cov))
  return jax.tree_util.tree_map(lambda *x: jnp.stack(x), *outs)


def _expm(kernel_fn, x_train, y_train, x_test, ts, compute_cov):
  """NTK-GP (Lee et al. 2019) with one `expm` and solve per time."""
  k_train = kernel_fn(x_train, None, ('nngp', 'ntk'))
  k_test = kernel_fn(x_test, x_train, ('nngp', 'ntk'))
  k_test_test = kernel_fn(x_test, None, 'nngp') if compute_cov else None
  eye = jnp.eye(x_train.shape[0], dtype=k_train.ntk.dtype)
  means, covs = [], []
  for t in ts:
    relax = eye - jsp_linalg.expm(-k_train.ntk * t / y_train.size)
    a = jnp.linalg.solve(k_train.ntk, relax @ k_test.ntk.T).T
    means.append(a @ y_train)
    if compute_cov:
      cross = a @ k_test.nngp.T
      covs.append(k_test_test - cross - cross.T + a @ k_train.nngp @ a.T)
  mean = jnp.stack(means)
  return nt.predict.Gaussian(mean, jnp.stack(covs)) if compute_cov else mean


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--n_train', type=int, default=2000)
  parser.add_argument('--n_test', type=int, default=200)
  parser.add_argument('--n_times', type=int, default=10)
  parser.add_argument('--repeats', type=int, default=2)
  args = parser.parse_args()

  keys = jax.random.split(jax.random.PRNGKey(0), 3)
  in_dim = 16
  x_train = jax.random.normal(keys[0], (args.n_train, in_dim))
  x_test = jax.random.normal(keys[1], (args.n_test, in_dim))
  y_train = jnp.sin(x_train[:, :1]) + 0.1 * jax.random.normal(
      keys[2], (args.n_train, 1))
  _, _, kernel_fn = stax.serial(stax.Dense(512, 1.5, 0.05), stax.Relu(),
                                stax.Dense(1, 1.5, 0.05))
  ts = jnp.logspace(0, 5, args.n_times)
  common = dict(benchmark='predict.gradient_descent_mse_ensemble',
                n_train=args.n_train, n_test=args.n_test,
                n_times=args.n_times, get='ntk', backend=jax.default_backend(),
                dtype=str(x_train.dtype))

  for compute_cov in (False, True):
    data = (kernel_fn, x_train, y_train, x_test, ts, compute_cov)
    seconds, outputs = {}, {}
    for method, fn in (('batched', _batched), ('refit', _refit),
                       ('expm', _expm)):
      seconds[method], outputs[method] = _timed(lambda fn=fn: fn(*data),
                                                args.repeats)
      print(json.dumps(dict(common, compute_cov=compute_cov, method=method,
                            seconds=round(seconds[method], 4))), flush=True)
    max_diff = {
        method: float(max(
            jnp.max(jnp.abs(a - b)) for a, b in zip(
                jax.tree_util.tree_leaves(outputs[method]),
                jax.tree_util.tree_leaves(outputs['batched']))))
        for method in ('refit', 'expm')}
    print(json.dumps(dict(
        common, compute_cov=compute_cov,
        refit_over_batched=round(seconds['refit'] / seconds['batched'], 2),
        expm_over_batched=round(seconds['expm'] / seconds['batched'], 2),
        max_abs_diff_refit=max_diff['refit'],
        max_abs_diff_expm=max_diff['expm'])), flush=True)


if __name__ == '__main__':
  main()
