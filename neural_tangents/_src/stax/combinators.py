"""Layers made of layers: `serial`, `parallel` and `repeat`.

A combinator is itself a layer `(init_fn, apply_fn, kernel_fn)`, whose
`KernelSpec` is built from its layers' by `protocol.compose` (`serial`),
`protocol.in_parallel` (`parallel`) and `protocol.repeated` (`repeat`).
"""
import dataclasses
from typing import Any, Callable, NamedTuple, Optional, Sequence

import jax
from jax import lax
from jax import random
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.stax import protocol
from neural_tangents._src.stax import requirements
from neural_tangents._src.stax.protocol import kernel_op_of
from neural_tangents._src.stax.protocol import kernel_spec
from neural_tangents._src.utils import arguments
from neural_tangents._src.utils.kernel import Kernel
from neural_tangents._src.utils.typing import Layer


def _split_rng(rng: Any, n: int) -> list[Any]:
  """`n` independent keys, or `n` Nones when no key is given."""
  if rng is None:
    return [None] * n
  return list(random.split(rng, n))


@requirements.layer
def serial(*layers: Layer, fold_repeats: bool = True) -> Layer:
  """Composes layers: `serial(f, g)(x) = g(f(x))`, for finite and infinite nets.

  Params are a list with one entry per layer, `init_fn` splitting its key
  sequentially (`rng, layer_rng = split(rng)`) as `jax.example_libraries.stax`
  does. `apply_fn` splits an `rng=` keyword into one key per layer. The kernel
  is the composition of the layers' kernel maps.

  Runs of two or more identical consecutive layers (the same layer object
  repeated, or the same sequence of layer objects repeated, as in
  `serial(*[Dense(512), Relu()] * depth)`) have their kernel evaluated with one
  `lax.scan`, as `repeat` does, so deep networks compile in constant time.
  Params, `init_fn` and `apply_fn` are unaffected.

  Args:
    *layers: layers `(init_fn, apply_fn, kernel_fn)`.
    fold_repeats: whether to scan repeated runs in `kernel_fn`; `False`
      unrolls every layer (for comparison and debugging).

  Returns:
    The composed layer.

  Example:
    >>> init_fn, apply_fn, kernel_fn = stax.serial(
    ...     stax.Dense(512), stax.Relu(), stax.Dense(1))
    >>> kernel_fn(jnp.ones((2, 3)), None, 'ntk').shape
    (2, 2)
  """
  layers = arguments.layers(layers, 'serial')
  init_fns = [l[0] for l in layers]
  apply_fns = [l[1] for l in layers]
  kernel_ops = [kernel_op_of(l[2]) for l in layers]

  def init_fn(rng, input_shape):
    params, rng = [], arguments.prng_key(rng)
    for layer_init_fn in init_fns:
      rng, layer_rng = random.split(rng)
      input_shape, param = layer_init_fn(layer_rng, input_shape)
      params.append(param)
    return input_shape, params

  def apply_fn(params, inputs, **kwargs):
    if not isinstance(params, (list, tuple)) or len(params) != len(layers):
      got = (f'{len(params)} entries' if isinstance(params, (list, tuple))
             else f'a {type(params).__name__}')
      raise ValueError(
          f'`params` of `serial` of {len(layers)} layers must be a list with '
          f'one entry per layer ({len(layers)} entries); got {got}. Pass the '
          'params that this `serial`\'s `init_fn` returns.')
    rngs = _split_rng(kwargs.pop('rng', None), len(apply_fns))
    for layer_apply_fn, param, rng in zip(apply_fns, params, rngs):
      inputs = layer_apply_fn(param, inputs, rng=rng, **kwargs)
    return inputs

  segments = (fold_runs(kernel_ops) if fold_repeats else
              [(op, 1) for op in kernel_ops])

  def kernel_fn(k, **kwargs):
    previous = None
    for op, count in segments:
      first, last = _ends(op)
      requirements.check_representation(previous, first, k)
      k = _apply_run(op, count, k, **kwargs)
      if count > 1:  # The block also reads its own output.
        requirements.check_representation(last, first, k)
      previous = last
    return k

  spec = protocol.compose([kernel_spec(op) for op in kernel_ops])
  return init_fn, apply_fn, protocol.with_spec(kernel_fn, spec)


