"""Memory of the current process, read from Linux's `/proc` (for benchmarks).

Example:
  >>> reset_peak()  # The peak (`VmHWM`) restarts from the resident size.
  True
  >>> status_mib('VmHWM') >= status_mib('VmRSS') > 0
  True
"""


def status_mib(field: str) -> float:
  """A memory field (`VmHWM` peak, `VmRSS` resident) of this process, in MiB."""
  with open('/proc/self/status') as f:
    for line in f:
      if line.startswith(field + ':'):
        return int(line.split()[1]) / 1024
  return float('nan')


def reset_peak() -> bool:
  """Resets `VmHWM` to the current resident size (Linux >= 4.0)."""
  try:
    with open('/proc/self/clear_refs', 'w') as f:
      f.write('5')
    return True
  except OSError:
    return False


def available_mib() -> float:
  """Memory available to new processes (`MemAvailable`), in MiB."""
  with open('/proc/meminfo') as f:
    for line in f:
      if line.startswith('MemAvailable:'):
        return int(line.split()[1]) / 1024
  return float('nan')
