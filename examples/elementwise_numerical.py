"""Closed-form kernels vs Gauss-Hermite quadrature (`ElementwiseNumerical`).

For several nonlinearities with closed-form kernels in `stax` (Relu, Erf,
Gelu, Sin, Rbf, Abs, LeakyRelu), builds the network `Dense -> nonlinearity ->
Dense -> nonlinearity -> Dense` twice: with the closed-form layer and with
`stax.ElementwiseNumerical(fn, deg)`, which integrates the same `fn`
numerically. Prints the relative max difference of their NNGP and NTK on
digit images. Smooth functions agree to float precision at small `deg`;
functions with kinks (Relu, Abs, LeakyRelu) converge slowly in `deg`.

Usage:
  python examples/elementwise_numerical.py [--deg=25] [--train_size=64]
"""
from absl import app
from absl import flags
import jax
import jax.numpy as jnp

import datasets
from neural_tangents import stax

_DATASET = flags.DEFINE_enum('dataset', 'digits', datasets.NAMES,
                             'Dataset, see examples/datasets.py.')
_TRAIN_SIZE = flags.DEFINE_integer('train_size', 64, 'Inputs.')
_DEG = flags.DEFINE_integer('deg', 25, 'Quadrature degree.')

# name: (closed-form layer, the function it applies).
NONLINEARITIES = {
    'Relu': (stax.Relu(), jax.nn.relu),
    'Erf': (stax.Erf(), jax.scipy.special.erf),
    'Gelu': (stax.Gelu(), lambda x: jax.nn.gelu(x, approximate=False)),
    'Sin': (stax.Sin(), jnp.sin),
    'Rbf': (stax.Rbf(gamma=0.5), lambda x: jnp.sqrt(2.) * jnp.sin(
        jnp.sqrt(2 * 0.5) * x + jnp.pi / 4)),
    'Abs': (stax.Abs(), jnp.abs),
    'LeakyRelu': (stax.LeakyRelu(0.1), lambda x: jax.nn.leaky_relu(x, 0.1)),
}


def network(nonlinearity):
  return stax.serial(
      stax.Flatten(), stax.Dense(512, W_std=1.5, b_std=0.05), nonlinearity,
      stax.Dense(512, W_std=1.5, b_std=0.05), nonlinearity,
      stax.Dense(1, W_std=1.5, b_std=0.05))


def relative_difference(a: jax.Array, b: jax.Array) -> float:
  return float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))


def run(dataset: str, train_size: int, deg: int) -> dict[str, dict[str,
                                                                    float]]:
  """Prints and returns `{name: {'nngp': diff, 'ntk': diff}}`."""
  x = datasets.load(dataset, train_size, 1).x_train
  result = {}
  print(f'Relative max difference, closed form vs ElementwiseNumerical '
        f'(deg={deg}), {len(x)} inputs:')
  print(f'{"nonlinearity":>12} {"NNGP":>9} {"NTK":>9}')
  for name, (layer, fn) in NONLINEARITIES.items():
    exact = network(layer)[2](x, None, ('nngp', 'ntk'))
    numerical = network(stax.ElementwiseNumerical(fn, deg))[2](
        x, None, ('nngp', 'ntk'))
    result[name] = {k: relative_difference(getattr(numerical, k),
                                           getattr(exact, k))
                    for k in ('nngp', 'ntk')}
    print(f'{name:>12} {result[name]["nngp"]:9.2e} {result[name]["ntk"]:9.2e}')
  return result


def main(argv) -> None:
  del argv
  run(_DATASET.value, _TRAIN_SIZE.value, _DEG.value)


if __name__ == '__main__':
  # JAX logs at INFO level each backend it probes ("Unable to initialize
  # backend 'tpu'"): show its warnings and errors only
  # (`--logger_levels=jax:INFO` shows all).
  flags.FLAGS.set_default('logger_levels', 'jax:WARNING')
  app.run(main)
