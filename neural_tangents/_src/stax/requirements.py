"""Layer machinery: the `@layer`, `@requires` and `@supports_masking` decorators.

A stax layer is a triple `(init_fn, apply_fn, kernel_fn)`. Layer authors
write `kernel_fn` as a *kernel op*, a function `Kernel -> Kernel` (or lists of
kernels for branching layers), and decorate it with `@requires(...)` to
declare which representations of its input it can work with. `@layer` then
turns the op into the public `kernel_fn(x1, x2=None, get=None, **kwargs)`
that users call, which:

1. validates `get` and the inputs;
2. resolves, across the whole network, the cheapest representation of the
   input kernel that every layer allows (batch-diagonal `cov1`/`cov2`,
   spatially diagonal covariances), by propagating requirements backwards from
   the representation asked for at the output;
3. builds the input `Kernel` (`inputs.inputs_to_kernel`), skipping the NTK
   when `get` does not need it;
4. runs the ops and returns what `get` asks for.

A layer written by hand, `(init_fn, apply_fn, kernel_fn)` with a plain
`kernel_fn(k, **kwargs)` (no `@requires`, no `@layer`), works in `serial` and
`parallel` and is treated as a local layer, as if decorated with
`@requires()` (the published release's default): with `kernel_fn`'s defaults
it receives batch-diagonal covariances (`cov1` of shape `(N1,)`,
`diagonal_batch=True`) and full spatial ones. `serial` raises a `ValueError`
when a layer gives only spatial diagonals to one that needs the full
covariance.

Representation requirements are stated per axis kind (`diagonal_batch`,
`diagonal_spatial`) with a `Diagonal(input, output)`, with the values and the
composition (`>>`, `<<`) of the published release. Resolution runs backwards
from the network's output with a level `s` (`YES` where a diagonal output is
asked for, else `NO`): a layer with `Diagonal(i, o)` passes on `i` if
`o == YES` or `s + o >= 2`, else `NO` (`protocol.transfer`); the input kernel
is diagonal where the level reaching it is `YES`. So:

* `Diagonal()`, i.e. `(input=YES, output=NO)`: a local layer (`Dense`,
  nonlinearities, convolutions): it computes from a diagonal input iff what
  follows allows a diagonal.
* `input=Bool.NO`: it needs the full input (global pooling, attention).
* `(input=YES, output=YES)`: whatever follows is computed from the diagonal
  (the output has no off-diagonal entries left, as `Flatten`'s has no spatial
  axes), so its input may always be diagonal.
* `MAYBE` is an intermediate level: an `input=MAYBE` is passed on only by
  layers whose `output` is `MAYBE` or `YES`, and never makes the network's
  input diagonal by itself.

What a layer declares is one `KernelSpec` on its kernel op, read with
`kernel_spec(kernel_fn)` (see `protocol`).

Example:
  >>> from jax import random
  >>> x1 = random.normal(random.PRNGKey(1), (3, 4))
  >>> x2 = random.normal(random.PRNGKey(2), (2, 4))
  >>> @layer
  ... def Scale(c: float):
  ...   init_fn = lambda rng, input_shape: (input_shape, ())
  ...   apply_fn = lambda params, x, **kwargs: c * x
  ...   @requires(diagonal_batch=Diagonal(), diagonal_spatial=Diagonal())
  ...   def kernel_fn(k, **kwargs):
  ...     scale = lambda x: None if x is None else c**2 * x
  ...     return k.replace(nngp=scale(k.nngp), ntk=scale(k.ntk),
  ...                      cov1=scale(k.cov1), cov2=scale(k.cov2))
  ...   return init_fn, apply_fn, kernel_fn
  >>> _, _, kernel_fn = Scale(2.)
  >>> kernel_fn(x1, x2, 'nngp').shape
  (3, 2)
"""
import dataclasses
import functools
import inspect
import types
import weakref
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.stax import inputs
from neural_tangents._src.stax import masking
from neural_tangents._src.stax import protocol
from neural_tangents._src.stax.layout import embed_spatial_diagonal
from neural_tangents._src.stax.layout import map_covariances
# The published path `neural_tangents._src.stax.requirements` (0.6.5) defined
# `Bool`, `Diagonal` and `supports_masking` next to `layer` and `requires`;
# they stay importable from here. The package imports each from the module
# that defines it (`protocol`, `masking`).
from neural_tangents._src.stax.masking import supports_masking  # pylint: disable=unused-import
from neural_tangents._src.stax.protocol import Allowed
from neural_tangents._src.stax.protocol import Bool
from neural_tangents._src.stax.protocol import conjunction
from neural_tangents._src.stax.protocol import Diagonal
from neural_tangents._src.stax.protocol import InputAxes
from neural_tangents._src.stax.protocol import kernel_op_of
from neural_tangents._src.stax.protocol import kernel_spec
from neural_tangents._src.stax.protocol import KernelSpec
from neural_tangents._src.stax.protocol import Requirements
from neural_tangents._src.utils import arguments
from neural_tangents._src.utils import compiled
from neural_tangents._src.utils import kernel as kernel_lib
from neural_tangents._src.utils import precision
from neural_tangents._src.utils import utils
from neural_tangents._src.utils.kernel import Kernel

