"""Monte Carlo estimates of the NNGP and NTK: `monte_carlo_kernel_fn`.

The infinite-width kernels of a network are expectations over its random
initialization `theta ~ p(theta)` of its empirical kernels,

  NNGP(x1, x2) = E_theta[ f(theta, x1) f(theta, x2)^T ],
  NTK(x1, x2)  = E_theta[ J(theta, x1) J(theta, x2)^T ],
  J(theta, x)  = d f(theta, x) / d theta,

(averaged over output channels, `trace_axes`), so a finite network's sample
mean over `n` initializations converges to them at the rate `O(1/sqrt(n))`
(plus the network's finite-width corrections, `O(1/width)`):

  K_n(x1, x2) = (1/n) sum_{s < n} K_emp(theta_s; x1, x2).

Example:
  >>> import neural_tangents as nt
  >>> from neural_tangents import stax
  >>> init_fn, apply_fn, _ = stax.serial(stax.Dense(64), stax.Relu(),
  ...                                    stax.Dense(1))
  >>> kernel_fn = nt.monte_carlo_kernel_fn(init_fn, apply_fn,
  ...                                      jax.random.PRNGKey(0), 16)
  >>> kernel_fn(x1, x2, 'ntk').shape  # ~ the analytic NTK of the network
  (3, 2)
"""
from collections.abc import Iterable
import inspect
from typing import Any, Callable, Generator, Sequence, Union

import jax
from jax import lax
from jax import random
import jax.numpy as jnp
import numpy as np

from neural_tangents._src import batching
from neural_tangents._src.empirical import canonical_x2
from neural_tangents._src.empirical import check_inputs
from neural_tangents._src.empirical import DEFAULT_NTK_IMPLEMENTATION
from neural_tangents._src.empirical import empirical_kernel_fn
from neural_tangents._src.empirical import inputs_are_equal
from neural_tangents._src.empirical import is_single_key
from neural_tangents._src.empirical import NtkImplementation
from neural_tangents._src.empirical import read_rng
from neural_tangents._src.empirical import second_key
from neural_tangents._src.utils import arguments
from neural_tangents._src.utils import utils
from neural_tangents._src.utils.typing import ApplyFn, Axes, InitFn, PyTree

_KERNEL_NAMES = ('nngp', 'ntk')
# With `progress=True`, the number of chunks the samples are summed in.
_PROGRESS_STEPS = 20


