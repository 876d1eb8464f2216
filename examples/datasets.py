"""Small datasets for the examples: digits, images and sequences.

Every example loads its data with `load(name, train_size, test_size)`. The
default datasets ship with scikit-learn (nothing is downloaded):

* `digits`: MNIST-like. scikit-learn's 1,797 handwritten digits (8x8 gray
  images, 10 classes), flattened to 64 features.
* `digit_images`: CIFAR-10-like. The same digits as `(16, 16, 3)` images:
  upsampled 2x and colored by a random per-image tint, 10 classes.
* `digit_sequences`: IMDB-like (variable-length sequences, binary labels).
  Each digit is read as a sequence of its rows (8 features per token), cut to
  a random length between 5 and 8 rows and padded to 8 with `MASK_CONSTANT`;
  the label is whether the digit is >= 5.

With `tensorflow-datasets` installed (`pip install ".[tfds]"`) and its data
already prepared locally, `mnist`, `cifar10` and `imdb_reviews` load the real
datasets (`download=False`: nothing is fetched). IMDB reviews are turned into
sequences of fixed random word embeddings (one per hashed lowercase word).

All inputs are float32 and standardized; labels are one-hot with the mean
`1 / classes` subtracted (zero-mean targets for mean-squared-error
regression).

Example:
  >>> import datasets
  >>> data = datasets.load('digits', train_size=100, test_size=50)
  >>> data.x_train.shape, data.y_train.shape
  ((100, 64), (100, 10))
"""
import hashlib
from typing import Any, NamedTuple

import numpy as np

# Padding value of sequences: inputs entries equal to it are masked (pass
# `mask_constant=MASK_CONSTANT` to `apply_fn` / `kernel_fn`).
MASK_CONSTANT = -1e4

DEFAULT_DATASETS = ('digits', 'digit_images', 'digit_sequences')
TFDS_DATASETS = ('mnist', 'cifar10', 'imdb_reviews')
NAMES = DEFAULT_DATASETS + TFDS_DATASETS

_SEQUENCE_LENGTH = 8
_IMDB_EMBEDDING_SIZE = 32
_IMDB_LENGTH = 64


class Dataset(NamedTuple):
  """Train and test inputs with one-hot zero-mean targets."""
  x_train: np.ndarray
  y_train: np.ndarray
  x_test: np.ndarray
  y_test: np.ndarray


def load(name: str, train_size: int, test_size: int, seed: int = 0) -> Dataset:
  """Loads `train_size` training and `test_size` test examples of `name`.

  Args:
    name: one of `NAMES`: `digits`, `digit_images`, `digit_sequences`
      (scikit-learn's digits) or `mnist`, `cifar10`, `imdb_reviews`
      (`tensorflow-datasets`, prepared locally).
    train_size: number of training examples, `>= 1`.
    test_size: number of test examples, `>= 1`.
    seed: seed of the shuffle (and of the random tints, lengths and word
      embeddings).

  Returns:
    A `Dataset` of float32 arrays.

  Raises:
    ValueError: for an unknown `name`, or sizes that are not positive or
      exceed the dataset.
    ImportError: for a `tensorflow-datasets` name without the package.

  Example:
    >>> data = load('digit_images', 100, 50)
    >>> data.x_train.shape
    (100, 16, 16, 3)
  """
  if name not in NAMES:
    raise ValueError(f'`dataset` must be one of {NAMES}; got {name!r}.')
  for arg, size in (('train_size', train_size), ('test_size', test_size)):
    if size < 1:
      raise ValueError(f'`{arg}` must be >= 1; got {size}.')
  rng = np.random.RandomState(seed)
  if name in TFDS_DATASETS:
    x_train, y_train, x_test, y_test = _tfds(name, train_size, test_size, rng)
  else:
    x, y = _digits(name, rng)
    if train_size + test_size > len(x):
      raise ValueError(
          f'`train_size + test_size` must be at most {len(x)} for {name!r}; '
          f'got {train_size} + {test_size}. Pass smaller sizes.')
    order = rng.permutation(len(x))
    x, y = x[order], y[order]
    x_train, y_train = x[:train_size], y[:train_size]
    x_test, y_test = x[train_size:train_size + test_size], y[
        train_size:train_size + test_size]
  classes = int(max(y_train.max(), y_test.max())) + 1
  return Dataset(x_train.astype(np.float32), _one_hot(y_train, classes),
                 x_test.astype(np.float32), _one_hot(y_test, classes))