GET_VALUES = ('nngp', 'ntk', 'cov1', 'cov2')
# Any `Kernel` field is a valid `get` (e.g. `('ntk', 'shape1', 'shape2')`);
# `GET_VALUES` are the covariances, named first in messages.
GET_FIELDS = GET_VALUES + tuple(
    name for name in kernel_lib.PUBLISHED_FIELDS if name not in GET_VALUES)
# Keywords that the public `kernel_fn` itself reads.
KERNEL_FN_KEYWORDS = ('diagonal_batch', 'diagonal_spatial', 'mask_constant',
                      'batch_axis', 'channel_axis')
# Keywords a published layer reads, accepted (and ignored) by a network none
# of whose layers reads them, as the published release does (e.g. `pattern`
# for a network without `Aggregate`, or `repeat(layer, 0)`).
LAYER_KEYWORDS = ('pattern',)


def requires(diagonal_batch: Diagonal = Diagonal(),
             diagonal_spatial: Diagonal = Diagonal(),
             batch_axis: Optional[int] = None,
             channel_axis: Optional[int] = None,
             *,
             accepts_scaled: bool = False) -> Callable[[Callable],
                                                       Callable]:
  """Declares the input representations a kernel op can work with.

  Args:
    diagonal_batch: requirement on the batch diagonal of `cov1` / `cov2`.
    diagonal_spatial: requirement on the spatial diagonal.
    batch_axis: batch axis the layer expects of its inputs, if it has one.
    channel_axis: channel axis the layer expects of its inputs.
    accepts_scaled: whether the op reads kernels stored with
      `Kernel.scale_exponents` (and returns them scaled, or unscaled with
      `scale_exponents=None`); otherwise it is given `Kernel.unscaled()`.

  Returns:
    A decorator attaching the `KernelSpec` of these requirements to the
    kernel op.
  """
  # One axis given: the other takes its default (see `InputAxes`).
  spec = KernelSpec(Requirements(diagonal_batch, diagonal_spatial),
                    input_axes=InputAxes(batch_axis, channel_axis))

  def decorator(kernel_op: Callable) -> Callable:
    keywords = protocol.read_keywords(kernel_op, var_keyword_reads_all=False)
    if not accepts_scaled:
      kernel_op = protocol.reading_unscaled(kernel_op)
    return protocol.with_spec(kernel_op,
                              dataclasses.replace(spec, keywords=keywords))
  return decorator


# -----------------------------------------------------------------------------
# The public `kernel_fn`.


def _parse_get(get: Any) -> tuple[Optional[tuple[str, ...]], bool]:
  """`(names or None, single)` of `get` (see `arguments.parse_get`), or
  raises `ValueError`."""
  # Any `Kernel` field is accepted, as published; only the covariances are
  # offered in the message, the other fields are metadata.
  return arguments.parse_get(
      get, GET_FIELDS,
      fix=f'Pass one of {GET_VALUES}, a tuple of them, e.g. '
      f'get={GET_VALUES[:2]!r}, or None for the whole `nt.Kernel`.')


