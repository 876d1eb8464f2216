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

Splitting the blocks off a call and assembling their outputs are in
`splitting` and `assembling`; dividing blocks over processes in `processes`; the
on-disk store in `store`.

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
from typing import Any, Callable, Iterator, Optional, Sequence, Union

import jax
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec
import numpy as np

from neural_tangents._src import empirical
from neural_tangents._src.batching import options
from neural_tangents._src.batching.assembling import Assembler
from neural_tangents._src.batching.assembling import leaf_specs
from neural_tangents._src.batching.assembling import LeafSpec
from neural_tangents._src.batching.assembling import Role
from neural_tangents._src.batching.splitting import classify_kwarg
from neural_tangents._src.batching.splitting import Grid
from neural_tangents._src.batching.splitting import is_array
from neural_tangents._src.batching.splitting import leaves_with_axes
from neural_tangents._src.batching.splitting import merge_static
from neural_tangents._src.batching.splitting import partition_static
from neural_tangents._src.batching.splitting import Split
from neural_tangents._src.batching.splitting import stack
from neural_tangents._src.batching.splitting import Static
from neural_tangents._src.batching.splitting import take
from neural_tangents._src.batching.splitting import Task
from neural_tangents._src.batching.processes import ProcessGroup
from neural_tangents._src.batching.store import fingerprint_of
from neural_tangents._src.batching.store import import_zarr
from neural_tangents._src.batching.store import Store
from neural_tangents._src.stax import protocol
from neural_tangents._src.stax import inputs
from neural_tangents._src.stax import requirements
from neural_tangents._src.utils import arguments
from neural_tangents._src.utils.kernel import Kernel

# Name of the mesh axis that blocks are spread over.
_DEVICES = 'devices'


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
    computation_type = Computation
    if requirements.is_kernel_tree(x1_or_kernel):
      if x2 is not None:
        raise TypeError(
            'A batched kernel function called on a `Kernel` takes `x2=None` '
            f'(the kernel holds both inputs); got x2 of type '
            f'{type(x2).__name__}. Call it as `batched_kernel_fn(k, None, '
            'get)`.')
      computation_type = KernelComputation
    elif (getattr(kernel_fn, 'takes_rng_pairs', False) and
          empirical.is_single_key(kwargs.get('rng'))):
      # Blocks see slices of `x1` and `x2`, so they cannot tell whether
      # `x2` is `x1`: the keys of the whole call are chosen here.
      kwargs = {**kwargs,
                'rng': empirical.read_rng(kwargs['rng'], x1_or_kernel, x2)}
    computation = computation_type(kernel_fn, block_fn, x1_or_kernel, x2,
                                   args, kwargs, batch_size, store_on_device,
                                   progress, store)
    out = computation.run()
    batched_kernel_fn.block_counts = computation.block_counts()
    return out

  batched_kernel_fn.block_counts = None

  return batched_kernel_fn


# -----------------------------------------------------------------------------
# Computing blocks: jitted, one device or sharded over several.


class BlockFunction:
  """`kernel_fn` on a block, jitted once per batched function.

  Calls are `(static, x1, x2, split_kwargs, shared_arrays)`, with
  `merge_static(static, shared_arrays) == (args, shared_kwargs)`.
  """

  def __init__(self, kernel_fn: Callable[..., Any], devices: Sequence[Any]):
    self.kernel_fn = kernel_fn
    self.devices = list(devices)
    self.single = jax.jit(self.call, static_argnums=0)
    if len(self.devices) > 1:
      self.mesh = Mesh(np.array(self.devices), (_DEVICES,))
      self.sharded = jax.jit(self._call_sharded, static_argnums=0)

  def call(self, static: Static, x1: Any, x2: Any, split_kwargs: Any,
           shared: Sequence[Any]) -> Any:
    """`kernel_fn` on one block (not jitted)."""
    args, kwargs = merge_static(static, shared)
    return self.kernel_fn(x1, x2, *args, **kwargs, **split_kwargs)

  def _call_sharded(self, static: Static, x1: Any, x2: Any,
                    split_kwargs: Any, shared: Sequence[Any]) -> Any:
    """Inputs stacked on a leading device axis: one block per device."""
    def local(x1, x2, split_kwargs, shared):
      first = lambda tree: jax.tree_util.tree_map(lambda x: x[0], tree)
      out = self.call(static, first(x1), first(x2), first(split_kwargs),
                       shared)
      return jax.tree_util.tree_map(lambda x: x[None], out)

    stacked = PartitionSpec(_DEVICES)
    return jax.shard_map(
        local, mesh=self.mesh,
        in_specs=(stacked, stacked, stacked, PartitionSpec()),
        out_specs=stacked, check_vma=False)(x1, x2, split_kwargs, shared)



