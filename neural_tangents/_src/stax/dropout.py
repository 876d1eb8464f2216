"""Dropout.

Also importable from `neural_tangents._src.stax.linear`, where the published
package defines it.
"""
import dataclasses

import numpy as np

import jax
import jax.numpy as jnp
from jax import random

from neural_tangents._src.stax import protocol
from neural_tangents._src.stax.masking import supports_masking
from neural_tangents._src.stax.protocol import Diagonal
from neural_tangents._src.stax.requirements import layer
from neural_tangents._src.stax.requirements import requires
from neural_tangents._src.utils import arguments
from neural_tangents._src.utils.kernel import Kernel
from neural_tangents._src.utils.typing import Layer

Array = jax.Array

_MODES = ('train', 'test')


def self_pair_indicator(shape: tuple[int, ...], batch_pair: bool,
                        diagonal_spatial: bool) -> np.ndarray:
  """Which entries of a covariance pair an activation with itself.

  Args:
    shape: shape of the covariance, `(N, N, S_1, S_1, ...)` if `batch_pair`
      else `(N, S_1, S_1, ...)` (a batch-diagonal `cov1`); the spatial axes
      are single (`S_1, ...`) if `diagonal_spatial`.
    batch_pair: whether the covariance has a pair of batch axes.
    diagonal_spatial: whether only spatial diagonals are stored.

  Returns:
    A boolean array broadcastable to `shape`, true on entries with the same
    example and the same position on both sides.
  """
  out = np.ones((1,) * len(shape), bool)
  pairs = [(0, 1)] if batch_pair else []
  n_batch = 2 if batch_pair else 1
  if not diagonal_spatial:
    pairs += [(i, i + 1) for i in range(n_batch, len(shape), 2)]
  for a, b in pairs:
    eye_shape = [1] * len(shape)
    eye_shape[a], eye_shape[b] = shape[a], shape[b]
    out = out & np.eye(shape[a], shape[b], dtype=bool).reshape(eye_shape)
  return out


def _scale_self_pairs(x: Array, factor: float, batch_pair: bool,
                      diagonal_spatial: bool) -> Array:
  if x is None:
    return None
  on_diagonal = self_pair_indicator(x.shape, batch_pair, diagonal_spatial)
  return jnp.where(on_diagonal, factor * x, x)


@layer
@supports_masking(remask_kernel=False)
def Dropout(rate: float, mode: str = 'train') -> Layer:
  """Dropout (Srivastava et al. 2014), with `rate` the KEEP probability.

  In `'train'` mode `apply_fn(params, x, rng=key)` computes
  `x * m / rate` with independent `m ~ Bernoulli(rate)` for every entry of
  `x` (every example, position and channel); in `'test'` mode it is the
  identity, and so is the kernel.

  Kernel (train mode). Masks of different entries are independent and
  `E[m m'] / rate^2 = 1`, while an entry with itself has
  `E[m^2] / rate^2 = 1 / rate`. So the covariances are unchanged except on
  entries pairing an activation with itself (same example, same position),
  which are divided by `rate`:

    * `cov1` (and `cov2`): the batch diagonal (all of a batch-diagonal
      `cov1`) at equal positions (`s = s'`);
    * `nngp` and `ntk`: only when `x2` is None or equal to `x1` (by value:
      one forward pass for both sides, as in the published release and in
      Monte Carlo estimates, whose `apply_fn(x2)` then gets `apply_fn(x1)`'s
      key), the entries `(i, i, s, s)`. With a different `x2` the two sides
      are separate forward passes with independent masks, and nothing
      changes.

  The NTK is rescaled like the NNGP since `d(x m / rate) = m / rate dx`.
  Its outputs are not Gaussian (a mixture with a point mass at 0), so a
  nonlinearity cannot directly follow a train-mode `Dropout` in a kernel
  computation: put a `Dense` (or convolution) between them.

  Args:
    rate: keep probability, `0 < rate <= 1`.
    mode: `'train'` or `'test'`.

  Returns:
    `(init_fn, apply_fn, kernel_fn)`.

  Example:
    >>> init_fn, apply_fn, kernel_fn = stax.serial(
    ...     stax.Dense(512), stax.Relu(), stax.Dropout(0.9), stax.Dense(1))
    >>> _, params = init_fn(random.PRNGKey(0), (-1, 3))
    >>> y = apply_fn(params, jnp.ones((2, 3)), rng=random.PRNGKey(1))
  """
  rate_value = arguments.concrete_real(rate)
  if rate_value is None or not 0 < rate_value <= 1:
    raise ValueError(f'`rate` is the keep probability and must be a number '
                     f'(a Python, NumPy or JAX scalar) in (0, 1]; got '
                     f'{rate!r}. Pass e.g. `Dropout(rate=0.9)` to keep 90% of '
                     'activations.')
  if mode not in _MODES:
    raise ValueError(f'`mode` must be one of {_MODES}; got {mode!r}. Pass '
                     "`mode='test'` for the identity (evaluation).")
  rate = rate_value
  init_fn = lambda rng, input_shape: (input_shape, ())

  def apply_fn(params, inputs, rng=None, **kwargs):
    if mode == 'test':
      return inputs
    if rng is None:
      raise ValueError(
          "`Dropout` in mode='train' needs a PRNG key; got rng=None. Call "
          '`apply_fn(params, x, rng=jax.random.PRNGKey(0))`, or use '
          "`Dropout(rate, mode='test')` for the identity.")
    keep = random.bernoulli(arguments.prng_key(rng), rate, inputs.shape)
    return jnp.where(keep, inputs / rate, jnp.zeros_like(inputs))

  @requires(diagonal_batch=Diagonal(), diagonal_spatial=Diagonal())
  def kernel_fn(k: Kernel, **kwargs) -> Kernel:
    if mode == 'test' or rate == 1:
      return k
    factor = 1 / rate
    scale_pairs = lambda x: _scale_self_pairs(x, factor, True,
                                              k.diagonal_spatial)
    scale_cov = lambda x: _scale_self_pairs(x, factor, not k.diagonal_batch,
                                            k.diagonal_spatial)
    return k.replace(
        nngp=scale_pairs(k.nngp) if k.x1_is_x2 else k.nngp,
        ntk=scale_pairs(k.ntk) if k.x1_is_x2 else k.ntk,
        cov1=scale_cov(k.cov1),
        cov2=scale_cov(k.cov2),
        is_gaussian=False,
        is_input=False)

  if mode == 'train' and rate < 1:
    # Masks are drawn per forward pass: `x2` equal to `x1` is one pass.
    protocol.with_spec(kernel_fn, dataclasses.replace(
        protocol.kernel_spec(kernel_fn), random_per_pass=True))
  return init_fn, apply_fn, kernel_fn
