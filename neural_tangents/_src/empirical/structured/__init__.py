"""STRUCTURED_DERIVATIVES: NTKs from the structure of primitives' derivatives.

The pipeline (docs/dev/structured_derivatives.md): `program` traces `f` into
a flat program (its types in `ir`); `separability` proves its examples
independent; `plan` finds where parameters enter, with one record per
primitive in `rules`; `contraction` computes each side's values (cotangents,
possibly as `tails`) and contracts them (`Factor`s, `factor`) with
`empirical/einsum.py` into kernels.

What the rest of `empirical` uses; everything else is internal to this
subpackage.
"""
from neural_tangents._src.empirical.structured.contraction import contract
from neural_tangents._src.empirical.structured.contraction import side_values
from neural_tangents._src.empirical.structured.contraction import value_axes
from neural_tangents._src.empirical.structured.params import call_body
from neural_tangents._src.empirical.structured.plan import make_plan
from neural_tangents._src.empirical.structured.plan import Mode
from neural_tangents._src.empirical.structured.plan import Plan
from neural_tangents._src.empirical.structured.plan import Unsupported
from neural_tangents._src.empirical.structured.program import Program
from neural_tangents._src.empirical.structured.program import trace_program
from neural_tangents._src.empirical.structured.rules import INLINED
from neural_tangents._src.empirical.structured.rules import is_call
from neural_tangents._src.empirical.structured.separability import batch_axes
from neural_tangents._src.empirical.structured.separability import NotSeparable
from neural_tangents._src.empirical.structured.separability import outputs_batched_at
