"""Branching layers: `FanOut` splits one input into many, `FanIn*` merge.

Used with `parallel` to build residual and multi-branch networks:

  >>> block = stax.serial(stax.FanOut(2),
  ...                     stax.parallel(stax.Dense(512), stax.Identity()),
  ...                     stax.FanInSum())
"""
import functools
import operator
from typing import Any

import jax.numpy as jnp
import numpy as np

from neural_tangents._src.stax.masking import supports_masking
from neural_tangents._src.stax.protocol import Diagonal
from neural_tangents._src.stax.requirements import layer
from neural_tangents._src.stax.requirements import requires
from neural_tangents._src.utils import arguments
from neural_tangents._src.utils.kernel import Kernel
from neural_tangents._src.utils.typing import Layer


@layer
@supports_masking(remask_kernel=False)
def FanOut(num: int) -> Layer:
  """Copies its input into a list of `num` identical outputs.

  A masked input's mask is copied with it: each output carries the input's
  mask.

  Args:
    num: number of copies, positive.

  Returns:
    `(init_fn, apply_fn, kernel_fn)`.

  Example:
    >>> _, apply_fn, _ = stax.FanOut(2)
    >>> len(apply_fn((), jnp.ones(3)))
    2
  """
  arguments.positive_int(num, 'num',
                         'Pass the number of branches, e.g. `FanOut(2)`.')
  init_fn = lambda rng, input_shape: ([input_shape] * num, ())
  apply_fn = lambda params, inputs, **kwargs: [inputs] * num

  # The consumers of the `num` copies may allow different representations:
  # `Diagonal()` lets the shared input be diagonal iff all of them allow it.
  @requires(diagonal_batch=Diagonal(), diagonal_spatial=Diagonal())
  def kernel_fn(k: Kernel, **kwargs) -> list[Kernel]:
    return [k] * num

  def mask_fn(mask, input_shape):
    del input_shape
    return [mask] * num

  return init_fn, apply_fn, kernel_fn, mask_fn


def _check_fan_in(shapes: Any, name: str) -> list[tuple[int, ...]]:
  if not isinstance(shapes, (list, tuple)) or not shapes:
    raise ValueError(
        f'`{name}` takes a non-empty list of inputs (e.g. the output of '
        f'`parallel`); got {type(shapes).__name__}. Put `FanOut(n)` and '
        f'`parallel(...)` before `{name}`.')
  return [tuple(s) for s in shapes]


def _check_same_shapes(shapes: list[tuple[int, ...]], name: str) -> None:
  def norm(s):  # `-1` is an unknown batch size at `init_fn` time.
    return tuple(None if d == -1 else d for d in s)
  first = norm(shapes[0])
  for i, s in enumerate(shapes[1:], 1):
    if len(s) != len(first) or any(a is not None and b is not None and a != b
                                   for a, b in zip(first, norm(s))):
      raise ValueError(
          f'`{name}` needs inputs of the same shape; got shapes {shapes} '
          f'(input 0 is {shapes[0]}, input {i} is {s}). Make the branches of '
          f'the `parallel` before `{name}` output the same shape, e.g. with '
          'the same `Dense(out_dim)` width.')


def _fan_in_kernel_shapes(ks: list[Kernel], name: str) -> None:
  _check_same_shapes([k.shape1 for k in ks], name)
  _check_same_shapes([k.shape2 for k in ks], name)
  first = ks[0]
  for k in ks[1:]:
    if (k.diagonal_batch, k.diagonal_spatial, k.x1_is_x2) != (
        first.diagonal_batch, first.diagonal_spatial, first.x1_is_x2):
      raise ValueError(f'`{name}` got kernels in different representations; '
                       'compute all branches from the same inputs.')