@dataclasses.dataclass(frozen=True)
class _Block:
  """Kernel ops applied in order: one period of a repeated run."""
  ops: tuple[Callable, ...]

  def __call__(self, k: Any, **kwargs) -> Any:
    previous = None
    for op in self.ops:
      requirements.check_representation(previous, op, k)
      k = op(k, **kwargs)
      previous = op
    return k


def _ends(op: Callable) -> tuple[Callable, Callable]:
  """The first and last layer ops of an op or of a `_Block`."""
  ops = op.ops if isinstance(op, _Block) else (op,)
  return ops[0], ops[-1]


def fold_runs(ops: Sequence[Callable]) -> list[tuple[Callable, int]]:
  """Groups `ops` into `(block, count)`: `block` applied `count` times.

  A run is a block of one or more ops (compared by identity) repeated at least
  twice in a row; at each position the block covering the most ops is taken.

  Args:
    ops: kernel ops in application order.

  Returns:
    `(op, count)` pairs whose successive application equals `ops`.
  """
  segments, i, n = [], 0, len(ops)
  while i < n:
    best_period, best_count = 1, 1
    for period in range(1, (n - i) // 2 + 1):
      count = 1
      while (i + (count + 1) * period <= n and all(
          ops[i + count * period + j] is ops[i + j] for j in range(period))):
        count += 1
      if count > 1 and period * count > best_period * best_count:
        best_period, best_count = period, count
    block = ops[i:i + best_period]
    segments.append((block[0] if best_period == 1 else _Block(tuple(block)),
                     best_count))
    i += best_period * best_count
  return segments


def _apply_run(op: Callable, count: int, k: Any, **kwargs) -> Any:
  """`op` applied `count` times; scanned when its kernel reaches a fixed point."""
  if count == 1:
    return op(k, **kwargs)
  try:
    return _scan_kernel_op(op, count, k, 'serial', **kwargs)
  except _NotAFixedPoint:
    for _ in range(count):
      k = op(k, **kwargs)
    return k


@requirements.layer
def parallel(*layers: Layer) -> Layer:
  """Applies layer `i` to input `i` of a list/tuple of inputs.

  Inputs, output shapes, outputs and kernels keep the container type they were
  given (a tuple stays a tuple, a list a list); params are a tuple with one
  entry per layer.

  Args:
    *layers: layers `(init_fn, apply_fn, kernel_fn)`, one per input.

  Returns:
    The parallel layer.

  Example:
    >>> _, apply_fn, kernel_fn = stax.parallel(stax.Dense(3), stax.Identity())
    >>> k = kernel_fn([jnp.ones((2, 4)), jnp.ones((2, 5))])
    >>> type(k), len(k)
    (<class 'list'>, 2)
  """
  init_fns = [l[0] for l in layers]
  apply_fns = [l[1] for l in layers]
  kernel_ops = [kernel_op_of(l[2]) for l in layers]

  def check(xs, name):
    if not isinstance(xs, (list, tuple)) or len(xs) != len(layers):
      raise ValueError(
          f'`parallel` of {len(layers)} layers needs a list or tuple of '
          f'{len(layers)} {name}; got {type(xs).__name__}'
          f'{f" of length {len(xs)}" if isinstance(xs, (list, tuple)) else ""}'
          '. Put `FanOut(n)` before `parallel` to feed one input to n layers.')

  def init_fn(rng, input_shape):
    check(input_shape, 'input shapes')
    rngs = random.split(arguments.prng_key(rng), len(layers))
    outs = [f(r, s) for f, r, s in zip(init_fns, rngs, input_shape)]
    return type(input_shape)(o[0] for o in outs), tuple(o[1] for o in outs)

  def apply_fn(params, inputs, **kwargs):
    check(inputs, 'inputs')
    rngs = _split_rng(kwargs.pop('rng', None), len(layers))
    return type(inputs)(f(p, x, rng=r, **kwargs)
                        for f, p, x, r in zip(apply_fns, params, inputs, rngs))

  def kernel_fn(ks, **kwargs):
    check(ks, 'kernels')
    return type(ks)(op(k, **kwargs) for op, k in zip(kernel_ops, ks))

  spec = protocol.in_parallel([kernel_spec(op) for op in kernel_ops])
  return init_fn, apply_fn, protocol.with_spec(kernel_fn, spec)


# -----------------------------------------------------------------------------
# `repeat`: a depth-`n` stack of one layer, compiled as one `lax.scan`.


class RepeatParams(NamedTuple):
  """Params of `repeat` whose first application has differently shaped params.

  Attributes:
    first: params of the first application (e.g. a `Dense` reading the input
      features).
    rest: params of the remaining `n - 1` applications, stacked on a new
      leading axis.
  """
  first: Any
  rest: Any


def _stack(trees: Sequence[Any]) -> Any:
  return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *trees)


