"""Feature maps of neural kernels: `nt.experimental.features`.

Layers `(init_fn, feature_fn)` mirror `stax` layers; `feature_fn` maps inputs
to `Features` whose inner products are (exactly, or approximately with
random features and sketches) the NNGP and NTK that `stax`'s `kernel_fn`
computes for the same layers. Features cost time and memory linear in the
number of examples, where kernel matrices are quadratic (Zandieh et al. 2021,
arXiv 2106.07880; Han et al. 2022, arXiv 2209.04121). See `docs/features.md`.

Example:
  >>> from neural_tangents.experimental import features as ft
  >>> init_fn, feature_fn = ft.serial(
  ...     ft.DenseFeatures(1), ft.ReluFeatures(method='EXACT'),
  ...     ft.DenseFeatures(1))
  >>> _, params = init_fn(random.PRNGKey(0), x1.shape)
  >>> f = feature_fn(x1, params)
  >>> _, _, kernel_fn = stax.serial(stax.Dense(1), stax.Relu(), stax.Dense(1))
  >>> k = kernel_fn(x1, None, ('nngp', 'ntk'))
  >>> bool(jnp.allclose(f.ntk_feat @ f.ntk_feat.T, k.ntk, atol=1e-5))
  True
"""
# pylint: disable=unused-import
from neural_tangents._src.experimental.features.aggregate import AggregateFeatures
from neural_tangents._src.experimental.features.combinators import serial
from neural_tangents._src.experimental.features.convolution import ConvFeatures
from neural_tangents._src.experimental.features.elementwise import ElementwiseFeatures
from neural_tangents._src.experimental.features.elementwise import ElementwiseFeaturesImplementation
from neural_tangents._src.experimental.features.feature_type import Features
from neural_tangents._src.experimental.features.linear import DenseFeatures
from neural_tangents._src.experimental.features.linear import FlattenFeatures
from neural_tangents._src.experimental.features.normalization import LayerNormFeatures
from neural_tangents._src.experimental.features.pooling import AvgPoolFeatures
from neural_tangents._src.experimental.features.pooling import GlobalAvgPoolFeatures
from neural_tangents._src.experimental.features.relu import ReluFeatures
from neural_tangents._src.experimental.features.relu import ReluFeaturesImplementation
from neural_tangents._src.experimental.features.relu_ntk import ReluNTKFeatures
from neural_tangents._src.experimental.features.stax_conversion import from_stax
