"""Checks of `nt.batch`'s arguments shared with `nt.monte_carlo_kernel_fn`.

Example:
  >>> check_batch_size(0)  # 0 is no batching
  >>> len(select_devices(1))
  1
"""
from typing import Any, Callable

import jax

from neural_tangents._src.utils import arguments


def check_batch_size(batch_size: Any) -> None:
  """Raises unless `batch_size` is an int `>= 0` (0: no batching)."""
  arguments.positive_int(batch_size, 'batch_size', 'Pass the number of '
                         'examples per block, or 0 for no batching.', minimum=0)


def select_devices(device_count: Any) -> list[Any]:
  """The devices that `device_count` asks for, over every process.

  `jax.devices()` lists the devices of every process of JAX's distributed
  runtime (`jax.distributed.initialize`), ordered by process; with one process
  it is `jax.local_devices()`. `device_count=-1` is all of them; `n >= 1` the
  first `n` of each process's share (`n / process_count` per process), so
  that every process computes blocks; `0` the default device of each process.

  Args:
    device_count: `-1`, or `0 <= device_count <= len(jax.devices())`.

  Returns:
    The devices of this process that compute blocks (each process gets its
    own list; together they are `device_count` devices).

  Raises:
    TypeError: if `device_count` is not an int.
    ValueError: if it is out of range, or with several processes not a
      multiple of the number of processes.
  """
  if not arguments.is_int(device_count):
    raise TypeError(f'`device_count` must be an int; got {device_count!r}. '
                    'Pass -1 to use every device.')
  total = len(jax.devices())
  local = jax.local_devices()
  processes = jax.process_count()
  if device_count == -1:
    return local
  if device_count < -1:
    raise ValueError(
        f'`device_count` must be -1 (every device) or between 0 and {total}; '
        f'got {device_count}. Pass -1 to use every device.')
  if device_count > total:
    raise ValueError(
        f'`device_count`={device_count} is larger than the {total} device(s) '
        f'of all {processes} process(es) ({jax.default_backend()}). Pass -1 '
        f'to use every device, or a number up to {total}.')
  if processes > 1 and device_count > 0 and device_count % processes:
    raise ValueError(
        f'`device_count`={device_count} must be a multiple of the number of '
        f'processes ({processes}), so that every process computes blocks on '
        f'the same number of devices. Pass -1, or e.g. '
        f'{processes * max(1, device_count // processes)}.')
  return local[:max(device_count // processes, 1)]


def progress_bar_class() -> Callable[..., Any]:
  try:
    import tqdm  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ImportError(
        '`progress=True` needs the `tqdm` package, which is not installed. '
        'Run `pip install tqdm`, or pass progress=False.') from None
  return tqdm.tqdm


