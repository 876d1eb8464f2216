"""The published path of the linear layers, `neural_tangents._src.stax.linear`
(where Neural Tangents 0.6.5 defined them): re-exports only.

`Dense`, `Identity` and `Flatten` are defined in `dense`; the other layers
the published module defined (convolutions, pooling, attention, `LayerNorm`,
`Dropout`, ...) each in their own module. Nothing in the package imports this
module; `neural_tangents.stax` imports from the defining modules.
"""
# pylint: disable=unused-import
from neural_tangents._src.stax.aggregate import Aggregate
from neural_tangents._src.stax.aggregate import AggregateImplementation
from neural_tangents._src.stax.attention import AttentionMechanism
from neural_tangents._src.stax.attention import GlobalSelfAttention
from neural_tangents._src.stax.attention import PositionalEmbedding
from neural_tangents._src.stax.convolution import Conv
from neural_tangents._src.stax.convolution import ConvLocal
from neural_tangents._src.stax.convolution import ConvTranspose
from neural_tangents._src.stax.dense import Dense
from neural_tangents._src.stax.dense import Flatten
from neural_tangents._src.stax.dense import Identity
from neural_tangents._src.stax.dropout import Dropout
from neural_tangents._src.stax.normalization import LayerNorm
from neural_tangents._src.stax.parameterization import Parameterization
from neural_tangents._src.stax.pooling import AvgPool
from neural_tangents._src.stax.pooling import GlobalAvgPool
from neural_tangents._src.stax.pooling import GlobalSumPool
from neural_tangents._src.stax.pooling import SumPool
from neural_tangents._src.stax.spatial import DotGeneral
from neural_tangents._src.stax.spatial import ImageResize
from neural_tangents._src.stax.spatial import Index
from neural_tangents._src.stax.spatial import Slice
from neural_tangents._src.stax.windows import Padding
