"""Batching kernel computations over blocks of inputs, processes and disk.

`batch` (in `blockwise.py`) computes a kernel function on blocks of its inputs
and assembles them, composing a plan, a runner and a sink (see
`docs/dev/batching.md`). The package's modules, one concept each:

* `splitting`: cutting one call into blocks (`Grid`, `Task`) and splitting
  its arguments (`classify_kwarg`, `partition_static` / `merge_static`);
* `call`: one call read once, and the arguments of each of its blocks
  (`Call`, `KernelCall`);
* `plan`: which blocks a call computes, in which order, over which
  processes (`Plan`);
* `runners`: how a list of blocks is computed: one at a time, sharded over
  local devices, or dealt over processes (`SerialRunner`, `ShardedRunner`,
  `ProcessRunner`);
* `sinks`: where finished blocks go: assembled in memory or written into
  the on-disk store (`MemorySink`, `StoreSink`);
* `assembling`: assembling block outputs into the full output (`Assembler`);
* `options`: checks of the arguments `batch` shares with
  `nt.monte_carlo_kernel_fn` (`check_batch_size`, `select_devices`,
  `progress_bar_class`);
* `processes`: dividing blocks over the processes of JAX's distributed
  runtime and sharing the results (`ProcessGroup`);
* `store`: the resumable on-disk kernel (`Store`, zarr).
"""
from neural_tangents._src.batching.blockwise import batch
from neural_tangents._src.batching.blockwise import batched
from neural_tangents._src.batching.options import check_batch_size
from neural_tangents._src.batching.options import progress_bar_class
from neural_tangents._src.batching.options import select_devices
from neural_tangents._src.batching.splitting import is_array
