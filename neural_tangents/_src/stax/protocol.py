"""The layer protocol: `KernelSpec`, what a kernel op declares about itself.

A stax layer's kernel op (a function `Kernel -> Kernel`, or lists of kernels
for branching layers) carries one `KernelSpec` in its `kernel_spec`
attribute, and the public `kernel_fn` that `@layer` makes carries its op in
`kernel_op`. `kernel_spec(fn)` reads the spec of either (or of a `kernel_fn`
written by hand, which declares nothing and is treated as a local layer,
`@requires()`). The spec says:

* which representations of its input kernel the op can read, given those its
  output may be stored in (`Requirements`, one `Diagonal` per axis kind; see
  `requirements` for their meaning), resolved by `allowed_inputs`;
* the `(batch_axis, channel_axis)` its inputs are laid out in, if declared
  (`InputAxes`);
* whether it handles masked inputs (`supports_masking`);
* the layer's name, for messages.

The public `kernel_fn` also carries the `LayerSpec` of the constructor call
that made it (`layer_spec(fn)`), for tools that map a stax network to
another representation (e.g. `nt.experimental.features.from_stax`).

Combinators build their spec from their layers' with `compose` (`serial`),
`in_parallel` (`parallel`) and `repeated` (`repeat`).

Example:
  >>> from neural_tangents import stax
  >>> dense, relu = stax.Dense(1)[2], stax.Relu()[2]
  >>> spec = compose([kernel_spec(dense), kernel_spec(relu)])
  >>> spec == kernel_spec(stax.serial(stax.Dense(1), stax.Relu())[2])
  True
  >>> spec.allowed_inputs(Allowed(diagonal_batch=True, diagonal_spatial=True))
  Allowed(diagonal_batch=True, diagonal_spatial=True)
"""
import dataclasses
import enum
import functools
import inspect
import operator
from typing import Any, Callable, Mapping, NamedTuple, Optional, Sequence, Union

from neural_tangents._src.utils.kernel import Kernel


class Bool(enum.IntEnum):
  """Three-valued logic for requirements: `NO < MAYBE < YES`."""
  NO = 0
  MAYBE = 1
  YES = 2

  def __and__(self, other: 'Bool') -> 'Bool':
    return Bool(min(self, other))

  def __or__(self, other: 'Bool') -> 'Bool':
    return Bool(max(self, other))


@dataclasses.dataclass(frozen=True)
class Diagonal:
  """Whether a layer can take (`input`) diagonal covariances, and whether its
  `output` lets what follows it decide that.

  Values are those of the published Neural Tangents release (see the
  `requirements` module docstring for their meaning): `Diagonal()` is
  `Diagonal(input=YES, output=NO)`, a local layer (e.g. `Dense`, `Relu`).

  Composition: `a >> b` (`a`'s layer followed by `b`'s) and `b << a` (the
  same) are associative; with `a = (i, o)`,

    a >> b = a                                   if o == YES,
    a >> b = (i if b.input + o >= 2 else NO, b.output)   otherwise.

  Example:
    >>> Diagonal() >> Diagonal(input=Bool.NO)
    Diagonal(input=<Bool.NO: 0>, output=<Bool.NO: 0>)
    >>> Diagonal(input=Bool.NO) << Diagonal() == Diagonal() >> Diagonal(
    ...     input=Bool.NO)
    True
  """
  input: Bool = Bool.YES
  output: Bool = Bool.NO

  def __and__(self, other: 'Diagonal') -> 'Diagonal':
    """Requirement of two layers reading the same kernel (in parallel)."""
    return Diagonal(input=self.input & other.input,
                    output=self.output & other.output)

  def __rshift__(self, other: 'Diagonal') -> 'Diagonal':
    """Requirement of `self`'s layer followed by `other`'s (`serial`)."""
    if not isinstance(other, Diagonal):
      raise TypeError(
          f'`Diagonal() >> other` composes two layers\' diagonal requirements, '
          f'but `other` is {other!r} ({type(other).__name__}). Pass a '
          '`Diagonal`, e.g. `Diagonal() >> Diagonal(input=Bool.YES)`.')
    if self.output == Bool.YES:
      return self
    return Diagonal(input=transfer(self, other.input), output=other.output)

  def __lshift__(self, other: 'Diagonal') -> 'Diagonal':
    """`self << other` is `other >> self`: `other`'s layer, then `self`'s."""
    if not isinstance(other, Diagonal):
      raise TypeError(
          f'`Diagonal() << other` composes two layers\' diagonal requirements, '
          f'but `other` is {other!r} ({type(other).__name__}). Pass a '
          '`Diagonal`, e.g. `Diagonal() << Diagonal(input=Bool.YES)`.')
    return other >> self


