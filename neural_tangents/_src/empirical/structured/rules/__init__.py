"""One record per JAX primitive: everything structured derivatives know of it.

A `Rule` (`record.py`) says, for one primitive,

* `linear_in`: whether it is linear in input `k` when its other inputs are
  constants, so that a parameter's *chain* of linear operations continues
  through it (`plan.Chain`);
* `leaf_letters`: the backward letter map of such a chain step: the letters
  of input `k` from those of the output, and a constant scaling; None when
  the step mixes entries (then the leaf's Jacobian is materialized);
* `jacobian_form`: the Jacobian of the output with respect to input `k` as
  an einsum of the output's cotangent and of the other inputs (`Form`);
* `passes_cotangent`: the scaling `c` when `out = c * in_k + (terms without
  in_k)`, so that a site's cotangent target moves on through it;
* `tail_step`: the forward step of a cotangent tail (`tails.py`): the
  output's letters from input `k`'s, and the factors it multiplies by;
* `batch_axis`: the batch axis of each output from those of the inputs
  (`separability.py`); it raises `NotSeparable` where examples would mix;
* `expand`: the equations that replace it when a program is flattened
  (`program.py`): a call's body, the steps of a short `scan`;
* `elementwise`, `shape_dependent`, `call`: plain properties.

The records live in one module per primitive family, each family's functions
next to its records; this package collects them into the table `RULES`:

  elementwise.py  elementwise functions, sums (`add`, `sub`), `select_n`
  products.py     `mul`, `div`, `dot_general`, convolutions
  structural.py   shape operations (`transpose`, `broadcast_in_dim`,
                  `reshape`, `squeeze`), slices, padding, concatenations,
                  stacks, and shape-dependent values (`iota`, random bits)
  reductions.py   reductions, cumulative operations, `reduce_window_*`
  calls.py        calls and loops (`jit`, `scan`, `custom_jvp_call`, ...)
  common.py       helpers they share (constants, letters, linearity, batch
                  axes); `record.py` the `Rule` record and its types.

The family modules never import this package (it imports them): the call
records, whose cotangent tails read the records of a call's body, receive
the lookup `rule` as an argument (`calls.call_rules`).

A primitive without a record, or a field left None, takes the generic path:
its Jacobian comes from its own VJP, and separability is not proven through
it. The engines (`plan`, `tails`, `separability`) look records up with
`rule(name)`, which also resolves names of older JAX releases (`ALIASES`).

Example:
  >>> rule('dot_general').jacobian_form is not None
  True
  >>> rule('pjit').call
  'inlined'
"""
from typing import Optional

from neural_tangents._src.empirical.structured.rules import calls
from neural_tangents._src.empirical.structured.rules import elementwise
from neural_tangents._src.empirical.structured.rules import products
from neural_tangents._src.empirical.structured.rules import reductions
from neural_tangents._src.empirical.structured.rules import structural
# The names below were this module's when it was one file (`rules.py`); the
# engines and tests read them here.
from neural_tangents._src.empirical.structured.rules.calls import MAX_UNROLLED_SCAN
from neural_tangents._src.empirical.structured.rules.common import broadcast_letters
from neural_tangents._src.empirical.structured.rules.common import inexact
from neural_tangents._src.empirical.structured.rules.common import require
from neural_tangents._src.empirical.structured.rules.common import scalar_value
from neural_tangents._src.empirical.structured.rules.products import conv_windows
from neural_tangents._src.empirical.structured.rules.products import dot_general_letters
from neural_tangents._src.empirical.structured.rules.record import BatchAxis
from neural_tangents._src.empirical.structured.rules.record import CUSTOM
from neural_tangents._src.empirical.structured.rules.record import FormParts
from neural_tangents._src.empirical.structured.rules.record import INLINED
from neural_tangents._src.empirical.structured.rules.record import Inline
from neural_tangents._src.empirical.structured.rules.record import NotSeparable
from neural_tangents._src.empirical.structured.rules.record import Rule
from neural_tangents._src.empirical.structured.rules.record import TailStep
from neural_tangents._src.empirical.structured.rules.structural import unit_reshape_letters

# Names that older supported JAX releases (>= 0.6) give primitives now named
# otherwise: {old name: current name}.
ALIASES = {
    'pjit': 'jit',  # JAX < 0.7.
    'custom_vjp_call_jaxpr': 'custom_vjp_call',  # JAX < 0.7.
}


def rule(name: str) -> Optional[Rule]:
  """The record of a primitive, by its current or an older name."""
  return RULES.get(ALIASES.get(name, name))


def is_call(name: str, kind: str) -> bool:
  """Whether `name` is a call primitive of `kind` (`INLINED`, `CUSTOM`)."""
  r = rule(name)
  return r is not None and r.call == kind


_TABLE = (*elementwise.ELEMENTWISE_RULES, *elementwise.SUM_RULES,
          *products.PRODUCT_RULES, *elementwise.SELECT_RULES,
          *products.DOT_RULES, *products.CONV_RULES, *structural.SHAPE_RULES,
          *reductions.REDUCTION_RULES, *structural.SLICING_RULES,
          *reductions.WINDOW_RULES, *calls.call_rules(rule),
          *structural.SHAPE_DEPENDENT_RULES)

RULES: dict[str, Rule] = {r.name: r for r in _TABLE}
assert len(RULES) == len(_TABLE), 'a primitive has two records'
