"""Masked inputs: `MaskedArray`, `mask_constant=` and `@supports_masking`.

Inputs of different sizes (variable-length sequences, graphs with different
numbers of nodes, images with missing pixels) are padded to a common shape and
the padding is *masked*: either pass a `MaskedArray(masked_value, mask)` to
`apply_fn` / `kernel_fn`, or pass `mask_constant=c` to them, in which case
every input entry equal to `c` is masked (`NaN` masks `NaN` entries).

Semantics (the same for the finite network and its kernels):

* A mask is a boolean array, `True` = masked out, of the same rank as the
  activations it masks and broadcastable to them (e.g. `(N, L, 1)` for
  `(N, L, C)` sequences).
* Masked entries are zero: they are zeroed in the inputs, before every layer
  and in every layer's outputs. Kernels are computed from the zeroed inputs,
  so every covariance entry involving a masked position is zero.
* Each layer maps its input mask to an output mask with a `mask_fn(mask,
  input_shape)`: elementwise layers keep it; `Dense` masks a position iff all
  its channels are masked (output mask of size 1 on the channel axis);
  `Flatten` flattens it with the activations; global pooling masks an
  example iff all its positions and channels are (the published rules, so
  `apply_fn` keeps returning a `MaskedArray`); a convolution or pooling
  window's output position is masked iff the input position at the centre
  of its window is (padding counts as masked: with `SAME` padding and
  stride 1 the mask passes through unchanged, with strides it is strided
  through the window centres); pooling, and global average pooling,
  average over unmasked entries only; attention and
  `Aggregate` ignore masked positions as keys / sender nodes and mask the same
  positions of their output; `FanOut` copies the mask to every branch,
  `FanInSum` masks an entry iff every input does, `FanInProd` iff any input
  does, and `FanInConcat` concatenates the masks (an input without a mask
  masks nothing).
* `apply_fn` returns a `MaskedArray` whenever its output mask is not `None`
  (a plain array otherwise), so masks flow from layer to layer.
* In a `Kernel`, `mask1` / `mask2` hold the current masks of `x1` / `x2` in the
  activation layout of `shape1` / `shape2` (`None` when unmasked). With
  `x2=None`, `mask2` is `mask1`. Covariance entries pairing a masked position
  (a position masked on all its channels) with anything are zero.
* A layer that does not declare masking support raises a `ValueError` when it
  receives a masked input (in `apply_fn` or `kernel_fn`), rather than giving
  a silently wrong result.

How a layer author adds masking (e.g. to a convolution or pooling layer):

1. Decorate the layer constructor, *inside* `@layer`::

     @layer
     @supports_masking(remask_kernel=True)
     def MyLayer(...):
       ...
       return init_fn, apply_fn, kernel_fn, mask_fn

   Returning three functions (no `mask_fn`) keeps the mask unchanged.
2. `mask_fn(mask, input_shape) -> output_mask`: `mask` is a boolean array of
   the same rank as the inputs, broadcastable to `input_shape`; return a
   boolean array of the rank of the outputs, broadcastable to them, or `None`
   when no output entry is masked. It is called for `apply_fn` and for
   `kernel_fn` (with `k.shape1` / `k.shape2`), so it must only use shapes.
   It is never called with `mask=None`. Examples:
   `mask_all_channels(mask, channel_axis)` for a layer mixing channels; for a
   convolution, `~(conv(~mask as float, ones window) > 0)` on the position
   mask; `None` for global pooling.
3. `apply_fn(params, inputs, *, mask=None, **kwargs)` receives inputs whose
   masked entries are already zero, and the input mask as `mask=` (or `None`)
   for layers that need it (e.g. pooling averages over the unmasked entries:
   divide by the number of unmasked entries in each window, not the window
   size). Return a plain array: the decorator wraps it in a `MaskedArray` and
   zeroes its masked entries.
4. The kernel op reads the input masks from `k.mask1` / `k.mask2` (use
   `position_mask(k.mask1, ...)` for an `(N, S_1, ..., S_d)` boolean array in
   the kernel's standard layout) and must not set them: the decorator sets
   the output kernel's masks to `mask_fn(k.mask1, k.shape1)` and
   `mask_fn(k.mask2, k.shape2)`.
5. `remask_kernel=True` makes the decorator zero every covariance entry at a
   masked output position after the op. Use it when the op would otherwise
   leave them nonzero (a bias, a nonlinearity with `phi(0) != 0`, a
   positional embedding, mixing positions); with it, `mask_fn` must return
   masks of size 1 on the channel axis (reduce with `mask_all_channels`),
   since a kernel holds one covariance per position, not per channel.

Example:
  >>> import jax.numpy as jnp
  >>> from neural_tangents import stax
  >>> x = jnp.ones((2, 5, 3)).at[1, 3:].set(0.)  # example 1 has length 3
  >>> mask = jnp.zeros((2, 5, 1), bool).at[1, 3:].set(True)
  >>> _, apply_fn, kernel_fn = stax.serial(stax.Dense(8), stax.Relu())
  >>> kernel_fn(MaskedArray(x, mask), None, 'nngp')[1, 1, 3, 3]
  Array(0., dtype=float32)
  >>> k = kernel_fn(x, None, 'nngp', mask_constant=0.)  # the same mask
  >>> k[1, 1, 3, 3]
  Array(0., dtype=float32)
"""
import dataclasses as builtin_dataclasses
import functools
import math
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.stax import protocol
from neural_tangents._src.utils import dataclasses
from neural_tangents._src.utils import kernel as kernel_lib
from neural_tangents._src.utils.kernel import Kernel

