"""Myrtle-5 CNTK: features of 10,000 images against the exact kernel.

The network (Shankar et al. 2020, Myrtle-5; NTK parameterization, no
biases, `W_std = sqrt(2)`, float32):

  [Conv(3x3, SAME), Relu] x 2, AvgPool(2x2, 2x2), Conv(3x3, SAME), Relu,
  AvgPool(2x2, 2x2), Conv(3x3, SAME), Relu, AvgPool(2x2, 2x2),
  GlobalAvgPool, Dense(1)

The images are synthetic, seeded 32x32x3 "smooth random images": white
Gaussian noise blurred by a Gaussian of `BLUR_SIGMA` pixels (spatially
correlated like natural images), each image standardized to zero mean and
unit variance over its pixels.

Measurements (one JSON line each):

* `features`: seconds of the feature map of all `num_images` images, in row
  blocks of `block_images` images through one jitted `feature_fn` (the
  compiling first block excluded and timed separately), the feature
  dimensions and the process peak RSS.
* `exact`: seconds of `stax`'s exact kernel (`nt.batch`, `batch_size`
  images per block) of the first `exact_subset` images (after a call that
  compiles both block shapes, diagonal and off-diagonal), and its
  extrapolation to `num_images` by the number of pairs `n (n + 1) / 2` and
  by the number of blocks (`nt.batch` computes the blocks on and above the
  diagonal only).
* `error`: the relative Frobenius errors `|F F^T - K| / |K|` of the NTK and
  the NNGP on the first `error_images` images, and those of the centered
  kernels `H K H` (`H = I - 1 1^T / n`). The exact kernel of those
  images (20,100 pairs for 200 images: the slowest part by far) is cached in
  `--exact_cache` (an `.npz` keyed by the configuration) when given.
* `summary`: the speed-up (extrapolated exact seconds over feature seconds)
  and whether the target (at least 20x faster, NTK error at most 0.15) is
  met.

Usage:
  python benchmarks/features_myrtle.py [--num_images 10000]
      [--error_images 200] [--exact_subset 16] [--feature_dim 64 64 256 1024]
      [--exact_cache /tmp/myrtle_exact.npz]
"""
import argparse
import json
import math
import os
import time
from typing import Optional, Sequence, Union

import jax
import numpy as np

import neural_tangents as nt
from neural_tangents import stax
from neural_tangents.experimental import features as ft

import process_memory  # benchmarks/process_memory.py

IMAGE_SHAPE = (32, 32, 3)
W_STD = math.sqrt(2.)
BLUR_SIGMA = 1.5
# Random features (and NTK sketch dimension) of the four ReLUs.
FEATURE_DIMS = (64, 64, 256, 1024)


def images(n: int, seed: int = 0) -> np.ndarray:
  """`n` smooth random standardized images `(n, 32, 32, 3)`, float32."""
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((n,) + IMAGE_SHAPE).astype(np.float32)
  radius = int(3 * BLUR_SIGMA)
  t = np.arange(-radius, radius + 1)
  g = np.exp(-t**2 / (2 * BLUR_SIGMA**2))
  g = (g / g.sum()).astype(np.float32)
  for axis in (1, 2):  # Separable blur, reflecting at the edges.
    widths = [(0, 0)] * 4
    widths[axis] = (radius, radius)
    padded = np.pad(x, widths, mode='reflect')
    x = sum(g[i] * np.take(padded, np.arange(i, i + x.shape[axis]), axis)
            for i in range(len(g)))
  x = x - x.mean(axis=(1, 2, 3), keepdims=True)
  return (x / x.std(axis=(1, 2, 3), keepdims=True)).astype(np.float32)


def myrtle5_kernel_fn():
  """`stax` Myrtle-5 (module docstring): its `kernel_fn`."""
  conv_relu = lambda: [stax.Conv(1, (3, 3), padding='SAME', W_std=W_STD),
                       stax.Relu()]
  pool = lambda: stax.AvgPool((2, 2), (2, 2))
  return stax.serial(*conv_relu(), *conv_relu(), pool(), *conv_relu(), pool(),
                     *conv_relu(), pool(), stax.GlobalAvgPool(),
                     stax.Dense(1))[2]


def myrtle5_features(feature_dims: Sequence[int]):
  """The feature layers of the same network: `(init_fn, feature_fn)`.

  `feature_dims[i]` are the random features (`feature_dim0`,
  `feature_dim1`) and the NTK sketch dimension of the `i`-th ReLU.
  """
  dims = iter(feature_dims)

  def conv_relu():
    m = next(dims)
    return [ft.ConvFeatures(1, (3, 3), padding='SAME', W_std=W_STD),
            ft.ReluFeatures('RANDFEAT', m, m, m)]

  pool = lambda: ft.AvgPoolFeatures((2, 2), (2, 2))
  return ft.serial(*conv_relu(), *conv_relu(), pool(), *conv_relu(), pool(),
                   *conv_relu(), pool(), ft.GlobalAvgPoolFeatures(),
                   ft.DenseFeatures(1))


