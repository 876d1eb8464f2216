"""Custom nonlinearities with their own closed-form kernels (`Elementwise`).

`stax.Elementwise(fn, nngp_fn)` turns any elementwise `fn` with a known
Gaussian expectation `nngp_fn(c, q1, q2) = E[fn(u) fn(v)]`,
`(u, v) ~ N(0, [[q1, c], [c, q2]])`, into a layer; its NTK contribution
`E[fn'(u) fn'(v)]` is `d nngp_fn / d c` by autodiff (Price's theorem). For a
few such functions this script prints the relative max difference of the NNGP
and NTK of `Dense -> fn -> Dense` on digit images between

* the closed form and Gauss-Hermite quadrature (`ElementwiseNumerical`),
* the closed form and a Monte Carlo estimate from finite networks
  (`nt.monte_carlo_kernel_fn`, `--n_samples` networks of width `--width`).

Usage:
  python examples/elementwise.py [--n_samples=64] [--width=512]
"""
from absl import app
from absl import flags
import jax
from jax import random
import jax.numpy as jnp
import numpy as np

import datasets
import neural_tangents as nt
from neural_tangents import stax

_DATASET = flags.DEFINE_enum('dataset', 'digits', datasets.NAMES,
                             'Dataset, see examples/datasets.py.')
_TRAIN_SIZE = flags.DEFINE_integer('train_size', 16, 'Inputs.')
_N_SAMPLES = flags.DEFINE_integer('n_samples', 64, 'Monte Carlo networks.')
_WIDTH = flags.DEFINE_integer('width', 512, 'Width of the Monte Carlo nets.')
_DEG = flags.DEFINE_integer('deg', 25, 'Quadrature degree.')


def erf_nngp(c, q1, q2):
  """E[erf(u) erf(v)] (Williams 1997)."""
  return 2 / np.pi * jnp.arcsin(2 * c / jnp.sqrt((1 + 2 * q1) * (1 + 2 * q2)))


def cos_nngp(c, q1, q2):
  """E[cos(u) cos(v)] = (E[cos(u - v)] + E[cos(u + v)]) / 2."""
  return 0.5 * (jnp.exp(-(q1 + q2 - 2 * c) / 2) +
                jnp.exp(-(q1 + q2 + 2 * c) / 2))


def square_nngp(c, q1, q2):
  """E[u^2 v^2] = q1 q2 + 2 c^2 (Isserlis)."""
  return q1 * q2 + 2 * c**2


def relu_nngp(c, q1, q2):
  """E[relu(u) relu(v)] (Cho and Saul 2009), with an angle safe at |rho|=1."""
  norm = jnp.sqrt(q1 * q2)
  rho = c / norm  # Not clipped: a clip would zero d/dc at rho = 1.
  theta = jnp.arctan2(jnp.sqrt(jnp.maximum(1 - rho**2, 1e-12)), rho)
  return norm / (2 * np.pi) * (jnp.sin(theta) + (np.pi - theta) * rho)


# name: (fn, nngp_fn).
NONLINEARITIES = {
    'erf': (jax.scipy.special.erf, erf_nngp),
    'cos': (jnp.cos, cos_nngp),
    'square': (jnp.square, square_nngp),
    'relu': (jax.nn.relu, relu_nngp),
}


def network(nonlinearity, width, readout=1):
  return stax.serial(stax.Flatten(), stax.Dense(width, W_std=1., b_std=0.1),
                     nonlinearity, stax.Dense(readout, W_std=1., b_std=0.1))


def relative_difference(a, b) -> float:
  return float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))


def run(dataset: str, train_size: int, n_samples: int, width: int,
        deg: int) -> dict[str, dict[str, float]]:
  """Prints and returns `{name: {'numerical_nngp': diff, ...}}`."""
  x = datasets.load(dataset, train_size, 1).x_train
  x = x / np.sqrt(x.shape[-1])  # Unit-variance pre-activations.
  print(f'Relative max difference to the closed form ({len(x)} inputs; '
        f'quadrature deg={deg}; Monte Carlo {n_samples} nets of width '
        f'{width}):')
  print(f'{"fn":>8} {"quad NNGP":>9} {"quad NTK":>9} {"MC NNGP":>9} '
        f'{"MC NTK":>9}')
  result = {}
  for name, (fn, nngp_fn) in NONLINEARITIES.items():
    closed = network(stax.Elementwise(fn, nngp_fn), 1)[2](x, None,
                                                           ('nngp', 'ntk'))
    numerical = network(stax.ElementwiseNumerical(fn, deg), 1)[2](
        x, None, ('nngp', 'ntk'))
    # 32 outputs (averaged over by `trace_axes`): 32x less NNGP noise.
    init_fn, apply_fn, _ = network(stax.Elementwise(fn, nngp_fn), width, 32)
    monte_carlo = nt.monte_carlo_kernel_fn(
        init_fn, apply_fn, random.PRNGKey(0), n_samples, vmap_axes=0,
        progress=True)(x, None, ('nngp', 'ntk'))
    row = {}
    for method, k in (('numerical', numerical), ('monte_carlo', monte_carlo)):
      for kind in ('nngp', 'ntk'):
        row[f'{method}_{kind}'] = relative_difference(getattr(k, kind),
                                                      getattr(closed, kind))
    result[name] = row
    print(f'{name:>8} ' + ' '.join(f'{v:9.2e}' for v in row.values()))
  return result


def main(argv) -> None:
  del argv
  run(_DATASET.value, _TRAIN_SIZE.value, _N_SAMPLES.value, _WIDTH.value,
      _DEG.value)


if __name__ == '__main__':
  # JAX logs at INFO level each backend it probes ("Unable to initialize
  # backend 'tpu'"): show its warnings and errors only
  # (`--logger_levels=jax:INFO` shows all).
  flags.FLAGS.set_default('logger_levels', 'jax:WARNING')
  app.run(main)