def transfer(diagonal: Diagonal, allowed: Bool) -> Bool:
  """Whether a layer's input may be diagonal, given whether its output may.

  `allowed` is what the layers after it allow (`YES` for a diagonal
  representation asked for at the network's output); the result is what
  they and the layer allow together. `Diagonal` composes as these maps do:
  `transfer(a >> b, s) == transfer(a, transfer(b, s))`.

  Example:
    >>> transfer(Diagonal(), Bool.YES), transfer(Diagonal(), Bool.NO)
    (<Bool.YES: 2>, <Bool.NO: 0>)
  """
  if diagonal.output == Bool.YES or allowed + diagonal.output >= 2:
    return diagonal.input
  return Bool.NO


class Allowed(NamedTuple):
  """Whether a kernel may be stored batch- / spatially diagonal."""
  diagonal_batch: bool
  diagonal_spatial: bool


def conjunction(allowed: Any) -> Allowed:
  """Combines the allowances of several consumers of one kernel (`FanOut`)."""
  if isinstance(allowed, Allowed):
    return allowed
  leaves = [conjunction(a) for a in allowed]
  return Allowed(all(a.diagonal_batch for a in leaves),
                 all(a.diagonal_spatial for a in leaves))


class Requirements(NamedTuple):
  """The `Diagonal` requirements of a layer, per axis kind."""
  diagonal_batch: Diagonal
  diagonal_spatial: Diagonal

  def __rshift__(self, other: 'Requirements') -> 'Requirements':
    return Requirements(self.diagonal_batch >> other.diagonal_batch,
                        self.diagonal_spatial >> other.diagonal_spatial)


def _as_states(allowed: Any) -> Any:
  """`Allowed` of bools as `Allowed` of `Bool`s (`True` -> `YES`), nested."""
  if isinstance(allowed, Allowed):
    return Allowed(*(Bool.YES if a else Bool.NO for a in allowed))
  return [_as_states(a) for a in allowed]


def _as_bools(states: Any) -> Any:
  """The inverse of `_as_states`: only a `YES` state allows a diagonal."""
  if isinstance(states, Allowed):
    return Allowed(*(bool(s == Bool.YES) for s in states))
  return [_as_bools(s) for s in states]


def _conjunction_states(states: Any) -> Allowed:
  if isinstance(states, Allowed):
    return states
  leaves = [_conjunction_states(s) for s in states]
  return Allowed(Bool(min(s.diagonal_batch for s in leaves)),
                 Bool(min(s.diagonal_spatial for s in leaves)))