def monte_carlo_kernel_fn(
    init_fn: InitFn,
    apply_fn: ApplyFn,
    key: jax.Array,
    n_samples: Union[int, Sequence[int]],
    batch_size: int = 0,
    device_count: int = -1,
    store_on_device: bool = True,
    trace_axes: Axes = (-1,),
    diagonal_axes: Axes = (),
    vmap_axes: Any = None,
    implementation: Union[NtkImplementation, int] = DEFAULT_NTK_IMPLEMENTATION,
    *,
    progress: bool = False
) -> Callable[..., Any]:
  """Monte Carlo estimate of the NNGP and NTK from random initializations.

  Estimates `K(x1, x2) = E_theta[K_emp(theta; x1, x2)]` by the mean of the
  empirical kernels (`nt.empirical_kernel_fn(apply_fn, trace_axes,
  diagonal_axes, vmap_axes, implementation)`) of `n_samples` networks with
  params `init_fn(key_s, x1.shape)[1]`.

  Randomness, as the published release. Sample `s` (counting from 0) is
  drawn from the chain `key_0 = key`, `key_{s+1}, k_s = random.split(key_s)`,
  `init_key_s, rng_s = random.split(k_s)`: params from
  `init_fn(init_key_s, x1.shape)`, and `apply_fn` gets `rng=rng_s` (for
  `apply_fn(x2)`, `random.fold_in(rng_s, 1)` unless x2 is None or equals
  x1, the convention of `nt.empirical_kernel_fn`), when it takes an `rng`
  (a parameter `rng` or `**kwargs`, as every stax `apply_fn`), e.g. for
  `Dropout(mode='train')`. So the same `key` gives the published estimate
  (with JAX's PRNG stream of its day,
  `jax.config.update('jax_threefry_partitionable', False)`), and an
  estimate from `n` samples uses the same networks whatever `n_samples`
  list it belongs to and whatever `implementation`, `batch_size` or device
  count computes it. An `rng` keyword argument given by the caller replaces
  the chain's `rng_s`: sample `s` then gets `random.fold_in(rng, s)` (and
  `random.fold_in(rng2, s)` for the key `rng2` of `apply_fn(x2)`, chosen as
  above once for the whole call; a pair `(rng1, rng2)` is used as given).

  Args:
    init_fn: `init_fn(key, input_shape) -> (output_shape, params)`.
    apply_fn: `apply_fn(params, x, **kwargs)`.
    key: PRNG key the params keys are derived from.
    n_samples: number of networks, `>= 1`; or an increasing sequence of
      counts, in which case `kernel_fn` returns a generator yielding the
      estimate after each count. The networks are sampled once: the estimate
      at `n_samples[k]` adds `n_samples[k] - n_samples[k - 1]` networks to
      the previous sum.
    batch_size: if `> 0`, the sum of the empirical kernels is computed on
      blocks of `batch_size` examples of `x1` by `x2` with `nt.batch` (every
      block re-draws the same networks, so the result is the same).
    device_count: devices to spread the blocks over, see `nt.batch` (with
      `batch_size=0` the sum is one block, computed on the default device).
    store_on_device: whether to keep the estimate on the device; `False`
      returns numpy arrays, see `nt.batch`.
    trace_axes: output axes averaged over, see `nt.empirical_kernel_fn`.
    diagonal_axes: output axes of which only the diagonal is kept.
    vmap_axes: batch axes of inputs / outputs / kwargs, see
      `nt.empirical_kernel_fn`.
    implementation: how the empirical NTK is computed (`NtkImplementation` or
      its int value); all give the same estimate for the same `key`.
    progress: whether to show a `tqdm` progress bar of the networks sampled
      (requires the optional `tqdm` package). The samples are then summed in
      up to 20 chunks (the same networks; the sum may differ
      by float rounding).

  Returns:
    `kernel_fn(x1, x2=None, get=None, **apply_fn_kwargs)`: for `get` 'nngp'
    or 'ntk' that estimate; for a tuple of them, or `None` (both), a
    namedtuple `Kernel` of estimates, in the layout of
    `nt.empirical_kernel_fn`. With a sequence `n_samples`, a generator of
    these. `apply_fn_kwargs` are passed to `apply_fn` (a tuple
    `(for_x1, for_x2)` passes different values to the two calls).

  Raises:
    ValueError: for `n_samples` that are not positive (increasing) ints, and
      for bad `batch_size` / `device_count` (see `nt.batch`).

  Example:
    >>> init_fn, apply_fn, _ = stax.serial(stax.Dense(64), stax.Relu(),
    ...                                    stax.Dense(1))
    >>> kernel_fn = nt.monte_carlo_kernel_fn(
    ...     init_fn, apply_fn, random.PRNGKey(0), n_samples=[4, 16])
    >>> for k in kernel_fn(x1, x2, ('nngp', 'ntk')):
    ...   print(k.ntk.shape)  # 4-sample estimate, then 16-sample estimate
    (3, 2)
    (3, 2)
  """
  counts, as_generator = _sample_counts(n_samples)
  key = _check_key(key)
  _check_network(init_fn, apply_fn)
  batching.check_batch_size(batch_size)
  if progress:
    batching.progress_bar_class()
  devices = batching.select_devices(device_count)
  empirical = empirical_kernel_fn(apply_fn, trace_axes, diagonal_axes,
                                  vmap_axes, implementation)
  init_keys, chain_rngs = published_key_chain(key, counts[-1])
  takes_rng = _takes_rng(apply_fn)
  sample_sum = _sample_sum_fn(init_fn, empirical, init_keys, chain_rngs)

  # One block (`batch_size=None`) still jits the sum and handles storage.
  summed = batching.batched(
      sample_sum, batch_size or None, devices, bool(store_on_device),
      progress=False)

  def partial_sum(x1, x2, get, start, stop, kwargs):
    args = (x1, x2, get, np.asarray(start, np.int32),
            np.asarray(stop, np.int32))
    if not batch_size and not _has_example_pairs(sample_sum, args, kwargs):
      # A traced or diagonal batch axis: no `(N1, N2)` blocks to assemble.
      out = _jit_with_static(sample_sum, args, kwargs)
      return out if store_on_device else jax.device_get(out)
    return summed(*args, **kwargs)

  def range_sum(x1, x2, get, start, stop, kwargs, bar):
    """Sum over samples `start <= s < stop`, in chunks advancing `bar`."""
    if bar is None:
      return partial_sum(x1, x2, get, start, stop, kwargs)
    step = max(1, -(-counts[-1] // _PROGRESS_STEPS))
    total = None
    for lo in range(start, stop, step):
      hi = min(lo + step, stop)
      total = _add(total, partial_sum(x1, x2, get, lo, hi, kwargs))
      # JAX dispatches asynchronously: without waiting, the bar would reach
      # its end long before the samples are computed.
      total = jax.block_until_ready(total)
      bar.update(hi - lo)
    return total

  def estimates(x1, x2, get, kwargs) -> Generator[Any, None, None]:
    total, done = None, 0
    bar = _progress_bar(progress, counts[-1], x1, x2)
    try:
      for n in counts:
        if n > done:
          total = _add(total, range_sum(x1, x2, get, done, n, kwargs, bar))
          done = n
        yield _divide(total, n)
    finally:
      if bar is not None:
        bar.close()

  def kernel_fn(x1: PyTree, x2: PyTree = None, get: Any = None,
                **apply_fn_kwargs) -> Any:
    get = _check_get(get)
    x2 = canonical_x2(x2)
    check_inputs(x1, x2)
    apply_fn_kwargs = _with_sample_rngs(x1, x2, takes_rng, apply_fn_kwargs)
    if as_generator:
      return estimates(x1, x2, get, apply_fn_kwargs)
    bar = _progress_bar(progress, counts[-1], x1, x2)
    try:
      return _divide(
          range_sum(x1, x2, get, 0, counts[0], apply_fn_kwargs, bar),
          counts[0])
    finally:
      if bar is not None:
        bar.close()

  return kernel_fn


def _check_key(key: Any) -> jax.Array:
  """`key` as one PRNG key, or raises."""
  if not batching.is_array(key):
    raise TypeError(f'`key` must be a PRNG key array; got {type(key).__name__}'
                    '. Pass e.g. `jax.random.PRNGKey(0)`.')
  # One key: the samples' keys are split from it (a batch of keys is not).
  return arguments.prng_key(key, 'key')


def _check_network(init_fn: InitFn, apply_fn: ApplyFn) -> None:
  arguments.callable_arg(
      init_fn, 'init_fn', 'Pass the `init_fn(key, input_shape)` of a network, '
      'e.g. the first of `stax.serial(...)`.')
  arguments.callable_arg(
      apply_fn, 'apply_fn', 'Pass the `apply_fn(params, x)` of a network, '
      'e.g. the second of `stax.serial(...)`.')


def _sample_sum_fn(init_fn: InitFn, empirical: Callable[..., Any],
                   init_keys: jax.Array,
                   chain_rngs: jax.Array) -> Callable[..., Any]:
  """`sample_sum(x1, x2, get, start, stop, **kwargs)`: a sum of samples.

  Args:
    init_fn: the network's `init_fn`.
    empirical: its empirical kernel function, `empirical(x1, x2, get,
      params, **apply_fn_kwargs)`.
    init_keys: the params key of each sample (`published_key_chain`).
    chain_rngs: the `apply_fn` key of each sample (`published_key_chain`).

  Returns:
    `sample_sum(x1, x2, get, start, stop, *, chain_x2_is_x1=None,
    **apply_fn_kwargs)`: the sum of the empirical kernels of samples
    `start <= s < stop`, which `nt.batch` can compute in blocks of examples.
  """

  def sample_sum(x1: PyTree, x2: PyTree, get: Any, start: jax.Array,
                 stop: jax.Array, *, chain_x2_is_x1: Any = None,
                 **apply_fn_kwargs) -> Any:
    """Sum of the empirical kernels of samples `start <= s < stop`.

    `chain_x2_is_x1` (a bool, or `None` when the caller gave `rng` or
    `apply_fn` takes none): whether the whole call's x2 is None or equals
    x1, for the chain keys of `apply_fn(x2)`.
    """
    input_shape = jax.tree_util.tree_map(lambda x: tuple(x.shape), x1)
    rng = apply_fn_kwargs.pop('rng', None)

    names = _KERNEL_NAMES if get is None else (
        (get,) if isinstance(get, str) else tuple(get))

    def sample_kernels(s: jax.Array) -> tuple[Any, ...]:
      _, params = init_fn(init_keys[s], input_shape)
      kwargs = dict(apply_fn_kwargs)
      if chain_x2_is_x1 is not None:
        rng_s = chain_rngs[s]
        kwargs['rng'] = (rng_s, second_key(rng_s, chain_x2_is_x1))
      elif rng is not None and is_single_key(rng):
        # One key object for both calls: x2 is None or equals x1.
        rng_s = random.fold_in(rng, s)
        kwargs['rng'] = (rng_s, rng_s)
      elif rng is not None:
        kwargs['rng'] = jax.tree_util.tree_map(
            lambda r: random.fold_in(r, s), rng)
      return tuple(empirical(x1, x2, name, params, **kwargs)
                   for name in names)

    # `stop > start`: the first sample gives the shapes of the sum.
    first = sample_kernels(start)
    total = lax.fori_loop(
        start + 1, stop,
        lambda s, total: jax.tree_util.tree_map(jnp.add, total,
                                                sample_kernels(s)),
        first)
    if isinstance(get, str):
      return total[0]
    return utils.get_namedtuple(tuple(names))(*total)

  return sample_sum


def _with_sample_rngs(x1: PyTree, x2: PyTree, takes_rng: bool,
                      apply_fn_kwargs: dict[str, Any]) -> dict[str, Any]:
  """The keyword arguments of `sample_sum`: how each sample's `rng` is made.

  Without a caller's `rng` (and an `apply_fn` that takes one), the chain's
  keys, with `chain_x2_is_x1` saying whether x2 is None or equals x1; a
  caller's single `rng` becomes the pair `(rng1, rng2)` of `read_rng` (one
  key when they are the same).
  """
  apply_fn_kwargs = dict(apply_fn_kwargs)
  if takes_rng and 'rng' not in apply_fn_kwargs:
    same = inputs_are_equal(x1, x2)
    # Traced inputs under the caller's `jit`: equal only if identical.
    apply_fn_kwargs['chain_x2_is_x1'] = same if isinstance(same,
                                                           bool) else False
  rng = apply_fn_kwargs.get('rng')
  if is_single_key(rng):
    rng1, rng2 = read_rng(rng, x1, x2)
    apply_fn_kwargs['rng'] = rng1 if rng2 is rng1 else (rng1, rng2)
  return apply_fn_kwargs


def _progress_bar(progress: bool, total: int, x1: PyTree, x2: PyTree) -> Any:
  """A `tqdm` bar of `total` samples, or None (no progress, or traced)."""
  traced = any(isinstance(x, jax.core.Tracer)
               for x in jax.tree_util.tree_leaves((x1, x2)))
  if not progress or traced:
    return None
  return batching.progress_bar_class()(
      total=total, desc='Monte Carlo samples', unit='network')


def _add(total: Any, part: Any) -> Any:
  """`total + part` leaf by leaf, `part` when there is no total yet."""
  return part if total is None else jax.tree_util.tree_map(
      lambda a, b: a + b, total, part)


def published_key_chain(key: jax.Array,
                        n: int) -> tuple[jax.Array, jax.Array]:
  """The params and `apply_fn` keys of `n` Monte Carlo samples, as published.

  `key_0 = key`; for `s = 0 .. n - 1`: `key_{s+1}, k_s = random.split(key_s)`
  and `init_key_s, rng_s = random.split(k_s)`.

  Args:
    key: the sampling key (a legacy `uint32[2]` key or a typed key).
    n: the number of samples.

  Returns:
    `(init_keys, rngs)`, each `n` keys stacked on a leading axis.

  Example:
    >>> init_keys, rngs = published_key_chain(jax.random.PRNGKey(1), 4)
    >>> init_keys.shape, rngs.shape
    ((4, 2), (4, 2))
  """
  def step(carry, _):
    carry, k = random.split(carry)
    init_key, rng = random.split(k)
    return carry, (init_key, rng)
  _, (init_keys, rngs) = jax.jit(
      lambda k: lax.scan(step, k, None, length=n))(key)
  return init_keys, rngs


def _takes_rng(apply_fn: ApplyFn) -> bool:
  """Whether `apply_fn` accepts an `rng` keyword (by name or `**kwargs`)."""
  try:
    parameters = inspect.signature(apply_fn).parameters.values()
  except (TypeError, ValueError):  # No signature (e.g. some builtins).
    return False
  return any(p.kind == p.VAR_KEYWORD or
             (p.name == 'rng' and p.kind != p.POSITIONAL_ONLY)
             for p in parameters)


def _jit_with_static(fn: Callable[..., Any], args: tuple,
                     kwargs: dict[str, Any], shapes_only: bool = False) -> Any:
  """`fn(*args, **kwargs)` jitted (or shape-evaluated), non-arrays static."""
  is_array = lambda v: all(isinstance(l, (jax.Array, np.ndarray, np.generic))
                           for l in jax.tree_util.tree_leaves(v))
  dynamic = {k: v for k, v in kwargs.items() if is_array(v)}
  static = {k: v for k, v in kwargs.items() if k not in dynamic}
  x1, x2, get, start, stop = args
  call = lambda x1, x2, start, stop, dynamic: fn(x1, x2, get, start, stop,
                                                 **dynamic, **static)
  run = jax.eval_shape if shapes_only else jax.jit(call)
  return (run(call, x1, x2, start, stop, dynamic) if shapes_only else
          run(x1, x2, start, stop, dynamic))


def _has_example_pairs(fn: Callable[..., Any], args: tuple,
                       kwargs: dict[str, Any]) -> bool:
  """Whether every kernel of `fn(*args, **kwargs)` starts with `(N1, N2)`.

  Not so when `trace_axes` or `diagonal_axes` contain the batch axis; then
  `nt.batch` cannot assemble blocks of examples.
  """
  x1, x2 = args[:2]
  n1 = np.shape(jax.tree_util.tree_leaves(x1)[0])[0]
  n2 = n1 if x2 is None else np.shape(jax.tree_util.tree_leaves(x2)[0])[0]
  out = _jit_with_static(fn, args, kwargs, shapes_only=True)
  return all(tuple(k.shape[:2]) == (n1, n2)
             for k in jax.tree_util.tree_leaves(out))


def _divide(tree: Any, n: int) -> Any:
  def divide(x):
    out = x / n
    # Keep numpy (host) results numpy and float32 float32.
    return out.astype(x.dtype) if hasattr(out, 'astype') else out
  return jax.tree_util.tree_map(divide, tree)


def _sample_counts(n_samples: Any) -> tuple[tuple[int, ...], bool]:
  """`(counts, whether a generator is asked for)`, or raises."""
  fix = ('Pass a positive int, or an increasing sequence of positive ints '
         'such as [16, 64, 256].')
  if arguments.is_int(n_samples):
    if n_samples < 1:
      raise ValueError(f'`n_samples` must be >= 1; got {n_samples}. {fix}')
    return (int(n_samples),), False
  if not isinstance(n_samples, Iterable) or isinstance(n_samples, str):
    raise TypeError(f'`n_samples` must be an int or a sequence of ints; got '
                    f'{n_samples!r}. {fix}')
  counts = tuple(n_samples)
  if not counts:
    raise ValueError(f'`n_samples` must not be empty; got {n_samples!r}. '
                     f'{fix}')
  for n in counts:
    if not arguments.is_int(n):
      raise TypeError(f'`n_samples` must contain ints; got {n!r} in '
                      f'{n_samples!r}. {fix}')
    if n < 1:
      raise ValueError(f'`n_samples` must contain counts >= 1; got {n} in '
                       f'{n_samples!r}. {fix}')
  if any(b < a for a, b in zip(counts, counts[1:])):
    raise ValueError(f'`n_samples` must be increasing; got {n_samples!r}. '
                     f'Sort it, e.g. {sorted(counts)}.')
  return tuple(int(n) for n in counts), True


def _check_get(get: Any) -> Any:
  """`get` as a hashable (static) argument: None, a name or a tuple of names."""
  names, single = arguments.parse_get(
      get, _KERNEL_NAMES,
      fix="A Monte Carlo estimate has 'nngp' and 'ntk': pass one of them, a "
      'tuple of them, or None for both.')
  return names[0] if single else names
