"""Batching kernel computations over blocks of inputs: `batch`.

A kernel between inputs `x1` (`N1` examples) and `x2` (`N2` examples) is a
block matrix of the kernels between their blocks. Splitting `x1` into blocks
`x1_1, ..., x1_B1` and `x2` into `x2_1, ..., x2_B2`,

  K(x1, x2) = [ K(x1_i, x2_j) ]_{i, j},

so the full kernel is assembled from `B1 * B2` small computations, each of
which fits in memory, and which can run on several devices at once. With
`x2=None` the kernel is symmetric,

  K(x1_j, x1_i) = K(x1_i, x1_j)^T

(the transpose swapping the two batch axes and each interleaved pair of
spatial axes `(S_k, S_k')`), so only the blocks on and above the diagonal are
computed.

A call is computed in three separable parts (see `docs/dev/batching.md`):
the *plan* (`plan.Plan`: which blocks, in which order, dealt over which
processes, skipping those already in a store), a *runner* (`runners`: how a
list of blocks is computed, serially, sharded over local devices, or over
processes) and a *sink* (`sinks`: where finished blocks go, assembled in
memory or written into the on-disk store). `Computation` composes them for
one call (`call.Call`: the call cut into blocks' arguments).

Example:
  >>> _, _, kernel_fn = stax.serial(stax.Dense(512), stax.Relu(),
  ...                               stax.Dense(1))
  >>> batched_kernel_fn = nt.batch(kernel_fn, batch_size=2)
  >>> ntk = batched_kernel_fn(x1, x2, 'ntk')  # 2 x 1 blocks
  >>> bool(jnp.allclose(ntk, kernel_fn(x1, x2, 'ntk'), rtol=1e-5))
  True
"""
import functools
import os
from typing import Any, Callable, Optional, Sequence, Union

import jax
import numpy as np

from neural_tangents._src import empirical
from neural_tangents._src.batching import options
from neural_tangents._src.batching.assembling import blocks_transpose
from neural_tangents._src.batching.assembling import leaf_specs
from neural_tangents._src.batching.assembling import LeafSpec
from neural_tangents._src.batching.assembling import Role
from neural_tangents._src.batching.assembling import with_full_shapes
from neural_tangents._src.batching.call import Call
from neural_tangents._src.batching.call import KernelCall
from neural_tangents._src.batching.plan import Plan
from neural_tangents._src.batching.processes import ProcessGroup
from neural_tangents._src.batching.runners import BlockFunction
from neural_tangents._src.batching.runners import local_runner
from neural_tangents._src.batching.runners import ProcessRunner
from neural_tangents._src.batching.sinks import MemorySink
from neural_tangents._src.batching.sinks import StoreSink
from neural_tangents._src.batching.store import fingerprint_of
from neural_tangents._src.batching.store import import_zarr
from neural_tangents._src.stax import requirements
from neural_tangents._src.utils import arguments