# -----------------------------------------------------------------------------
# One batched call.


class Computation:
  """Computes and assembles the blocks of one call of a batched kernel_fn."""

  def __init__(self, kernel_fn, block_fn, x1, x2, args, kwargs, batch_size,
               store_on_device, progress, store=None):
    self.kernel_fn = kernel_fn
    self.block_fn = block_fn
    self.x1, self.x2 = x1, x2
    self.args, self.kwargs = tuple(args), dict(kwargs)
    self.batch_size = batch_size
    self.progress = progress
    self.symmetric = x2 is None

    n1, n2 = self._examples(x1, x2)
    # No examples: one (empty) block, see `_run_empty`.
    b1 = max(1, n1 if batch_size is None else min(batch_size, n1))
    b2 = max(1, n2 if batch_size is None else min(batch_size, n2))
    self.grid = Grid(n1, n2, b1, b2, self.symmetric)

    traced = any(isinstance(x, jax.core.Tracer) for x in
                 jax.tree_util.tree_leaves((x1, x2, args, kwargs)))
    # Inside a trace (e.g. this batched function jitted, or composed with
    # another batched function) blocks stay traced values: no host storage,
    # no device placement of our own.
    self.traced = traced
    self.store = None if store is None else os.fspath(store)
    if traced and store is not None:
      raise ValueError(
          f'`store={store!r}` needs concrete inputs; this batched kernel '
          'function was called inside a trace (e.g. under `jax.jit`). Call '
          'it outside of `jit`, or pass store=None.')
    self.store_on_device = store_on_device
    self.on_host = (not store_on_device or store is not None) and not traced
    self.group = ProcessGroup.current()
    self.computed = 0
    self.from_store = 0
    self.n_devices = 1 if traced else len(block_fn.devices)

    self.split = {
        name: classify_kwarg(name, value, n1, n2, self.symmetric)
        for name, value in self.kwargs.items()}
    shared_kwargs = {name: value for name, value in self.kwargs.items()
                     if self.split[name] == Split.SHARED}
    self.static, self.shared = partition_static((self.args, shared_kwargs))
    self.get = self._get()
    self.analytic = protocol.is_layer_kernel_fn(kernel_fn)

  # --- inputs ---------------------------------------------------------------

  def _examples(self, x1: Any, x2: Any) -> tuple[int, int]:
    """`(N1, N2)`; sets `symmetric` and the inputs' batch axes."""
    self.axes1 = inputs.input_batch_axes(self.kernel_fn, x1)
    self.axes2 = (self.axes1 if x2 is None else
                  inputs.input_batch_axes(self.kernel_fn, x2))
    n1 = self._count(x1, self.axes1, 'x1')
    n2 = n1 if x2 is None else self._count(x2, self.axes2, 'x2')
    return n1, n2

  def _count(self, x: Any, axes: Any, name: str) -> int:
    leaves = leaves_with_axes(x, axes)
    if not leaves or not all(is_array(l) for l, _ in leaves):
      raise TypeError(
          f'`{name}` must be an array (or a list/tuple of arrays); got '
          f'{type(x).__name__}. Pass inputs of shape (batch, ..., channels).')
    counts = {l.shape[a] for l, a in leaves}
    if len(counts) != 1:
      raise ValueError(f'Every input in `{name}` must have the same number of '
                       f'examples; got {sorted(counts)}.')
    return counts.pop()

  def _get(self) -> Any:
    if 'get' in self.kwargs:
      return self.kwargs['get']
    if self.args and _is_get(self.args[0]):
      return self.args[0]
    return None

  def _inputs(self, i: int, side: int) -> Any:
    x, axes = (self.x1, self.axes1) if side == 1 or self.symmetric else (
        self.x2, self.axes2)
    indices = self.grid.indices(i, side)
    # `axes` is a prefix of `x`: one axis per input, which may be a pytree
    # (e.g. a `MaskedArray` of values and mask).
    return jax.tree_util.tree_map(
        lambda a, xi: jax.tree_util.tree_map(
            lambda l: take(l, indices, a), xi), axes, x)

  def _representation(self) -> dict[str, Any]:
    """The `diagonal_batch` / `diagonal_spatial` of the outputs."""
    return self.kwargs

  def _block_inputs(self, task: Task) -> tuple[Any, Any]:
    """`(x1, x2)` of a block; `x2` is None on a symmetric grid's diagonal."""
    return (self._inputs(task.i, 1),
            None if task.diagonal else self._inputs(task.j, 2))

  def _split_kwargs(self, task: Task) -> dict[str, Any]:
    rows = self.grid.indices(task.i, 1)
    cols = self.grid.indices(task.j, 2)
    take_rows = lambda a, idx: None if a is None else take(a, idx, 0)
    out = {}
    for name, split in self.split.items():
      value = self.kwargs[name]
      if split == Split.SINGLE:
        out[name] = (take_rows(value, rows) if task.diagonal else
                     (take_rows(value, rows), take_rows(value, cols)))
      elif split == Split.PAIR:
        a1, a2 = value
        if task.diagonal and self.symmetric and (a2 is None or a2 is a1):
          # `x2=None` and `(p, p)` or `(p, None)`: the block pairs `x1_i`
          # with itself, as `(p_i, None)` says.
          out[name] = (take_rows(a1, rows), None)
        elif task.diagonal:
          out[name] = (take_rows(a1, rows), take_rows(a2, rows))
        else:
          col_source = a1 if self.symmetric and a2 is None else a2
          out[name] = (take_rows(a1, rows), take_rows(col_source, cols))
    return out

  # --- running blocks --------------------------------------------------------

  def _run_tasks(self, tasks: Sequence[Task], bar: Any
                 ) -> Iterator[tuple[Task, Any]]:
    """Yields `(task, output)` of every task, `n_devices` at a time."""
    n = self.n_devices if len(tasks) > 1 else 1
    for start in range(0, len(tasks), n):
      chunk = list(tasks[start:start + n])
      self.computed += len(chunk)
      if n == 1:
        task = chunk[0]
        out = self.block_fn.single(
            self.static, *self._block_inputs(task),
            self._split_kwargs(task), self.shared)
        yield task, self._finish_block(out)
      else:
        yield from zip(chunk, self._run_sharded(chunk, n))
      if bar is not None:
        bar.update(len(chunk))

  def _run_sharded(self, chunk: list[Task], n: int) -> list[Any]:
    real = len(chunk)
    padded = chunk + [chunk[-1]] * (n - real)  # Uniform shapes per device.
    mesh = self.block_fn.mesh
    stacked = NamedSharding(mesh, PartitionSpec(_DEVICES))
    put = lambda tree: jax.device_put(tree, stacked)
    pairs = [self._block_inputs(t) for t in padded]
    x1 = put(stack([p[0] for p in pairs]))
    x2 = None if pairs[0][1] is None else put(stack([p[1] for p in pairs]))
    split_kwargs = put(stack([self._split_kwargs(t) for t in padded]))
    shared = jax.device_put(self.shared, NamedSharding(mesh, PartitionSpec()))
    out = self.block_fn.sharded(self.static, x1, x2, split_kwargs, shared)
    if self.on_host:
      out = jax.device_get(out)
      return [jax.tree_util.tree_map(lambda x, t=t: x[t], out)
              for t in range(real)]
    default = self.block_fn.devices[0]
    return [jax.tree_util.tree_map(
        lambda x, t=t: jax.device_put(_shard(x, t), default), out)
            for t in range(real)]

  def _finish_block(self, out: Any) -> Any:
    return jax.device_get(out) if self.on_host else out

  # --- the whole computation -------------------------------------------------

  def _tasks(self, need_lower: bool) -> tuple[list[Task], list[Task]]:
    """`(diagonal tasks, other tasks)`."""
    g = self.grid
    if not self.symmetric:
      return [], [Task(i, j, False) for i in range(g.nb1)
                  for j in range(g.nb2)]
    diagonal = [Task(i, i, True) for i in range(g.nb1)]
    others = [Task(i, j, False) for i in range(g.nb1) for j in range(g.nb1)
              if j > i or (need_lower and j < i)]
    return diagonal, others

  def block_counts(self) -> dict[str, int]:
    """Blocks of this call (see `batch`'s docstring)."""
    g = self.grid
    return {'total': g.nb1 * g.nb2, 'computed': self.computed,
            'from_store': self.from_store, 'processes': self.group.count}

  def run(self) -> Any:
    if self.grid.n1 == 0 or self.grid.n2 == 0:
      return self._run_empty()
    if not self.traced and (self.store is not None or
                            self.group.distributed):
      return self._run_shared()
    first_tasks, other_tasks = self._tasks(need_lower=False)
    n_upper = len(first_tasks) + len(other_tasks)
    bar = None
    if self.progress and not self.traced:
      bar = options.progress_bar_class()(total=n_upper, desc='kernel blocks', unit='block')
    try:
      return self._run(first_tasks, other_tasks, bar)
    finally:
      if bar is not None:
        bar.close()

  def _run(self, diagonal_tasks, other_tasks, bar) -> Any:
    ref_tasks = diagonal_tasks if self.symmetric else other_tasks
    outputs = self._run_tasks(ref_tasks, bar)
    task, ref = next(outputs)
    specs = leaf_specs(ref, self.get, self._representation(), self.analytic)
    assembler = Assembler(specs, self.grid, self.on_host)
    need_lower = self.symmetric and not all(
        s.transposable for s in specs if s.role == Role.PAIR)
    if need_lower:
      assembler.transpose = False
      _, other_tasks = self._tasks(need_lower=True)
      if bar is not None:
        bar.total = len(diagonal_tasks) + len(other_tasks)
        bar.refresh()
    assembler.add(task, ref)
    for task, out in outputs:
      assembler.add(task, out)
    if self.symmetric:
      for task, out in self._run_tasks(other_tasks, bar):
        assembler.add(task, out)
    leaves = assembler.finish()
    leaves = self._full_covariances(specs, leaves)
    out = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(ref),
                                       leaves)
    return self._fix_kernels(out)

  def _run_empty(self) -> Any:
    """`kernel_fn` on inputs without examples: its (empty) output as is."""
    out = self.kernel_fn(self.x1, self.x2, *self.args, **self.kwargs)
    return jax.device_get(out) if self.on_host else out

  # --- several processes and / or an on-disk store -------------------------

  def _block_shapes(self, task: Task) -> Any:
    """The output of `task`'s block as `ShapeDtypeStruct`s, not computed."""
    return jax.eval_shape(
        functools.partial(self.block_fn.call, self.static),
        *self._block_inputs(task), self._split_kwargs(task), self.shared)

  def _run_shared(self) -> Any:
    """Blocks divided over processes; gathered, or written into the store."""
    diagonal, others = self._tasks(need_lower=False)
    first = diagonal[0] if self.symmetric else others[0]
    template = self._block_shapes(first)
    specs = leaf_specs(template, self.get, self._representation(),
                       self.analytic)
    need_lower = self.symmetric and not all(
        s.transposable for s in specs if s.role == Role.PAIR)
    if need_lower:
      _, others = self._tasks(need_lower=True)
    phases = [p for p in ([diagonal, others] if self.symmetric else [others])
              if p]
    store = self._open_store(specs, template) if self.store else None
    assembler = Assembler(specs, self.grid, self.on_host,
                          store and (lambda spec, *a: store.array(spec.path,
                                                                  *a)))
    assembler.transpose = not need_lower
    done = set()
    if store is not None:
      # One process creates the arrays, then every process opens them, and
      # all read the same record of complete blocks before any writes.
      if self.group.index == 0:
        assembler.allocate_all(jax.tree_util.tree_leaves(template))
      self.group.barrier('nt.batch: store arrays created')
      if self.group.index != 0:
        assembler.allocate_all(jax.tree_util.tree_leaves(template))
      done = store.completed()
      self.group.barrier('nt.batch: store record read')
    bar = None
    if self.progress:
      bar = options.progress_bar_class()(
          total=sum(map(len, phases)), desc='kernel blocks', unit='block')
    dealt = 0
    try:
      for phase in phases:
        missing = [t for t in phase if (t.i, t.j) not in done]
        self.from_store += len(phase) - len(missing)
        if bar is not None:
          bar.update(len(phase) - len(missing))
        if not missing:  # The same on every process: they all read `done`.
          continue
        arranged = self.group.arrange(missing, dealt)
        dealt += len(missing)
        if store is not None:
          for task, out in self._run_tasks(self.group.share(arranged), bar):
            assembler.add(task, out)
            store.mark_complete(task, assembler.take_written())
        else:
          self._gather(arranged, self._block_shapes(phase[0]), assembler,
                       bar)
    finally:
      if bar is not None:
        bar.close()
    if store is not None:
      self.group.barrier('nt.batch: store complete')
      leaves = assembler.host
      if self.store_on_device:
        leaves = [jax.numpy.asarray(leaf[...]) for leaf in leaves]
    else:
      leaves = assembler.finish()
    leaves = self._full_covariances(specs, leaves)
    out = jax.tree_util.tree_unflatten(
        jax.tree_util.tree_structure(template), leaves)
    return self._fix_kernels(out)

  def _gather(self, tasks: list[Optional[Task]], template: Any,
              assembler: Assembler, bar: Any) -> None:
    """Computes this process's share of arranged `tasks`; all add every one."""
    outputs = self._run_tasks(self.group.share(tasks), bar)
    zeros = jax.tree_util.tree_map(lambda s: np.zeros(s.shape, s.dtype),
                                   template)
    for r in range(self.group.rounds(tasks)):
      owners = self.group.owner_tasks(tasks, r)
      mine = zeros if owners[self.group.index] is None else (
          jax.device_get(next(outputs)[1]))
      gathered = self.group.gather(mine)
      for p, task in enumerate(owners):
        if task is None:
          continue
        block = jax.tree_util.tree_map(lambda x, p=p: np.asarray(x[p]),
                                       gathered)
        if not self.on_host:
          block = jax.device_put(block, self.block_fn.devices[0])
        assembler.add(task, block)

  def _open_store(self, specs: list[LeafSpec], template: Any) -> Store:
    """The store of this call, created by process 0 and checked by all."""
    for spec, leaf in zip(specs, jax.tree_util.tree_leaves(template)):
      if spec.role in (Role.MASK1, Role.MASK2) or (
          spec.role in (Role.SELF1, Role.SELF2) and not spec.diagonal_batch):
        raise ValueError(
            f'`store=` holds kernels between examples; output '
            f'{spec.path or "array"} of shape {leaf.shape} is a '
            f'{spec.role.name.lower()} leaf, which a store does not hold. '
            "Ask for `get='nngp'`/`'ntk'` (with diagonal_batch=True), or "
            'pass store=None.')
    store = Store(self.store, fingerprint_of(
        self.kernel_fn, (self.x1, self.x2), self.args, self.kwargs,
        self.batch_size))
    if self.group.index == 0:
      store.create()
    self.group.barrier('nt.batch: store created')
    store.check()
    return store

  def _full_covariances(self, specs: list[LeafSpec],
                        leaves: list[Any]) -> list[Any]:
    """`(N, N, ...)` covariances of `x1`, `x2`: their NNGP with themselves."""
    needed = {s.role for s in specs if s.role in (Role.SELF1, Role.SELF2)
              and not s.diagonal_batch}
    if not needed:
      return leaves
    full = {}
    for role in sorted(needed, key=lambda r: r.value):
      side = 1 if role == Role.SELF1 or self.symmetric else 2
      if side == 1 and Role.SELF1 in full:
        full[role] = full[Role.SELF1]
        continue
      full[role] = self._nngp_with_itself(side)
    return [full[s.role] if s.role in full and not s.diagonal_batch else leaf
            for s, leaf in zip(specs, leaves)]

  def _nngp_with_itself(self, side: int) -> Any:
    x = self.x1 if side == 1 else self.x2
    args, kwargs = list(self.args), dict(self.kwargs)
    if 'get' in kwargs or not args:
      kwargs['get'] = 'nngp'
    else:
      args[0] = 'nngp'
    for name, split in self.split.items():
      if split == Split.PAIR:
        kwargs[name] = (self.kwargs[name][side - 1], None)
    return Computation(
        self.kernel_fn, self.block_fn, x, None, args, kwargs, self.batch_size,
        not self.on_host, self.progress).run()

  def _fix_kernels(self, out: Any) -> Any:
    """Full batch sizes in `shape1` / `shape2` of the output `Kernel`s."""
    def fix(k):
      if not isinstance(k, Kernel):
        return k
      def full(shape, n):
        shape = list(shape)
        if shape:
          shape[k.batch_axis % len(shape)] = n
        return tuple(shape)
      return k.replace(shape1=full(k.shape1, self.grid.n1),
                       shape2=full(k.shape2, self.grid.n2))
    return jax.tree_util.tree_map(fix, out,
                                  is_leaf=lambda x: isinstance(x, Kernel))


