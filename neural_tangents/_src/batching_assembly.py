"""Old import path of `neural_tangents._src.batching.assembling` (re-exported).

Example:
  >>> Role.PAIR.name
  'PAIR'
"""
# pylint: disable=unused-import
from neural_tangents._src.batching.assembling import Assembler
from neural_tangents._src.batching.assembling import leaf_specs
from neural_tangents._src.batching.assembling import LeafSpec
from neural_tangents._src.batching.assembling import Role
from neural_tangents._src.batching.assembling import transpose_pair