@dataclasses.dataclass(frozen=True)
class InputAxes:
  """The `(batch_axis, channel_axis)` layout a layer expects of its inputs.

  One of three forms:

  * undeclared, `InputAxes()`: the layer does not say (a hand-written
    `kernel_fn`, or a layer without axes); inputs are read as
    `(batch, ..., channels)`, i.e. batch axis 0 and channel axis -1;
  * declared for one input, `InputAxes(batch_axis, channel_axis)`;
  * one per input of a `parallel` layer, `InputAxes(per_input=(...))`,
    each entry an `InputAxes` (nested for nested `parallel`s).

  `KernelSpec` converts the legacy encoding of these (`None`, a
  `(batch_axis, channel_axis)` tuple, a list of them) with `InputAxes.of`.

  Example:
    >>> axes = InputAxes.of([(0, 1), None])
    >>> axes.first()
    InputAxes(batch_axis=0, channel_axis=1, per_input=None)
    >>> [a.batch_axis for a in axes.for_inputs(('x', 'y'))]
    [0, 0]
  """
  batch_axis: Optional[int] = None
  channel_axis: Optional[int] = None
  per_input: Optional[tuple['InputAxes', ...]] = None

  def __post_init__(self):
    if self.per_input is not None and (self.batch_axis is not None or
                                       self.channel_axis is not None):
      raise ValueError(
          f'`InputAxes` declares either `batch_axis`/`channel_axis` (one '
          f'input) or `per_input` (several); got batch_axis={self.batch_axis}, '
          f'channel_axis={self.channel_axis} and per_input={self.per_input}. '
          'Pass only one of them.')
    if self.per_input is not None:
      object.__setattr__(self, 'per_input',
                         tuple(InputAxes.of(a) for a in self.per_input))
    elif (self.batch_axis is None) != (self.channel_axis is None):
      # One axis declared: the other takes its default.
      object.__setattr__(self, 'batch_axis',
                         0 if self.batch_axis is None else self.batch_axis)
      object.__setattr__(self, 'channel_axis',
                         -1 if self.channel_axis is None else
                         self.channel_axis)

  @classmethod
  def of(cls, value: Union['InputAxes', None, tuple[int, int], list]
         ) -> 'InputAxes':
    """`value` as `InputAxes`: `None`, a `(batch_axis, channel_axis)` pair,
    a list of such values (one per input), or an `InputAxes`."""
    if isinstance(value, InputAxes):
      return value
    if value is None:
      return cls()
    if isinstance(value, list):
      return cls(per_input=tuple(cls.of(v) for v in value))
    if (isinstance(value, tuple) and len(value) == 2 and
        all(isinstance(a, int) and not isinstance(a, bool) for a in value)):
      return cls(batch_axis=value[0], channel_axis=value[1])
    raise TypeError(
        f'`input_axes` must be None, a `(batch_axis, channel_axis)` tuple of '
        f'ints, a list of them (one per input) or an `InputAxes`; got '
        f'{value!r}. Pass e.g. input_axes=(0, -1).')

  @property
  def declared(self) -> bool:
    """Whether the layer says anything about its inputs' axes."""
    return self.per_input is not None or self.batch_axis is not None

  def first(self) -> 'InputAxes':
    """The first single-input layout declared (depth first), or the
    undeclared one: what a network given one input array expects of it."""
    if self.per_input is None:
      return self
    for axes in self.per_input:
      axes = axes.first()
      if axes.declared:
        return axes
    return InputAxes()

  def for_inputs(self, x: Any) -> Any:
    """One single-input `InputAxes` per input array of `x`, in the (nested)
    list/tuple structure of `x`, undeclared ones filled with `(0, -1)`."""
    if not isinstance(x, (list, tuple)):
      axes = self.first()
      return axes if axes.declared else InputAxes(0, -1)
    per_input = (self.per_input if self.per_input is not None else
                 (self,) * len(x))
    return type(x)(a.for_inputs(xi) for a, xi in zip(per_input, x))


class Combination(enum.Enum):
  """How a spec is made of the specs of other layers."""
  SERIAL = 'serial'
  PARALLEL = 'parallel'
  REPEAT = 'repeat'


# A `kernel_fn` written by hand declares nothing: it is treated as a local
# layer, `@requires()` with its defaults (as in the published release), so
# with `kernel_fn`'s defaults it gets the batch diagonal of `cov1` / `cov2`.
UNDECLARED = Requirements(Diagonal(), Diagonal())