Array = jax.Array
MaskFn = Callable[[Any, Any], Any]


@dataclasses.dataclass
class MaskedArray:
  """An array with a boolean mask (`True` = masked out); a pytree.

  Attributes:
    masked_value: the array, of any shape `(N, ..., C)`.
    mask: boolean array of the same rank, broadcastable to `masked_value`
      (e.g. `(N, L, 1)` to mask whole positions of `(N, L, C)` sequences).

  Example:
    >>> import jax.numpy as jnp
    >>> x = MaskedArray(jnp.ones((2, 4, 3)), jnp.zeros((2, 4, 1), bool))
    >>> x.shape
    (2, 4, 3)
  """
  masked_value: Array
  mask: Array

  @property
  def shape(self) -> tuple[int, ...]:
    return tuple(self.masked_value.shape)

  @property
  def ndim(self) -> int:
    return self.masked_value.ndim

  @property
  def dtype(self) -> Any:
    return self.masked_value.dtype


def _is_masked_leaf(x: Any) -> bool:
  return isinstance(x, MaskedArray)


def is_masked(x: Any) -> bool:
  """Whether a (list/tuple pytree of) input(s) holds a `MaskedArray`."""
  return any(_is_masked_leaf(leaf) for leaf in
             jax.tree_util.tree_leaves(x, is_leaf=_is_masked_leaf))


def _validate_mask(value: Array, mask: Array, name: str) -> Array:
  mask = jnp.asarray(mask)
  if mask.dtype != jnp.bool_:
    raise TypeError(
        f'`{name}.mask` must be a boolean array (True = masked out); got dtype '
        f'{mask.dtype}. Pass e.g. `mask=lengths_mask.astype(bool)`.')
  if mask.ndim != value.ndim or any(
      m not in (1, v) for m, v in zip(mask.shape, value.shape)):
    raise ValueError(
        f'`{name}.mask` of shape {mask.shape} must have the rank of the masked '
        f'value {value.shape} and be broadcastable to it. Add size-1 axes, '
        'e.g. `mask[..., None]` to mask all channels of a position.')
  return mask


