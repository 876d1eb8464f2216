"""Infinite attention networks on variable-length sequences (IMDB-like).

Classifies variable-length sequences with the NNGP and NTK of an infinitely
wide network `Dense -> GlobalSelfAttention -> Dense -> Relu -> Aggregate -> Dense ->
Relu -> GlobalAvgPool -> Dense`. Padding positions hold `datasets.MASK_CONSTANT` and
are masked by passing `mask_constant=` to `kernel_fn`: they are ignored by
attention and by pooling, so the kernel of a sequence does not depend on how
much padding it has. `Aggregate` sums each token's features with those of its
valid neighbors (a symmetric chain graph per sequence, passed as
`pattern=`). Prints the test accuracies of NNGP and NTK regression.

The default data are scikit-learn's digits read row by row (5 to 8 rows, 8
features per token, binary label: digit >= 5); `--dataset=imdb_reviews`
uses IMDB reviews from a local `tensorflow-datasets` install.

Usage:
  python examples/imdb.py [--train_size=200] [--batch_size=50]
"""
from absl import app
from absl import flags
import jax.numpy as jnp
import numpy as np

import datasets
import neural_tangents as nt
from neural_tangents import stax

_DATASET = flags.DEFINE_enum('dataset', 'digit_sequences',
                             ('digit_sequences', 'imdb_reviews'),
                             'Dataset, see examples/datasets.py.')
_TRAIN_SIZE = flags.DEFINE_integer('train_size', 200, 'Training sequences.')
_TEST_SIZE = flags.DEFINE_integer('test_size', 200, 'Test sequences.')
_BATCH_SIZE = flags.DEFINE_integer(
    'batch_size', 50, 'Kernel block size for `nt.batch` (0: one block).')


def chain_pattern(x: np.ndarray) -> np.ndarray:
  """`(N, L, L)` adjacency (with self-loops) of neighboring valid tokens."""
  valid = ~np.all(x == datasets.MASK_CONSTANT, axis=-1)  # (N, L)
  length = x.shape[1]
  near = np.abs(np.arange(length)[:, None] - np.arange(length)[None]) <= 1
  return (near[None] & valid[:, :, None] & valid[:, None, :]).astype(
      np.float32)


def network():
  return stax.serial(
      stax.Dense(256, W_std=1., b_std=0.),
      stax.GlobalSelfAttention(n_chan_out=256, n_chan_key=256,
                               n_chan_val=256, n_heads=2,
                               attention_mechanism='SOFTMAX'),
      stax.Dense(256, W_std=1.5, b_std=0.), stax.Relu(),
      stax.Aggregate(aggregate_axis=1),
      stax.Dense(256, W_std=1.5, b_std=0.), stax.Relu(),
      stax.GlobalAvgPool(),
      stax.Dense(1, W_std=1., b_std=0.))


def run(dataset: str, train_size: int, test_size: int,
        batch_size: int) -> dict[str, float]:
  """Prints and returns the NNGP and NTK test accuracies."""
  data = datasets.load(dataset, train_size, test_size)
  lengths = np.sum(~np.all(data.x_train == datasets.MASK_CONSTANT, -1), -1)
  print(f'{len(data.x_train)} train / {len(data.x_test)} test sequences of '
        f'{lengths.min()} to {lengths.max()} tokens (padded to '
        f'{data.x_train.shape[1]}).')
  _, _, kernel_fn = network()
  kernel_fn = nt.batch(kernel_fn, batch_size=batch_size,
                       progress=batch_size > 0)
  p_train, p_test = chain_pattern(data.x_train), chain_pattern(data.x_test)
  kwargs = dict(get=('nngp', 'ntk'), mask_constant=datasets.MASK_CONSTANT)
  k_train = kernel_fn(data.x_train, None, pattern=(p_train, None), **kwargs)
  k_test = kernel_fn(data.x_test, data.x_train, pattern=(p_test, p_train),
                     **kwargs)
  result = {}
  for name in ('nngp', 'ntk'):
    predict_fn = nt.predict.gradient_descent_mse(
        getattr(k_train, name), data.y_train, diag_reg=1e-3)
    _, fx_test = predict_fn(None, 0., 0., getattr(k_test, name))
    result[name] = datasets.accuracy(fx_test, data.y_test)
    print(f'{name.upper()} test accuracy: {result[name]:.4f}')
  result['chance'] = float(jnp.max(jnp.mean(data.y_test > 0, 0)))
  print(f'Majority class: {result["chance"]:.4f}')
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
