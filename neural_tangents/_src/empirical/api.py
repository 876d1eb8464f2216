"""Empirical (finite-width) kernels of any JAX function `f(params, x)`.

The empirical NTK is `Theta(x1, x2) = J(x1) J(x2)^T` with
`J(x) = df(params, x) / dparams`, and the empirical NNGP kernel is
`f(x1) f(x2)^T`. Three ways to compute the NTK give the same answer:

* `JACOBIAN_CONTRACTION`: Jacobians (`jacrev`/`jacfwd`, per example under
  `vmap` when `vmap_axes` is given), contracted leaf by leaf.
* `NTK_VECTOR_PRODUCTS`: `Theta v = J(x1) (J(x2)^T v)` by a VJP then a JVP,
  applied to a basis of x2's output cotangents; no Jacobian is stored.
* `STRUCTURED_DERIVATIVES`: reads `f`'s jaxpr and contracts, for each
  parameter, the inputs and output cotangents of the layers it enters
  instead of its Jacobian (see `structured/` and `structured_derivatives`).

`AUTO` estimates the cost of each (FLOPs and bytes, counted on its jaxpr as
XLA's cost analysis counts them) and picks the cheapest; with
`vmap_axes=None` it also tries to prove from the jaxpr that batch items do
not interact, which makes per-example derivatives valid.

Kernel layout: for an output leaf of shape `(O_0, ..., O_k)` (the batch
axis among them: axis 0 without `vmap_axes`), the kernel has, for each
non-traced axis in order, `O_i` once if it is in `diagonal_axes` and
`(O_i, O_i)` otherwise: `(N1, N2, O_1, O_1, ...)` for a batch axis 0 and no
traced or diagonal axes. Traced axes are averaged over (mean, not sum). For
pytree outputs the result is a pytree of kernels, one per output leaf.

Keyword arguments of `f` are passed to both calls, `f(x1)` and `f(x2)`; to
pass different values, give the pair `(value_for_x1, value_for_x2)` as a
tuple. (A tuple of exactly two elements is always read as such a pair.) A
single PRNG key `rng` follows the published convention: `f(x1)` gets `rng`
and `f(x2)` gets `jax.random.fold_in(rng, 1)`, unless x2 is None or equal
to x1, when both get `rng` (`read_rng`).

`vmap_axes` is None, an int, a pytree of axes that is a prefix of both the
inputs and the outputs, a pair `(in_axes, out_axes)`, or a triple
`(in_axes, out_axes, kwargs_axes)`. Whatever `vmap_axes`, the kernel has
the layout it has without it: the batch axis is an output axis like the
others (its pair `(N1, N2)` sits at its place among the output axes), and
may be traced or diagonal.
"""
import functools
import math
import types
from typing import Any, Callable, Optional, Union

import jax
from jax import tree_util
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.empirical import auto
from neural_tangents._src.empirical import einsum as einsum_lib
from neural_tangents._src.empirical import implementations
from neural_tangents._src.empirical import layout as layout_lib
from neural_tangents._src.empirical import problem as problem_lib
from neural_tangents._src.empirical import rng as rng_lib
from neural_tangents._src.empirical import structured_derivatives
from neural_tangents._src.empirical.implementations import NtkImplementation
from neural_tangents._src.empirical.problem import ApplyFn
from neural_tangents._src.empirical.problem import VMapAxes
from neural_tangents._src.empirical.rng import takes_rng_pairs
from neural_tangents._src.utils import arguments
from neural_tangents._src.utils import compiled
from neural_tangents._src.utils import precision
from neural_tangents._src.utils import utils
from neural_tangents._src.utils.typing import Axes, PyTree


DEFAULT_NTK_IMPLEMENTATION = NtkImplementation.JACOBIAN_CONTRACTION


