"""Einsum letters, and einsums of many operands in the cheapest order.

Every empirical kernel implementation writes its kernels (and structured
derivatives every Jacobian and cotangent) as an einsum whose dimensions are
named by integer *letters*. `Letters` hands out fresh ones; a `Letter` is
`None` for a dimension of size 1, which an einsum can drop (`mask`,
`squeeze_units`). `einsum` contracts `(array, letters)` pairs along
opt_einsum's optimal path, one `lax.dot_general` per pair.
"""
import functools
import math
from typing import Any, Callable, Optional, Sequence

from jax import lax
import jax.numpy as jnp
import opt_einsum

from neural_tangents._src.utils.typing import Array

Letter = Optional[int]  # `None` marks a dimension of size 1.


class Letters:
  """Hands out fresh integer einsum letters: 0, 1, 2, ...

  Example:
    >>> letters = Letters()
    >>> letters.new(), letters.many(2)
    (0, [1, 2])
  """

  def __init__(self):
    self._next = 0

  def new(self) -> int:
    """A letter not handed out before."""
    self._next += 1
    return self._next - 1

  def many(self, n: int) -> list[int]:
    """`n` fresh letters."""
    return [self.new() for _ in range(n)]


def mask(letters: Sequence[Letter], shape: Sequence[int]) -> tuple[Letter, ...]:
  """Drops (to None) the letters of size-1 dimensions.

  Example:
    >>> mask([0, 1, 2], (3, 1, 4))
    (0, None, 2)
  """
  return tuple(None if s == 1 else letter for letter, s in zip(letters, shape))


def squeeze_units(x: Array, letters: Sequence[Letter], lead: int) -> Array:
  """Drops the size-1 dimensions (letter None) after the first `lead`.

  Example:
    >>> squeeze_units(jnp.ones((2, 3, 1)), (0, None), lead=1).shape
    (2, 3)
  """
  axes = tuple(lead + i for i, letter in enumerate(letters) if letter is None)
  return jnp.squeeze(x, axes) if axes else x


def einsum_into(operands: list, result: Sequence[int], shape: Sequence[int],
                dtype: Any) -> Array:
  """An einsum whose result letters may be missing from all operands.

  A missing letter is a dimension the value does not depend on: an output
  dimension of size 1, or examples when only shared values are involved;
  the result is broadcast along it. Without operands (the cotangent of a
  single output entry with respect to itself) the product is 1.

  Example:
    >>> einsum_into([(jnp.ones((2, 3)), [0, 1])], [0, 2], (2, 4),
    ...             jnp.float32).shape
    (2, 4)
  """
  if not operands:
    return jnp.ones(tuple(shape), dtype)
  present = set(letter for _, ls in operands for letter in ls)
  kept = [letter for letter in result if letter in present]
  out = einsum(*operands, result=kept)
  out = out.reshape([s if letter in present else 1
                     for letter, s in zip(result, shape)])
  return jnp.broadcast_to(out, tuple(shape))


def einsum(*operands_and_letters, result: Sequence[int]) -> Array:
  """An einsum over `(array, letters)` pairs, in the cheapest order.

  The pairwise order is opt_einsum's optimal path; each pair is contracted
  by one `lax.dot_general`, whose natural output layout (batch, then free
  dimensions) is kept until the end. (`jnp.einsum` instead transposes every
  intermediate to opt_einsum's letter order, which can cost more than the
  products themselves for the many-dimensional operands here.)

  Example:
    >>> einsum((jnp.ones((2, 3)), [0, 1]), (jnp.ones((4, 3)), [2, 1]),
    ...        result=[0, 2]).shape
    (2, 4)
  """
  arrays = [a for a, _ in operands_and_letters]
  letters = [list(letter) for _, letter in operands_and_letters]
  if any(len(set(letter)) < len(letter) for letter in letters):
    # Repeated letters in an operand (diagonals): jnp.einsum handles them.
    args = []
    for a, letter in zip(arrays, letters):
      args += [a, letter]
    return jnp.einsum(*args, list(result))
  for a, letter in zip(arrays, letters):
    if a.ndim != len(letter):
      raise ValueError(
          f'`operands_and_letters`: an operand of shape {a.shape} has '
          f'letters {letter}; give one letter per dimension of the operand.')
  path, _ = _contraction_path(tuple(tuple(letter) for letter in letters),
                              tuple(tuple(a.shape) for a in arrays),
                              tuple(result))
  for pair in path:
    picked = [(arrays[i], letters[i]) for i in pair]
    for i in sorted(pair, reverse=True):
      del arrays[i], letters[i]
    keep = set(result).union(*letters)
    if len(picked) == 1:
      (a, la), = picked
      a, la = _sum_out(a, la, keep)
    else:
      (a, la), (b, lb) = picked
      a, la = _contract_pair(a, la, b, lb, keep)
    arrays.append(a)
    letters.append(la)
  (a, la), = zip(arrays, letters)
  a, la = _sum_out(a, la, set(result))
  return jnp.transpose(a, [la.index(letter) for letter in result])


