"""Empirical NTKs of TensorFlow models, computed in JAX (the `tf` extra).

A TensorFlow function is converted to JAX by `tf2jax`, its empirical NTK

  Theta(x1, x2) = sum_p  d f(x1) / d p  (d f(x2) / d p)^T

is computed by `nt.empirical_ntk_fn` over the model's trainable variables
`p`, and the kernel function is converted back to TensorFlow by
`jax.experimental.jax2tf` (a `tf.function`, called with TensorFlow or numpy
values). Three kinds of `f` are accepted:

* a Keras model (Keras 3, built): the parameters are
  `f.trainable_variables`, in that order; non-trainable variables (batch
  statistics, ...) are held at their current values. Converted through
  `f.stateless_call`.
* any other `tf.Module` whose `__call__(x)` TensorFlow can trace: the
  parameters are `f.trainable_variables`, then the trainable variables of
  the Keras 3 models it holds (which `f.trainable_variables` misses:
  `module_variables(f)`); other variables are held fixed. Passing the empty
  `f.trainable_variables` of a module that only wraps Keras 3 models means
  their current values.
* a `tf.function` (or a Python function of TensorFlow ops) `f(params, x)`:
  the parameters are its first argument, any nest of tensors. An
  `input_signature` may fix the batch size (inputs must then have it).

Only the batch axis of `x` may change between calls; each new shape of the
other axes converts the model again.

Requires `pip install "neural-tangents[tf]"` (`tensorflow`, `tf2jax`);
`import neural_tangents` never imports TensorFlow.

Example:
  >>> import numpy as np
  >>> import tensorflow as tf
  >>> import neural_tangents as nt
  >>> model = tf.keras.Sequential([tf.keras.Input((3,)),
  ...                              tf.keras.layers.Dense(8, 'tanh'),
  ...                              tf.keras.layers.Dense(2)])
  >>> ntk_fn = nt.experimental.empirical_ntk_fn_tf(model, vmap_axes=0)
  >>> x1, x2 = np.ones((4, 3), np.float32), np.zeros((5, 3), np.float32)
  >>> ntk_fn(x1, x2, model.trainable_variables).shape
  TensorShape([4, 5])
"""
import functools
import inspect
from typing import Any, Callable, Optional, Union

import jax
import numpy as np

from neural_tangents._src.empirical.api import DEFAULT_NTK_IMPLEMENTATION
from neural_tangents._src.empirical.api import empirical_ntk_fn
from neural_tangents._src.empirical.implementations import NtkImplementation
from neural_tangents._src.empirical.problem import VMapAxes
from neural_tangents._src.utils.typing import Axes

EXTRA_HINT = ('Install the TensorFlow extra: pip install '
              '"neural-tangents[tf]" (tensorflow and tf2jax).')


def _tensorflow() -> tuple[Any, Any]:
  """`(tensorflow, tf2jax)`, or an ImportError naming the extra."""
  try:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import tf2jax  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(
        f'`neural_tangents.experimental` TensorFlow support needs '
        f'{e.name or "tensorflow"}. {EXTRA_HINT}') from e
  return tf, tf2jax


def check_extra() -> None:
  """Raises an ImportError naming the `tf` extra if it is not installed."""
  _tensorflow()


def _kind(f: Any, tf: Any) -> str:
  if (hasattr(f, 'stateless_call') and hasattr(f, 'trainable_variables') and
      hasattr(f, 'non_trainable_variables')):
    return 'keras'  # Keras 3 layers are not `tf.Module`s.
  if isinstance(f, tf.Module) and callable(f):
    return 'module'
  if callable(f):
    return 'function'
  raise TypeError(
      f'`f` must be a Keras model, a callable `tf.Module` or a function '
      f'`f(params, x)` of TensorFlow ops; got {type(f).__name__}.')


def _input_spec(x: Any, tf: Any) -> Any:
  """A `tf.TensorSpec` of `x` with a free batch axis."""
  shape = tuple(np.shape(x))
  if not shape:
    raise ValueError(f'`x` must have a batch axis; got shape {shape}.')
  return tf.TensorSpec((None,) + shape[1:], tf.as_dtype(np.dtype(x.dtype)))


def _signature(traced: Any) -> Optional[list[Any]]:
  """The `input_signature` of a `tf.function`, or None."""
  signature = getattr(traced, 'input_signature', None)
  return None if signature is None else list(signature)