def empirical_ntk_fn(
    f: ApplyFn,
    trace_axes: Axes = (-1,),
    diagonal_axes: Axes = (),
    vmap_axes: VMapAxes = None,
    implementation: Union[NtkImplementation, int] = DEFAULT_NTK_IMPLEMENTATION
) -> Callable[..., PyTree]:
  """The empirical NTK `Theta(x1, x2) = J(x1) J(x2)^T` of `f`.

  `J(x) = df(params, x) / dparams`, contracted over all parameter leaves.

  Args:
    f: `f(params, x, **kwargs)`; params, x and the output may be pytrees.
    trace_axes: output axes averaged over (their diagonal's mean), indexed
      in `f(x)`'s shape; may contain the batch axis.
    diagonal_axes: output axes of which only the diagonal is kept. An axis
      in both is traced. May contain the batch axis (x1 and x2 then need
      equal batch sizes).
    vmap_axes: the batch axis, promising that examples do not interact so
      that per-example derivatives can be used: None (no promise; axis 0 of
      the outputs is the batch axis), an int (the batch axis of inputs,
      outputs, and of keyword arguments whose leaves all have the batch size
      along it), a pytree prefix of both x and the output (their batch
      axes), a pair `(in_axes, out_axes)` of pytree prefixes of x and of the
      output, or `(in_axes, out_axes, kwargs_axes)` with also a dict from
      keyword name to axis (None or absent: shared by the batch). Keyword
      arguments are shared unless given in `kwargs_axes` or batched by an
      int `vmap_axes`.
    implementation: an `NtkImplementation` or its int value.

  Returns:
    `ntk_fn(x1, x2, params, **kwargs)` giving the kernel (a pytree like the
    output): for each output axis (the batch axis included, whatever
    `vmap_axes`) in order, none if traced, `O` if diagonal, else `(O, O)`.
    `x2=None` means `x2 = x1`. A keyword argument given as a tuple
    `(for_x1, for_x2)` is split between the two calls; others are passed to
    both, except a single PRNG key `rng`: `f(x1)` gets `rng` and `f(x2)`
    gets `jax.random.fold_in(rng, 1)` unless x2 is None or equals x1.

  Raises:
    ValueError: for an unknown `implementation`, axes out of range, or
      `vmap_axes` that do not match the inputs.

  Example:
    >>> def f(params, x):
    ...   return jnp.tanh(x @ params['w']) @ params['v']
    >>> params = {'w': jnp.ones((3, 8)), 'v': jnp.ones((8, 2))}
    >>> ntk_fn = empirical_ntk_fn(f, vmap_axes=0)
    >>> ntk_fn(jnp.ones((4, 3)), None, params).shape
    (4, 4)
  """
  arguments.callable_arg(f, 'f', 'Pass the `apply_fn(params, x)` of a network.')
  implementation = arguments.parse_enum(implementation, NtkImplementation,
                                        'implementation')
  trace_axes = problem_lib.parse_output_axes(trace_axes, 'trace_axes')
  diagonal_axes = problem_lib.parse_output_axes(diagonal_axes,
                                                'diagonal_axes')
  problem_lib.check_vmap_axes(vmap_axes)
  # Decisions remembered per shapes, held by an object rather than dicts in
  # the closure: a store's fingerprint of `ntk_fn` (`nt.batch(...,
  # store=)`) describes the dicts it closes over, and these fill as it runs.
  memo = types.SimpleNamespace(
      choices={},  # AUTO's choice per shapes, see `auto.choose`.
      per_example={})  # See `_per_example_where_equivalent`.

  def ntk_fn(x1: PyTree, x2: Optional[PyTree], params: PyTree,
             **apply_fn_kwargs) -> PyTree:
    x2 = problem_lib.canonical_x2(x2)
    problem_lib.check_inputs(x1, x2)
    problem_lib.check_params(params)
    problem_lib.reject_complex_params(params)
    setup = functools.partial(problem_lib.setup, f, x1, x2, params,
                              apply_fn_kwargs, trace_axes, diagonal_axes)
    problem, param_leaves, data1, data2 = setup(vmap_axes)
    if implementation == NtkImplementation.AUTO:
      other = functools.partial(auto.other_formulation, setup, vmap_axes,
                                param_leaves, data1, data2)
      problem, fn = auto.choose(
          problem, other, param_leaves, data1, data2,
          problem_lib.static_kwargs_key(apply_fn_kwargs), memo.choices)
    else:
      fn = implementations.implementation(implementation).kernel_fn
      if vmap_axes is None:
        problem = _per_example_where_equivalent(
            setup, problem, param_leaves, data1, data2,
            problem_lib.static_kwargs_key(apply_fn_kwargs), memo.per_example)
    kernels = problem_lib.place_example_axes(
        problem, fn(problem, param_leaves, data1, data2))
    return tree_util.tree_unflatten(problem.out_treedef, kernels)

  # Unjitted, one XLA program per signature of `(x1, x2, params, kwargs)`
  # instead of the op-by-op dispatch of every derivative (see `compiled`).
  return takes_rng_pairs(precision.library_precision(
      compiled.compile_per_signature(ntk_fn)))