def _unstack(tree: Any, n: int) -> list[Any]:
  return [jax.tree_util.tree_map(lambda x, i=i: x[i], tree) for i in range(n)]


def _same_shapes(a: Any, b: Any) -> bool:
  sa = jax.tree_util.tree_map(lambda x: (jnp.shape(x), jnp.result_type(x)), a)
  sb = jax.tree_util.tree_map(lambda x: (jnp.shape(x), jnp.result_type(x)), b)
  return (jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
          and sa == sb)


def serial_params_to_repeat(params: Sequence[Any]) -> Any:
  """Converts the params of `serial(*[layer] * n)` to those of `repeat(layer, n)`.

  Args:
    params: the list of per-layer params that `serial`'s `init_fn` returns.

  Returns:
    The per-layer params stacked on a new leading axis of size `n`, or, if the
    first layer's params are shaped differently from the others', a
    `RepeatParams(first, rest)` with the others stacked.

  Example:
    >>> layer = stax.serial(stax.Dense(4), stax.Relu())
    >>> init_fn, apply_fn, _ = stax.serial(*[layer] * 3)
    >>> _, params = init_fn(random.PRNGKey(0), x1.shape)
    >>> stacked = stax.serial_params_to_repeat(params)
    >>> out = stax.repeat(layer, 3)[1](stacked, x1)
    >>> bool(jnp.allclose(out, apply_fn(params, x1), rtol=1e-5))
    True
  """
  params = list(params)
  if not params:
    return ()
  if all(_same_shapes(params[0], p) for p in params[1:]):
    return _stack(params)
  if len(params) > 2 and not all(_same_shapes(params[1], p)
                                 for p in params[2:]):
    raise ValueError(
        'Only the first of the `params` may be shaped differently from the '
        'others to convert them to the params of `repeat`; got params whose '
        'shapes change after the second layer. Keep these params with '
        '`serial`.')
  return RepeatParams(params[0], _stack(params[1:]))


def repeat_params_to_serial(params: Any, n: int) -> list[Any]:
  """Converts the params of `repeat(layer, n)` to those of `serial(*[layer]*n)`.

  Args:
    params: params returned by `repeat(layer, n)`'s `init_fn`.
    n: the depth.

  Returns:
    The list of per-layer params.
  """
  if (not isinstance(n, (int, np.integer)) or isinstance(n, (bool, np.bool_))
      or n < 0):
    raise ValueError(f'`n` must be an int >= 0 (the depth of `repeat(layer, '
                     f'n)`); got {n!r}. Pass the `n` of the `repeat` whose '
                     '`init_fn` made these params.')
  if n == 0:
    return []
  stacked = params.rest if isinstance(params, RepeatParams) else params
  leaves = jax.tree_util.tree_leaves(stacked)
  if leaves:
    depth = jnp.shape(leaves[0])[0] + isinstance(params, RepeatParams)
    if n > depth:
      raise ValueError(
          f'`n`={n} is larger than the depth of the stacked `params` '
          f'({depth} layers). Pass the `n` of the `repeat(layer, n)` whose '
          '`init_fn` made these params.')
  if isinstance(params, RepeatParams):
    return [params.first] + _unstack(params.rest, n - 1)
  return _unstack(params, n)


def _split_first(params: Any) -> tuple[Any, Any]:
  """`(params of the first application, stacked params of the others)`."""
  if isinstance(params, RepeatParams):
    return params.first, params.rest
  return (jax.tree_util.tree_map(lambda x: x[0], params),
          jax.tree_util.tree_map(lambda x: x[1:], params))


def _serial_keys(rng: jax.Array, n: int) -> jax.Array:
  """The `n` layer keys `serial`'s `init_fn` draws: `rng, k = split(rng)`."""
  def step(rng, _):
    rng, layer_rng = random.split(rng)
    return rng, layer_rng
  return lax.scan(step, rng, None, length=n)[1]


def _kernel_signature(k: Any) -> tuple[Any, Any]:
  """Pytree structure (including static metadata) and leaf shapes of `k`."""
  leaves, treedef = jax.tree_util.tree_flatten(k)
  return treedef, tuple((jnp.shape(x), jnp.result_type(x)) for x in leaves)


