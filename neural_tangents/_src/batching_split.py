"""Old import path of `neural_tangents._src.batching.splitting` (re-exported).

Example:
  >>> Grid(5, 5, 2, 2, True).nb1
  3
"""
from neural_tangents._src.batching.splitting import classify_kwarg
from neural_tangents._src.batching.splitting import Grid
from neural_tangents._src.batching.splitting import is_array
from neural_tangents._src.batching.splitting import leaves_with_axes
from neural_tangents._src.batching.splitting import merge_static
from neural_tangents._src.batching.splitting import partition_static
from neural_tangents._src.batching.splitting import Split
from neural_tangents._src.batching.splitting import stack
from neural_tangents._src.batching.splitting import Static
from neural_tangents._src.batching.splitting import take
from neural_tangents._src.batching.splitting import Task
