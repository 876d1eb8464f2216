"""Old import path of `neural_tangents._src.batching.assembly` (re-exported).

Example:
  >>> Role.PAIR.name
  'PAIR'
"""
# pylint: disable=unused-import
from neural_tangents._src.batching.assembly import Assembler
from neural_tangents._src.batching.assembly import leaf_specs
from neural_tangents._src.batching.assembly import LeafSpec
from neural_tangents._src.batching.assembly import Role
from neural_tangents._src.batching.assembly import transpose_pair
