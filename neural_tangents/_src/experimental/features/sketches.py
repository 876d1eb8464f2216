"""Randomized sketches of inner products, of tensor products and of powers.

The sketches here are unbiased for tensor products,
`E[<T(a, b), T(a', b')>] = <a, a'> <b, b'>` without forming `a (x) b`, before
`tensor_srht` rescales each row to its exact norm `|a| |b|`
(`with_row_norms`): a ratio estimator, consistent and biased by `O(1 / m)`,
whose diagonal `<T(a, b), T(a, b)>` is exact and whose variance is much
smaller for nearly parallel rows (where the unbiased one has a second moment
of up to 9 times its squared mean).

* `fwht`: the orthonormal fast Walsh-Hadamard transform `H / sqrt(n)`.
* `tensor_srht`: the TensorSRHT of Ahle et al. (2020): with random signs
  `D_1`, `D_2`, indices `i_k`, `j_k` drawn uniformly (with replacement) and
  `u = H D_1 a`, `v = H D_2 b` (zero-padded to powers of 2 `n_1`, `n_2`),

    T(a, b)_k = sqrt(n_1 n_2 / m) u[i_k] v[j_k],     k = 1..m.

  `E[u_i u'_i] = <a, a'> / n_1` over a uniform `i`, so each of the `m` terms
  of `<T(a, b), T(a', b')>` has mean `<a, a'> <b, b'> / m`. Memory and time
  are `O(m + n_1 log n_1 + n_2 log n_2)` per row.
* `polynomial_sketch`: features of `sum_j A_j(x) A_j(x') <x, x'>^j`
  (per-row coefficients `A`), by Horner's rule on sketched tensor products
  (the PolySketch of Zandieh et al. 2021, Han et al. 2022):

    h_p = [A_p],   h_j = [A_j, T_j(x, h_{j+1})],   features h_0

  so that `<h_j, h_j'> = A_j A_j' + <x, x'> <h_{j+1}, h_{j+1}'>` in
  expectation, each `T_j` independent (`h_p` is zero-padded to the width of
  the others). With exact tensor products (`kron_rows`) the same recursion
  gives the explicit features of dimension `1 + d + ... + d^p`.

Example:
  >>> key = random.PRNGKey(0)
  >>> params = tensor_srht_params(key, 3, 4, 256)
  >>> a, b = jnp.ones((2, 3)), jnp.ones((2, 4))
  >>> tensor_srht(a, b, params).shape
  (2, 256)
"""
import functools
import math
from typing import Optional, Sequence

import jax
from jax import lax
from jax import random
import jax.numpy as jnp
import numpy as np

Array = jax.Array
Params = dict[str, Array]


def next_power_of_two(n: int) -> int:
  """The least power of 2 `>= n` (1 for `n <= 1`)."""
  return 1 << max(int(n) - 1, 0).bit_length()


# The largest Hadamard factor applied as a dense matrix (the transform of
# size `n = 2^L` is the Kronecker product of factors of at most this size).
_MAX_FACTOR_BITS = 7


