"""JACOBIAN_CONTRACTION: the NTK from materialized Jacobians.

`Theta(x1, x2) = sum_p J_p(x1) J_p(x2)^T` over the parameter leaves `p`,
with `J_p(x) = df(params, x) / dp` from `jax.jacrev` or `jax.jacfwd`
(whichever needs fewer passes), per example under `vmap` when the problem is
per-example.
"""
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.empirical import einsum as einsum_lib
from neural_tangents._src.empirical import layout as layout_lib
from neural_tangents._src.empirical import problem as problem_lib
from neural_tangents._src.utils.typing import Array


def jacobian_contraction(problem: problem_lib.Problem, params: list,
                         data1: list, data2: list) -> list[Array]:
  """`sum_p J1_p J2_p^T`, with per-example Jacobians under `vmap_axes`.

  Example:
    >>> problem, params, data1, data2 = problem_lib.setup(
    ...     lambda p, x: x @ p, x1, x2, jnp.ones((4, 2)), {}, (-1,), (), None)
    >>> [kernel.shape for kernel in jacobian_contraction(
    ...     problem, params, data1, data2)]
    [(3, 2)]
  """
  per_example = problem.per_example

  def jacobians(side: problem_lib.Side, data: list) -> list[list[Array]]:
    fn = side.call(per_example)
    out_size = sum(math.prod(shape) for shape in side.out_shapes)
    n_params = sum(np.size(p) for p in params)
    # Reverse mode costs a pass per output entry, forward one per parameter.
    jacobian = jax.jacrev(fn) if out_size <= n_params else jax.jacfwd(fn)
    return side.over_examples(jacobian, per_example)(params, data)

  jacobians1 = jacobians(problem.sides[0], data1)
  jacobians2 = (jacobians1 if problem.symmetric else
                jacobians(problem.sides[1], data2))
  kernels = []
  for leaf, (layout, shape) in enumerate(zip(problem.layouts,
                                             problem.result_shapes)):
    letters = einsum_lib.Letters()
    kernel_letters = layout_lib.kernel_letters(layout, letters)
    lead1 = (([kernel_letters.example1] if per_example else []) +
             list(kernel_letters.out1))
    lead2 = (([kernel_letters.example2] if per_example else []) +
             list(kernel_letters.out2))
    kernel = jnp.zeros(shape, _result_type(jacobians1[leaf]))
    for jacobian1, jacobian2 in zip(jacobians1[leaf], jacobians2[leaf]):
      param_letters = letters.many(jacobian1.ndim - len(lead1))
      kernel += einsum_lib.einsum((jacobian1, lead1 + param_letters),
                                  (jacobian2, lead2 + param_letters),
                                  result=kernel_letters.result)
    out_shape = problem.sides[0].out_shapes[leaf]
    kernels.append(kernel / layout_lib.trace_size(layout, out_shape))
  return kernels


def _result_type(arrays: Sequence[Array]) -> Any:
  return jnp.result_type(*arrays) if arrays else jnp.float32
