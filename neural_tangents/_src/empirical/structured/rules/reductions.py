"""Records of reductions, cumulative operations and windowed reductions.

A reduction is separable when the batch axis is not reduced over (it is
kept, one place lower per reduced axis before it); `reduce_sum` is linear and
drops the reduced letters in a cotangent tail.

Example:
  >>> [r.name for r in WINDOW_RULES][0]
  'reduce_window_sum'
"""
from neural_tangents._src.empirical.structured import params
from neural_tangents._src.empirical.structured.rules import common
from neural_tangents._src.empirical.structured.rules.record import Rule

# ---------------------------------------------------------------------------
# Reductions and cumulative operations.
# ---------------------------------------------------------------------------


def _reduce_sum_tail(eqn, k, letters, new):
  del k, new
  axes = params.reduction_axes(eqn)
  kept = [letter for d, letter in enumerate(letters) if d not in axes]
  return kept, [], 1., 0


def _reduction_axis(eqn, in_axes):
  a = common.dropping_axis(params.reduction_axes(eqn),
                           common.only_axis(in_axes))
  return [a] * len(eqn.outputs)


REDUCTION_RULES = (
    Rule('reduce_sum', linear_in=common.linear_in_any,
         tail_step=_reduce_sum_tail, batch_axis=_reduction_axis),
    *(Rule(name, batch_axis=_reduction_axis) for name in (
        'reduce_max', 'reduce_min', 'reduce_prod', 'reduce_and', 'reduce_or',
        'reduce_xor', 'argmax', 'argmin')),
    Rule('cumsum', linear_in=common.linear_in_any,
         batch_axis=common.not_along_axis_param),
    *(Rule(name, batch_axis=common.not_along_axis_param)
      for name in ('cumprod', 'cummax', 'cummin', 'cumlogsumexp')),
)

# ---------------------------------------------------------------------------
# Windows: reduce_window_*.
# ---------------------------------------------------------------------------


def _reduce_window_axis(eqn, in_axes):
  a = common.common_axis(in_axes)
  w = params.reduce_window(eqn)
  common.require(w.window_dimensions[a] == 1 and w.window_strides[a] == 1 and
                 w.padding[a] == (0, 0) and w.base_dilation[a] == 1 and
                 w.window_dilation[a] == 1)
  # A generic `reduce_window` also takes init values, which must be shared.
  common.require(all(i < len(eqn.outputs)
                     for i, _ in common.batched(in_axes)))
  return [a] * len(eqn.outputs)


WINDOW_RULES = (
    Rule('reduce_window_sum', linear_in=common.linear_in_only_input,
         batch_axis=_reduce_window_axis),
    *(Rule(name, batch_axis=_reduce_window_axis) for name in (
        'reduce_window_max', 'reduce_window_min', 'reduce_window')),
)

