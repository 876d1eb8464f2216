"""Finite-width kernels of any function: empirical NTK and NNGP, Taylor
expansions (`linearize`, `taylor_expand`).

The subpackage is laid out by concept:

* `api`: the public functions.
* `layout`: axis bookkeeping of kernels (trace / diagonal / vmap axes).
* `structured/`: the STRUCTURED_DERIVATIVES engine, which reads `f` as a
  program and contracts the derivatives of its primitives instead of its
  Jacobian.
"""
from neural_tangents._src.empirical.api import (
    ApplyFn,
    DEFAULT_NTK_IMPLEMENTATION,
    empirical_kernel_fn,
    empirical_nngp_fn,
    empirical_ntk_fn,
    empirical_ntk_vp_fn,
    is_single_key,
    linearize,
    NtkImplementation,
    read_rng,
    takes_rng_pairs,
    taylor_expand,
    VMapAxes,
)