@layer
@supports_masking(remask_kernel=False)
def FanInSum() -> Layer:
  """Sums a list of inputs of the same shape.

  For independent (or jointly Gaussian) branches, covariances and NTKs add.
  Masked inputs: an output entry is masked iff it is masked in every input
  (elsewhere the sum holds the unmasked inputs' values); an input without a
  mask masks nothing.

  Example:
    >>> _, apply_fn, _ = stax.FanInSum()
    >>> apply_fn((), [jnp.ones(3), jnp.ones(3)])
    Array([2., 2., 2.], dtype=float32)
  """
  def init_fn(rng, input_shape):
    shapes = _check_fan_in(input_shape, 'FanInSum')
    _check_same_shapes(shapes, 'FanInSum')
    return shapes[0], ()

  def apply_fn(params, inputs, **kwargs):
    _check_same_shapes([tuple(x.shape) for x in
                        _check_fan_in_inputs(inputs, 'FanInSum')], 'FanInSum')
    return functools.reduce(operator.add, inputs)

  @requires(diagonal_batch=Diagonal(), diagonal_spatial=Diagonal())
  def kernel_fn(ks: list[Kernel], **kwargs) -> Kernel:
    ks = _check_fan_in_inputs(ks, 'FanInSum')
    _fan_in_kernel_shapes(ks, 'FanInSum')
    out = functools.reduce(operator.add, ks)
    return out.replace(is_gaussian=all(k.is_gaussian for k in ks),
                       is_input=False)

  return init_fn, apply_fn, kernel_fn, _masked_in_all


def _check_fan_in_inputs(inputs: Any, name: str) -> list[Any]:
  if not isinstance(inputs, (list, tuple)) or not inputs:
    raise ValueError(
        f'`{name}` takes a non-empty list of inputs (e.g. the output of '
        f'`parallel`); got {type(inputs).__name__}. Put `FanOut(n)` and '
        f'`parallel(...)` before `{name}`.')
  return list(inputs)


@layer
@supports_masking(remask_kernel=False)
def FanInProd() -> Layer:
  """Multiplies a list of inputs of the same shape elementwise.

  For independent, zero-mean branches (each branch with its own weights),
  `E[prod_i a_i(x) prod_i a_i(x')] = prod_i K_i(x, x')`, and the NTK follows by
  the product rule: `sum_i ntk_i * prod_{j != i} nngp_j`. Masked inputs: an
  output entry is masked iff it is masked in any input (a zero factor).

  Example:
    >>> _, apply_fn, _ = stax.FanInProd()
    >>> apply_fn((), [2 * jnp.ones(3), 3 * jnp.ones(3)])
    Array([6., 6., 6.], dtype=float32)
  """
  def init_fn(rng, input_shape):
    shapes = _check_fan_in(input_shape, 'FanInProd')
    _check_same_shapes(shapes, 'FanInProd')
    return shapes[0], ()

  def apply_fn(params, inputs, **kwargs):
    inputs = _check_fan_in_inputs(inputs, 'FanInProd')
    _check_same_shapes([tuple(x.shape) for x in inputs], 'FanInProd')
    return functools.reduce(operator.mul, inputs)

  @requires(diagonal_batch=Diagonal(), diagonal_spatial=Diagonal())
  def kernel_fn(ks: list[Kernel], **kwargs) -> Kernel:
    ks = _check_fan_in_inputs(ks, 'FanInProd')
    _fan_in_kernel_shapes(ks, 'FanInProd')
    prod = lambda xs: functools.reduce(operator.mul, xs)
    nngp = prod([k.nngp for k in ks])
    ntk = None
    if all(k.ntk is not None for k in ks):
      ntk = sum(ks[i].ntk * prod([k.nngp for j, k in enumerate(ks) if j != i]
                                 + [jnp.ones_like(ks[i].nngp)])
                for i in range(len(ks)))
    cov2 = None if ks[0].cov2 is None else prod([k.cov2 for k in ks])
    return ks[0].replace(nngp=nngp, ntk=ntk, cov1=prod([k.cov1 for k in ks]),
                         cov2=cov2, is_gaussian=False, is_input=False)

  return init_fn, apply_fn, kernel_fn, _masked_in_any