def _select(k: Any, names: Optional[tuple[str, ...]], single: bool,
            get: Any) -> Any:
  """Extracts the fields `names` (parsed from `get`, which is named in
  messages) from a kernel or a (nested) list/tuple of kernels."""
  if names is None:
    return k
  if isinstance(k, (list, tuple)):
    return type(k)(_select(ki, names, single, get) for ki in k)

  def field(name):
    if name == 'cov2' and k.cov2 is None:
      return k.cov1
    value = getattr(k, name)
    if value is None and name in GET_VALUES:
      raise ValueError(
          f'`get={get!r}` asks for {name!r}, which this kernel does not hold. '
          'Ask for it when calling `kernel_fn`, e.g. get=("nngp", "ntk").')
    return value

  if single:
    return field(names[0])
  return utils.get_namedtuple(names)(*(field(name) for name in names))


def match_representation(k: Any, allowed: Any) -> Any:
  """Converts `k` to the representation `allowed` asks for, if it differs.

  A full kernel where a diagonal one is allowed is reduced to its diagonal
  when the allowance is what the caller requested; a diagonal kernel where a
  full one is needed is only produced by layers declaring
  `Diagonal(output=Bool.YES)` (nothing after them needs off-diagonal
  entries), and is embedded.
  """
  if isinstance(k, (list, tuple)):
    if isinstance(allowed, Allowed):
      allowed = [allowed] * len(k)
    return type(k)(match_representation(ki, a) for ki, a in zip(k, allowed))
  allowed = conjunction(allowed)
  if k.n_spatial == 0 or k.diagonal_spatial == allowed.diagonal_spatial:
    pass
  elif k.diagonal_spatial:
    k = map_covariances(k, embed_spatial_diagonal).replace(
        diagonal_spatial=False)
  else:
    k = map_covariances(k, kernel_lib.spatial_diagonal).replace(
        diagonal_spatial=True)
  if k.diagonal_batch != allowed.diagonal_batch and not k.diagonal_batch:
    k = k.replace(cov1=kernel_lib.batch_diagonal(k.cov1),
                  cov2=None if k.cov2 is None else
                  kernel_lib.batch_diagonal(k.cov2),
                  diagonal_batch=True)
  return k


def is_kernel_tree(x: Any) -> bool:
  """Whether `x` is a `Kernel` or a (nested) non-empty list/tuple of them."""
  if isinstance(x, Kernel):
    return True
  return (isinstance(x, (list, tuple)) and bool(x) and
          all(is_kernel_tree(xi) for xi in x))


def _broadcast_allowed(allowed: Any, x1: Any) -> Any:
  if isinstance(x1, (list, tuple)):
    if isinstance(allowed, Allowed):
      allowed = [allowed] * len(x1)
    elif len(allowed) != len(x1):
      # `zip` would silently drop the extra inputs.
      raise ValueError(
          f'The network takes {len(allowed)} inputs (e.g. a `parallel` of '
          f'{len(allowed)} layers), but `x1` is a {type(x1).__name__} of '
          f'{len(x1)} arrays. Pass one array per input (the same number in '
          '`x2`), or `FanOut(n)` before `parallel` to feed one input to n '
          'layers.')
    return type(x1)(_broadcast_allowed(a, x) for a, x in zip(allowed, x1))
  return conjunction(allowed)


