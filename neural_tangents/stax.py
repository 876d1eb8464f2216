"""Stax: layers `(init_fn, apply_fn, kernel_fn)` of finite and infinite nets.

Example:
  >>> from neural_tangents import stax
  >>> init_fn, apply_fn, kernel_fn = stax.serial(
  ...     stax.Dense(512), stax.Relu(), stax.Dense(1))
  >>> kernel_fn(x1, x2, 'ntk')
"""
# pylint: disable=unused-import
from neural_tangents._src.stax.branching import FanInConcat
from neural_tangents._src.stax.branching import FanInProd
from neural_tangents._src.stax.branching import FanInSum
from neural_tangents._src.stax.branching import FanOut
from neural_tangents._src.stax.combinators import parallel
from neural_tangents._src.stax.combinators import repeat
from neural_tangents._src.stax.combinators import repeat_params_to_serial
from neural_tangents._src.stax.combinators import RepeatParams
from neural_tangents._src.stax.combinators import serial
from neural_tangents._src.stax.combinators import serial_params_to_repeat
from neural_tangents._src.stax.elementwise import Erf
from neural_tangents._src.stax.elementwise import Relu
from neural_tangents._src.stax.linear import Dense
from neural_tangents._src.stax.linear import Flatten
from neural_tangents._src.stax.linear import Identity
from neural_tangents._src.stax.linear import Parameterization
from neural_tangents._src.stax.requirements import Bool
from neural_tangents._src.stax.requirements import Diagonal
from neural_tangents._src.stax.requirements import layer
from neural_tangents._src.stax.requirements import requires
from neural_tangents._src.stax.requirements import supports_masking
