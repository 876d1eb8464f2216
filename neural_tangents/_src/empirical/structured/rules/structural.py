"""Records of structural primitives: shape operations, slices, padding,
concatenations, and values that depend on shapes only.

They move entries without combining them: a transpose, a broadcast or a
reshape that adds or drops unit dimensions only renames letters
(`leaf_letters`, `tail_step`); slices and concatenations are linear; the
batch axis passes through when the operation leaves it whole.

Example:
  >>> [r.name for r in SHAPE_RULES]
  ['transpose', 'broadcast_in_dim', 'reshape', 'squeeze']
"""
import math
from typing import Optional, Sequence

from neural_tangents._src.empirical.einsum import Letter
from neural_tangents._src.empirical.einsum import mask
from neural_tangents._src.empirical.structured import params
from neural_tangents._src.empirical.structured.rules import common
from neural_tangents._src.empirical.structured.rules.record import NotSeparable
from neural_tangents._src.empirical.structured.rules.record import Rule

# ---------------------------------------------------------------------------
# Shape operations: transpose, broadcast_in_dim, reshape, squeeze.
# ---------------------------------------------------------------------------


def unit_reshape_letters(from_shape: Sequence[int], to_shape: Sequence[int],
                         letters: Sequence[Letter]) -> Optional[list]:
  """Letters of `to_shape` for a reshape that only adds or drops unit dims.

  Works in both directions (a reshape's input from its output and back).
  Returns None if the reshape moves entries across dimensions.

  Example:
    >>> unit_reshape_letters((3, 1, 4), (3, 4), [0, None, 1])
    [0, 1]
  """
  if [s for s in from_shape if s != 1] != [s for s in to_shape if s != 1]:
    return None
  kept = iter([letter for letter, s in zip(letters, from_shape) if s != 1])
  return [None if s == 1 else next(kept) for s in to_shape]


def _transpose_back(eqn, k, out):
  new: list[Letter] = [None] * len(eqn.inputs[k].shape)
  for j, d in enumerate(params.transpose_permutation(eqn)):
    new[d] = out[j]
  return new, 1.


def _transpose_tail(eqn, k, letters, new):
  del k, new
  return [letters[d] for d in params.transpose_permutation(eqn)], [], 1., 0


def _transpose_axis(eqn, in_axes):
  return [list(params.transpose_permutation(eqn)).index(
      common.batched(in_axes)[0][1])]


def _broadcast_back(eqn, k, out):
  shape, out_shape = eqn.inputs[k].shape, eqn.outputs[0].shape
  return [out[b] if shape[j] == out_shape[b] else None
          for j, b in enumerate(params.broadcast_dimensions(eqn))], 1.


def _broadcast_tail(eqn, k, letters, new):
  if len(eqn.inputs) != 1:
    return None
  v, w = eqn.inputs[k], eqn.outputs[0]
  out = list(mask(new.many(len(w.shape)), w.shape))
  for i, b in enumerate(params.broadcast_dimensions(eqn)):
    if v.shape[i] == w.shape[b]:
      out[b] = letters[i]
  return out, [], 1., 0


def _broadcast_axis(eqn, in_axes):
  common.require(len(eqn.inputs) == 1)
  a = common.only_axis(in_axes)
  b = params.broadcast_dimensions(eqn)[a]
  common.require(eqn.inputs[0].shape[a] == eqn.outputs[0].shape[b])
  return [b]


def _unit_reshape_back(eqn, k, out):
  new = unit_reshape_letters(eqn.outputs[0].shape, eqn.inputs[k].shape, out)
  return None if new is None else (new, 1.)


def _unit_reshape_tail(eqn, k, letters, new):
  del new
  if len(eqn.inputs) != 1:
    return None
  out = unit_reshape_letters(eqn.inputs[k].shape, eqn.outputs[0].shape,
                             letters)
  return None if out is None else (out, [], 1., 0)


def _reshape_axis(eqn, in_axes):
  # The batch axis survives a reshape if it stays a whole axis: the sizes
  # before it multiply to the same number, and it keeps its size.
  common.require(params.reshape_dimensions(eqn) is None)
  in_shape, a = eqn.inputs[0].shape, common.batched(in_axes)[0][1]
  before = math.prod(in_shape[:a])
  for b, size in enumerate(eqn.outputs[0].shape):
    if math.prod(eqn.outputs[0].shape[:b]) == before and size == in_shape[a]:
      return [b]
  raise NotSeparable('reshape')


def _squeeze_axis(eqn, in_axes):
  return [common.dropping_axis(params.squeezed_dimensions(eqn),
                               common.batched(in_axes)[0][1])]


SHAPE_RULES = (
    Rule('transpose', linear_in=common.linear_in_any,
         leaf_letters=_transpose_back, tail_step=_transpose_tail,
         batch_axis=_transpose_axis),
    Rule('broadcast_in_dim', linear_in=common.linear_in_only_input,
         leaf_letters=_broadcast_back, tail_step=_broadcast_tail,
         batch_axis=_broadcast_axis),
    Rule('reshape', linear_in=common.linear_in_only_input,
         leaf_letters=_unit_reshape_back, tail_step=_unit_reshape_tail,
         batch_axis=_reshape_axis),
    Rule('squeeze', linear_in=common.linear_in_any,
         leaf_letters=_unit_reshape_back, tail_step=_unit_reshape_tail,
         batch_axis=_squeeze_axis),
)

# ---------------------------------------------------------------------------
# Slices, padding, concatenations and stacks.
# ---------------------------------------------------------------------------


def _slice_region(eqn):
  s = params.slice_bounds(eqn)
  return (s.start, s.limit) if s.unit_strides() else None


def _slice_axis(eqn, in_axes):
  a = common.only_axis(in_axes)
  s = params.slice_bounds(eqn)
  common.require(s.start[a] == 0 and s.limit[a] == eqn.inputs[0].shape[a] and
                 (s.strides is None or s.strides[a] == 1))
  return [a]


def _pad_axis(eqn, in_axes):
  common.require(in_axes[1] is None)
  a = in_axes[0]
  common.require(params.padding_config(eqn)[a] == (0, 0, 0))
  return [a]


def _stack_axis(eqn, in_axes):
  a = common.common_axis(in_axes)
  return [a + 1 if params.axis(eqn) <= a else a]


_rev_axis = common.keeps_axis(params.reversed_dimensions)
_concatenate_axis = common.keeps_axis(
    lambda eqn: (params.concatenate_dimension(eqn),), common.common_axis)

SLICING_RULES = (
    Rule('slice', linear_in=common.linear_in_any, leaf_region=_slice_region,
         batch_axis=_slice_axis),
    Rule('rev', linear_in=common.linear_in_any, batch_axis=_rev_axis),
    Rule('pad', linear_in=common.linear_in_first, batch_axis=_pad_axis),
    Rule('concatenate', linear_in=common.linear_in_any,
         batch_axis=_concatenate_axis),
    Rule('stack', batch_axis=_stack_axis),
    Rule('split', batch_axis=common.not_along_axis_param),
    Rule('dynamic_slice', linear_in=common.linear_in_first),
    Rule('gather', linear_in=common.linear_in_first),
)

# ---------------------------------------------------------------------------
# Values that depend on shapes only (iota, random bits).
# ---------------------------------------------------------------------------

SHAPE_DEPENDENT_RULES = tuple(
    Rule(name, shape_dependent=True)
    for name in ('iota', 'random_bits', 'rng_bit_generator', 'rng_uniform'))