def _per_example_where_equivalent(
    setup: Callable[[VMapAxes], tuple], problem: problem_lib.Problem,
    params: list, data1: list, data2: list, static_key: tuple, cache: dict
) -> problem_lib.Problem:
  """The per-example formulation of a whole-batch problem, where it provably
  gives the same kernel; else `problem`.

  Whole-batch derivatives mix examples: the reverse-mode derivative of a
  layer sums over the batch, so the zero cotangents of other examples'
  outputs multiply a NaN or inf activation of one example (`0 * NaN = NaN`)
  and the whole kernel becomes NaN. Per example, a non-finite example only
  spoils its own row and column, as with `vmap_axes=0`. Used only where the
  jaxpr proves that examples do not interact
  (`structured_derivatives.examples_separable`), `f` is the same program at
  every batch size (`auto.other_formulation`) and keyword arguments stay
  shared; the answer is cached per shapes.
  """
  key = (tree_util.tree_structure((params, data1, data2)),
         tuple((np.shape(x), str(jnp.result_type(x)))
               for x in tree_util.tree_leaves((params, data1, data2))),
         problem.symmetric, problem.layouts, static_key)
  if key not in cache:
    other = None
    if structured_derivatives.examples_separable(problem, params, data1,
                                                 data2):
      other = auto.other_formulation(setup, None, params, data1, data2,
                                     verify=True, separable=True)
    cache[key] = other is not None and all(
        axis is None for side in other.sides
        for axis in side.data_axes[side.n_x:])
  if not cache[key]:
    return problem
  return auto.other_formulation(setup, None, params, data1, data2,
                                verify=False)


def empirical_nngp_fn(f: ApplyFn, trace_axes: Axes = (-1,),
                      diagonal_axes: Axes = ()) -> Callable[..., PyTree]:
  """The empirical NNGP kernel `f(x1) f(x2)^T` of `f`.

  Args:
    f: `f(params, x, **kwargs)`; x and the output may be pytrees.
    trace_axes: output axes averaged over (may contain the batch axis).
    diagonal_axes: output axes of which only the diagonal is kept (may
      contain the batch axis).

  Returns:
    `nngp_fn(x1, x2, params, **kwargs)` with the layout and keyword
    arguments (`rng` included) of `empirical_ntk_fn`.

  Example:
    >>> nngp_fn = empirical_nngp_fn(lambda p, x: x @ p)
    >>> nngp_fn(jnp.ones((4, 3)), None, jnp.ones((3, 2))).shape
    (4, 4)
  """
  trace_axes = problem_lib.parse_output_axes(trace_axes, 'trace_axes')
  diagonal_axes = problem_lib.parse_output_axes(diagonal_axes,
                                                'diagonal_axes')

  def nngp_fn(x1: PyTree, x2: Optional[PyTree], params: PyTree,
              **apply_fn_kwargs) -> PyTree:
    x2 = problem_lib.canonical_x2(x2)
    problem_lib.check_inputs(x1, x2)
    kwargs1, kwargs2, same = rng_lib.split_kwargs(apply_fn_kwargs, x1, x2)
    out1 = f(params, x1, **kwargs1)
    out2 = out1 if x2 is None and same else f(
        params, x1 if x2 is None else x2, **kwargs2)
    leaves1, treedef = tree_util.tree_flatten(out1)
    leaves2 = tree_util.tree_leaves(out2)
    kernels = []
    for leaf1, leaf2 in zip(leaves1, leaves2):
      layout = layout_lib.KernelLayout.build(leaf1.ndim, 0, trace_axes,
                                             diagonal_axes, per_example=False)
      letters = layout_lib.kernel_letters(layout, einsum_lib.Letters())
      kernel = einsum_lib.einsum((leaf1, letters.out1), (leaf2, letters.out2),
                                 result=letters.result)
      kernels.append(kernel / layout_lib.trace_size(layout, leaf1.shape))
    return tree_util.tree_unflatten(treedef, kernels)

  return takes_rng_pairs(precision.library_precision(nngp_fn))