def get_masked_array(x: Any, mask_constant: Optional[float] = None,
                     name: str = 'inputs') -> Any:
  """Inputs as `MaskedArray`s with zeroed masked entries, where masked.

  Args:
    x: an array, a `MaskedArray`, or a list/tuple of them.
    mask_constant: if not `None`, entries of plain arrays equal to it (or
      `NaN` entries, for a `NaN` constant) are masked.
    name: name of the argument, for error messages.

  Returns:
    `x` with every masked leaf a `MaskedArray` whose masked entries are zero;
    plain arrays are returned unchanged when `mask_constant` is `None`.
  """
  check_mask_constant(mask_constant)
  x = from_numpy_masked(x)
  if isinstance(x, (list, tuple)):
    return type(x)(get_masked_array(xi, mask_constant, f'{name}[{i}]')
                   for i, xi in enumerate(x))
  if isinstance(x, MaskedArray):
    value = jnp.asarray(x.masked_value)
    mask = _validate_mask(value, x.mask, name)
  elif mask_constant is None or x is None:
    return x
  else:
    value = jnp.asarray(x)
    if isinstance(mask_constant, float) and math.isnan(mask_constant):
      mask = jnp.isnan(value)
    else:
      mask = value == mask_constant
  return MaskedArray(zero_masked(value, mask), mask)


def check_mask_constant(mask_constant: Any) -> None:
  """Raises a `TypeError` unless `mask_constant` is None or a real number."""
  if mask_constant is None or isinstance(mask_constant, jax.core.Tracer):
    return
  if isinstance(mask_constant, (bool, np.bool_, str, bytes)) or not (
      isinstance(mask_constant, (int, float, np.integer, np.floating)) or
      (np.ndim(mask_constant) == 0 and
       np.issubdtype(getattr(mask_constant, 'dtype', object), np.number))):
    raise TypeError(
        f'`mask_constant` must be a number (or None); got {mask_constant!r}. '
        'Entries of the inputs equal to it are masked: pass e.g. '
        '`mask_constant=0.` or `float("nan")`, or None for no masking.')


def from_numpy_masked(x: Any) -> Any:
  """`x` with each `numpy.ma.MaskedArray` (at the top or in a list/tuple) as
  a `MaskedArray` of its data and full mask: JAX rejects numpy's."""
  if isinstance(x, np.ma.MaskedArray):
    return MaskedArray(np.ma.getdata(x), np.ma.getmaskarray(x))
  if isinstance(x, (list, tuple)) and any(
      isinstance(xi, (np.ma.MaskedArray, list, tuple)) for xi in x):
    return type(x)(from_numpy_masked(xi) for xi in x)
  return x


def zero_masked(x: Array, mask: Optional[Array]) -> Array:
  """`x` with its masked entries set to zero (`x` itself if `mask` is None)."""
  if mask is None:
    return x
  return jnp.where(mask, jnp.zeros((), x.dtype), x)


def split(x: Any) -> tuple[Any, Any]:
  """`(values, masks)` of a (pytree of) `MaskedArray`(s); `None` masks for
  plain arrays."""
  if isinstance(x, (list, tuple)):
    pairs = [split(xi) for xi in x]
    return type(x)(p[0] for p in pairs), type(x)(p[1] for p in pairs)
  if isinstance(x, MaskedArray):
    return x.masked_value, x.mask
  return x, None


def combine(values: Any, masks: Any) -> Any:
  """Inverse of `splitting`: zeroes masked entries and wraps them as
  `MaskedArray`s; leaves with a `None` mask stay plain arrays."""
  if isinstance(values, (list, tuple)):
    if not isinstance(masks, (list, tuple)):
      masks = [masks] * len(values)
    return type(values)(combine(v, m) for v, m in zip(values, masks))
  if masks is None:
    return values
  return MaskedArray(zero_masked(values, masks), masks)


def mask_all_channels(mask: Array, channel_axis: int) -> Array:
  """A position is masked iff all its channels are: size 1 on `channel_axis`.

  The `mask_fn` of any layer mixing channels (`Dense`, convolutions,
  attention).
  """
  return jnp.all(mask, axis=channel_axis, keepdims=True)


# The mask of positions in the kernel's layout; see `Kernel.mask`.
position_mask = kernel_lib.position_mask