def batch(kernel_fn: Callable[..., Any],
          batch_size: int = 0,
          device_count: int = -1,
          store_on_device: bool = True,
          *,
          progress: bool = False,
          store: Optional[Union[str, os.PathLike]] = None
          ) -> Callable[..., Any]:
  """Computes a kernel function on blocks of its inputs and assembles them.

  `batch(kernel_fn)(x1, x2, *args, **kwargs)` returns what
  `kernel_fn(x1, x2, *args, **kwargs)` returns (a `Kernel`, an array, a
  namedtuple of arrays, or lists of these), computed from blocks of
  `batch_size` examples of `x1` by `batch_size` examples of `x2`:
  `K(x1, x2) = [K(x1_i, x2_j)]_{ij}`. Works for analytic kernel functions
  (`kernel_fn(x1, x2, get, **kwargs)` of `stax` layers), empirical ones
  (`kernel_fn(x1, x2, get, params, **kwargs)`) and Monte Carlo ones.

  How the output is assembled:

  * `nngp`, `ntk` (and every array output that is not a `cov1`/`cov2`):
    blocks tiled in the `(N1, N2, ...)` layout. With `x2=None` only blocks
    `i <= j` are computed (the diagonal ones with `x2=None`) and the others
    are their transposes (the batch axes and each interleaved spatial pair
    swapped). For kernel functions whose output layout is not known to be the
    analytic one (e.g. empirical kernels with untraced output axes), blocks
    below the diagonal are computed rather than transposed.
  * `cov1` / `cov2`: batch-diagonal `(N, ...)` ones are concatenated from the
    blocks of `x1` / `x2`. Full ones (`diagonal_batch=False`), `(N, N, ...)`,
    are the NNGP of `x1` (resp. `x2`) with itself, computed blockwise.
  * `mask1` / `mask2`: concatenated along the batch axis; `shape1` / `shape2`
    carry the full batch sizes; other attributes are those of the unbatched
    call.

  Block sizes that do not divide `N1` / `N2` work: the last block is padded
  by repeating the last example, and the padded rows are cut from the result.

  Keyword arguments (and extra positional ones) are split with the blocks or
  shared by all of them according to this rule:

  * `rng`, PRNG keys, and anything that is not an array are shared.
  * A pair `(a1, a2)` (tuple or list) of arrays (or `None`) with leading
    dimensions `N1` and `N2` is per example of `x1` and `x2` (e.g. the
    `pattern=(pattern1, pattern2)` of graph layers): `a1` is split with the
    blocks of `x1`, `a2` with those of `x2`. With `x2=None`, an `a2` of
    `None` stands for `a1`.
  * A single array whose leading dimension is `N1` (and `N2`, if `x2` is
    given) is per example of both inputs: it is split with the blocks,
    passed as `a_i` to the diagonal blocks `(x1_i, None)` of a symmetric
    computation (`x2=None`) and as the pair `(a_i, a_j)` to every other block
    `(x1_i, x2_j)`.
  * Any other array (params, an array whose leading dimension is not the
    batch size) is shared. Positional arguments after `x2` are always shared.

  Each block is computed by `jax.jit(kernel_fn)` (also with `batch_size=0`,
  as one block), so `kernel_fn` must be traceable (all kernel functions of
  this library are); non-array arguments are static. Called inside a trace
  (e.g. under `jax.jit`), blocks stay traced values: no host storage and no
  device placement of their own.

  Args:
    kernel_fn: a kernel function `kernel_fn(x1, x2=None, *args, **kwargs)`.
    batch_size: number of examples of `x1` (and of `x2`) per block; `0`
      computes the kernel in one call (no batching).
    device_count: number of local devices to spread blocks over, `-1` for all
      of them. Blocks are stacked and sharded over a 1-D `Mesh` of devices
      with `jax.shard_map`, one block per device at a time. `0` or `1` uses
      the default device only.
    store_on_device: whether to keep the assembled kernel on the device;
      `False` moves each finished block to host memory (numpy arrays), so the
      kernel may be larger than device memory.
    progress: whether to show a `tqdm` progress bar of the blocks done
      (requires the optional `tqdm` package).
    store: a directory for a resumable on-disk kernel (requires the optional
      `zarr` package, `pip install "neural-tangents[store]"`). Every finished
      block is written into one zarr array per output leaf (chunked by
      blocks) and recorded as complete only once its data are on disk; a
      call with the same inputs, arguments, `batch_size` and `kernel_fn` on
      an existing store computes only the blocks missing there (e.g. after
      the previous run was killed), and a store written for anything else is
      refused with a `ValueError`. The result is then read from the store:
      `zarr` arrays (read lazily, `np.asarray(leaf)` loads one) with
      `store_on_device=False`, device arrays otherwise. Supports outputs
      whose leaves are kernels between `x1` and `x2` and batch-diagonal
      covariances (not masks or `diagonal_batch=False` covariances).

  Multiple processes. With JAX's distributed runtime initialized
  (`jax.distributed.initialize`, `jax.process_count() > 1`), every process
  calls the batched function with the same arguments; each computes only
  its share of the blocks (on its local devices; `device_count` counts the
  devices of all processes) and every process returns the same result,
  gathered with `jax.experimental.multihost_utils`. With `store=` (a
  directory every process sees) nothing is gathered: each process writes
  its blocks into the store and the result is read from it. See
  `docs/scale.md` for a recipe.

  After each call, `batched_kernel_fn.block_counts` is a dict of the blocks
  of that call: `total` (in the grid, computed or transposed), `computed` (by
  this process), `from_store` (found complete in the store) and
  `processes`.

  Returns:
    A function with the signature and outputs of `kernel_fn`. Its inputs
    `x1`, `x2` are arrays (or lists/tuples of arrays for networks with several
    inputs) split along their batch axis (the `batch_axis` the network
    declares, `0` otherwise).

  Raises:
    ValueError: if `batch_size` is negative or `device_count` is out of range.

  Example:
    >>> _, _, kernel_fn = stax.serial(stax.Dense(512), stax.Relu(),
    ...                               stax.Dense(1))
    >>> kernel_fn = nt.batch(kernel_fn, batch_size=2, store_on_device=False)
    >>> k = kernel_fn(x1, None, 'ntk')  # numpy (N, N), built 2 x 2
    >>> type(k).__name__, k.shape
    ('ndarray', (3, 3))
  """
  arguments.callable_arg(kernel_fn, 'kernel_fn', 'Pass the `kernel_fn` of a '
                         'network, e.g. `stax.serial(...)[2]`.')
  options.check_batch_size(batch_size)
  devices = options.select_devices(device_count)
  if store is not None:
    if not isinstance(store, (str, os.PathLike)):
      raise TypeError(f'`store` must be a directory path (str); got '
                      f'{store!r}. Pass e.g. store="kernel.zarr", or None.')
    import_zarr()  # Fails now, not after the first blocks.
  if not isinstance(store_on_device, (bool, np.bool_)):
    raise TypeError(f'`store_on_device` must be a bool; got '
                    f'{store_on_device!r}. Pass True or False.')
  if progress:
    options.progress_bar_class()  # Fails now, not in the middle of a computation.
  return batched(kernel_fn, batch_size or None, devices,
                 bool(store_on_device), progress, store)


