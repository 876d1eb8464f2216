"""One call of a batched kernel function, cut into the arguments of its blocks.

`Call(kernel_fn, x1, x2, args, kwargs, batch_size)` reads the call once: the
number of examples of `x1` and `x2` along their batch axes, the block grid
(`Grid`), whether the call is traced (under `jax.jit`), which keyword
arguments are split with the blocks (`classify_kwarg`) and the static part
and the arrays of the rest (`partition_static`). Then, for every block
`Task(i, j, diagonal)`,

  kernel_fn(x1_i, x2_j, *args, **kwargs_ij) = block_fn.call(
      call.static, *call.inputs(task), call.split_kwargs(task), call.shared)

with `x2_j = None` on the diagonal of a symmetric call. `KernelCall` is the
same for a call on an input `Kernel`, sliced rather than its inputs.

Example:
  >>> call = Call(lambda x1, x2=None, get=None: x1, jnp.ones((5, 3)), None,
  ...             ('ntk',), {}, 2)
  >>> call.grid.nb1, call.inputs(Task(2, 2, True))[0].shape
  (3, (2, 3))
"""
from typing import Any, Callable, Optional

import jax

from neural_tangents._src.batching.splitting import classify_kwarg
from neural_tangents._src.batching.splitting import Grid
from neural_tangents._src.batching.splitting import is_array
from neural_tangents._src.batching.splitting import leaves_with_axes
from neural_tangents._src.batching.splitting import partition_static
from neural_tangents._src.batching.splitting import Split
from neural_tangents._src.batching.splitting import take
from neural_tangents._src.batching.splitting import Task
from neural_tangents._src.stax import inputs
from neural_tangents._src.stax import protocol
from neural_tangents._src.utils.kernel import Kernel