def _x_spec(x: Any, signature: Optional[list[Any]], tf: Any) -> Any:
  """The spec `x` is converted with: the last of the function's
  `input_signature` if it has one (which may fix the batch size), else
  `_input_spec(x)`."""
  spec = _input_spec(x, tf)
  if signature is None:
    return spec
  fixed = signature[-1]
  actual = tf.TensorSpec(np.shape(x), spec.dtype)
  if not fixed.is_compatible_with(actual):
    raise ValueError(
        f'`x` of shape {np.shape(x)} and dtype {spec.dtype.name} does not '
        f'match the `input_signature` of `f`, {fixed}. Pass inputs of that '
        'shape (batch size included, where the signature fixes it), or a '
        '`tf.function` whose signature leaves the batch size `None`.')
  return fixed


def _check_params_and_x(f: Any, traced: Any) -> None:
  """Refuses a function that does not take `(params, x)`, e.g. one closing
  over a model's variables, which TensorFlow would refuse with "too many
  positional arguments"."""
  signature = _signature(traced)
  if signature is not None:
    count, names = len(signature), f'an `input_signature` of {len(signature)}'
  else:
    try:
      parameters = inspect.signature(
          getattr(traced, 'python_function', f)).parameters.values()
    except (TypeError, ValueError):  # No signature to read: let it run.
      return
    if any(p.kind == p.VAR_POSITIONAL for p in parameters):
      return
    positional = [p.name for p in parameters
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    count, names = len(positional), f'({", ".join(positional)})'
  if count != 2:
    raise TypeError(
        f'`f` takes {count} positional argument(s), {names}; a function must '
        'be `f(params, x)`, its parameters the first argument, since the NTK '
        'differentiates with respect to them. A function closing over a '
        "model's variables (e.g. `tf.function(lambda x: model(x))`) has "
        'none: pass the Keras model or `tf.Module` itself (its trainable '
        'variables are the parameters), or write `f(params, x)`.')


def _keras_variables(f: Any) -> list[Any]:
  """Trainable variables of the Keras 3 layers / models held by the
  `tf.Module` `f` (in attributes, lists, tuples or dicts, or in nested
  modules), in attribute-name order. Keras 3 variables are not
  `tf.Variable`s, so `f.trainable_variables` misses them."""
  found, seen = [], set()

  def visit(obj: Any, depth: int) -> None:
    if id(obj) in seen or depth > 16:
      return
    seen.add(id(obj))
    if hasattr(obj, 'stateless_call') and hasattr(obj, 'trainable_variables'):
      found.extend(obj.trainable_variables)
    elif isinstance(obj, dict):
      for key in sorted(obj, key=str):
        visit(obj[key], depth + 1)
    elif isinstance(obj, (list, tuple)):
      for item in obj:
        visit(item, depth + 1)
    elif depth == 0 or _is_tf_module(obj):
      for key in sorted(vars(obj)):
        visit(vars(obj)[key], depth + 1)

  visit(f, 0)
  return found


def _is_tf_module(obj: Any) -> bool:
  tf, _ = _tensorflow()
  return isinstance(obj, tf.Module)


def _tf_variable(v: Any) -> Any:
  """The `tf.Variable` behind a Keras 3 variable (`v` if it is one)."""
  tf, _ = _tensorflow()
  return v if isinstance(v, tf.Variable) else getattr(v, 'value', v)


def module_variables(f: Any) -> list[Any]:
  """The parameters of a `tf.Module` `f`: its `trainable_variables`, then
  the trainable variables of the Keras 3 models it holds (which
  `trainable_variables` does not see), each once."""
  variables = list(f.trainable_variables)
  handles = {v.handle.ref() for v in variables}
  for v in _keras_variables(f):
    handle = _tf_variable(v).handle.ref()
    if handle not in handles:
      handles.add(handle)
      variables.append(v)
  return variables


def _numpy_params(params: Any) -> Any:
  """Variables / tensors -> numpy arrays, keeping the nest."""
  return jax.tree_util.tree_map(
      lambda p: np.asarray(p.numpy() if hasattr(p, 'numpy') else p), params,
      is_leaf=lambda p: hasattr(p, 'numpy'))


def get_apply_fn_and_params(f: Any) -> tuple[Callable[..., Any], Any]:
  """A JAX `apply_fn(params, x)` of a TensorFlow model, and its parameters.

  Args:
    f: a Keras model, a callable `tf.Module`, or a function `f(params, x)` of
      TensorFlow ops (see the module docstring).

  Returns:
    `(apply_fn, params)`: `apply_fn(params, x)` is a JAX function (of JAX or
    numpy arrays) equal to `f` on `x`; `params` are the model's trainable
    variables as numpy arrays (a list in the order of
    `f.trainable_variables`), or `None` for a function `f(params, x)`, whose
    parameters the caller passes.

  Raises:
    ImportError: without the `tf` extra.
    TypeError: if `f` is none of the above.

  Example:
    >>> import numpy as np
    >>> import tensorflow as tf
    >>> from neural_tangents import experimental
    >>> model = tf.keras.Sequential([tf.keras.Input((3,)),
    ...                              tf.keras.layers.Dense(2)])
    >>> apply_fn, params = experimental.get_apply_fn_and_params(model)
    >>> apply_fn(params, np.ones((4, 3), np.float32)).shape
    (4, 2)
  """
  tf, tf2jax = _tensorflow()
  kind = _kind(f, tf)
  converted = {}  # Per input spec (all axes but the batch axis, and dtype).

  if kind == 'keras':
    params = [np.asarray(v.numpy()) for v in f.trainable_variables]
    fixed = [np.asarray(v.numpy()) for v in f.non_trainable_variables]
    traced = tf.function(
        lambda tv, x: f.stateless_call(tv, fixed, x)[0], autograph=False)
  elif kind == 'module':
    params = [np.asarray(v.numpy()) for v in module_variables(f)]
    traced = f.__call__ if hasattr(f.__call__, 'get_concrete_function') else (
        tf.function(f.__call__, autograph=False))
  else:
    params = None
    traced = f if hasattr(f, 'get_concrete_function') else tf.function(
        f, autograph=False)
    _check_params_and_x(f, traced)
  signature = _signature(traced)

  def convert(p: Any, x: Any) -> tuple[Callable[..., Any], Any, Any]:
    spec = _x_spec(x, signature, tf)
    key = (tuple(spec.shape[1:]), spec.dtype.name)
    if kind == 'function':
      key += (str(jax.tree_util.tree_structure(p)),
              tuple((np.shape(v), str(np.result_type(v)))
                    for v in jax.tree_util.tree_leaves(p)))
    if key not in converted:
      if kind == 'keras':
        p_spec = [tf.TensorSpec(np.shape(v), tf.as_dtype(np.result_type(v)))
                  for v in params]
        converted[key] = tf2jax.convert(traced, p_spec, spec)
      elif kind == 'module':
        jax_fn, jax_params = tf2jax.convert(traced, spec)
        converted[key] = (jax_fn, jax_params,
                          _variable_keys(f, traced, spec, jax_params, tf))
      else:
        p_spec = signature[0] if signature is not None else (
            jax.tree_util.tree_map(
                lambda v: tf.TensorSpec(np.shape(v),
                                        tf.as_dtype(np.result_type(v))), p))
        converted[key] = tf2jax.convert(traced, p_spec, spec)
    return converted[key]

  def apply_fn(params: Any, x: Any) -> Any:
    # TensorFlow broadcasts ranks implicitly, and so does the converted code.
    with jax.numpy_rank_promotion('allow'):
      return converted_apply_fn(params, x)

  def converted_apply_fn(params: Any, x: Any) -> Any:
    if kind == 'module':
      jax_fn, jax_params, keys = convert(params, x)
      if len(params) != len(keys):
        raise ValueError(
            f'`params` has {len(params)} entries but the model has '
            f'{len(keys)} trainable variables; pass '
            '`get_apply_fn_and_params(f)[1]` or `f.trainable_variables` (or '
            'arrays of their shapes, in order; Keras 3 variables of the '
            'models `f` holds come last).')
      jax_params = dict(jax_params)
      for key, p in zip(keys, params):
        if key is None:
          continue  # A variable `f` does not use.
        if np.shape(p) != np.shape(jax_params[key]):
          raise ValueError(
              f'`params` entry of shape {np.shape(p)} for the variable '
              f'"{key}" of shape {np.shape(jax_params[key])}; pass '
              '`f.trainable_variables` in their order.')
        jax_params[key] = p
      out, _ = jax_fn(jax_params, x)
      return out
    jax_fn, jax_params = convert(params, x)
    out, _ = jax_fn(jax_params, params, x)
    return out

  return apply_fn, params


def _variable_keys(f: Any, traced: Any, spec: Any, jax_params: dict,
                   tf: Any) -> list[Optional[str]]:
  """The keys of `jax_params` of `f.trainable_variables`, in their order.

  `tf2jax` keys the variables a function captures in the order of its
  captured inputs (by name, made unique by suffixes): the same order here,
  matched by the variables' handles. A trainable variable the function does
  not use gets `None` (its part of the NTK is zero).
  """
  concrete = traced.get_concrete_function(spec)
  by_handle = {v.handle.ref(): v for v in concrete.variables}
  captured = [by_handle[c.ref()] for c in concrete.captured_inputs
              if c.dtype == tf.resource and c.ref() in by_handle]
  if len(captured) != len(jax_params):
    raise ValueError(
        f'Could not match the {len(jax_params)} variables of the converted '
        f'model to its {len(captured)} captured variables; pass a function '
        '`f(params, x)` instead.')
  key_of = {v.handle.ref(): key for v, key in zip(captured, jax_params)}
  return [key_of.get(_tf_variable(v).handle.ref())
          for v in module_variables(f)]


def empirical_ntk_fn_tf(
    f: Any,
    trace_axes: Axes = (-1,),
    diagonal_axes: Axes = (),
    vmap_axes: VMapAxes = None,
    implementation: Union[NtkImplementation, int] = DEFAULT_NTK_IMPLEMENTATION
) -> Callable[..., Any]:
  """The empirical NTK of a TensorFlow model, as a TensorFlow function.

  `Theta(x1, x2) = J(x1) J(x2)^T`, `J` the Jacobian of the outputs of `f`
  with respect to its trainable parameters; the arguments are those of
  `nt.empirical_ntk_fn` (see there), which computes it on the model
  converted to JAX.

  Args:
    f: a Keras model, a callable `tf.Module`, or a function `f(params, x)` of
      TensorFlow ops (see the module docstring).
    trace_axes: output axes traced over.
    diagonal_axes: output axes of which only the diagonal is kept.
    vmap_axes: the batch axes of the inputs and outputs (e.g. 0), or `None`.
    implementation: an `NtkImplementation` (or 1, 2, 3, 0 for AUTO).

  Returns:
    `ntk_fn(x1, x2, params)`: `x1`, `x2` TensorFlow tensors or numpy arrays
    (`x2=None` means `x1`), `params` the model's `trainable_variables` (for
    a Keras model or `tf.Module`) or the first argument of `f(params, x)`;
    returns the kernel as a `tf.Tensor`, of the layout of
    `nt.empirical_ntk_fn`.

  Raises:
    ImportError: without the `tf` extra.
  """
  tf, _ = _tensorflow()
  from jax.experimental import jax2tf  # pylint: disable=g-import-not-at-top

  apply_fn, _ = get_apply_fn_and_params(f)
  ntk_fn = empirical_ntk_fn(apply_fn, trace_axes, diagonal_axes, vmap_axes,
                            implementation)

  @functools.lru_cache(maxsize=32)
  def tf_kernel(has_x2: bool) -> Callable[..., Any]:
    if has_x2:
      fn = lambda x1, x2, params: ntk_fn(x1, x2, params)
    else:
      fn = lambda x1, params: ntk_fn(x1, None, params)
    return tf.function(jax2tf.convert(fn, with_gradient=False),
                       autograph=False)

  def ntk_fn_tf(x1: Any, x2: Optional[Any], params: Any) -> Any:
    if (isinstance(params, (list, tuple)) and not params and
        _kind(f, tf) == 'module'):
      # The empty `f.trainable_variables` of a module wrapping Keras 3
      # models: their variables, at their current values.
      params = module_variables(f)
    params = _numpy_params(params)
    # `tf2jax` converts models with variables only eagerly, so not inside the
    # graph that `jax2tf` traces: once per input shape, here (the batch size
    # included, which an `input_signature` may fix).
    for x in (x1, x2):
      if x is not None:
        with jax.numpy_rank_promotion('allow'):
          dtype = np.dtype(getattr(x.dtype, 'as_numpy_dtype', x.dtype))
          jax.eval_shape(apply_fn, params, jax.ShapeDtypeStruct(
              tuple(x.shape), dtype))
    if x2 is None:
      return tf_kernel(False)(x1, params)
    return tf_kernel(True)(x1, x2, params)

  return ntk_fn_tf
