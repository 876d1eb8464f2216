"""Stax: layers `(init_fn, apply_fn, kernel_fn)` of finite and infinite nets.

Example:
  >>> from neural_tangents import stax
  >>> init_fn, apply_fn, kernel_fn = stax.serial(
  ...     stax.Dense(512), stax.Relu(), stax.Dense(1))
  >>> kernel_fn(x1, x2, 'ntk').shape
  (3, 2)
"""
# pylint: disable=unused-import
from neural_tangents._src.stax.aggregate import Aggregate
from neural_tangents._src.stax.aggregate import AggregateImplementation
from neural_tangents._src.stax.attention import AttentionMechanism
from neural_tangents._src.stax.attention import GlobalSelfAttention
from neural_tangents._src.stax.attention import PositionalEmbedding
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
from neural_tangents._src.stax.convolution import Conv
from neural_tangents._src.stax.convolution import ConvLocal
from neural_tangents._src.stax.convolution import ConvTranspose
from neural_tangents._src.stax.dense import Dense
from neural_tangents._src.stax.dense import Flatten
from neural_tangents._src.stax.dense import Identity
from neural_tangents._src.stax.dropout import Dropout
from neural_tangents._src.stax.elementwise import ABRelu
from neural_tangents._src.stax.elementwise import Abs
from neural_tangents._src.stax.elementwise import Cos
from neural_tangents._src.stax.elementwise import Elementwise
from neural_tangents._src.stax.elementwise import ElementwiseNumerical
from neural_tangents._src.stax.elementwise import Erf
from neural_tangents._src.stax.elementwise import Exp
from neural_tangents._src.stax.elementwise import ExpNormalized
from neural_tangents._src.stax.elementwise import Gabor
from neural_tangents._src.stax.elementwise import Gaussian
from neural_tangents._src.stax.elementwise import Gelu
from neural_tangents._src.stax.elementwise import Hermite
from neural_tangents._src.stax.elementwise import LeakyRelu
from neural_tangents._src.stax.elementwise import Monomial
from neural_tangents._src.stax.elementwise import Polynomial
from neural_tangents._src.stax.elementwise import Rbf
from neural_tangents._src.stax.elementwise import RectifiedMonomial
from neural_tangents._src.stax.elementwise import Relu
from neural_tangents._src.stax.elementwise import Sigmoid_like
from neural_tangents._src.stax.elementwise import Sign
from neural_tangents._src.stax.elementwise import Sin
from neural_tangents._src.stax.masking import MaskedArray
from neural_tangents._src.stax.masking import supports_masking
from neural_tangents._src.stax.masking import unmask_fn
from neural_tangents._src.stax.normalization import LayerNorm
from neural_tangents._src.stax.parameterization import Parameterization
from neural_tangents._src.stax.pooling import AvgPool
from neural_tangents._src.stax.pooling import GlobalAvgPool
from neural_tangents._src.stax.pooling import GlobalSumPool
from neural_tangents._src.stax.pooling import SumPool
from neural_tangents._src.stax.protocol import Bool
from neural_tangents._src.stax.protocol import Diagonal
from neural_tangents._src.stax.requirements import layer
from neural_tangents._src.stax.requirements import requires
from neural_tangents._src.stax.spatial import DotGeneral
from neural_tangents._src.stax.spatial import ImageResize
from neural_tangents._src.stax.spatial import Index
from neural_tangents._src.stax.spatial import Slice
from neural_tangents._src.stax.windows import Padding