def _changed_attributes(before: Any, after: Any) -> list[str]:
  """Names of the `Kernel` attributes that differ in shape or value."""
  if not isinstance(before, Kernel) or not isinstance(after, Kernel):
    return ['the output structure (the layer maps a '
            f'{type(before).__name__} to a {type(after).__name__})']
  changed = []
  for field in dataclasses.fields(Kernel):
    a, b = getattr(before, field.name), getattr(after, field.name)
    if field.metadata.get('pytree_node', True):
      if (a is None) != (b is None) or (a is not None and (
          jnp.shape(a) != jnp.shape(b))):
        changed.append(
            f'{field.name} (shape {None if a is None else jnp.shape(a)}'
            f' -> {None if b is None else jnp.shape(b)})')
    elif a != b:
      changed.append(f'{field.name} ({a!r} -> {b!r})')
  return changed


class _NotAFixedPoint(ValueError):
  pass


def _scan_kernel_op(op: Callable, n: int, k: Any, name: str,
                    **kwargs) -> Any:
  """Applies `op` `n` times: once unrolled if needed, the rest in a scan."""
  if n == 0:
    return k
  step = lambda k: op(k, **kwargs)
  out = jax.eval_shape(step, k)
  if _kernel_signature(out) != _kernel_signature(k):
    k, n = step(k), n - 1
    if n == 0:
      return k
    out = jax.eval_shape(step, k)
    if _kernel_signature(out) != _kernel_signature(k):
      raise _NotAFixedPoint(
          f'`{name}` cannot scan this layer: its kernel still changes from one '
          'application to the next after the first, in '
          f'{", ".join(_changed_attributes(k, out))}. Use '
          '`stax.serial(*[layer] * n)` for layers that change shapes or '
          'metadata at every application.')
  return lax.scan(lambda k, _: (step(k), None), k, None, length=n)[0]


def _apply_signature(x: Any) -> Any:
  return _kernel_signature(x)


def _check_stacked(params: Any, n: int) -> None:
  """Raises a `ValueError` unless `params` are `repeat`'s stacked params:
  every leaf with a leading axis of size `n` (`n - 1` after a
  differently shaped first application)."""
  if isinstance(params, RepeatParams):
    leaves, size = jax.tree_util.tree_leaves(params.rest), n - 1
  else:
    leaves, size = jax.tree_util.tree_leaves(params), n
  if all(np.ndim(leaf) > 0 and np.shape(leaf)[0] == size for leaf in leaves):
    return
  shapes = [np.shape(leaf) for leaf in leaves]
  raise ValueError(
      f'`repeat(layer, {n})` takes the params of its `init_fn`: each leaf '
      f'stacked along a leading axis of size {size}; got leaves of shapes '
      f'{shapes}. Pass the params `repeat`\'s `init_fn` returned; to use the '
      f'params of `serial(*[layer] * {n})`, convert them with '
      '`stax.serial_params_to_repeat(serial_params)`.')


def _scan_apply(apply_fn: Callable, params: Any, x: Any, n: int,
                rng: Optional[jax.Array], **kwargs) -> Any:
  """Applies `apply_fn` with stacked params `n` times, as `serial` would."""
  if n == 0:
    return x
  _check_stacked(params, n)
  rngs = None if rng is None else random.split(rng, n)
  first, rest = _split_first(params)

  def step(x, p, r):
    return apply_fn(p, x, rng=r, **kwargs)

  def scan(x, stacked, rngs, length):
    def body(x, p_r):
      p, r = p_r
      return step(x, p, r), None
    return lax.scan(body, x, (stacked, rngs), length=length)[0]

  if not isinstance(params, RepeatParams):
    out = jax.eval_shape(step, x, first, None if rngs is None else rngs[0])
    if _apply_signature(out) == _apply_signature(x):
      return scan(x, params, rngs, n)
  x = step(x, first, None if rngs is None else rngs[0])
  if n == 1:
    return x
  out = jax.eval_shape(step, x, jax.tree_util.tree_map(lambda p: p[0], rest),
                       None if rngs is None else rngs[1])
  if _apply_signature(out) != _apply_signature(x):
    raise ValueError(
        '`repeat` cannot scan this layer: its output shape still changes '
        f'after the first application ({jax.tree_util.tree_map(jnp.shape, x)}'
        f' -> {jax.tree_util.tree_map(lambda o: o.shape, out)}). Use '
        '`stax.serial(*[layer] * n)` instead.')
  return scan(x, rest, None if rngs is None else rngs[1:], n - 1)


