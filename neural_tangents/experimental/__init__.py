"""Experimental parts of Neural Tangents, imported on demand.

`import neural_tangents` imports only this small module; its parts load when
first used:

* `features`: feature maps of the NNGP, NTK and CNTK kernels (random
  features and sketches), `nt.experimental.features`;
* `empirical_ntk_fn_tf`, `get_apply_fn_and_params`: empirical NTKs of
  TensorFlow models (`pip install "neural-tangents[tf]"`); TensorFlow is
  imported only when they are first used.

Without the TensorFlow extra, the TensorFlow names are absent to feature
detection (`hasattr(nt.experimental, 'empirical_ntk_fn_tf')` is False,
`getattr(..., None)` is None, `dir()` does not list them), and using them
(`nt.experimental.empirical_ntk_fn_tf(...)`, or `from
neural_tangents.experimental import empirical_ntk_fn_tf`) raises an
ImportError naming the extra.

Example:
  >>> from neural_tangents.experimental import features
  >>> features.DenseFeatures(1)[1](jnp.ones((2, 3)), ()).nngp_feat.shape
  (2, 3)
"""
import dis
import importlib
import importlib.util
import sys
from typing import Any

_TF_NAMES = ('empirical_ntk_fn_tf', 'get_apply_fn_and_params')
_TF_MODULES = ('tensorflow', 'tf2jax')
_SUBMODULES = ('features',)
# Instructions of a caller that uses the name (rather than probing for it).
_USES = ('LOAD_ATTR', 'LOAD_METHOD', 'IMPORT_FROM')


def _caller_uses_name(frame: Any) -> bool:
  """Whether `frame` reads the attribute in its own code (`module.name`, or
  `from module import name`), rather than through `hasattr` / `getattr` /
  `inspect`, whose calls are feature detection."""
  if frame is None:
    return False
  try:
    return any(i.offset == frame.f_lasti and i.opname in _USES
               for i in dis.get_instructions(frame.f_code))
  except Exception:  # pylint: disable=broad-except
    return False


def __getattr__(name: str) -> Any:
  if name in _SUBMODULES:
    return importlib.import_module(f'{__name__}.{name}')
  if name in _TF_NAMES:
    from neural_tangents._src.experimental import empirical_tf  # pylint: disable=g-import-not-at-top
    try:
      empirical_tf.check_extra()
    except ImportError as e:
      if _caller_uses_name(sys._getframe(1)):  # pylint: disable=protected-access
        raise
      # Feature detection: absent, as any missing attribute.
      raise AttributeError(f'{e} (`{name}` is unavailable without it.)',
                           name=name, obj=sys.modules[__name__]) from e
    return getattr(empirical_tf, name)
  raise AttributeError(
      f'module {__name__!r} has no attribute {name!r}')


def _have_tf_extra() -> bool:
  return all(importlib.util.find_spec(m) is not None for m in _TF_MODULES)


def __dir__() -> list[str]:
  tf_names = list(_TF_NAMES) if _have_tf_extra() else []
  return sorted(list(globals()) + tf_names + list(_SUBMODULES))
