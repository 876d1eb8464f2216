"""Pytest configuration shared by every test module.

Sets, once for the whole suite, the JAX options that users may set, so that the
library is tested under them: float64 (`jax_enable_x64`) and strict rank
promotion (`jax_numpy_rank_promotion='raise'`, which turns silent broadcasting
of arrays of different ranks into an error). Test modules import shared
helpers as a package, `from tests import test_utils`.
"""
import jax

jax.config.update('jax_enable_x64', True)
jax.config.update('jax_numpy_rank_promotion', 'raise')