@dataclasses.dataclass(frozen=True)
class KernelSpec:
  """What a kernel op declares to the machinery that runs it.

  Attributes:
    requirements: the `Diagonal` requirements of a layer (or of a chain of
      layers that each declare theirs, combined with `>>`); `None` for a
      `combination` of layers.
    combination: how the spec is made of `parts` (`None` for a layer that
      declares its own `requirements`).
    parts: the specs of the combined layers.
    depth: for `Combination.REPEAT`, how many times `parts[0]` is applied.
    input_axes: the `InputAxes` of the inputs the layer expects (one per
      input for `parallel`; undeclared by default). The legacy encoding
      (`None`, a `(batch_axis, channel_axis)` tuple, a list of them) is
      converted.
    supports_masking: whether the layer handles masked inputs (see
      `masking`); one that does not refuses them.
    name: the layer's name, for messages.
    keywords: the keyword arguments of `kernel_fn` the layer reads (e.g.
      `pattern` for `Aggregate`), or `None` if it may read any (a hand-written
      `kernel_fn(k, **kwargs)`); the public `kernel_fn` refuses the others.
    random_per_pass: whether the layer (or one of its parts) draws random
      numbers in each forward pass (a train-mode `Dropout`), so that its
      kernel depends on whether `x1` and `x2` go through one pass: the
      public `kernel_fn` then takes an `x2` equal to `x1` (by value) as one
      pass, as `x2=None` (and as Monte Carlo estimates, whose `apply_fn(x2)`
      gets `apply_fn(x1)`'s key then).
  """
  requirements: Optional[Requirements] = Requirements(Diagonal(), Diagonal())
  combination: Optional[Combination] = None
  parts: tuple['KernelSpec', ...] = ()
  depth: int = 1
  input_axes: InputAxes = InputAxes()
  supports_masking: bool = False
  name: Optional[str] = dataclasses.field(default=None, compare=False)
  keywords: Optional[frozenset[str]] = dataclasses.field(default=frozenset(),
                                                         compare=False)
  random_per_pass: bool = dataclasses.field(default=False, compare=False)

  def __post_init__(self):
    object.__setattr__(self, 'input_axes', InputAxes.of(self.input_axes))

  def allowed_inputs(self, output_allowed: Any) -> Any:
    """The representations the input may have, given those of the output.

    Args:
      output_allowed: an `Allowed`, or a (nested) list of them for a layer
        with several outputs.

    Returns:
      An `Allowed`, or a list of them (one per input) for `parallel`.
    """
    return _as_bools(self.allowed_states(_as_states(output_allowed)))

  def allowed_states(self, output_states: Any) -> Any:
    """`allowed_inputs` on `Bool` states (`transfer` of each layer)."""
    if self.combination is None:
      out = _conjunction_states(output_states)
      return Allowed(
          transfer(self.requirements.diagonal_batch, out.diagonal_batch),
          transfer(self.requirements.diagonal_spatial, out.diagonal_spatial))
    if self.combination == Combination.SERIAL:
      for part in reversed(self.parts):
        output_states = part.allowed_states(output_states)
      return output_states
    if self.combination == Combination.PARALLEL:
      if isinstance(output_states, Allowed):
        output_states = [output_states] * len(self.parts)
      return [p.allowed_states(a) for p, a in zip(self.parts, output_states)]
    # REPEAT: the allowances reach a fixed point after a few applications.
    for _ in range(self.depth):
      new = self.parts[0].allowed_states(output_states)
      if new == output_states:
        break
      output_states = new
    return output_states

  @property
  def output_diagonal(self) -> Bool:
    """Whether the output's spatial off-diagonal entries are always zero."""
    if self.combination is None:
      return self.requirements.diagonal_spatial.output
    if self.combination == Combination.PARALLEL or not self.parts:
      return Bool.NO
    return self.parts[-1].output_diagonal

  @property
  def needs_full_spatial(self) -> bool:
    """Whether the layer needs full spatial covariances whatever follows."""
    return not conjunction(
        self.allowed_inputs(Allowed(True, True))).diagonal_spatial


def compose(specs: Sequence[KernelSpec]) -> KernelSpec:
  """The spec of `specs`' layers applied in order (`serial`).

  A chain of layers that each declare their requirements is one `Requirements`
  (`>>` of theirs); a chain with a combination in it keeps its parts. Masks
  ride along with the kernels, and each layer checks its own.

  Example:
    >>> a = KernelSpec(Requirements(Diagonal(), Diagonal(input=Bool.NO)))
    >>> compose([KernelSpec(), a]).requirements.diagonal_spatial
    Diagonal(input=<Bool.NO: 0>, output=<Bool.NO: 0>)
  """
  specs = tuple(specs)
  axes = next((s.input_axes for s in specs if s.input_axes.declared),
              InputAxes())
  if specs and all(s.combination is None for s in specs):
    return KernelSpec(
        requirements=functools.reduce(operator.rshift,
                                      [s.requirements for s in specs]),
        input_axes=axes, supports_masking=True,
        keywords=union_keywords(specs), random_per_pass=any_random(specs))
  return KernelSpec(requirements=None, combination=Combination.SERIAL,
                    parts=specs, input_axes=axes, supports_masking=True,
                    keywords=union_keywords(specs),
                    random_per_pass=any_random(specs))


