"""Neural Tangents, maintained: infinite and finite-width networks on current JAX.

Example:
  >>> import neural_tangents as nt
  >>> from neural_tangents import stax
  >>> init_fn, apply_fn, kernel_fn = stax.serial(stax.Dense(512), stax.Relu(),
  ...                                            stax.Dense(1))
  >>> kernel_fn(x1, x2, 'ntk')
"""

__version__ = '0.7.0'

from neural_tangents import stax
from neural_tangents._src.utils.kernel import Kernel
