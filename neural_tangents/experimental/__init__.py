"""Experimental parts of Neural Tangents.

* `empirical_ntk_fn_tf`, `get_apply_fn_and_params`: empirical NTKs of
  TensorFlow models (`pip install "neural-tangents[tf]"`); TensorFlow is
  imported only when they are first used.
"""
from typing import Any

_TF_NAMES = ('empirical_ntk_fn_tf', 'get_apply_fn_and_params')


def __getattr__(name: str) -> Any:
  if name in _TF_NAMES:
    from neural_tangents._src.experimental import empirical_tf  # pylint: disable=g-import-not-at-top
    empirical_tf.check_extra()
    return getattr(empirical_tf, name)
  raise AttributeError(
      f'module {__name__!r} has no attribute {name!r}')


def __dir__() -> list[str]:
  return sorted(list(globals()) + list(_TF_NAMES))