def batched(kernel_fn: Callable[..., Any], batch_size: Optional[int],
            devices: Sequence[Any], store_on_device: bool,
            progress: bool, store: Optional[str] = None) -> Callable[..., Any]:
  """`batch` without argument checks; `batch_size=None` is one block.

  Args:
    kernel_fn: the kernel function.
    batch_size: examples per block, or None for one block.
    devices: this process's devices computing blocks
      (`options.select_devices`).
    store_on_device: whether results stay on the device.
    progress: whether to show a progress bar (`tqdm` must be importable).
    store: directory of an on-disk store, or None.

  Returns:
    The batched kernel function (see `batch`).
  """
  block_fn = BlockFunction(kernel_fn, devices)

  @functools.wraps(kernel_fn)
  def batched_kernel_fn(x1_or_kernel: Any, x2: Any = None, *args,
                        **kwargs) -> Any:
    call_type = Call
    if requirements.is_kernel_tree(x1_or_kernel):
      if x2 is not None:
        raise TypeError(
            'A batched kernel function called on a `Kernel` takes `x2=None` '
            f'(the kernel holds both inputs); got x2 of type '
            f'{type(x2).__name__}. Call it as `batched_kernel_fn(k, None, '
            'get)`.')
      call_type = KernelCall
    elif (getattr(kernel_fn, 'takes_rng_pairs', False) and
          empirical.is_single_key(kwargs.get('rng'))):
      # Blocks see slices of `x1` and `x2`, so they cannot tell whether
      # `x2` is `x1`: the keys of the whole call are chosen here.
      kwargs = {**kwargs,
                'rng': empirical.read_rng(kwargs['rng'], x1_or_kernel, x2)}
    call = call_type(kernel_fn, x1_or_kernel, x2, args, kwargs, batch_size,
                     store)
    computation = Computation(block_fn, call, store_on_device, progress,
                              store)
    out = computation.run()
    batched_kernel_fn.block_counts = computation.block_counts()
    return out

  batched_kernel_fn.block_counts = None
  # The store, and the same batched function writing into another one (the
  # ensemble stores each kernel it asks for in its own subdirectory).
  batched_kernel_fn.store = store
  batched_kernel_fn.with_store = lambda path: batched(
      kernel_fn, batch_size, devices, store_on_device, progress,
      os.fspath(path))

  return batched_kernel_fn


