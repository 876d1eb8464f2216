"""STRUCTURED_DERIVATIVES: NTKs from the structure of each primitive's derivative.

What the rest of `empirical` uses; everything else is internal to this
subpackage.
"""
from neural_tangents._src.empirical.structured.derivatives import contract
from neural_tangents._src.empirical.structured.derivatives import make_plan
from neural_tangents._src.empirical.structured.derivatives import Mode
from neural_tangents._src.empirical.structured.derivatives import Plan
from neural_tangents._src.empirical.structured.derivatives import side_values
from neural_tangents._src.empirical.structured.derivatives import Unsupported
from neural_tangents._src.empirical.structured.derivatives import value_axes
from neural_tangents._src.empirical.structured.program import Program
from neural_tangents._src.empirical.structured.program import trace_program
from neural_tangents._src.empirical.structured.separability import batch_axes
from neural_tangents._src.empirical.structured.separability import NotSeparable
from neural_tangents._src.empirical.structured.separability import outputs_batched_at
