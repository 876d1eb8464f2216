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
`batching_split` and `batching_assembly`.

Example:
  >>> _, _, kernel_fn = stax.serial(stax.Dense(512), stax.Relu(),
  ...                               stax.Dense(1))
  >>> batched_kernel_fn = nt.batch(kernel_fn, batch_size=2)
  >>> ntk = batched_kernel_fn(x1, x2, 'ntk')  # 2 x 1 blocks
  >>> bool(jnp.allclose(ntk, kernel_fn(x1, x2, 'ntk'), rtol=1e-5))
  True
"""
import functools
from typing import Any, Callable, Iterator, Optional, Sequence

import jax
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec
import numpy as np

from neural_tangents._src.utils import arguments
from neural_tangents._src import empirical
# The block splitting and assembly, re-exported: this module keeps every name.
# pylint: disable=unused-import
from neural_tangents._src.batching_assembly import _assemble_on_device
from neural_tangents._src.batching_assembly import _Assembler
from neural_tangents._src.batching_assembly import _concatenate_pairs
from neural_tangents._src.batching_assembly import _FIELD_ROLES
from neural_tangents._src.batching_assembly import _key_name
from neural_tangents._src.batching_assembly import _leaf_specs
from neural_tangents._src.batching_assembly import _LeafSpec
from neural_tangents._src.batching_assembly import _Role
from neural_tangents._src.batching_assembly import _transpose_pair
from neural_tangents._src.batching_split import _classify_kwarg
from neural_tangents._src.batching_split import _Grid
from neural_tangents._src.batching_split import _hashable
from neural_tangents._src.batching_split import _is_array
from neural_tangents._src.batching_split import _is_key
from neural_tangents._src.batching_split import _leading_dim_is
from neural_tangents._src.batching_split import _leaves_with_axes
from neural_tangents._src.batching_split import _REPRESENTATION_KWARGS
from neural_tangents._src.batching_split import _SHARED_KWARGS
from neural_tangents._src.batching_split import _Split
from neural_tangents._src.batching_split import _stack
from neural_tangents._src.batching_split import _Static
from neural_tangents._src.batching_split import _take
from neural_tangents._src.batching_split import _Task
from neural_tangents._src.batching_split import merge_static
from neural_tangents._src.batching_split import partition_static
# pylint: enable=unused-import
from neural_tangents._src.stax import protocol
from neural_tangents._src.stax import requirements
from neural_tangents._src.utils.kernel import Kernel

# Name of the mesh axis that blocks are spread over.
_DEVICES = 'devices'


def batch(kernel_fn: Callable[..., Any],
          batch_size: int = 0,
          device_count: int = -1,
          store_on_device: bool = True,
          *,
          progress: bool = False) -> Callable[..., Any]:
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
  _check_batch_size(batch_size)
  devices = _devices(device_count)
  if not isinstance(store_on_device, (bool, np.bool_)):
    raise TypeError(f'`store_on_device` must be a bool; got '
                    f'{store_on_device!r}. Pass True or False.')
  if progress:
    _tqdm()  # Fails now, not in the middle of a computation.
  return _batched(kernel_fn, batch_size or None, devices,
                  bool(store_on_device), progress)


def _batched(kernel_fn: Callable[..., Any], batch_size: Optional[int],
             devices: Sequence[Any], store_on_device: bool,
             progress: bool) -> Callable[..., Any]:
  """`batch` without argument checks; `batch_size=None` is one block."""
  block_fn = _BlockFunction(kernel_fn, devices)

  @functools.wraps(kernel_fn)
  def batched_kernel_fn(x1_or_kernel: Any, x2: Any = None, *args,
                        **kwargs) -> Any:
    computation_type = _Computation
    if requirements.is_kernel_tree(x1_or_kernel):
      if x2 is not None:
        raise TypeError(
            'A batched kernel function called on a `Kernel` takes `x2=None` '
            f'(the kernel holds both inputs); got x2 of type '
            f'{type(x2).__name__}. Call it as `batched_kernel_fn(k, None, '
            'get)`.')
      computation_type = _KernelComputation
    elif (getattr(kernel_fn, 'takes_rng_pairs', False) and
          empirical.is_single_key(kwargs.get('rng'))):
      # Blocks see slices of `x1` and `x2`, so they cannot tell whether
      # `x2` is `x1`: the keys of the whole call are chosen here.
      kwargs = {**kwargs,
                'rng': empirical.read_rng(kwargs['rng'], x1_or_kernel, x2)}
    computation = computation_type(kernel_fn, block_fn, x1_or_kernel, x2,
                                   args, kwargs, batch_size, store_on_device,
                                   progress)
    return computation.run()

  return batched_kernel_fn


# -----------------------------------------------------------------------------
# Argument checks.


def _check_batch_size(batch_size: Any) -> None:
  if isinstance(batch_size, bool) or not isinstance(batch_size,
                                                    (int, np.integer)):
    raise TypeError(f'`batch_size` must be an int; got {batch_size!r}. Pass '
                    'the number of examples per block, or 0 for no batching.')
  if batch_size < 0:
    raise ValueError(f'`batch_size` must be >= 0; got {batch_size}. Pass the '
                     'number of examples per block, or 0 for no batching.')


def _devices(device_count: Any) -> list[Any]:
  """The local devices that `device_count` asks for."""
  if isinstance(device_count, bool) or not isinstance(device_count,
                                                      (int, np.integer)):
    raise TypeError(f'`device_count` must be an int; got {device_count!r}. '
                    'Pass -1 to use every local device.')
  local = jax.local_devices()
  if device_count == -1:
    return local
  if device_count < -1:
    raise ValueError(f'`device_count` must be -1 (every device) or between 0 '
                     f'and {len(local)}; got {device_count}. Pass -1 to use '
                     'every local device.')
  if device_count > len(local):
    raise ValueError(
        f'`device_count`={device_count} is larger than the {len(local)} local '
        f'device(s) present ({jax.default_backend()}). Pass -1 to use every '
        f'local device, or a number up to {len(local)}.')
  return local[:max(device_count, 1)]


def _tqdm() -> Callable[..., Any]:
  try:
    import tqdm  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ImportError(
        '`progress=True` needs the `tqdm` package, which is not installed. '
        'Run `pip install tqdm`, or pass progress=False.') from None
  return tqdm.tqdm


# -----------------------------------------------------------------------------
# Computing blocks: jitted, one device or sharded over several.


class _BlockFunction:
  """`kernel_fn` on a block, jitted once per batched function.

  Calls are `(static, x1, x2, split_kwargs, shared_arrays)`, with
  `merge_static(static, shared_arrays) == (args, shared_kwargs)`.
  """

  def __init__(self, kernel_fn: Callable[..., Any], devices: Sequence[Any]):
    self.kernel_fn = kernel_fn
    self.devices = list(devices)
    self.single = jax.jit(self._call, static_argnums=0)
    if len(self.devices) > 1:
      self.mesh = Mesh(np.array(self.devices), (_DEVICES,))
      self.sharded = jax.jit(self._call_sharded, static_argnums=0)

  def _call(self, static: _Static, x1: Any, x2: Any, split_kwargs: Any,
            shared: Sequence[Any]) -> Any:
    args, kwargs = merge_static(static, shared)
    return self.kernel_fn(x1, x2, *args, **kwargs, **split_kwargs)

  def _call_sharded(self, static: _Static, x1: Any, x2: Any,
                    split_kwargs: Any, shared: Sequence[Any]) -> Any:
    """Inputs stacked on a leading device axis: one block per device."""
    def local(x1, x2, split_kwargs, shared):
      first = lambda tree: jax.tree_util.tree_map(lambda x: x[0], tree)
      out = self._call(static, first(x1), first(x2), first(split_kwargs),
                       shared)
      return jax.tree_util.tree_map(lambda x: x[None], out)

    stacked = PartitionSpec(_DEVICES)
    return jax.shard_map(
        local, mesh=self.mesh,
        in_specs=(stacked, stacked, stacked, PartitionSpec()),
        out_specs=stacked, check_vma=False)(x1, x2, split_kwargs, shared)



# -----------------------------------------------------------------------------
# One batched call.


class _Computation:
  """Computes and assembles the blocks of one call of a batched kernel_fn."""

  def __init__(self, kernel_fn, block_fn, x1, x2, args, kwargs, batch_size,
               store_on_device, progress):
    self.kernel_fn = kernel_fn
    self.block_fn = block_fn
    self.x1, self.x2 = x1, x2
    self.args, self.kwargs = tuple(args), dict(kwargs)
    self.batch_size = batch_size
    self.progress = progress
    self.symmetric = x2 is None

    n1, n2 = self._examples(x1, x2)
    b1 = n1 if batch_size is None else min(batch_size, n1)
    b2 = n2 if batch_size is None else min(batch_size, n2)
    self.grid = _Grid(n1, n2, b1, b2, self.symmetric)

    traced = any(isinstance(x, jax.core.Tracer) for x in
                 jax.tree_util.tree_leaves((x1, x2, args, kwargs)))
    # Inside a trace (e.g. this batched function jitted, or composed with
    # another batched function) blocks stay traced values: no host storage,
    # no device placement of our own.
    self.traced = traced
    self.on_host = not store_on_device and not traced
    self.n_devices = 1 if traced else len(block_fn.devices)

    self.split = {
        name: _classify_kwarg(name, value, n1, n2, self.symmetric)
        for name, value in self.kwargs.items()}
    shared_kwargs = {name: value for name, value in self.kwargs.items()
                     if self.split[name] == _Split.SHARED}
    self.static, self.shared = partition_static((self.args, shared_kwargs))
    self.get = self._get()
    self.analytic = protocol.is_layer_kernel_fn(kernel_fn)

  # --- inputs ---------------------------------------------------------------

  def _examples(self, x1: Any, x2: Any) -> tuple[int, int]:
    """`(N1, N2)`; sets `symmetric` and the inputs' batch axes."""
    self.axes1 = requirements.input_batch_axes(self.kernel_fn, x1)
    self.axes2 = (self.axes1 if x2 is None else
                  requirements.input_batch_axes(self.kernel_fn, x2))
    n1 = self._count(x1, self.axes1, 'x1')
    n2 = n1 if x2 is None else self._count(x2, self.axes2, 'x2')
    return n1, n2

  def _count(self, x: Any, axes: Any, name: str) -> int:
    leaves = _leaves_with_axes(x, axes)
    if not leaves or not all(_is_array(l) for l, _ in leaves):
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
            lambda l: _take(l, indices, a), xi), axes, x)

  def _representation(self) -> dict[str, Any]:
    """The `diagonal_batch` / `diagonal_spatial` of the outputs."""
    return self.kwargs

  def _block_inputs(self, task: _Task) -> tuple[Any, Any]:
    """`(x1, x2)` of a block; `x2` is None on a symmetric grid's diagonal."""
    return (self._inputs(task.i, 1),
            None if task.diagonal else self._inputs(task.j, 2))

  def _split_kwargs(self, task: _Task) -> dict[str, Any]:
    rows = self.grid.indices(task.i, 1)
    cols = self.grid.indices(task.j, 2)
    take = lambda a, idx: None if a is None else _take(a, idx, 0)
    out = {}
    for name, split in self.split.items():
      value = self.kwargs[name]
      if split == _Split.SINGLE:
        out[name] = (take(value, rows) if task.diagonal else
                     (take(value, rows), take(value, cols)))
      elif split == _Split.PAIR:
        a1, a2 = value
        if task.diagonal:
          out[name] = (take(a1, rows), take(a2, rows))
        else:
          col_source = a1 if self.symmetric and a2 is None else a2
          out[name] = (take(a1, rows), take(col_source, cols))
    return out

  # --- running blocks --------------------------------------------------------

  def _run_tasks(self, tasks: Sequence[_Task], bar: Any
                 ) -> Iterator[tuple[_Task, Any]]:
    """Yields `(task, output)` of every task, `n_devices` at a time."""
    n = self.n_devices if len(tasks) > 1 else 1
    for start in range(0, len(tasks), n):
      chunk = list(tasks[start:start + n])
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

  def _run_sharded(self, chunk: list[_Task], n: int) -> list[Any]:
    real = len(chunk)
    padded = chunk + [chunk[-1]] * (n - real)  # Uniform shapes per device.
    mesh = self.block_fn.mesh
    stacked = NamedSharding(mesh, PartitionSpec(_DEVICES))
    put = lambda tree: jax.device_put(tree, stacked)
    pairs = [self._block_inputs(t) for t in padded]
    x1 = put(_stack([p[0] for p in pairs]))
    x2 = None if pairs[0][1] is None else put(_stack([p[1] for p in pairs]))
    split_kwargs = put(_stack([self._split_kwargs(t) for t in padded]))
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

  def _tasks(self, need_lower: bool) -> tuple[list[_Task], list[_Task]]:
    """`(diagonal tasks, other tasks)`."""
    g = self.grid
    if not self.symmetric:
      return [], [_Task(i, j, False) for i in range(g.nb1)
                  for j in range(g.nb2)]
    diagonal = [_Task(i, i, True) for i in range(g.nb1)]
    others = [_Task(i, j, False) for i in range(g.nb1) for j in range(g.nb1)
              if j > i or (need_lower and j < i)]
    return diagonal, others

  def run(self) -> Any:
    first_tasks, other_tasks = self._tasks(need_lower=False)
    n_upper = len(first_tasks) + len(other_tasks)
    bar = None
    if self.progress and not self.traced:
      bar = _tqdm()(total=n_upper, desc='kernel blocks', unit='block')
    try:
      return self._run(first_tasks, other_tasks, bar)
    finally:
      if bar is not None:
        bar.close()

  def _run(self, diagonal_tasks, other_tasks, bar) -> Any:
    ref_tasks = diagonal_tasks if self.symmetric else other_tasks
    outputs = self._run_tasks(ref_tasks, bar)
    task, ref = next(outputs)
    specs = _leaf_specs(ref, self.get, self._representation(), self.analytic)
    assembler = _Assembler(specs, self.grid, self.on_host)
    need_lower = self.symmetric and not all(
        s.transposable for s in specs if s.role == _Role.PAIR)
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

  def _full_covariances(self, specs: list[_LeafSpec],
                        leaves: list[Any]) -> list[Any]:
    """`(N, N, ...)` covariances of `x1`, `x2`: their NNGP with themselves."""
    needed = {s.role for s in specs if s.role in (_Role.SELF1, _Role.SELF2)
              and not s.diagonal_batch}
    if not needed:
      return leaves
    full = {}
    for role in sorted(needed, key=lambda r: r.value):
      side = 1 if role == _Role.SELF1 or self.symmetric else 2
      if side == 1 and _Role.SELF1 in full:
        full[role] = full[_Role.SELF1]
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
      if split == _Split.PAIR:
        kwargs[name] = (self.kwargs[name][side - 1], None)
    return _Computation(
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


class _KernelComputation(_Computation):
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

  def _block_inputs(self, task: _Task) -> tuple[Any, Any]:
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
    return _KernelComputation(
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