@functools.lru_cache(maxsize=None)
def _hadamard_factors(n: int) -> tuple[np.ndarray, ...]:
  """Sylvester Hadamard matrices whose Kronecker product is `H_n`."""
  bits = n.bit_length() - 1
  sizes = [_MAX_FACTOR_BITS] * (bits // _MAX_FACTOR_BITS)
  if bits % _MAX_FACTOR_BITS:
    sizes.append(bits % _MAX_FACTOR_BITS)
  factors = []
  for b in sizes:
    h = np.ones((1, 1))
    for _ in range(b):
      h = np.block([[h, h], [h, -h]])
    factors.append(h)
  return tuple(factors)


def fwht(x: Array) -> Array:
  """Orthonormal Walsh-Hadamard transform `H_n / sqrt(n)` of rows `(R, n)`.

  `n` must be a power of 2. `H_n` is the Kronecker product of Sylvester
  matrices of size at most 128, applied to the rows reshaped as a tensor, one
  axis each (`O(n log n)` up to the factor size, in few operations).

  Example:
    >>> fwht(jnp.array([[1., 0.]]))
    Array([[0.70710677, 0.70710677]], dtype=float32)
  """
  rows, n = x.shape
  if n & (n - 1):
    raise ValueError(f'`fwht` needs a power-of-2 number of columns; got {n}. '
                     'Zero-pad the rows first.')
  factors = _hadamard_factors(n)
  if not factors:
    return x
  letters = 'abcdefghijklmnop'[:len(factors)]
  spec = ('z' + letters + ',' +
          ','.join(f'{a.upper()}{a}' for a in letters) +
          '->z' + letters.upper())
  out = jnp.einsum(spec, x.reshape((rows,) + tuple(len(h) for h in factors)),
                   *(jnp.asarray(h, x.dtype) for h in factors),
                   precision=jax.lax.Precision.HIGHEST)
  return out.reshape((rows, n)) / math.sqrt(n)


def split_bits(key: Array, sizes: Sequence[int]) -> list[Array]:
  """Random `uint32` bits in chunks of the given sizes, from one draw.

  One draw compiles several times faster than one per array (the random
  number generator is inlined once), which dominates the cost of drawing the
  sketches of a layer on CPU.
  """
  bits = random.bits(key, (max(sum(sizes), 1),), jnp.uint32)
  ends = np.cumsum([0] + list(sizes))
  return [bits[a:b] for a, b in zip(ends[:-1], ends[1:])]


def normal_from_bits(bits: Array, shape: tuple[int, ...]) -> Array:
  """Standard normal float32 samples of `shape` from as many random bits
  (as `jax.random.normal`: the inverse error function of uniforms on
  `(-1, 1)`)."""
  mantissa = (bits >> 9) | jnp.uint32(0x3F800000)
  uniform = lax.bitcast_convert_type(mantissa, jnp.float32) - 1  # [0, 1)
  low = np.nextafter(np.float32(-1), np.float32(1))
  uniform = jnp.maximum(low, 2 * uniform - 1)
  return (math.sqrt(2) * jax.scipy.special.erfinv(uniform)).reshape(shape)


def _padded_dims(dim1: int, dim2: int) -> tuple[int, int]:
  return next_power_of_two(dim1), next_power_of_two(dim2)


def tensor_srht_bit_count(dim1: int, dim2: int, out_dim: int,
                          steps: int = 1) -> int:
  """The random bits `tensor_srht_params_from_bits` uses (`steps` stacked
  sketches)."""
  n1, n2 = _padded_dims(dim1, dim2)
  return steps * (n1 + n2 + 2 * out_dim)


def tensor_srht_params_from_bits(bits: Array, dim1: int, dim2: int,
                                 out_dim: int, steps: Optional[int] = None
                                 ) -> Params:
  """`tensor_srht_params` from `tensor_srht_bit_count(...)` random bits.

  The padded dimensions `n_i` are powers of 2, so masking bits gives exactly
  uniform indices. With `steps`, the arrays have a leading axis of `steps`
  independent sketches.
  """
  n1, n2 = _padded_dims(dim1, dim2)
  bits = bits.reshape((1 if steps is None else steps, -1))
  ends = np.cumsum([n1, n2, out_dim, out_dim])
  sign = lambda b: (1 - 2 * (b & 1)).astype(jnp.int8)
  index = lambda b, n: (b & (n - 1)).astype(jnp.int32)
  params = dict(signs1=sign(bits[:, :ends[0]]),
                signs2=sign(bits[:, ends[0]:ends[1]]),
                index1=index(bits[:, ends[1]:ends[2]] >> 1, n1),
                index2=index(bits[:, ends[2]:ends[3]] >> 1, n2))
  if steps is None:
    params = {k: v[0] for k, v in params.items()}
  return params


def tensor_srht_params(key: Array, dim1: int, dim2: int, out_dim: int
                       ) -> Params:
  """Random signs and indices of a `tensor_srht` of `(dim1, dim2)` rows.

  Args:
    key: PRNG key.
    dim1, dim2: the numbers of columns of the two factors.
    out_dim: the number `m` of sketch coordinates.

  Returns:
    A dict of `signs1` `(n1,)`, `signs2` `(n2,)` (int8, +-1) and `index1`,
    `index2` `(m,)`, `n_i` the padded dimensions (powers of 2).
  """
  bits = split_bits(key, [tensor_srht_bit_count(dim1, dim2, out_dim)])[0]
  return tensor_srht_params_from_bits(bits, dim1, dim2, out_dim)


def _randomized_hadamard(x: Array, signs: Array) -> Array:
  """`H D x` of the rows of `x`, zero-padded to `len(signs)` columns."""
  n = signs.shape[0]
  x = jnp.pad(x, ((0, 0), (0, n - x.shape[1])))
  return fwht(x * signs.astype(x.dtype)[None, :])


def tensor_srht(a: Array, b: Array, params: Params) -> Array:
  """TensorSRHT of the row-wise tensor products `a (x) b` (see the module).

  Args:
    a: `(R, d1)` rows.
    b: `(R, d2)` rows.
    params: from `tensor_srht_params(key, d1, d2, m)`.

  Returns:
    `(R, m)` sketches with `E[<T(a, b), T(a', b')>] = <a, a'> <b, b'>`.
  """
  n1, n2 = params['signs1'].shape[0], params['signs2'].shape[0]
  m = params['index1'].shape[0]
  u = jnp.take(_randomized_hadamard(a, params['signs1']), params['index1'],
               axis=1)
  v = jnp.take(_randomized_hadamard(b, params['signs2']), params['index2'],
               axis=1)
  out = math.sqrt(n1 * n2 / m) * u * v
  return with_row_norms(out, row_norms(a) * row_norms(b))


def row_norms(x: Array) -> Array:
  """`(R, 1)` Euclidean norms of the rows of `x`."""
  return jnp.sqrt(jnp.sum(x * x, axis=1, keepdims=True))


def with_row_norms(x: Array, norms: Array) -> Array:
  """The rows of `x` rescaled to the given `(R, 1)` norms (zero rows stay
  zero)."""
  current = row_norms(x)
  positive = current > 0
  return x * jnp.where(positive, norms / jnp.where(positive, current, 1), 0)


def kron_rows(a: Array, b: Array) -> Array:
  """The exact row-wise tensor products `(R, d1 * d2)`."""
  rows = a.shape[0]
  return (a[:, :, None] * b[:, None, :]).reshape((rows, -1))


def polynomial_sketch_bit_count(degree: int, dim: int, sketch_dim: int) -> int:
  """The random bits `polynomial_sketch_params_from_bits` uses."""
  return tensor_srht_bit_count(dim, sketch_dim + 1, sketch_dim, degree)


def polynomial_sketch_params_from_bits(bits: Array, degree: int, dim: int,
                                       sketch_dim: int) -> Params:
  """`polynomial_sketch_params` from `polynomial_sketch_bit_count(...)` bits.
  """
  return tensor_srht_params_from_bits(bits, dim, sketch_dim + 1, sketch_dim,
                                      degree)


def polynomial_sketch_params(key: Array, degree: int, dim: int,
                             sketch_dim: int) -> Params:
  """The `tensor_srht_params` of the `degree` steps of `polynomial_sketch`,
  stacked on a leading axis (step `j` in row `j`).

  Step `j` sketches `x (x) h_{j+1}`, `x` of `dim` and `h_{j+1}` of
  `sketch_dim + 1` columns, into `sketch_dim` coordinates.
  """
  bits = split_bits(key, [polynomial_sketch_bit_count(degree, dim,
                                                      sketch_dim)])[0]
  return polynomial_sketch_params_from_bits(bits, degree, dim, sketch_dim)


def polynomial_sketch(coefficients: Array, x: Array,
                      params: Optional[Params]) -> Array:
  """Features of `sum_j A_j(x) A_j(x') <x, x'>^j` by Horner's rule.

  Args:
    coefficients: `A`, `(R, p + 1)`: the coefficient of degree `j` of each
      row in column `j`.
    x: `(R, d)` rows (typically of unit norm).
    params: the stacked steps from `polynomial_sketch_params` (sketched:
      `(R, m + 1)` features), or None for the exact tensor products
      (`(R, 1 + d + ... + d^p)` features).

  Returns:
    Features `h_0` (see the module docstring).
  """
  degree = coefficients.shape[1] - 1
  if params is None:
    h = coefficients[:, degree:]
    for j in reversed(range(degree)):
      h = jnp.concatenate([coefficients[:, j:j + 1], kron_rows(x, h)], axis=1)
    return h
  if params['signs1'].shape[0] != degree:
    raise ValueError(f'`polynomial_sketch` of degree {degree} needs {degree} '
                     f'steps; got {params["signs1"].shape[0]}.')
  sketch_dim = params['index1'].shape[1]
  # `h_p = [A_p, 0, ..., 0]`: the same width at every step, so that the
  # steps are one `lax.scan` (compiled once, whatever the degree).
  h = jnp.pad(coefficients[:, degree:], ((0, 0), (0, sketch_dim)))

  reverse = lambda a: a[::-1]
  steps = (reverse(coefficients[:, :degree].T),
           jax.tree_util.tree_map(reverse, params))
  return jax.lax.scan(_horner_step, (h, x), steps)[0][0]


def _horner_step(carry: tuple[Array, Array], inputs: tuple[Array, Params]
                 ) -> tuple[tuple[Array, Array], None]:
  """`h_j = [A_j, T_j(x, h_{j+1})]` (a top-level function, so that eager
  `lax.scan`s of the same shapes reuse one compilation)."""
  h, x = carry
  coefficient, step_params = inputs
  h = jnp.concatenate([coefficient[:, None], tensor_srht(x, h, step_params)],
                      axis=1)
  return (h, x), None


def explicit_polynomial_dim(dim: int, degree: int) -> int:
  """`1 + d + ... + d^p`: the dimension of exact polynomial features."""
  return sum(dim**j for j in range(degree + 1))


def unit_rows(x: Array) -> tuple[Array, Array]:
  """`(x / |x|, |x|)` row-wise; zero rows stay zero (norm 0)."""
  norm = jnp.sqrt(jnp.sum(x * x, axis=1, keepdims=True))
  positive = norm > 0
  unit = x / jnp.where(positive, norm, 1)
  return jnp.where(positive, unit, 0), norm