def relative_frobenius(actual, expected) -> float:
  return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


def centered(k: np.ndarray) -> np.ndarray:
  """`H K H`, `H = I - 1 1^T / n`: the kernel without its constant part."""
  k = k - k.mean(axis=0, keepdims=True)
  return k - k.mean(axis=1, keepdims=True)


def exact_kernels(x: np.ndarray, batch_size: int):
  """`(nngp, ntk, seconds)` of `x` by `nt.batch` (compiling block
  included: one compilation per block shape)."""
  kernel_fn = nt.batch(myrtle5_kernel_fn(), batch_size=batch_size)
  start = time.perf_counter()
  k = kernel_fn(x, None, ('nngp', 'ntk'))
  nngp, ntk = (np.asarray(jax.block_until_ready(a)) for a in k)
  return nngp, ntk, time.perf_counter() - start


def cached_exact_kernels(x: np.ndarray, batch_size: int, cache: str,
                         key: str):
  """`exact_kernels`, loaded from / saved to the `.npz` file `cache`."""
  if cache and os.path.exists(cache):
    with np.load(cache) as data:
      if str(data['key']) == key:
        return data['nngp'], data['ntk'], float(data['seconds']), True
  nngp, ntk, seconds = exact_kernels(x, batch_size)
  if cache:
    np.savez(cache, key=key, nngp=nngp, ntk=ntk, seconds=seconds)
  return nngp, ntk, seconds, False


def feature_kernels(x: np.ndarray, params, feature_fn, block_images: int):
  """`(F_nngp, F_ntk, first_block_seconds, other_seconds)`: features of
  all of `x` in row blocks (the last block zero-padded to the same shape,
  so that one compilation serves all)."""
  fn = jax.jit(feature_fn)
  nngp, ntk = [], []
  first = other = 0.
  for start in range(0, len(x), block_images):
    block = x[start:start + block_images]
    rows = len(block)
    if rows < block_images:
      block = np.concatenate(
          [block, np.zeros((block_images - rows,) + block.shape[1:],
                           block.dtype)])
    t = time.perf_counter()
    f = jax.block_until_ready(fn(block, params))
    seconds = time.perf_counter() - t
    if start == 0:
      first = seconds
    else:
      other += seconds
    nngp.append(np.asarray(f.nngp_feat[:rows]))
    ntk.append(np.asarray(f.ntk_feat[:rows]))
  return np.concatenate(nngp), np.concatenate(ntk), first, other