def mask_covariances(k: Kernel) -> Kernel:
  """Zeroes the entries of `k`'s covariances at positions `k.mask1/mask2` mask.

  Args:
    k: a kernel whose masks have size 1 on the channel axis (or `None`).

  Returns:
    `k` with `nngp`, `ntk`, `cov1`, `cov2` zero wherever the left (`x1`) or
    right (`x2`) position of an entry is masked (see `Kernel.mask`).
  """
  if k.mask1 is None and k.mask2 is None:
    return k
  for m in (k.mask1, k.mask2):
    if m is not None and m.shape[k.channel_axis] != 1:
      raise ValueError(
          'Re-masking a kernel needs masks constant across channels; got a '
          f'mask of shape {m.shape} with channel axis {k.channel_axis}. The '
          '`mask_fn` of a layer with `remask_kernel=True` must reduce the '
          'mask over channels, e.g. with `mask_all_channels`.')
  return k.mask(k.mask1, k.mask2)


def kernel_is_masked(k: Any) -> bool:
  """Whether a kernel (or a list/tuple of kernels) carries a mask."""
  if isinstance(k, (list, tuple)):
    return any(kernel_is_masked(ki) for ki in k)
  return k.mask1 is not None or k.mask2 is not None


def _map_mask_fn(mask_fn: MaskFn, mask: Any, shape: Any) -> Any:
  """`mask_fn(mask, shape)`, `None` for an unmasked single input."""
  if mask is None:
    return None
  if isinstance(mask, (list, tuple)) and all(m is None for m in mask):
    return None
  return mask_fn(mask, shape)


def _identity_mask_fn(mask: Any, input_shape: Any) -> Any:
  del input_shape
  return mask


def _shapes_of(x: Any) -> Any:
  if isinstance(x, (list, tuple)):
    return type(x)(_shapes_of(xi) for xi in x)
  return tuple(x.shape)


def _kernel_field(k: Any, name: str) -> Any:
  """Field `name` (e.g. `mask1`, `shape1`) of a kernel, or of each kernel of
  a list/tuple of them (a layer with several inputs)."""
  if isinstance(k, (list, tuple)):
    return type(k)(getattr(ki, name) for ki in k)
  return getattr(k, name)


def _set_masks(out: Any, mask1: Any, mask2: Any, remask: bool) -> Any:
  """Sets the output masks of a kernel (or of each of a list of kernels, for
  layers with several outputs and a list of masks each) and re-masks."""
  if isinstance(out, (list, tuple)):
    as_list = lambda m: m if isinstance(m, (list, tuple)) else [m] * len(out)
    return type(out)(_set_masks(o, m1, m2, remask) for o, m1, m2 in zip(
        out, as_list(mask1), as_list(mask2)))
  out = out.replace(mask1=mask1, mask2=mask2)
  return mask_covariances(out) if remask else out


def supports_masking(remask_kernel: bool) -> Callable[[Callable], Callable]:
  """Declares that a layer handles masked inputs (see the module docstring).

  Apply it to the layer constructor inside `@layer`. The constructor returns
  `(init_fn, apply_fn, kernel_op)` (mask unchanged by the layer) or
  `(init_fn, apply_fn, kernel_op, mask_fn)`.

  Args:
    remask_kernel: whether covariance entries at masked output positions must
      be zeroed after the layer's kernel op (because the op makes them
      nonzero, e.g. by adding a bias).

  Returns:
    A decorator of layer constructors.
  """
  def decorator(layer_fn: Callable) -> Callable:
    @functools.wraps(layer_fn)
    def new_layer_fn(*args, **kwargs):
      fns = layer_fn(*args, **kwargs)
      if len(fns) == 3:
        (init_fn, apply_fn, kernel_op), mask_fn = fns, _identity_mask_fn
      elif len(fns) == 4:
        init_fn, apply_fn, kernel_op, mask_fn = fns
      else:
        raise TypeError(
            f'`{layer_fn.__name__}` decorated with `@supports_masking` must '
            'return `(init_fn, apply_fn, kernel_fn)` or `(init_fn, apply_fn, '
            f'kernel_fn, mask_fn)`; got {len(fns)} values. Return the three '
            'functions, plus `mask_fn` if the layer changes the mask.')
      kernel_op = protocol.kernel_op_of(kernel_op)

      @functools.wraps(apply_fn)
      def masked_apply_fn(params, inputs, *, mask=None, **kwargs):
        del mask  # Recomputed from `inputs`, which carry their own masks.
        if not is_masked(inputs):
          return apply_fn(params, inputs, mask=None, **kwargs)
        inputs = get_masked_array(inputs)
        values, masks = split(inputs)
        outputs = apply_fn(params, values, mask=masks, **kwargs)
        return combine(outputs,
                       _map_mask_fn(mask_fn, masks, _shapes_of(values)))

      @functools.wraps(kernel_op)
      def masked_kernel_op(k, **kwargs):
        if not kernel_is_masked(k):
          return kernel_op(k, **kwargs)
        out = kernel_op(k, **kwargs)
        return _set_masks(
            out,
            _map_mask_fn(mask_fn, _kernel_field(k, 'mask1'),
                         _kernel_field(k, 'shape1')),
            _map_mask_fn(mask_fn, _kernel_field(k, 'mask2'),
                         _kernel_field(k, 'shape2')),
            remask_kernel)

      spec = protocol.kernel_spec(kernel_op)
      protocol.with_spec(masked_kernel_op,
                         builtin_dataclasses.replace(spec,
                                                     supports_masking=True))
      return init_fn, masked_apply_fn, masked_kernel_op
    return new_layer_fn
  return decorator