class Computation:
  """One call of a batched kernel function: its plan, runner and sink.

  `run` computes the blocks of the call's `Plan` with a runner and sends
  them to a sink, which assembles the output leaves:

  * one process, no store: a local runner (serial or sharded over the
    devices) into a `MemorySink`;
  * several processes: the plan dealt over them, each computing its share
    (`ProcessRunner`), the blocks gathered into a `MemorySink` on every
    process, or written into a `StoreSink` with `store=`.
  """

  def __init__(self, block_fn: BlockFunction, call: Call,
               store_on_device: bool, progress: bool,
               store: Optional[Union[str, os.PathLike]] = None):
    self.block_fn = block_fn
    self.call = call
    self.progress = progress
    self.store = None if store is None else os.fspath(store)
    self.store_on_device = store_on_device
    self.on_host = ((not store_on_device or store is not None) and
                    not call.traced)
    self.group = ProcessGroup.current()
    self.runner = local_runner(block_fn, self.on_host, call.traced)
    self.from_store = 0

  def block_counts(self) -> dict[str, int]:
    """Blocks of this call (see `batch`'s docstring)."""
    g = self.call.grid
    return {'total': g.nb1 * g.nb2, 'computed': self.runner.computed,
            'from_store': self.from_store, 'processes': self.group.count}

  def run(self) -> Any:
    """The output of the call, assembled from its blocks."""
    call = self.call
    if call.grid.n1 == 0 or call.grid.n2 == 0:
      # No examples: `kernel_fn`'s (empty) output as is.
      out = call.compute_whole()
      return jax.device_get(out) if self.on_host else out
    if not call.traced and (self.store is not None or
                            self.group.distributed):
      return self._run_shared()
    plan = Plan(call.grid)
    bar = None
    if self.progress and not call.traced:
      bar = options.progress_bar_class()(total=plan.count(),
                                         desc='kernel blocks', unit='block')
    try:
      return self._run_local(plan, bar)
    finally:
      if bar is not None:
        bar.close()

  def _specs(self, block: Any) -> list[LeafSpec]:
    call = self.call
    return leaf_specs(block, call.get, call.representation(), call.analytic)

  def _run_local(self, plan: Plan, bar: Any) -> Any:
    """One process: the first phase tells whether lower blocks are needed."""
    call = self.call
    first, *rest = plan.phases()
    outputs = self.runner.run(first, call, bar)
    task, ref = next(outputs)
    specs = self._specs(ref)
    need_lower = call.symmetric and not blocks_transpose(specs)
    if need_lower:
      plan = Plan(call.grid, need_lower=True)  # The same first phase.
      _, *rest = plan.phases()
      if bar is not None:
        bar.total = plan.count()
        bar.refresh()
    sink = self._sink(specs, ref, need_lower)
    sink.add(task, ref)
    for task, out in outputs:
      sink.add(task, out)
    for phase in rest:
      for task, out in self.runner.run(phase, call, bar):
        sink.add(task, out)
    return self._output(specs, sink.finish(), ref)

  def _run_shared(self) -> Any:
    """Blocks divided over processes; gathered, or written into the store."""
    call = self.call
    template = self.block_fn.shapes(call, Plan(call.grid).reference())
    specs = self._specs(template)
    need_lower = call.symmetric and not blocks_transpose(specs)
    plan = Plan(call.grid, need_lower=need_lower)
    sink = self._sink(specs, template, need_lower)
    runner = ProcessRunner(self.runner, self.group)
    bar = None
    if self.progress:
      bar = options.progress_bar_class()(
          total=plan.count(), desc='kernel blocks', unit='block')
    try:
      for phase in plan.deal(sink.done, self.group):
        self.from_store += phase.from_store
        if bar is not None:
          bar.update(phase.from_store)
        if not phase.arranged:  # The same on every process: all read `done`.
          continue
        if self.store is not None:
          blocks = runner.own(phase.arranged, call, bar)
        else:
          blocks = runner.gathered(
              phase.arranged, call,
              self.block_fn.shapes(call, phase.tasks[0]), bar)
        for task, out in blocks:
          sink.add(task, out)
    finally:
      if bar is not None:
        bar.close()
    return self._output(specs, sink.finish(), template)

  def _sink(self, specs: list[LeafSpec], block: Any,
            need_lower: bool) -> Union[MemorySink, StoreSink]:
    """Where the blocks go: the store of `store=`, else memory.

    Args:
      specs: the specs of the output leaves.
      block: a block's output (or its `ShapeDtypeStruct`s).
      need_lower: whether blocks below a symmetric diagonal are computed.
    """
    call = self.call
    if self.store is not None:
      return StoreSink(
          self.store, fingerprint_of(call.kernel_fn, (call.x1, call.x2),
                                     call.args, call.kwargs, call.batch_size),
          specs, jax.tree_util.tree_leaves(block), call.grid, self.group,
          self.store_on_device, transpose=not need_lower)
    return MemorySink(specs, call.grid, self.on_host,
                      transpose=not need_lower)

  def _output(self, specs: list[LeafSpec], leaves: list[Any],
              block: Any) -> Any:
    """The output pytree (structured as `block`) of the assembled leaves."""
    leaves = self._full_covariances(specs, leaves)
    out = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(block),
                                       leaves)
    return with_full_shapes(out, self.call.grid)

  def _full_covariances(self, specs: list[LeafSpec],
                        leaves: list[Any]) -> list[Any]:
    """`(N, N, ...)` covariances of `x1`, `x2`: their NNGP with themselves."""
    needed = {s.role for s in specs if s.role in (Role.SELF1, Role.SELF2)
              and not s.diagonal_batch}
    if not needed:
      return leaves
    full = {}
    for role in sorted(needed, key=lambda r: r.value):
      side = 1 if role == Role.SELF1 or self.call.symmetric else 2
      if side == 1 and Role.SELF1 in full:
        full[role] = full[Role.SELF1]
        continue
      full[role] = Computation(self.block_fn, self.call.with_itself(side),
                               not self.on_host, self.progress).run()
    return [full[s.role] if s.role in full and not s.diagonal_batch else leaf
            for s, leaf in zip(specs, leaves)]