_KERNELS = ('nngp', 'ntk')


def empirical_kernel_fn(
    f: ApplyFn,
    trace_axes: Axes = (-1,),
    diagonal_axes: Axes = (),
    vmap_axes: VMapAxes = None,
    implementation: Union[NtkImplementation, int] = DEFAULT_NTK_IMPLEMENTATION
) -> Callable[..., Any]:
  """Empirical NNGP and NTK kernels of `f`, selected by `get`.

  Args:
    f: `f(params, x, **kwargs)`.
    trace_axes: see `empirical_ntk_fn`.
    diagonal_axes: see `empirical_ntk_fn`.
    vmap_axes: see `empirical_ntk_fn` (used by the NTK).
    implementation: see `empirical_ntk_fn`.

  Returns:
    `kernel_fn(x1, x2, get, params, **kwargs)`: for `get` `'nngp'` or
    `'ntk'` that kernel; for a tuple of them a namedtuple `Kernel` with
    those fields; for `get=None` the namedtuple `(nngp, ntk)`.

  Example:
    >>> kernel_fn = empirical_kernel_fn(lambda p, x: x @ p)
    >>> k = kernel_fn(jnp.ones((4, 3)), None, ('nngp', 'ntk'),
    ...               jnp.ones((3, 2)))
    >>> k.ntk.shape
    (4, 4)
  """
  kernel_fns = {
      'nngp': empirical_nngp_fn(f, trace_axes, diagonal_axes),
      'ntk': empirical_ntk_fn(f, trace_axes, diagonal_axes, vmap_axes,
                              implementation),
  }

  def kernel_fn(x1: PyTree, x2: Optional[PyTree], get: Any, params: PyTree,
                **apply_fn_kwargs) -> Any:
    names, single = arguments.parse_get(get, _KERNELS)
    names = names or _KERNELS
    x2 = problem_lib.canonical_x2(x2)
    values = [kernel_fns[n](x1, x2, params, **apply_fn_kwargs) for n in names]
    if single:
      return values[0]
    return utils.get_namedtuple(tuple(names))(*values)

  return takes_rng_pairs(kernel_fn)


def empirical_ntk_vp_fn(f: ApplyFn, x1: PyTree, x2: Optional[PyTree],
                        params: PyTree, **apply_fn_kwargs
                        ) -> Callable[[PyTree], PyTree]:
  """`v -> Theta(x1, x2) v` by a VJP and a JVP, without forming `Theta`.

  `Theta` is the full (untraced) NTK, summed over x2's output entries:
  `Theta v = J(x1) (J(x2)^T v)`.

  Args:
    f: `f(params, x, **kwargs)`.
    x1: the inputs whose outputs the result is shaped like.
    x2: the inputs whose outputs `v` is shaped like (None: x1).
    params: the parameters.
    **apply_fn_kwargs: keyword arguments of `f`; a tuple `(for_x1,
      for_x2)` is split between the two calls.

  Returns:
    `ntk_vp(cotangents)`, cotangents shaped like `f(params, x2)`, returning
    an array shaped like `f(params, x1)`.

  Example:
    >>> f = lambda p, x: x @ p
    >>> vp = empirical_ntk_vp_fn(f, jnp.ones((4, 3)), None, jnp.ones((3, 2)))
    >>> vp(jnp.ones((4, 2))).shape
    (4, 2)
  """
  x2 = problem_lib.canonical_x2(x2)
  problem_lib.check_inputs(x1, x2)
  problem_lib.check_params(params)
  problem_lib.reject_complex_params(params)
  kwargs1, kwargs2, _ = rng_lib.split_kwargs(apply_fn_kwargs, x1, x2)
  x2 = x1 if x2 is None else x2

  def ntk_vp(cotangents: PyTree) -> PyTree:
    arguments.reject_kernel(cotangents, 'cotangents',
                            'Pass arrays shaped like `f(params, x2)`.')
    out, vjp_fn = jax.vjp(lambda p: f(p, x2, **kwargs2), params)
    _check_like(cotangents, out, 'cotangents', 'f(params, x2)')
    tangents, = vjp_fn(cotangents)
    return jax.jvp(lambda p: f(p, x1, **kwargs1), (params,), (tangents,))[1]

  return precision.library_precision(ntk_vp)