def unmask_fn(fn: Callable[..., Any]) -> Callable[..., Any]:
  """Makes a function returning `MaskedArray`s return plain arrays.

  Every `MaskedArray` in the output of `fn` (a pytree) is replaced by its
  value with the masked entries set to zero. Useful with `mask_constant=`
  when the caller wants arrays, not `MaskedArray`s.

  Args:
    fn: a function, typically an `apply_fn`.

  Returns:
    `fn` with unmasked outputs.

  Example:
    >>> from jax import random
    >>> from neural_tangents import stax
    >>> x1 = random.normal(random.PRNGKey(1), (3, 4))
    >>> init_fn, apply_fn, _ = stax.serial(stax.Dense(8), stax.Relu())
    >>> _, params = init_fn(random.PRNGKey(0), x1.shape)
    >>> apply_fn = stax.unmask_fn(apply_fn)
    >>> type(apply_fn(params, x1, mask_constant=0.)).__name__  # plain array
    'ArrayImpl'
  """
  def unmask(x):
    if isinstance(x, MaskedArray):
      return zero_masked(jnp.asarray(x.masked_value), x.mask)
    return x

  @functools.wraps(fn)
  def fn_no_mask(*args, **kwargs):
    return jax.tree_util.tree_map(unmask, fn(*args, **kwargs),
                                  is_leaf=_is_masked_leaf)

  return fn_no_mask


def check_apply_masking(apply_fn: Callable, supported: bool,
                        name: str) -> Callable:
  """Wraps a layer's `apply_fn` to accept `mask_constant=` and to refuse
  masked inputs when the layer does not support masking (`supported`)."""

  @functools.wraps(apply_fn)
  def checked_apply_fn(params, inputs, *, mask_constant=None, **kwargs):
    check_mask_constant(mask_constant)
    inputs = from_numpy_masked(inputs)
    if mask_constant is not None:
      inputs = get_masked_array(inputs, mask_constant)
    if not supported and is_masked(inputs):
      raise ValueError(
          f'`{name}` does not support masked inputs (a `MaskedArray` or '
          '`mask_constant=`). Remove the mask before this layer (e.g. pool or '
          '`Flatten` first), or use layers that support masking.')
    return apply_fn(params, inputs, **kwargs)

  return checked_apply_fn


def check_kernel_masking(kernel_op: Callable, name: str) -> Callable:
  """Wraps a kernel op to refuse masked kernels when the layer does not
  support masking (keeping its `KernelSpec`)."""
  if protocol.kernel_spec(kernel_op).supports_masking:
    return kernel_op

  @functools.wraps(kernel_op)
  def checked_kernel_op(k, **kwargs):
    if kernel_is_masked(k):
      raise ValueError(
          f'`{name}` does not support masked inputs (a `MaskedArray` or '
          '`mask_constant=`), and its kernel would be wrong for them. Remove '
          'the mask before this layer (e.g. pool or `Flatten` first), or use '
          'layers that support masking.')
    return kernel_op(k, **kwargs)

  return checked_kernel_op