def public_kernel_fn(kernel_op: Callable) -> Callable:
  """Wraps a kernel op into the user-facing `kernel_fn`."""

  def kernel_fn(x1_or_kernel: Any,
                x2: Any = None,
                get: Any = None,
                *,
                diagonal_batch: bool = True,
                diagonal_spatial: bool = False,
                **kwargs) -> Any:
    """Computes the NNGP / NTK of the network.

    Args:
      x1_or_kernel: inputs `(N1, ..., C)` (or a list/tuple of them for a
        network with several inputs), or a `Kernel` from a previous layer.
      x2: second inputs `(N2, ..., C)`, or `None` to use `x1`.
      get: `None` for the whole `Kernel`; a name among 'nngp', 'ntk', 'cov1',
        'cov2' for that array; or a tuple of names for a namedtuple.
      diagonal_batch: return `cov1`/`cov2` as the batch diagonal only.
      diagonal_spatial: return only the spatial diagonal of the covariances,
        `(N1, N2, S_1, ..., S_d)` instead of `(N1, N2, S_1, S_1, ...)`.
      **kwargs: `mask_constant=` (input entries equal to it are masked, see
        `masking`); `batch_axis=`, `channel_axis=` (the layout of the
        inputs, overriding the one the first layer declares); the rest is
        passed to the layers (e.g. `pattern=` for `Aggregate`; ignored by a
        network none of whose layers reads it).

    Returns:
      What `get` asks for.
    """
    names, single = _parse_get(get)  # Once per call.
    mask_constant = kwargs.pop('mask_constant', None)
    batch_axis = kwargs.pop('batch_axis', None)
    channel_axis = kwargs.pop('channel_axis', None)
    spec = kernel_spec(kernel_op)
    kwargs = _check_keywords(spec, kwargs)
    if is_kernel_tree(x1_or_kernel):
      if jax.tree_util.tree_leaves(x2):
        raise ValueError(
            '`x2` must be None when `kernel_fn` is given a `Kernel`: a '
            'Kernel already holds both sides (its `nngp` is the x1-x2 '
            f'covariance); got x2 of type {type(x2).__name__}. Call '
            '`kernel_fn(kernel)`, or `kernel_fn(x1, x2)` with input arrays.')
      out = kernel_op(_unreversed(x1_or_kernel), **kwargs)
      return _select(protocol.unscaled_kernels(out), names, single, get)

    compute_ntk = names is None or 'ntk' in names
    requested = Allowed(bool(diagonal_batch), bool(diagonal_spatial))
    allowed_in = _broadcast_allowed(spec.allowed_inputs(requested),
                                    x1_or_kernel)
    input_axes = spec.input_axes
    if batch_axis is not None or channel_axis is not None:
      input_axes = InputAxes(batch_axis, channel_axis)
    axes = input_axes.for_inputs(x1_or_kernel)

    def to_kernel(x1, x2, allowed, axes):
      return inputs.inputs_to_kernel(
          x1, x2,
          diagonal_batch=allowed.diagonal_batch,
          diagonal_spatial=allowed.diagonal_spatial,
          compute_ntk=compute_ntk,
          batch_axis=axes.batch_axis,
          channel_axis=axes.channel_axis,
          mask_constant=mask_constant)

    def build(x1, x2, allowed, axes):
      """Input kernels in the (nested list/tuple) structure of `x1`."""
      if isinstance(x1, (list, tuple)):
        return type(x1)(build(*leaves) for leaves in zip(x1, x2, allowed,
                                                         axes))
      k = to_kernel(x1, x2, allowed, axes)
      if requested.diagonal_spatial and k.n_spatial and not k.diagonal_spatial:
        full_inputs.append(k.shape1)
      return k

    def check_diagonal_spatial(out):
      """Refuses `diagonal_spatial=True` where nothing spatial is returned
      and a layer needed the full spatial covariance (as published); a
      spatial output is returned as its diagonal."""
      if full_inputs and not _spatially_shaped(out):
        raise ValueError(
            '`diagonal_spatial=True` cannot be honoured by this network: a '
            'layer in it (e.g. global pooling, attention, a non-nearest '
            'resize, `Aggregate`) needs the full spatial covariance of its '
            f'input, for inputs of shape {full_inputs[0]}. Pass '
            '`diagonal_spatial=False` (the default).')

    x2s = inputs.pair_inputs(x1_or_kernel, x2)
    full_inputs = []
    k = build(x1_or_kernel, x2s, allowed_in, axes)
    out = protocol.unscaled_kernels(kernel_op(k, **kwargs))
    check_diagonal_spatial(out)
    _check_spatial_sizes_match(out)
    out = match_representation(out, requested)
    if not compute_ntk:
      out = _drop_ntk(out)
    return _select(out, names, single, get)

  # Unjitted, one XLA program per input signature instead of hundreds of
  # op-by-op dispatches (see `compiled`; `NT_COMPILE_UNJITTED_CALLS=0` turns
  # it off).
  kernel_fn = compiled.compile_per_signature(kernel_fn, _compiler_options)
  if kernel_spec(kernel_op).random_per_pass:
    kernel_fn = _one_pass_when_equal(kernel_fn)
  # float32-accurate contractions on every backend (see `precision`).
  kernel_fn = precision.library_precision(kernel_fn)
  kernel_fn.kernel_op = kernel_op  # Its `kernel_spec` is the layer's.
  _PAIRWISE_KERNEL_FNS.add(kernel_fn)
  return kernel_fn


