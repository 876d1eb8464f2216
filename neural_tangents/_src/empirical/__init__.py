"""Finite-width kernels of any function: empirical NTK and NNGP, Taylor
expansions (`linearize`, `taylor_expand`).

The subpackage is laid out by concept:

* `api`: the public functions.
* `problem`: one call flattened into a `Problem` (arguments, `vmap_axes`,
  keyword arguments, kernel layouts) and its arrays.
* `rng`: the published PRNG-key convention and per-call keyword arguments.
* `jacobian_contraction`, `vector_products`, `structured_derivatives`: the
  three implementations, each `(problem, params, data1, data2) -> kernels`.
* `auto`: AUTO's cost model, its tuning constants and formulation switching.
* `batch_size_independence`: whether `f` is the same program at every batch
  size (a structural comparison of jaxprs).
* `layout`: axis bookkeeping of kernels (trace / diagonal / vmap axes).
* `structured/`: the STRUCTURED_DERIVATIVES engine, which reads `f` as a
  program and contracts the derivatives of its primitives instead of its
  Jacobian.
"""
from neural_tangents._src.empirical.api import DEFAULT_NTK_IMPLEMENTATION
from neural_tangents._src.empirical.api import empirical_kernel_fn
from neural_tangents._src.empirical.api import empirical_nngp_fn
from neural_tangents._src.empirical.api import empirical_ntk_fn
from neural_tangents._src.empirical.api import empirical_ntk_vp_fn
from neural_tangents._src.empirical.api import linearize
from neural_tangents._src.empirical.api import NtkImplementation
from neural_tangents._src.empirical.api import taylor_expand
from neural_tangents._src.empirical.problem import ApplyFn
from neural_tangents._src.empirical.problem import canonical_x2
from neural_tangents._src.empirical.problem import check_inputs
from neural_tangents._src.empirical.problem import VMapAxes
from neural_tangents._src.empirical.rng import inputs_are_equal
from neural_tangents._src.empirical.rng import is_single_key
from neural_tangents._src.empirical.rng import read_rng
from neural_tangents._src.empirical.rng import second_key
from neural_tangents._src.empirical.rng import takes_rng_pairs
