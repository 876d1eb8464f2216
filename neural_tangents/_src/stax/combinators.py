"""Layers made of layers: `serial` and `parallel`.

A combinator is itself a layer `(init_fn, apply_fn, kernel_fn)`.
"""
from typing import Any, Callable

from jax import random

from neural_tangents._src.stax import requirements
from neural_tangents._src.stax.requirements import kernel_op_of
from neural_tangents._src.utils.typing import Layer


def _split_rng(rng: Any, n: int) -> list[Any]:
  """`n` independent keys, or `n` Nones when no key is given."""
  if rng is None:
    return [None] * n
  return list(random.split(rng, n))


@requirements.layer
def serial(*layers: Layer) -> Layer:
  """Composes layers: `serial(f, g)(x) = g(f(x))`, for finite and infinite nets.

  Params are a list with one entry per layer, `init_fn` splitting its key
  sequentially (`rng, layer_rng = split(rng)`) as `jax.example_libraries.stax`
  does. `apply_fn` splits an `rng=` keyword into one key per layer. The kernel
  is the composition of the layers' kernel maps.

  Args:
    *layers: layers `(init_fn, apply_fn, kernel_fn)`.

  Returns:
    The composed layer.

  Example:
    >>> init_fn, apply_fn, kernel_fn = stax.serial(
    ...     stax.Dense(512), stax.Relu(), stax.Dense(1))
    >>> kernel_fn(jnp.ones((2, 3)), None, 'ntk').shape
    (2, 2)
  """
  init_fns = [l[0] for l in layers]
  apply_fns = [l[1] for l in layers]
  kernel_ops = [kernel_op_of(l[2]) for l in layers]

  def init_fn(rng, input_shape):
    params = []
    for layer_init_fn in init_fns:
      rng, layer_rng = random.split(rng)
      input_shape, param = layer_init_fn(layer_rng, input_shape)
      params.append(param)
    return input_shape, params

  def apply_fn(params, inputs, **kwargs):
    rngs = _split_rng(kwargs.pop('rng', None), len(apply_fns))
    for layer_apply_fn, param, rng in zip(apply_fns, params, rngs):
      inputs = layer_apply_fn(param, inputs, rng=rng, **kwargs)
    return inputs

  def kernel_fn(k, **kwargs):
    for op in kernel_ops:
      k = op(k, **kwargs)
    return k

  return init_fn, apply_fn, _composite_op(kernel_fn, kernel_ops)


def _composite_op(kernel_fn: Callable, kernel_ops: list[Callable]) -> Callable:
  """Attaches the requirements of a sequence of ops to their composition."""
  def allowed_fn(output_allowed):
    for op in reversed(kernel_ops):
      output_allowed = op.allowed_fn(output_allowed)
    return output_allowed

  kernel_fn.allowed_fn = allowed_fn
  kernel_fn.input_axes = next((op.input_axes for op in kernel_ops
                               if getattr(op, 'input_axes', None) is not None),
                              None)
  kernel_fn.output_diagonal = (kernel_ops[-1].output_diagonal if kernel_ops
                               else requirements.Bool.NO)
  return kernel_fn


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
    rngs = random.split(rng, len(layers))
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

  def allowed_fn(output_allowed):
    if isinstance(output_allowed, requirements.Allowed):
      output_allowed = [output_allowed] * len(layers)
    return [op.allowed_fn(a) for op, a in zip(kernel_ops, output_allowed)]

  kernel_fn.allowed_fn = allowed_fn
  kernel_fn.input_axes = [getattr(op, 'input_axes', None) for op in kernel_ops]
  kernel_fn.output_diagonal = requirements.Bool.NO
  return init_fn, apply_fn, kernel_fn
