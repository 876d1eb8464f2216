"""Maps large covariances in place, one block of leading-axis rows at a time.

The layers' kernel maps are elementwise (nonlinearities) or act only on the
spatial axes (convolutions): rows of the leading batch axis are independent.
Mapped as a whole, a 256 MiB covariance (Myrtle-5 on 32x32 images, an 8 x 8
block of pairs) gets several same-sized intermediates from XLA (padded
copies, window taps, square roots and ratios with several uses); mapped in
blocks of rows inside a `lax.fori_loop` whose state is the covariance itself,
each block's result overwrites the block it was computed from, so the map
adds only block-sized buffers (XLA reuses the input's buffer when nothing
else reads it, and copies it once otherwise). Every entry is computed by the
same operations as unblocked, so the results are bitwise the same.

Example:
  >>> import jax.numpy as jnp
  >>> x = jnp.arange(12.).reshape(4, 3)
  >>> scale = jnp.arange(4.).reshape(4, 1)
  >>> y, = map_rows_in_place(lambda rows, scale: (rows * scale,), [x],
  ...                        [scale], blocked_above_bytes=0, block_bytes=24)
  >>> bool((y == x * scale).all())  # in two blocks of two rows
  True
"""
from typing import Callable, Optional, Sequence

import jax
from jax import lax
import jax.numpy as jnp

Array = jax.Array

# Arrays up to this size are mapped at once; larger ones in blocks of rows of
# about `BLOCK_BYTES`.
BLOCKED_ABOVE_BYTES = 8 * 2**20
BLOCK_BYTES = 2**20


def block_rows(x: Array, block_bytes: int) -> int:
  """The largest divisor of `x.shape[0]` whose rows fit in `block_bytes`."""
  n = x.shape[0]
  row_bytes = x.size // n * x.dtype.itemsize
  fitting = [d for d in range(1, n + 1)
             if n % d == 0 and d * row_bytes <= block_bytes]
  return max(fitting, default=1)


def map_rows_in_place(
    fn: Callable[..., Sequence[Optional[Array]]],
    mapped: Sequence[Optional[Array]],
    others: Sequence[Array] = (),
    blocked_above_bytes: Optional[int] = None,
    block_bytes: Optional[int] = None) -> list[Optional[Array]]:
  """`fn(*mapped, *others)`, in blocks of rows of `mapped` if they are large.

  Args:
    fn: maps arrays to as many arrays of the same shapes and dtypes (`None`
      to `None`), each row of the outputs depending only on the same row of
      the inputs.
    mapped: arrays (or `None`) of one shape, blocked along axis 0; the first
      is not `None`.
    others: further arguments of `fn`, with as many axes as `mapped[0]`:
      blocked along axis 0 too if it has the same length, passed whole if it
      has length 1 (broadcast).
    blocked_above_bytes: `mapped[0]` of at most this many bytes (or with one
      row) is mapped at once; `None` for `BLOCKED_ABOVE_BYTES`.
    block_bytes: the size of a block of rows (at least one row); `None` for
      `BLOCK_BYTES`.

  Returns:
    The outputs of `fn`, as a list.
  """
  if blocked_above_bytes is None:
    blocked_above_bytes = BLOCKED_ABOVE_BYTES
  if block_bytes is None:
    block_bytes = BLOCK_BYTES
  x = mapped[0]
  n = x.shape[0] if x.ndim else 1
  if (x.nbytes <= blocked_above_bytes or n < 2 or
      any(m is not None and (jnp.shape(m), jnp.result_type(m)) !=
          (x.shape, x.dtype) for m in mapped) or
      any(jnp.ndim(o) != x.ndim or jnp.shape(o)[0] not in (1, n)
          for o in others)):
    return list(fn(*mapped, *others))

  rows = block_rows(x, block_bytes)
  split = [jnp.shape(o)[0] == n for o in others]

  def block(a, start):
    return lax.dynamic_slice_in_dim(a, start, rows, 0)

  def block_fn(start, mapped):
    blocks = [None if m is None else block(m, start) for m in mapped]
    return fn(*blocks, *(block(o, start) if s else o
                         for o, s in zip(others, split)))

  block_shape = (rows,) + x.shape[1:]
  out_shapes = jax.eval_shape(block_fn, 0, mapped)
  if (len(out_shapes) != len(mapped) or
      any((m is None) != (o is None) or
          (o is not None and (o.shape, o.dtype) != (block_shape, x.dtype))
          for m, o in zip(mapped, out_shapes))):
    return list(fn(*mapped, *others))

  def body(i, state):
    start = i * rows
    out = block_fn(start, state)
    return [None if o is None else lax.dynamic_update_slice_in_dim(
        m, o, start, 0) for m, o in zip(state, out)]

  return lax.fori_loop(0, n // rows, body, list(mapped))