def mse(outputs: Any, targets: Any) -> Any:
  """Half the mean squared error, the loss the examples train on."""
  return 0.5 * ((outputs - targets)**2).mean()


def accuracy(predictions: np.ndarray, targets: np.ndarray) -> float:
  """Fraction of examples whose largest output is the target class."""
  return float(np.mean(np.argmax(predictions, -1) == np.argmax(targets, -1)))


def _one_hot(labels: np.ndarray, classes: int) -> np.ndarray:
  return (np.eye(classes, dtype=np.float32)[labels.astype(np.int64)] -
          1. / classes)


def _standardize(x: np.ndarray) -> np.ndarray:
  """Zero mean and unit variance per feature (over the whole set)."""
  return (x - x.mean(0)) / (x.std(0) + 1e-6)


def _digits(name: str, rng: np.random.RandomState):
  """`(inputs, int labels)` of a dataset built from scikit-learn's digits."""
  from sklearn import datasets as sk_datasets  # pylint: disable=g-import-not-at-top
  digits = sk_datasets.load_digits()
  images = digits.images.astype(np.float32) / 16.  # (N, 8, 8) in [0, 1].
  labels = digits.target
  if name == 'digits':
    x = _standardize(images.reshape(len(images), -1))
    # Unit-norm rows (times sqrt(features)), as usual for kernels of FCNs.
    x = x / np.linalg.norm(x, axis=1, keepdims=True) * np.sqrt(x.shape[1])
    return x, labels
  if name == 'digit_images':
    big = images.repeat(2, axis=1).repeat(2, axis=2)[..., None]
    tint = rng.uniform(0.3, 1., size=(len(images), 1, 1, 3))
    return _standardize(big * tint), labels
  # digit_sequences: rows as tokens, random lengths, padded and masked.
  x = _standardize(images.reshape(len(images), -1)).reshape(images.shape)
  lengths = rng.randint(5, _SEQUENCE_LENGTH + 1, size=len(images))
  positions = np.arange(_SEQUENCE_LENGTH)[None, :, None]
  x = np.where(positions < lengths[:, None, None], x, MASK_CONSTANT)
  return x, (labels >= 5).astype(np.int64)


def _tfds(name: str, train_size: int, test_size: int,
          rng: np.random.RandomState):
  """`(x_train, y_train, x_test, y_test)` from local `tensorflow-datasets`."""
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ImportError(
        f'`--dataset={name}` needs `tensorflow-datasets` and its prepared '
        'data: run `pip install ".[tfds]"`, or use one of '
        f'{DEFAULT_DATASETS}, which ship with scikit-learn.') from None
  splits = []
  for split, size in (('train', train_size), ('test', test_size)):
    ds = tfds.load(name, split=f'{split}[:{size}]', as_supervised=True,
                   batch_size=-1, download=False)
    x, y = tfds.as_numpy(ds)
    splits.append((x, np.asarray(y)))
  (x_train, y_train), (x_test, y_test) = splits
  if name == 'imdb_reviews':
    embeddings = _WordEmbeddings(rng)
    x_train, x_test = embeddings(x_train), embeddings(x_test)
    return x_train, y_train, x_test, y_test
  x_all = _standardize(np.concatenate([x_train, x_test]).astype(np.float32))
  return x_all[:len(x_train)], y_train, x_all[len(x_train):], y_test


class _WordEmbeddings:
  """Fixed random embeddings of hashed words, padded with `MASK_CONSTANT`."""

  def __init__(self, rng: np.random.RandomState, buckets: int = 1 << 14):
    self.table = rng.normal(size=(buckets, _IMDB_EMBEDDING_SIZE)).astype(
        np.float32)
    self.buckets = buckets

  def _bucket(self, word: str) -> int:
    return int(hashlib.md5(word.encode()).hexdigest(), 16) % self.buckets

  def __call__(self, texts: np.ndarray) -> np.ndarray:
    out = np.full((len(texts), _IMDB_LENGTH, _IMDB_EMBEDDING_SIZE),
                  MASK_CONSTANT, np.float32)
    for i, text in enumerate(texts):
      text = text.decode() if isinstance(text, bytes) else str(text)
      words = text.lower().split()[:_IMDB_LENGTH]
      for j, word in enumerate(words):
        out[i, j] = self.table[self._bucket(word)]
    return out
