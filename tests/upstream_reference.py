"""Reference outputs of the published Neural Tangents 0.6.5 (float64).

`data/upstream-0.6.5.npz` holds outputs of the published release on the
inputs stored next to them; `data/upstream-0.6.5.README.md` says how each
case was built. Random draws (`init_fn`) are not comparable across JAX
versions, so only kernels, shapes and `apply_fn` on stored params are.
"""
import functools
import os

import numpy as np

PATH = os.path.join(os.path.dirname(__file__), 'data', 'upstream-0.6.5.npz')
RTOL = 1e-6  # Relative tolerance of comparisons against the reference.


@functools.lru_cache(maxsize=1)
def load() -> dict[str, np.ndarray]:
  """All reference arrays, keyed `case/output` (inputs at the top level)."""
  with np.load(PATH) as data:
    return {name: data[name] for name in data.files}
