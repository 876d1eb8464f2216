"""`nt.monte_carlo_kernel_fn` draws its samples from the published key chain
(issue 28): the same key gives Neural Tangents 0.6.5's estimate, and blocks,
sample-count lists and `apply_fn` keys follow the chain."""
from absl.testing import absltest
import jax
from jax import random
import numpy as np

import neural_tangents as nt
from neural_tangents import stax
from neural_tangents._src import monte_carlo
from tests import test_utils


class PublishedKeyChainTest(test_utils.NeuralTangentsTestCase):

  def test_published_estimate(self):
    # Neural Tangents 0.6.5, float32, on JAX's PRNG stream of its day.
    with jax.enable_x64(False), jax.threefry_partitionable(False):
      init_fn, apply_fn, _ = stax.serial(stax.Dense(64), stax.Erf(),
                                         stax.Dense(1))
      x1 = np.cos(np.random.RandomState(0).randn(2, 1)).astype(np.float32)
      x2 = np.cos(np.random.RandomState(1).randn(3, 1)).astype(np.float32)
      for batch_size in (0, 1):
        kernel_fn = nt.monte_carlo_kernel_fn(
            init_fn, apply_fn, random.PRNGKey(1), 4, batch_size=batch_size)
        nngp = kernel_fn(x1, x2, 'nngp')
        self.assertAllClose(
            np.ravel(nngp)[:3],
            np.array([0.01580806, -0.15987603, -0.16353055]), rtol=1e-5,
            atol=1e-6)

  def test_samples_and_apply_keys_follow_the_chain(self):
    # Explicit chain: params from `init_key_s`, `apply_fn(x1)` with `rng_s`,
    # `apply_fn(x2)` with `fold_in(rng_s, 1)`; a `Dropout` network shows it.
    init_fn, apply_fn, _ = stax.serial(stax.Dense(16), stax.Dropout(0.5),
                                       stax.Relu(), stax.Dense(1))
    x1 = random.normal(random.PRNGKey(2), (3, 4))
    x2 = random.normal(random.PRNGKey(3), (2, 4))
    key, n = random.PRNGKey(7), 3
    expected_12 = expected_11 = 0.
    chain = key
    for _ in range(n):
      chain, k = random.split(chain)
      init_key, rng = random.split(k)
      _, params = init_fn(init_key, x1.shape)
      f1 = apply_fn(params, x1, rng=rng)
      f2 = apply_fn(params, x2, rng=random.fold_in(rng, 1))
      expected_12 += f1 @ f2.T / n
      expected_11 += f1 @ f1.T / n
    init_keys, rngs = monte_carlo.published_key_chain(key, n)
    self.assertEqual(init_keys.shape, (n, 2))
    estimates = nt.monte_carlo_kernel_fn(init_fn, apply_fn, key, [2, n])
    *_, last = estimates(x1, x2, 'nngp')
    self.assertAllClose(last, expected_12, rtol=1e-10, atol=1e-12)
    # (Batches of examples draw other dropout masks: not batched here.)
    kernel_fn = nt.monte_carlo_kernel_fn(init_fn, apply_fn, key, n)
    self.assertAllClose(kernel_fn(x1, None, 'nngp'), expected_11,
                        rtol=1e-10, atol=1e-12)


if __name__ == '__main__':
  absltest.main()