def _one_pass_when_equal(kernel_fn: Callable) -> Callable:
  """`kernel_fn` taking an `x2` equal to `x1` (by value) as `x2=None`.

  For a network that draws random numbers in each forward pass (a train-mode
  `Dropout`), `kernel_fn(x1, x2)` with `x2` equal to `x1` is the kernel of
  one forward pass, as `kernel_fn(x1, None)`, the published release and
  Monte Carlo estimates (`apply_fn(x2)` gets `apply_fn(x1)`'s key when `x2`
  equals `x1`) take it; the returned `Kernel` still holds `cov2` and
  `x1_is_x2=False`, as for any given `x2`. Under tracing (the user's `jit`)
  equality is a traced bool, and both kernels are computed and selected.
  """

  @functools.wraps(kernel_fn)
  def one_pass_kernel_fn(x1_or_kernel: Any, x2: Any = None, get: Any = None,
                         **kwargs) -> Any:
    if x2 is None or is_kernel_tree(x1_or_kernel):
      return kernel_fn(x1_or_kernel, x2, get, **kwargs)
    try:
      same = utils.inputs_are_equal(x1_or_kernel, x2)
    except TypeError:  # Not arrays: `kernel_fn` names the bad argument.
      same = False
    if same is False:
      return kernel_fn(x1_or_kernel, x2, get, **kwargs)
    one = _as_two_sides(kernel_fn(x1_or_kernel, None, get, **kwargs))
    if same is True:
      return one
    two = kernel_fn(x1_or_kernel, x2, get, **kwargs)
    return jax.tree_util.tree_map(lambda a, b: jnp.where(same, a, b), one,
                                  two)

  return one_pass_kernel_fn


def _as_two_sides(k: Any) -> Any:
  """A kernel computed with `x2=None` as computed with `x2=x1` given."""
  if isinstance(k, (list, tuple)) and not hasattr(k, '_fields'):
    return type(k)(_as_two_sides(ki) for ki in k)
  if not isinstance(k, Kernel):
    return k  # Fields selected by `get` (`cov2` is `cov1` there).
  return k.replace(cov2=k.cov1 if k.cov2 is None else k.cov2,
                   mask2=k.mask1 if k.mask2 is None else k.mask2,
                   shape2=k.shape1, x1_is_x2=False)


# The public `kernel_fn`s built here (not wrappers that copy their
# attributes, such as `nt.batch`'s).
_PAIRWISE_KERNEL_FNS: 'weakref.WeakSet[Callable]' = weakref.WeakSet()


def is_pairwise_kernel_fn(fn: Any) -> bool:
  """Whether `fn` is the `kernel_fn` of a stax layer or combinator.

  Such a kernel is pairwise: each entry `k(x1[i], x2[j])` depends on those
  two inputs only, so `kernel_fn(concatenate([a, b]), None)` holds the blocks
  `kernel_fn(a, None)`, `kernel_fn(b, a)` and `kernel_fn(b, None)`.
  """
  try:
    return fn in _PAIRWISE_KERNEL_FNS
  except TypeError:  # Not weakly referenceable.
    return False


# Kernels of at most this many entries (`N1 N2 S^2`, S spatial positions) are
# compiled with XLA's backend optimizations off when called unjitted: that
# halves the compilation (most of a first call), and they run in milliseconds
# either way. Larger ones, and every `kernel_fn` the user jits, get XLA's
# defaults.
# Off (0) for now: at optimization level 0 the arc-cosine kernels near
# correlation 1 round differently (float32 1.5e-4 relative on `ABRelu`
# diagonals, float64 3e-9) from the eager and jitted paths, which the
# representation tests catch. Raise it again once that is understood.
SMALL_KERNEL_ENTRIES = 0


def _kernel_entries(x: Any) -> int:
  """About `N1 N2 S^2`, the entries of the full kernel of inputs `x`."""
  return sum(int(np.prod(np.shape(xi)[1:-1], dtype=np.int64))**2
             for xi in jax.tree_util.tree_leaves(x))