_LINEARIZE_INPUTS_FIX = ('Call `f_lin(params, x)` with the inputs of `f` '
                         '(arrays); a `Kernel` is the input of an analytic '
                         '`kernel_fn` only.')


def _check_like(value: PyTree, reference: PyTree, name: str,
                what: str) -> None:
  """Raises a `ValueError` unless `value` has `reference`'s structure and
  leaf shapes (`what` says what `reference` is, for the message)."""
  structure = tree_util.tree_structure(value)
  expected = tree_util.tree_structure(reference)
  shapes = tree_util.tree_map(np.shape, value)
  expected_shapes = tree_util.tree_map(np.shape, reference)
  if structure != expected or shapes != expected_shapes:
    raise ValueError(
        f'`{name}` must have the structure and shapes of {what}, '
        f'{expected_shapes}; got {shapes}. Pass `{name}` shaped like {what}.')


def linearize(f: Callable[..., PyTree], params: PyTree) -> Callable[..., PyTree]:
  """`f`'s first-order Taylor expansion in its parameters around `params`.

  `f_lin(p, *args) = f(params, *args) + df(params, *args)/dparams (p - params)`,
  computed with one `jax.jvp`.

  Args:
    f: `f(params, *args, **kwargs)`.
    params: the expansion point.

  Returns:
    `f_lin(p, *args, **kwargs)`.

  Example:
    >>> f_lin = linearize(lambda p, x: jnp.sin(p * x), 1.)
    >>> print(f'{float(f_lin(1.5, 2.)):.4f}')  # sin(2) + 0.5 * 2 cos(2)
    0.4932
  """

  problem_lib.check_params(params)

  def f_lin(p: PyTree, *args, **kwargs) -> PyTree:
    _check_like(p, params, 'p', 'the `params` given to `linearize`')
    arguments.reject_kernel(args, 'x', _LINEARIZE_INPUTS_FIX)
    dparams = tree_util.tree_map(jnp.subtract, p, params)
    f_params, df = jax.jvp(lambda q: f(q, *args, **kwargs), (params,),
                           (dparams,))
    return tree_util.tree_map(jnp.add, f_params, df)

  return f_lin


def taylor_expand(f: Callable[..., PyTree], params: PyTree,
                  degree: int) -> Callable[..., PyTree]:
  """`f`'s Taylor expansion of degree `degree` in its parameters.

  `f_tayl(p) = sum_{k <= degree} D^k f(params)[p - params]^k / k!`, with the
  k-th directional derivative from k nested `jax.jvp`s.

  Args:
    f: `f(params, *args, **kwargs)`.
    params: the expansion point.
    degree: the degree (0: constant, 1: `linearize`).

  Returns:
    `f_tayl(p, *args, **kwargs)`.

  Example:
    >>> f2 = taylor_expand(lambda p, x: jnp.exp(p * x), 0., 2)
    >>> f2(1., 1.)  # 1 + 1 + 1/2
    Array(2.5, dtype=float32, weak_type=True)
  """
  if not isinstance(degree, (int, np.integer)) or degree < 0:
    raise ValueError(f'`degree={degree!r}` is not a non-negative int; pass '
                     'the order of the expansion, e.g. `degree=2` (0 gives '
                     'the constant `f(params)`, 1 gives `linearize`).')

  def f_tayl(p: PyTree, *args, **kwargs) -> PyTree:
    dparams = tree_util.tree_map(jnp.subtract, p, params)
    g = lambda q: f(q, *args, **kwargs)
    # derivatives[k](q) = D^k g(q)[dparams, ..., dparams]
    derivatives = [g]
    for _ in range(degree):
      prev = derivatives[-1]
      derivatives.append(
          lambda q, prev=prev: jax.jvp(prev, (q,), (dparams,))[1])
    total = None
    for k, d in enumerate(derivatives):
      term = tree_util.tree_map(lambda t, k=k: t / math.factorial(k),
                                d(params))
      total = term if total is None else tree_util.tree_map(jnp.add, total,
                                                            term)
    return total

  return f_tayl
