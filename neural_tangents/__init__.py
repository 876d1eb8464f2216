"""Neural Tangents, maintained: infinite and finite-width networks on current JAX.

Example:
  >>> import neural_tangents as nt
  >>> from neural_tangents import stax
  >>> init_fn, apply_fn, kernel_fn = stax.serial(stax.Dense(512), stax.Relu(),
  ...                                            stax.Dense(1))
  >>> kernel_fn(x1, x2, 'ntk').shape
  (3, 2)
"""

__version__ = '0.7.0'

from neural_tangents import experimental  # Imports nothing heavy.
from neural_tangents import predict
from neural_tangents import stax
from neural_tangents._src.batching import batch
from neural_tangents._src.empirical import (
    DEFAULT_NTK_IMPLEMENTATION,
    NtkImplementation,
    empirical_kernel_fn,
    empirical_nngp_fn,
    empirical_ntk_fn,
    empirical_ntk_vp_fn,
    linearize,
    taylor_expand,
)
from neural_tangents._src.monte_carlo import monte_carlo_kernel_fn
from neural_tangents._src.utils.kernel import Kernel