def _compiler_options(x1_or_kernel: Any, x2: Any = None, *args: Any,
                      **kwargs: Any) -> Optional[dict[str, Any]]:
  """XLA options of the program of an unjitted call (see `compiled`)."""
  del args, kwargs
  if jax.default_backend() != 'cpu':
    return None
  if is_kernel_tree(x1_or_kernel):
    entries = sum(np.size(k.nngp) for k in jax.tree_util.tree_leaves(
        x1_or_kernel, is_leaf=lambda k: isinstance(k, Kernel)))
  else:
    n1 = sum(np.shape(x)[0] for x in jax.tree_util.tree_leaves(x1_or_kernel))
    n2 = (n1 if x2 is None else
          sum(np.shape(x)[0] for x in jax.tree_util.tree_leaves(x2)))
    entries = n1 * n2 * _kernel_entries(x1_or_kernel)
  if entries > SMALL_KERNEL_ENTRIES:
    return None
  return {'xla_backend_optimization_level': 0}


def _check_spatial_sizes_match(k: Any) -> None:
  """Refuses outputs that keep spatial axes of different sizes per side.

  `x1` and `x2` of different spatial sizes are accepted where the network's
  output does not depend on the sizes matching (global pooling, attention
  read out by pooling); an output that is still spatial compares positions
  of the two sides one to one, which different sizes do not allow.
  """
  if isinstance(k, (list, tuple)):
    for ki in k:
      _check_spatial_sizes_match(ki)
    return
  if k.n_spatial and k.spatial_shape1 != k.spatial_shape2:
    raise ValueError(
        f'`x1` and `x2` have different spatial shapes ({k.spatial_shape1} and '
        f'{k.spatial_shape2} at the output), and this network\'s output is '
        'still spatial, so its positions are compared one to one. Pass `x2` '
        'of the same spatial shape as `x1`, or read the network out with '
        'global pooling (`GlobalAvgPool`), which accepts any sizes.')


def _spatially_shaped(k: Any) -> bool:
  """Whether any kernel of `k` has spatial axes."""
  if isinstance(k, (list, tuple)):
    return any(_spatially_shaped(ki) for ki in k)
  return k.n_spatial > 0


def _check_keywords(spec: KernelSpec,
                    kwargs: dict[str, Any]) -> dict[str, Any]:
  """The keywords for the layers: published layer keywords that no layer of
  the network reads are dropped; others no layer reads raise `TypeError`."""
  if spec.keywords is None:  # A hand-written layer taking `**kwargs`.
    return kwargs
  kwargs = {name: value for name, value in kwargs.items()
            if name in spec.keywords or name not in LAYER_KEYWORDS}
  unknown = sorted(set(kwargs) - spec.keywords)
  if unknown:
    accepted = sorted(set(KERNEL_FN_KEYWORDS) | set(LAYER_KEYWORDS) |
                      spec.keywords)
    raise TypeError(
        f'`kernel_fn` got unexpected keyword argument(s) {unknown}: no layer '
        f'of this network reads them. Accepted keywords: {accepted}. Check '
        'the spelling (e.g. `diagonal_spatial`).')
  return kwargs


def _unreversed(k: Any) -> Any:
  """Kernels with their spatial axes in order (`is_reversed=False`)."""
  if isinstance(k, (list, tuple)):
    return type(k)(_unreversed(ki) for ki in k)
  return k.reverse() if k.is_reversed else k


def _drop_ntk(k: Any) -> Any:
  if isinstance(k, (list, tuple)):
    return type(k)(_drop_ntk(ki) for ki in k)
  return k.replace(ntk=None)