class KernelComputation(Computation):
  """A batched call on an input `Kernel` (or a list/tuple tree of them).

  Block `(i, j)` is the input kernel sliced (`Kernel.slice`) to examples
  `i` of `x1` and `j` of `x2`; diagonal blocks of a kernel with `x1_is_x2`
  keep `x1_is_x2`, so that the grid is symmetric as for `x2=None`.
  """

  def _examples(self, x1: Any, x2: Any) -> tuple[int, int]:
    del x2
    first = _kernels(x1)[0]
    self.symmetric = first.x1_is_x2
    return first.nngp.shape[0], first.nngp.shape[1]

  def _representation(self) -> dict[str, Any]:
    # Kernel functions keep the representation of the kernel they are given.
    first = _kernels(self.x1)[0]
    return {'diagonal_batch': first.diagonal_batch,
            'diagonal_spatial': first.diagonal_spatial}

  def _block_inputs(self, task: Task) -> tuple[Any, Any]:
    rows = self.grid.indices(task.i, 1)
    cols = rows if task.diagonal else self.grid.indices(task.j, 2)
    return _map_kernels(lambda k: k.slice(rows, cols), self.x1), None

  def _nngp_with_itself(self, side: int) -> Any:
    """The NNGP of the kernel of `x1` (or `x2`) with itself."""
    def self_kernel(k):
      if side == 2 and k.cov2 is not None:
        k = k.replace(cov1=k.cov2, shape1=k.shape2, mask1=k.mask2)
      return k.replace(nngp=k.cov1, ntk=None, cov2=None, x1_is_x2=True,
                       shape2=k.shape1, mask2=k.mask1)
    args, kwargs = list(self.args), dict(self.kwargs)
    if 'get' in kwargs or not args:
      kwargs['get'] = 'nngp'
    else:
      args[0] = 'nngp'
    return KernelComputation(
        self.kernel_fn, self.block_fn, _map_kernels(self_kernel, self.x1),
        None, args, kwargs, self.batch_size, not self.on_host,
        self.progress).run()


def _kernels(tree: Any) -> list[Kernel]:
  return [k for k in jax.tree_util.tree_leaves(
      tree, is_leaf=lambda x: isinstance(x, Kernel)) if isinstance(k, Kernel)]


def _map_kernels(fn: Callable[[Kernel], Any], tree: Any) -> Any:
  return jax.tree_util.tree_map(fn, tree,
                                is_leaf=lambda x: isinstance(x, Kernel))


def _is_get(x: Any) -> bool:
  """Whether a positional argument is `get` (not, e.g., `params`)."""
  if x is None or isinstance(x, str):
    return True
  return (isinstance(x, (tuple, list)) and bool(x) and
          all(isinstance(n, str) for n in x))


def _shard(x: jax.Array, t: int) -> jax.Array:
  """Block `t` of an array sharded one block per device, on its device."""
  for shard in x.addressable_shards:
    start = shard.index[0].start or 0
    if start == t:
      return shard.data[0]
  return x[t]