@layer
@supports_masking(remask_kernel=False)
def FanInConcat(axis: int = -1) -> Layer:
  """Concatenates a list of inputs along `axis`.

  Along the channel axis, the output covariance is the channel-count-weighted
  mean of the inputs' covariances. The channels of different branches are
  then differently distributed, so the output is not treated as Gaussian: a
  nonlinearity needs a `Dense` (or convolution) between it and the concat. Along a spatial axis, positions of
  different branches are independent (zero covariance) and the spatial
  covariances are laid out block-diagonally. Masks are concatenated with
  the inputs (an input without a mask masks none of its entries).

  Args:
    axis: concatenation axis; the channel axis or a spatial axis (not the
      batch axis).

  Returns:
    `(init_fn, apply_fn, kernel_fn)`.

  Example:
    >>> init_fn, _, _ = stax.FanInConcat()
    >>> init_fn(None, [(-1, 3), (-1, 5)])[0]
    (-1, 8)
  """
  def check_axis(ndim):
    if not -ndim <= axis < ndim:
      raise ValueError(
          f'`axis`={axis} of `FanInConcat` is out of range for inputs of rank '
          f'{ndim}. Pass an axis in [{-ndim}, {ndim}), e.g. `axis=-1` for '
          'channels.')
    return axis % ndim

  def init_fn(rng, input_shape):
    shapes = _check_fan_in(input_shape, 'FanInConcat')
    ax = check_axis(len(shapes[0]))
    _check_same_shapes([s[:ax] + s[ax + 1:] for s in shapes], 'FanInConcat')
    return _concat_shape(shapes, ax), ()

  def apply_fn(params, inputs, **kwargs):
    return jnp.concatenate(_check_fan_in_inputs(inputs, 'FanInConcat'),
                           axis=axis)

  @requires(diagonal_batch=Diagonal(), diagonal_spatial=Diagonal())
  def kernel_fn(ks: list[Kernel], **kwargs) -> Kernel:
    ks = _check_fan_in_inputs(ks, 'FanInConcat')
    ndim = len(ks[0].shape1)
    ax = check_axis(ndim)
    if ax == ks[0].batch_axis % ndim:
      return _concat_batch(ks, ax, axis)
    _check_same_shapes([k.shape1[:ax] + k.shape1[ax + 1:] for k in ks],
                       'FanInConcat')
    if ax == ks[0].channel_axis % ndim:
      return _concat_channels(ks, ax)
    return _concat_spatial(ks, ax)

  def mask_fn(masks, input_shapes):
    return _concat_masks(masks, input_shapes, axis % len(input_shapes[0]))

  return init_fn, apply_fn, kernel_fn, mask_fn


def _masked_in_all(masks: list[Any], input_shapes: Any) -> Any:
  """Mask of a sum: entries masked (zero) in every input; `None` masks none."""
  del input_shapes
  if any(m is None for m in masks):
    return None
  return functools.reduce(jnp.logical_and, masks)


def _masked_in_any(masks: list[Any], input_shapes: Any) -> Any:
  """Mask of a product: entries masked (zero) in any input."""
  del input_shapes
  return functools.reduce(jnp.logical_or, [m for m in masks if m is not None])


def _concat_masks(masks: list[Any], input_shapes: list[tuple[int, ...]],
                  ax: int) -> Any:
  """Masks concatenated along axis `ax` as their inputs are.

  Each mask is broadcast to its input's size along `ax` (and along the other
  axes where any mask is not of size 1); an input without a mask gets an
  all-`False` one.
  """
  present = [m for m in masks if m is not None]
  ndim = len(input_shapes[0])
  sizes = [1 if all(m.shape[d] == 1 for m in present) else
           input_shapes[0][d] for d in range(ndim)]
  parts = []
  for m, shape in zip(masks, input_shapes):
    target = tuple(shape[d] if d == ax else sizes[d] for d in range(ndim))
    parts.append(np.zeros(target, bool) if m is None else
                 jnp.broadcast_to(m, target))
  return jnp.concatenate(parts, axis=ax)


def _concat_shape(shapes: list[tuple[int, ...]], ax: int) -> tuple[int, ...]:
  out = list(shapes[0])
  # `-1` is an unknown batch size at `init_fn` time.
  out[ax] = (-1 if any(s[ax] == -1 for s in shapes) else
             sum(s[ax] for s in shapes))
  return tuple(out)