def _check_layer(layer: Any, name: str) -> tuple[Callable, Callable, Callable]:
  if (not isinstance(layer, tuple) or len(layer) != 3 or
      not all(callable(f) for f in layer)):
    raise TypeError(
        f'`{name}` takes a layer `(init_fn, apply_fn, kernel_fn)`; got '
        f'{type(layer).__name__}. Pass e.g. `stax.serial(stax.Dense(512), '
        'stax.Relu())`.')
  return layer


@requirements.layer
def repeat(layer: Layer, n: int) -> Layer:
  """`layer` applied `n` times, compiled as one `jax.lax.scan`.

  Computes what `serial(*[layer] * n)` computes, but the compiled program of
  `init_fn`, `apply_fn` and `kernel_fn` does not grow with `n`, so deep
  networks compile in constant time and memory.

  If the first application changes the shapes or the kernel's metadata (e.g.
  a `Dense(512)` reading 784 input features), it is applied once unrolled and
  the remaining `n - 1` applications are scanned. A layer that keeps changing
  them raises a `ValueError`; use `serial` for it.

  Params are the per-layer params stacked on a new leading axis of size `n`
  (`W` of a `Dense(512)` becomes `(n, 512, 512)`); when the first layer's
  params are shaped differently, a `RepeatParams(first, rest)` with the other
  `n - 1` stacked. `serial_params_to_repeat` and `repeat_params_to_serial`
  convert between this layout and `serial`'s list. Keys: `init_fn` draws the
  same per-layer keys as `serial`, and `apply_fn` splits `rng=` into `n` keys
  as `serial` does, so both give identical results.

  Args:
    layer: the layer `(init_fn, apply_fn, kernel_fn)` to repeat.
    n: number of applications, `>= 0`; `0` is the identity.

  Returns:
    `(init_fn, apply_fn, kernel_fn)`.

  Example:
    >>> block = stax.serial(stax.Dense(512, W_std=1.5), stax.Relu())
    >>> init_fn, apply_fn, kernel_fn = stax.serial(stax.repeat(block, 100),
    ...                                            stax.Dense(1))
    >>> kernel_fn(x1, x2, 'ntk').shape  # compiles as fast as depth 2
    (3, 2)
  """
  init_fn_l, apply_fn_l, kernel_fn_l = _check_layer(layer, 'repeat')
  arguments.positive_int(n, 'n', 'Pass the number of times to apply the '
                         'layer.', minimum=0)
  op = kernel_op_of(kernel_fn_l)

  def init_fn(rng, input_shape):
    if n == 0:
      return input_shape, ()
    keys = _serial_keys(rng, n)
    shape1, first = init_fn_l(keys[0], input_shape)
    if n == 1:
      return shape1, jax.tree_util.tree_map(lambda x: x[None], first)
    shape2, second = init_fn_l(keys[1], shape1)
    if shape2 != shape1 or init_fn_l(keys[1], shape2)[0] != shape2:
      raise ValueError(
          '`repeat` cannot scan this layer: its output shape still changes '
          f'after the first application ({input_shape} -> {shape1} -> '
          f'{shape2}). Use `stax.serial(*[layer] * n)` instead.')
    rest = jax.vmap(lambda k: init_fn_l(k, shape1)[1])(keys[1:])
    if _same_shapes(first, second):
      return shape1, _concat_first(first, rest)
    return shape1, RepeatParams(first, rest)

  def apply_fn(params, inputs, **kwargs):
    return _scan_apply(apply_fn_l, params, inputs, n, kwargs.pop('rng', None),
                       **kwargs)

  def kernel_fn(k, **kwargs):
    try:
      return _scan_kernel_op(op, n, k, 'repeat', **kwargs)
    except _NotAFixedPoint as e:
      raise ValueError(str(e)) from None

  return init_fn, apply_fn, protocol.with_spec(
      kernel_fn, protocol.repeated(kernel_spec(op), n))


def _concat_first(first: Any, rest: Any) -> Any:
  """Prepends `first` to the stacked `rest` along the leading axis."""
  return jax.tree_util.tree_map(
      lambda a, b: jnp.concatenate([a[None], b]), first, rest)
