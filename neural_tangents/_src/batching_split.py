"""Old import path of `neural_tangents._src.batching.split` (re-exported).

Example:
  >>> Grid(5, 5, 2, 2, True).nb1
  3
"""
from neural_tangents._src.batching.split import classify_kwarg
from neural_tangents._src.batching.split import Grid
from neural_tangents._src.batching.split import is_array
from neural_tangents._src.batching.split import leaves_with_axes
from neural_tangents._src.batching.split import merge_static
from neural_tangents._src.batching.split import partition_static
from neural_tangents._src.batching.split import Split
from neural_tangents._src.batching.split import stack
from neural_tangents._src.batching.split import Static
from neural_tangents._src.batching.split import take
from neural_tangents._src.batching.split import Task