def _concat_batch(ks: list[Kernel], ax: int, axis: int) -> Kernel:
  """Concatenation along the batch axis: a block-diagonal kernel.

  Example `i` of branch `a` and example `j` of branch `b != a` are
  uncorrelated when the branches end in affine layers with their own
  zero-mean weights (their outputs are `W_a h_a`, `W_b h_b` with `W_a`, `W_b`
  independent), for the NNGP and, in the infinite-width limit, the NTK. So
  the `(B N1, B N2)` kernel holds each branch's `(N1, N2)` kernel on its
  diagonal block and zeros elsewhere.
  """
  shared = any(ks[i] is ks[j] for i in range(len(ks))
               for j in range(i + 1, len(ks)))
  if shared or not all(k.is_gaussian and not k.is_input for k in ks):
    raise ValueError(
        f'`FanInConcat(axis={axis})` concatenates along the batch axis, whose '
        'kernel is block-diagonal only when every branch ends in an affine '
        'layer with its own weights (e.g. `Dense`, `Conv`); got branches '
        'ending in other layers (or sharing their output). End each branch '
        'of the `parallel` with a `Dense` or convolution, or concatenate the '
        'inputs before calling `kernel_fn`.')
  _check_same_shapes([k.shape1[:ax] + k.shape1[ax + 1:] for k in ks],
                     'FanInConcat')
  n_cov = 1 if ks[0].diagonal_batch else 2

  def pairs(xs):  # (N1, N2, ...) blocks on the diagonal of (B N1, B N2, ...).
    if any(x is None for x in xs):
      return None
    total, start, rows = sum(x.shape[1] for x in xs), 0, []
    for x in xs:
      pad = [(0, 0)] * x.ndim
      pad[1] = (start, total - start - x.shape[1])
      rows.append(jnp.pad(x, pad))
      start += x.shape[1]
    return jnp.concatenate(rows)

  def covs(xs):
    if any(x is None for x in xs):
      return None
    return jnp.concatenate(xs) if n_cov == 1 else pairs(xs)

  return ks[0].replace(
      nngp=pairs([k.nngp for k in ks]),
      ntk=pairs([k.ntk for k in ks]),
      cov1=covs([k.cov1 for k in ks]),
      cov2=covs([k.cov2 for k in ks]),
      is_gaussian=True,
      is_input=False,
      shape1=_concat_shape([k.shape1 for k in ks], ax),
      shape2=_concat_shape([k.shape2 for k in ks], ax))


def _concat_channels(ks: list[Kernel], ax: int) -> Kernel:
  widths = [k.shape1[ax] for k in ks]
  total = sum(widths)

  def mean(xs):
    if any(x is None for x in xs):
      return None
    return sum(w * x for w, x in zip(widths, xs)) / total

  return ks[0].replace(
      nngp=mean([k.nngp for k in ks]),
      ntk=mean([k.ntk for k in ks]),
      cov1=mean([k.cov1 for k in ks]),
      cov2=mean([k.cov2 for k in ks]),
      # A mixture of differently distributed channels is not Gaussian.
      is_gaussian=len(ks) == 1 and ks[0].is_gaussian,
      is_input=False,
      shape1=_concat_shape([k.shape1 for k in ks], ax),
      shape2=_concat_shape([k.shape2 for k in ks], ax))


def _spatial_index(k: Kernel, ax: int) -> int:
  """Index among spatial dimensions of activation axis `ax`."""
  ndim = len(k.shape1)
  skip = {k.batch_axis % ndim, k.channel_axis % ndim}
  return [i for i in range(ndim) if i not in skip].index(ax)


def _block_diag_concat(xs: list[Any], n_batch: int, s: int,
                       diagonal_spatial: bool) -> Any:
  """Concatenates covariances along spatial dim `s`, zero across branches."""
  if any(x is None for x in xs):
    return None
  if diagonal_spatial:
    return jnp.concatenate(xs, axis=n_batch + s)
  a1, a2 = n_batch + 2 * s, n_batch + 2 * s + 1
  sizes = [x.shape[a1] for x in xs]
  total = sum(sizes)
  blocks, start = [], 0
  for x, size in zip(xs, sizes):
    pad = [(0, 0)] * x.ndim
    pad[a2] = (start, total - start - size)
    blocks.append(jnp.pad(x, pad))
    start += size
  return jnp.concatenate(blocks, axis=a1)


def _concat_spatial(ks: list[Kernel], ax: int) -> Kernel:
  s = _spatial_index(ks[0], ax)
  diag = ks[0].diagonal_spatial
  n_cov = 1 if ks[0].diagonal_batch else 2
  return ks[0].replace(
      nngp=_block_diag_concat([k.nngp for k in ks], 2, s, diag),
      ntk=_block_diag_concat([k.ntk for k in ks], 2, s, diag),
      cov1=_block_diag_concat([k.cov1 for k in ks], n_cov, s, diag),
      cov2=_block_diag_concat([k.cov2 for k in ks], n_cov, s, diag),
      is_gaussian=all(k.is_gaussian for k in ks),
      is_input=False,
      shape1=_concat_shape([k.shape1 for k in ks], ax),
      shape2=_concat_shape([k.shape2 for k in ks], ax))