def layer(layer_fn: Callable[..., tuple[Callable, Callable, Callable]]
          ) -> Callable[..., tuple[Callable, Callable, Callable]]:
  """Makes `layer_fn(...) -> (init_fn, apply_fn, kernel_op)` a stax layer.

  The kernel op is decorated with `@requires` (or is the `kernel_fn` of
  another layer); an undecorated one is given full covariances (see
  `protocol.undeclared_kernel_op`). The returned layer's `kernel_fn` is the
  public one (see `public_kernel_fn`), named after the layer, and carries the
  `protocol.LayerSpec` of the call (`layer_fn`'s name and arguments).
  """

  signature = inspect.signature(layer_fn)

  @functools.wraps(layer_fn)
  def new_layer_fn(*args, **kwargs):
    try:
      bound = signature.bind(*args, **kwargs)
    except TypeError:
      bound = None  # The call itself raises the usual error below.
    if bound is not None:
      arguments.finite_hyperparameters(layer_fn.__name__, bound)
    init_fn, apply_fn, kernel_op = layer_fn(*args, **kwargs)
    kernel_op = kernel_op_of(kernel_op)
    spec = kernel_spec(kernel_op)
    if spec.name is None:
      protocol.with_spec(kernel_op,
                         dataclasses.replace(spec, name=layer_fn.__name__))
    # Every layer takes `mask_constant=`, and one that does not declare
    # `@supports_masking` refuses masked inputs instead of mishandling them.
    apply_fn = masking.check_apply_masking(apply_fn, spec.supports_masking,
                                           layer_fn.__name__)
    apply_fn = _rejecting_kernels(apply_fn, layer_fn.__name__)
    kernel_op = masking.check_kernel_masking(kernel_op, layer_fn.__name__)
    kernel_fn = public_kernel_fn(kernel_op)
    init_fn = _checked_init_fn(init_fn)
    for fn in (init_fn, apply_fn, kernel_fn):
      fn.__name__ = fn.__qualname__ = layer_fn.__name__
    if bound is not None:
      bound.apply_defaults()
      kernel_fn.layer_spec = protocol.LayerSpec(
          layer_fn.__name__, types.MappingProxyType(dict(bound.arguments)))
    return init_fn, apply_fn, kernel_fn

  return new_layer_fn


def _rejecting_kernels(apply_fn: Callable, name: str) -> Callable:
  """Wraps a layer's `apply_fn` to raise a `TypeError` for `Kernel` inputs."""

  @functools.wraps(apply_fn)
  def checked_apply_fn(params, inputs, **kwargs):
    arguments.reject_kernel(
        inputs, 'inputs',
        f'`apply_fn` of `{name}` computes the network on arrays: pass '
        '`apply_fn(params, x)`; to propagate a `Kernel`, call '
        '`kernel_fn(kernel)`.')
    return apply_fn(params, inputs, **kwargs)

  return checked_apply_fn


def _checked_init_fn(init_fn: Callable) -> Callable:
  """`init_fn` with its PRNG key and input shape checked (see `arguments`)."""
  def checked(rng, input_shape, *args, **kwargs):
    # `None` passes: a layer without parameters needs no key.
    return init_fn(arguments.prng_key(rng, allow_none=True),
                   arguments.input_shape(input_shape), *args, **kwargs)
  return checked


def _spatially_diagonal(k: Any) -> bool:
  if isinstance(k, (list, tuple)):
    return any(_spatially_diagonal(ki) for ki in k)
  return isinstance(k, Kernel) and k.diagonal_spatial and k.n_spatial > 0


def check_representation(producer: Optional[Callable], consumer: Callable,
                         k: Any) -> None:
  """Raises if `consumer` needs full spatial covariances `producer` lacks.

  A spatially diagonal kernel can only feed a layer needing the full
  covariance when the producer declares `Diagonal(output=Bool.YES)` (its
  off-diagonal entries are zero); otherwise the producer returned a diagonal
  where its declaration promised full covariances, and the kernel would be
  wrong.

  Args:
    producer: the op that produced `k` (`None` for the network's input).
    consumer: the op about to read `k`.
    k: the kernel (or list of kernels) passed between them.

  Raises:
    ValueError: naming both layers and the fix.
  """
  if producer is None or not _spatially_diagonal(k):
    return
  if kernel_spec(producer).output_diagonal == Bool.YES:
    return
  if not kernel_spec(consumer).needs_full_spatial:
    return
  p, c = protocol.layer_name(producer), protocol.layer_name(consumer)
  raise ValueError(
      f'Layers `{p}` and `{c}` cannot agree on a kernel representation: `{c}` '
      'needs the full spatial covariance of its input (diagonal_spatial='
      f'False), but `{p}` before it gives only its spatial diagonal. Declare '
      f'`{p}`\'s kernel_fn with `@requires(diagonal_spatial=Diagonal('
      'input=Bool.NO))` if it needs full covariances, make it return full '
      'covariances when given full ones (what `Diagonal()` declares), or '
      'declare `output=Bool.YES` if its off-diagonal entries are zero; or '
      f'remove `{c}` after it.')

