"""NTK_VECTOR_PRODUCTS: the NTK from VJPs and JVPs, no Jacobian stored.

`Theta e_o = J(x1) (J(x2)^T e_o)` for each basis vector `e_o` of x2's
outputs: a VJP of x2's side, then a JVP of x1's side along it. Per example
(x2's examples mapped in chunks that fit in memory) when the problem is
per-example.
"""
import math
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.empirical import einsum as einsum_lib
from neural_tangents._src.empirical import layout as layout_lib
from neural_tangents._src.empirical import problem as problem_lib
from neural_tangents._src.utils.typing import Array

# Above this many bytes of stored VJPs, x2's examples are mapped in chunks
# (`lax.map`) instead of all at once (`vmap`). A memory bound (1 GiB), not a
# speed trade-off: no benchmark tunes it.
VECTOR_PRODUCTS_MAX_BYTES = 2 ** 30


def vector_products(problem: problem_lib.Problem, params: list, data1: list,
                    data2: list) -> list[Array]:
  """`Theta e_o = J(x1) (J(x2)^T e_o)` for each output entry `o` of x2.

  Example:
    >>> setup = problem_lib.setup(lambda p, x: x @ p, x1, None,
    ...                           jnp.ones((4, 2)), {}, (), (), 0)
    >>> vector_products(*setup)[0].shape  # No traced axes: (N1, N2, 2, 2).
    (3, 3, 2, 2)
  """
  per_example = problem.per_example
  side1, side2 = problem.sides
  fn1 = side1.over_examples(side1.call(per_example), per_example)
  fn2 = side2.call(per_example)
  example2 = problem_lib.example_avals(data2, side2.data_axes)
  dtypes = [out.dtype for out in jax.eval_shape(fn2, params, example2)]
  basis = _output_basis(side2.out_shapes, dtypes)

  def theta_rows(example: list) -> list[Array]:
    # VJPs of x2's basis cotangents, then JVPs of x1's outputs along them.
    _, vjp_fn = jax.vjp(lambda p: fn2(p, example), params)
    tangents, = jax.vmap(vjp_fn)(basis)
    push = lambda t: jax.jvp(lambda p: fn1(p, data1), (params,), (t,))[1]
    return jax.vmap(push)(tangents)

  if per_example:
    theta = _map_examples(theta_rows, data2, side2.data_axes,
                          _chunk_size(side2.n, len(basis[0]), params))
  else:
    theta = theta_rows(data2)
  kernels = []
  start = 0
  for leaf, layout in enumerate(problem.layouts):
    shape1, shape2 = side1.out_shapes[leaf], side2.out_shapes[leaf]
    size = math.prod(shape2)
    lead = (side2.n,) if per_example else ()
    rows = jax.lax.slice_in_dim(theta[leaf], start, start + size,
                                axis=len(lead))
    rows = rows.reshape(lead + tuple(shape2) + rows.shape[len(lead) + 1:])
    start += size
    kernel_letters = layout_lib.kernel_letters(layout, einsum_lib.Letters())
    example1 = [kernel_letters.example1] if per_example else []
    example2 = [kernel_letters.example2] if per_example else []
    kernel = einsum_lib.einsum(
        (rows, example2 + list(kernel_letters.out2) + example1 +
         list(kernel_letters.out1)), result=kernel_letters.result)
    kernels.append(kernel / layout_lib.trace_size(layout, shape1))
  return kernels


def _output_basis(out_shapes: Sequence[tuple[int, ...]],
                  dtypes: Sequence[Any]) -> list[Array]:
  """Rows of the identity over all output entries, split into output leaves."""
  sizes = [math.prod(shape) for shape in out_shapes]
  total, start, basis = sum(sizes), 0, []
  for shape, size, dtype in zip(out_shapes, sizes, dtypes):
    basis.append(jnp.eye(total, size, -start, dtype=dtype).reshape(
        (total,) + tuple(shape)))
    start += size
  return basis


def _chunk_size(n: int, rows: int, params: list) -> int:
  """Examples of x2 per step so that their stored VJPs fit in memory."""
  size = sum(np.size(p) * jnp.dtype(jnp.result_type(p)).itemsize
             for p in params)
  per_example = max(1, rows * size)
  return int(max(1, min(n, VECTOR_PRODUCTS_MAX_BYTES // per_example)))


def _map_examples(fn: Callable[[list], Any], data: list,
                  axes: Sequence[Optional[int]], chunk_size: int) -> Any:
  """`fn` on each example of `data`, results stacked along axis 0."""
  batched = [jnp.moveaxis(d, axis, 0) for d, axis in zip(data, axes)
             if axis is not None]

  def one(example_batched: list) -> Any:
    batched_it = iter(example_batched)
    return fn([next(batched_it) if axis is not None else d
               for d, axis in zip(data, axes)])

  n = batched[0].shape[0]
  if chunk_size >= n:
    return jax.vmap(one)(batched)
  return jax.lax.map(one, batched, batch_size=chunk_size)