def einsum_cost(*operands_and_letters, result: Sequence[int]) -> float:
  """FLOPs of `einsum(*operands_and_letters, result=result)`'s best order.

  Example:
    >>> einsum_cost((jnp.ones((2, 3)), [0, 1]), (jnp.ones((4, 3)), [2, 1]),
    ...             result=[0, 2])
    48.0
  """
  letters = tuple(tuple(letter) for _, letter in operands_and_letters)
  shapes = tuple(tuple(a.shape) for a, _ in operands_and_letters)
  return _contraction_path(letters, shapes, tuple(result))[1]


@functools.lru_cache(maxsize=4096)
def _contraction_path(letters: tuple, shapes: tuple,
                      result: tuple) -> tuple[list[tuple[int, ...]], float]:
  """opt_einsum's contraction order, and its FLOPs."""
  if len(letters) == 1:
    return [(0,)], float(math.prod(shapes[0]))
  symbols = {letter: opt_einsum.get_symbol(i)
             for i, letter in enumerate(sorted(set(result).union(*letters)))}
  spec = (','.join(''.join(symbols[letter] for letter in ls)
                   for ls in letters) + '->' +
          ''.join(symbols[letter] for letter in result))
  # 'optimal' searches all pairwise orders, cheap for a handful of operands,
  # and picks e.g. `(x1 x2^T) * (g1 g2^T)` over forming a Jacobian when
  # that is fewer FLOPs; dynamic programming scales to more operands.
  optimize = 'optimal' if len(letters) <= 5 else 'dp'
  path, info = opt_einsum.contract_path(spec, *shapes, shapes=True,
                                        optimize=optimize)
  return [tuple(p) for p in path], float(info.opt_cost)


def _sum_out(a: Array, letters: list[int],
             keep: set[int]) -> tuple[Array, list[int]]:
  """Sums over the dimensions whose letters are not in `keep`."""
  axes = tuple(i for i, letter in enumerate(letters) if letter not in keep)
  if axes:
    a = jnp.sum(a, axis=axes)
    letters = [letter for letter in letters if letter in keep]
  return a, letters


def _contract_pair(a: Array, la: list[int], b: Array, lb: list[int],
                   keep: set[int]) -> tuple[Array, list[int]]:
  """Contracts two operands as one batched matrix product.

  Letters in both are batch dimensions if still needed (`keep`), else
  contracted; letters in one only are summed out first unless needed. The
  operands are reshaped to `(batch, M, K)` or `(batch, K, M)` matrices
  (whichever needs no transpose, if either): XLA's CPU backend runs these
  canonical forms as fast GEMMs, but may fall back to a slow loop for a
  batched product of many-dimensional, interleaved operands.
  """
  a, la = _sum_out(a, la, keep | set(lb))
  b, lb = _sum_out(b, lb, keep | set(la))
  shared = [letter for letter in la if letter in lb]
  batch = [letter for letter in shared if letter in keep]
  contract = [letter for letter in shared if letter not in keep]
  free_a = [letter for letter in la if letter not in shared]
  free_b = [letter for letter in lb if letter not in shared]
  size = dict(zip(la, a.shape)) | dict(zip(lb, b.shape))
  prod = lambda ls: math.prod(size[letter] for letter in ls)
  a, a_contract_last = _as_matrices(a, la, batch, free_a, contract, prod)
  b, b_contract_last = _as_matrices(b, lb, batch, free_b, contract, prod)
  dims = (((2 if a_contract_last else 1,), (2 if b_contract_last else 1,)),
          ((0,), (0,)))
  out = lax.dot_general(a, b, dims)
  out = out.reshape([size[letter] for letter in batch + free_a + free_b])
  return out, batch + free_a + free_b


def _as_matrices(x: Array, letters: list[int], batch: list[int],
                 free: list[int], contract: list[int],
                 prod: Callable) -> tuple[Array, bool]:
  """`x` as `(batch, free, contract)` or `(batch, contract, free)` matrices.

  Returns the reshaped array and whether the contracted dimension is last.
  """
  contract_last = letters != batch + contract + free
  order = batch + free + contract if contract_last else letters
  if order != letters:
    x = jnp.transpose(x, [letters.index(letter) for letter in order])
  shape = ((prod(batch), prod(free), prod(contract)) if contract_last else
           (prod(batch), prod(contract), prod(free)))
  return x.reshape(shape), contract_last