def in_parallel(specs: Sequence[KernelSpec]) -> KernelSpec:
  """The spec of `specs`' layers applied to one input each (`parallel`).

  Example:
    >>> no = Diagonal(input=Bool.NO)
    >>> spec = in_parallel([KernelSpec(), KernelSpec(Requirements(no, no))])
    >>> spec.allowed_inputs(Allowed(True, True))
    [Allowed(diagonal_batch=True, diagonal_spatial=True),
     Allowed(diagonal_batch=False, diagonal_spatial=False)]
  """
  specs = tuple(specs)
  return KernelSpec(requirements=None, combination=Combination.PARALLEL,
                    parts=specs,
                    input_axes=InputAxes(
                        per_input=tuple(s.input_axes for s in specs)),
                    supports_masking=True, keywords=union_keywords(specs),
                    random_per_pass=any_random(specs))


def repeated(spec: KernelSpec, n: int) -> KernelSpec:
  """The spec of `spec`'s layer applied `n` times (`repeat`).

  `repeat` does not handle masked inputs.

  Example:
    >>> repeated(KernelSpec(), 3).allowed_inputs(Allowed(True, False))
    Allowed(diagonal_batch=True, diagonal_spatial=False)
  """
  return KernelSpec(requirements=None, combination=Combination.REPEAT,
                    parts=(spec,), depth=n, input_axes=spec.input_axes,
                    supports_masking=False, keywords=spec.keywords,
                    random_per_pass=spec.random_per_pass)


def any_random(specs: Sequence[KernelSpec]) -> bool:
  """Whether any of `specs` draws random numbers per forward pass.

  Example:
    >>> any_random([KernelSpec(), KernelSpec(random_per_pass=True)])
    True
  """
  return any(s.random_per_pass for s in specs)


def union_keywords(specs: Sequence[KernelSpec]) -> Optional[frozenset[str]]:
  """The keywords read by any of `specs`' layers (`None`: any keyword)."""
  if any(s.keywords is None for s in specs):
    return None
  return frozenset().union(*(s.keywords for s in specs))


def read_keywords(kernel_op: Callable, *, var_keyword_reads_all: bool
                  ) -> Optional[frozenset[str]]:
  """The keyword arguments `kernel_op(k, ...)` names after its kernel.

  Args:
    kernel_op: a kernel op or a hand-written `kernel_fn`.
    var_keyword_reads_all: whether a `**kwargs` parameter means the op may
      read any keyword (`None` is returned), as for a hand-written
      `kernel_fn`; a stax layer's op takes `**kwargs` only to ignore them.

  Example:
    >>> def op(k, *, pattern=None, **kwargs): return k
    >>> read_keywords(op, var_keyword_reads_all=False)
    frozenset({'pattern'})
  """
  try:
    params = list(inspect.signature(kernel_op).parameters.values())
  except (TypeError, ValueError):
    return None
  if var_keyword_reads_all and any(p.kind == p.VAR_KEYWORD for p in params):
    return None
  return frozenset(p.name for p in params[1:]
                   if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))


# -----------------------------------------------------------------------------
# Reading and attaching specs.


def unscaled_kernels(k: Any) -> Any:
  """`k` (a `Kernel`, or a list/tuple of them) with every scaled kernel
  multiplied back (`Kernel.unscaled`)."""
  if isinstance(k, (list, tuple)):
    return type(k)(unscaled_kernels(ki) for ki in k)
  return k.unscaled() if isinstance(k, Kernel) else k


def reading_unscaled(kernel_op: Callable) -> Callable:
  """`kernel_op` given its input kernels unscaled (see
  `Kernel.scale_exponents`): what every layer not declared
  `accepts_scaled` sees."""
  @functools.wraps(kernel_op)
  def op(k, **kwargs):
    return kernel_op(unscaled_kernels(k), **kwargs)
  return op


def with_spec(kernel_op: Callable, spec: KernelSpec) -> Callable:
  """Attaches `spec` to `kernel_op` (its `kernel_spec`) and returns the op."""
  kernel_op.kernel_spec = spec
  return kernel_op


def _declared_spec(fn: Callable) -> Optional[KernelSpec]:
  return getattr(getattr(fn, 'kernel_op', fn), 'kernel_spec', None)


