"""Experimental parts of Neural Tangents, imported on demand.

`import neural_tangents` imports only this small module; its parts load when
first used:

* `features`: feature maps of the NNGP, NTK and CNTK kernels (random
  features and sketches), `nt.experimental.features`;
* `empirical_ntk_fn_tf`, `get_apply_fn_and_params`: empirical NTKs of
  TensorFlow models (`pip install "neural-tangents[tf]"`); TensorFlow is
  imported only when they are first used.

Example:
  >>> from neural_tangents.experimental import features
  >>> features.DenseFeatures(1)[1](jnp.ones((2, 3)), ()).nngp_feat.shape
  (2, 3)
"""
import importlib
from typing import Any

_TF_NAMES = ('empirical_ntk_fn_tf', 'get_apply_fn_and_params')
_SUBMODULES = ('features',)


def __getattr__(name: str) -> Any:
  if name in _SUBMODULES:
    return importlib.import_module(f'{__name__}.{name}')
  if name in _TF_NAMES:
    from neural_tangents._src.experimental import empirical_tf  # pylint: disable=g-import-not-at-top
    empirical_tf.check_extra()
    return getattr(empirical_tf, name)
  raise AttributeError(
      f'module {__name__!r} has no attribute {name!r}')


def __dir__() -> list[str]:
  return sorted(list(globals()) + list(_TF_NAMES) + list(_SUBMODULES))