class Call:
  """`kernel_fn(x1, x2, *args, **kwargs)`, cut into blocks of `batch_size`.

  Attributes:
    kernel_fn: the kernel function.
    x1, x2: the inputs (`x2` may be None).
    args, kwargs: the other arguments.
    batch_size: examples per block, or None for one block.
    symmetric: whether blocks `(j, i)` mirror blocks `(i, j)` (`x2=None`).
    grid: the block grid.
    traced: whether an argument is a tracer (the call is under a trace).
    split: how each keyword argument is split (`Split`).
    static, shared: the static part and the arrays of the arguments shared
      by every block (`partition_static`).
    get: the `get` of the call, or None.
    analytic: whether `kernel_fn` is a layer's (its outputs have the analytic
      layout, so blocks below the diagonal are transposes).
  """

  def __init__(self, kernel_fn: Callable[..., Any], x1: Any, x2: Any,
               args: Any, kwargs: dict[str, Any],
               batch_size: Optional[int], store: Optional[Any] = None):
    """Reads the call.

    Args:
      kernel_fn: the kernel function.
      x1, x2: its inputs (`x2` may be None).
      args, kwargs: its other arguments.
      batch_size: examples per block, or None for one block.
      store: the `store=` of the call, if any (it needs untraced inputs).

    Raises:
      TypeError: if an input is not an array, or an argument that is not an
        array is not hashable.
      ValueError: if inputs disagree on their number of examples, or a store
        is asked for under a trace.
    """
    self.kernel_fn = kernel_fn
    self.x1, self.x2 = x1, x2
    self.args, self.kwargs = tuple(args), dict(kwargs)
    self.batch_size = batch_size
    self.symmetric = x2 is None

    n1, n2 = self._examples(x1, x2)
    # No examples: one (empty) block, computed by `kernel_fn` as is.
    b1 = max(1, n1 if batch_size is None else min(batch_size, n1))
    b2 = max(1, n2 if batch_size is None else min(batch_size, n2))
    self.grid = Grid(n1, n2, b1, b2, self.symmetric)
    # Inside a trace (e.g. this batched function jitted, or composed with
    # another batched function) blocks stay traced values: no host storage,
    # no device placement of our own.
    self.traced = any(isinstance(x, jax.core.Tracer) for x in
                      jax.tree_util.tree_leaves((x1, x2, args, kwargs)))
    if self.traced and store is not None:
      raise ValueError(
          f'`store={store!r}` needs concrete inputs; this batched kernel '
          'function was called inside a trace (e.g. under `jax.jit`). Call '
          'it outside of `jit`, or pass store=None.')

    self.split = {
        name: classify_kwarg(name, value, n1, n2, self.symmetric)
        for name, value in self.kwargs.items()}
    shared_kwargs = {name: value for name, value in self.kwargs.items()
                     if self.split[name] == Split.SHARED}
    self.static, self.shared = partition_static((self.args, shared_kwargs))
    self.get = self._get()
    self.analytic = protocol.is_layer_kernel_fn(kernel_fn)

  # --- the whole call --------------------------------------------------------

  def _examples(self, x1: Any, x2: Any) -> tuple[int, int]:
    """`(N1, N2)`; sets the inputs' batch axes."""
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

  def representation(self) -> dict[str, Any]:
    """The `diagonal_batch` / `diagonal_spatial` of the outputs."""
    return self.kwargs

  def with_itself(self, side: int) -> 'Call':
    """The call of the NNGP of `x1` (`side=1`) or `x2` with itself.

    Its output is the `(N, N, ...)` covariance `cov1` (`cov2`) of a call with
    `diagonal_batch=False`.
    """
    x = self.x1 if side == 1 else self.x2
    args, kwargs = self._nngp_arguments()
    for name, split in self.split.items():
      if split == Split.PAIR:
        kwargs[name] = (self.kwargs[name][side - 1], None)
    return Call(self.kernel_fn, x, None, args, kwargs, self.batch_size)

  def _nngp_arguments(self) -> tuple[list[Any], dict[str, Any]]:
    """The arguments of this call with `get='nngp'`."""
    args, kwargs = list(self.args), dict(self.kwargs)
    if 'get' in kwargs or not args:
      kwargs['get'] = 'nngp'
    else:
      args[0] = 'nngp'
    return args, kwargs

  def compute_whole(self) -> Any:
    """`kernel_fn` on the whole inputs, unbatched."""
    return self.kernel_fn(self.x1, self.x2, *self.args, **self.kwargs)

  # --- one block -------------------------------------------------------------

  def _inputs_of(self, i: int, side: int) -> Any:
    x, axes = (self.x1, self.axes1) if side == 1 or self.symmetric else (
        self.x2, self.axes2)
    indices = self.grid.indices(i, side)
    # `axes` is a prefix of `x`: one axis per input, which may be a pytree
    # (e.g. a `MaskedArray` of values and mask).
    return jax.tree_util.tree_map(
        lambda a, xi: jax.tree_util.tree_map(
            lambda l: take(l, indices, a), xi), axes, x)

  def inputs(self, task: Task) -> tuple[Any, Any]:
    """`(x1, x2)` of a block; `x2` is None on a symmetric grid's diagonal."""
    return (self._inputs_of(task.i, 1),
            None if task.diagonal else self._inputs_of(task.j, 2))

  def split_kwargs(self, task: Task) -> dict[str, Any]:
    """The keyword arguments split with the blocks, for block `task`."""
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


class KernelCall(Call):
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

  def representation(self) -> dict[str, Any]:
    # Kernel functions keep the representation of the kernel they are given.
    first = _kernels(self.x1)[0]
    return {'diagonal_batch': first.diagonal_batch,
            'diagonal_spatial': first.diagonal_spatial}

  def inputs(self, task: Task) -> tuple[Any, Any]:
    rows = self.grid.indices(task.i, 1)
    cols = rows if task.diagonal else self.grid.indices(task.j, 2)
    return _map_kernels(lambda k: k.slice(rows, cols), self.x1), None

  def with_itself(self, side: int) -> 'KernelCall':
    """The call of the NNGP of the kernel of `x1` (or `x2`) with itself."""
    def self_kernel(k):
      if side == 2 and k.cov2 is not None:
        k = k.replace(cov1=k.cov2, shape1=k.shape2, mask1=k.mask2)
      return k.replace(nngp=k.cov1, ntk=None, cov2=None, x1_is_x2=True,
                       shape2=k.shape1, mask2=k.mask1)
    args, kwargs = self._nngp_arguments()
    return KernelCall(self.kernel_fn, _map_kernels(self_kernel, self.x1),
                      None, args, kwargs, self.batch_size)


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