def kernel_spec(kernel_fn: Callable) -> KernelSpec:
  """The spec of a kernel op or of a layer's public `kernel_fn`.

  A `kernel_fn` written by hand (no `@requires`, no `@layer`) gets the
  default spec: the requirements of `@requires()` (`UNDECLARED`: a local
  layer, given batch-diagonal `cov1` / `cov2` by default), no declared axes,
  no masking.

  Example:
    >>> kernel_spec(lambda k: k).requirements == UNDECLARED
    True
    >>> from neural_tangents import stax
    >>> kernel_spec(stax.Dense(1)[2]).supports_masking
    True
  """
  spec = _declared_spec(kernel_fn)
  if spec is not None:
    return spec
  return KernelSpec(requirements=UNDECLARED,
                    name=getattr(kernel_fn, '__name__', 'kernel_fn'),
                    keywords=read_keywords(kernel_fn,
                                           var_keyword_reads_all=True))


@dataclasses.dataclass(frozen=True)
class LayerSpec:
  """The constructor call that made a stax layer, for tools that rebuild it.

  `@layer` attaches one to each layer's public `kernel_fn`, as its
  `layer_spec` attribute: the constructor's name and every argument it was
  called with, defaults included (for `serial`, `layers` is the tuple of its
  layers). It records the call only; the layer does not read it.

  Attributes:
    name: the constructor's name, e.g. 'Dense', 'Conv', 'serial'.
    arguments: the constructor's parameters and their values, in the order
      of its signature (a read-only mapping).

  Example:
    >>> from neural_tangents import stax
    >>> spec = layer_spec(stax.Dense(8, W_std=2.)[2])
    >>> spec.name, spec.arguments['W_std'], spec.arguments['b_std']
    ('Dense', 2.0, None)
  """
  name: str
  arguments: Mapping[str, Any]


def layer_spec(kernel_fn: Callable) -> Optional[LayerSpec]:
  """The `LayerSpec` of a stax layer's `kernel_fn`; None for a `kernel_fn`
  written by hand (not made by `@layer`)."""
  spec = getattr(kernel_fn, 'layer_spec', None)
  return spec if isinstance(spec, LayerSpec) else None


def is_layer_kernel_fn(kernel_fn: Callable) -> bool:
  """Whether `kernel_fn` is the public kernel function of a stax layer."""
  return hasattr(kernel_fn, 'kernel_op')


def layer_name(kernel_op: Callable) -> str:
  """A kernel op's layer name, for messages."""
  return kernel_spec(kernel_op).name or getattr(kernel_op, '__name__',
                                                'a layer')


def kernel_op_of(kernel_fn: Callable) -> Callable:
  """The `Kernel -> Kernel` op behind a public `kernel_fn`.

  A user-written `kernel_fn` without `@requires` (and not made by `@layer`)
  gets the default spec (see `kernel_spec`) and only the keyword arguments it
  names (see `undeclared_kernel_op`).
  """
  op = getattr(kernel_fn, 'kernel_op', kernel_fn)
  if _declared_spec(op) is not None:
    return op
  return undeclared_kernel_op(op)


def _accepted_kwargs(fn: Callable) -> Optional[frozenset[str]]:
  """Keyword names `fn` accepts, or `None` if it takes `**kwargs`."""
  try:
    params = inspect.signature(fn).parameters.values()
  except (TypeError, ValueError):
    return None
  if any(p.kind == p.VAR_KEYWORD for p in params):
    return None
  return frozenset(p.name for p in params
                   if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))


def undeclared_kernel_op(kernel_fn: Callable) -> Callable:
  """A kernel op for a `kernel_fn(k, **kwargs)` declaring no requirements.

  It is treated as a local layer (`Diagonal()` for both the batch and the
  spatial axes, as `@requires()`: with `kernel_fn`'s defaults it receives
  `cov1` of shape `(N1,)`, `diagonal_batch=True`), and is given only the
  keyword arguments its signature names (all of them if it takes
  `**kwargs`).

  Example:
    >>> def kernel_fn(k, **kwargs):  # No `@requires`.
    ...   return k.replace(nngp=2 * k.nngp, ntk=2 * k.ntk)
    >>> op = undeclared_kernel_op(kernel_fn)
    >>> kernel_spec(op).allowed_inputs(Allowed(True, False))
    Allowed(diagonal_batch=True, diagonal_spatial=False)
  """
  accepted = _accepted_kwargs(kernel_fn)

  @functools.wraps(kernel_fn)
  def kernel_op(k, **kwargs):
    if accepted is not None:
      kwargs = {n: v for n, v in kwargs.items() if n in accepted}
    return kernel_fn(unscaled_kernels(k), **kwargs)

  return with_spec(kernel_op, kernel_spec(kernel_fn))