def run(num_images: int = 10_000,
        error_images: int = 200,
        exact_subset: int = 16,
        feature_dim: Union[int, Sequence[int]] = FEATURE_DIMS,
        seed: int = 0,
        block_images: int = 50,
        batch_size: int = 8,
        exact_cache: Optional[str] = None) -> list[dict]:
  """The measurements of the module docstring, one dict each.

  Args:
    num_images: images whose features are timed.
    error_images: the first images, on which the errors are measured.
    exact_subset: the first images whose exact kernel is timed.
    feature_dim: random features and NTK sketch dimension of each of the
      four ReLUs (`ReluFeatures('RANDFEAT', m, m, m)`), or one for all.
      The default spends them where the error comes from (the last ReLU,
      whose features are averaged directly) and not where the time goes
      (the 32x32 layers).
    seed: seeds the images and the features' key.
    block_images: images per jitted feature block.
    batch_size: `nt.batch` block size of the exact kernel.
    exact_cache: an `.npz` path caching the exact kernel of the error images.
  """
  feature_dims = ((feature_dim,) * 4 if isinstance(feature_dim, int) else
                  tuple(feature_dim))
  x = images(max(num_images, error_images, exact_subset), seed)
  network = dict(network='Myrtle-5', W_std=round(W_STD, 6), b_std=None,
                 images=f'synthetic 32x32x3, Gaussian blur sigma '
                 f'{BLUR_SIGMA}, standardized per image, seed {seed}',
                 dtype='float32', backend=jax.devices()[0].platform)
  dims = dict(feature_dims=list(feature_dims), method='RANDFEAT')
  results = []

  init_fn, feature_fn = myrtle5_features(feature_dims)
  shapes, params = init_fn(jax.random.PRNGKey(seed), (-1,) + IMAGE_SHAPE)
  process_memory.reset_peak()
  rss_before = process_memory.status_mib('VmRSS')
  f_nngp, f_ntk, first, other = feature_kernels(x[:num_images], params,
                                                feature_fn, block_images)
  blocks = -(-num_images // block_images)
  # The compiling first block is replaced by the mean of the others.
  seconds = (other * blocks / (blocks - 1) if blocks > 1 else first)
  results.append(dict(
      measurement='features', num_images=num_images, seconds=round(seconds, 2),
      first_block_seconds=round(first, 2), block_images=block_images,
      nngp_feat_dim=shapes[0][-1], ntk_feat_dim=shapes[1][-1],
      peak_rss_mib=round(process_memory.status_mib('VmHWM'), 1),
      peak_rss_growth_mib=round(process_memory.status_mib('VmHWM') -
                                rss_before, 1), **dims, **network))

  sub = x[:exact_subset]
  # Compiles the diagonal `(x, None)` and the off-diagonal `(x1, x2)` blocks.
  exact_kernels(sub[:2 * batch_size], batch_size)
  _, _, exact_seconds = exact_kernels(sub, batch_size)
  pairs = lambda n: n * (n + 1) // 2
  extrapolated = exact_seconds * pairs(num_images) / pairs(exact_subset)
  # `nt.batch` computes whole blocks, `pairs(n / batch_size)` of them: the
  # pair count overstates small subsets' share (e.g. 3 blocks, 192 pairs
  # computed, for the 136 pairs of 16 images).
  block_count = lambda n: pairs(-(-n // batch_size))
  by_blocks = (exact_seconds * block_count(num_images) /
               block_count(exact_subset))
  results.append(dict(
      measurement='exact', exact_subset=exact_subset,
      seconds=round(exact_seconds, 2), batch_size=batch_size,
      extrapolated_images=num_images,
      extrapolated_seconds=round(extrapolated, 1),
      extrapolated_seconds_by_blocks=round(by_blocks, 1),
      peak_rss_mib=round(process_memory.status_mib('VmHWM'), 1), **network))

  key = json.dumps(dict(n=error_images, seed=seed, sigma=BLUR_SIGMA,
                        W_std=W_STD, batch_size=batch_size))
  k_nngp, k_ntk, error_exact_seconds, cached = cached_exact_kernels(
      x[:error_images], batch_size, exact_cache, key)
  a, b = f_nngp[:error_images], f_ntk[:error_images]
  ntk_error = relative_frobenius(b @ b.T, k_ntk)
  nngp_error = relative_frobenius(a @ a.T, k_nngp)
  # The kernel of these images is nearly constant (off-diagonal entries
  # within a few percent of each other), so the plain error is mostly that
  # of its scale; the centered error is that of what distinguishes images.
  ntk_centered = relative_frobenius(centered(b @ b.T), centered(k_ntk))
  nngp_centered = relative_frobenius(centered(a @ a.T), centered(k_nngp))
  off = ~np.eye(len(k_ntk), dtype=bool)
  results.append(dict(
      measurement='error', error_images=error_images,
      ntk_error=round(ntk_error, 4), nngp_error=round(nngp_error, 4),
      ntk_error_centered=round(ntk_centered, 4),
      nngp_error_centered=round(nngp_centered, 4),
      exact_ntk_diagonal_mean=round(float(np.diagonal(k_ntk).mean()), 4),
      exact_ntk_off_diagonal_mean=round(float(k_ntk[off].mean()), 4),
      exact_ntk_off_diagonal_std=round(float(k_ntk[off].std()), 4),
      exact_seconds=round(error_exact_seconds, 1), exact_cached=cached,
      **dims, **network))

  speedup = extrapolated / seconds
  results.append(dict(
      measurement='summary', num_images=num_images,
      feature_seconds=round(seconds, 2),
      exact_extrapolated_seconds=round(extrapolated, 1),
      speedup=round(speedup, 1),
      speedup_by_blocks=round(by_blocks / seconds, 1), ntk_error=round(ntk_error, 4),
      nngp_error=round(nngp_error, 4),
      target_met=bool(min(speedup, by_blocks / seconds) >= 20 and
                      ntk_error <= 0.15),
      load_average=round(os.getloadavg()[0], 2), **dims))
  return results


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--num_images', type=int, default=10_000)
  parser.add_argument('--error_images', type=int, default=200)
  parser.add_argument('--exact_subset', type=int, default=16)
  parser.add_argument('--feature_dim', type=int, nargs='+',
                      default=list(FEATURE_DIMS),
                      help='one per ReLU (4), or one for all')
  parser.add_argument('--block_images', type=int, default=50)
  parser.add_argument('--batch_size', type=int, default=8)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--exact_cache', default=None)
  args = parser.parse_args()
  if len(args.feature_dim) == 1:
    args.feature_dim = args.feature_dim[0]
  for result in run(**vars(args)):
    print(json.dumps(result), flush=True)


if __name__ == '__main__':
  main()
