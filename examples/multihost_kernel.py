"""Kernels computed by several processes (hosts) with `nt.batch`.

The multi-host recipe of `docs/scale.md`, and the script that
`tests/batching/processes_test.py` runs as two processes on one machine.
Every process runs this same script; JAX's distributed runtime connects them
(`jax.distributed.initialize`), `nt.batch` gives each process its share of the
blocks, and every process gets the whole kernel (or, with `--store`, finds it
in the shared on-disk store).

Under SLURM (one process per task; JAX reads the coordinator, the number of
processes and this process's id from SLURM's environment):

  srun --ntasks=2 python examples/multihost_kernel.py --slurm

By hand, on two machines (or twice on one), with a free port on the first:

  python examples/multihost_kernel.py --coordinator_address=host0:1234 \\
      --num_processes=2 --process_id=0
  python examples/multihost_kernel.py --coordinator_address=host0:1234 \\
      --num_processes=2 --process_id=1

Without these flags it runs as one process. `--cpu_devices=2` simulates two
CPU devices per process (for trying it on a laptop); `--store=DIR` writes the
kernel into a resumable on-disk store (a directory every process sees).
"""
import os
import time
from typing import Any, Optional

from absl import app
from absl import flags

_COORDINATOR = flags.DEFINE_string(
    'coordinator_address', None,
    '`host:port` of process 0; None: one process (or SLURM with --slurm).')
_NUM_PROCESSES = flags.DEFINE_integer('num_processes', 1, 'Processes.')
_PROCESS_ID = flags.DEFINE_integer('process_id', 0, 'This process.')
_SLURM = flags.DEFINE_bool(
    'slurm', False, 'Read the process layout from SLURM (srun).')
_CPU_DEVICES = flags.DEFINE_integer(
    'cpu_devices', 0, 'Simulated CPU devices per process (0: the real ones).')
_N = flags.DEFINE_integer('n', 12, 'Examples.')
_BATCH_SIZE = flags.DEFINE_integer('batch_size', 3, 'Examples per block.')
_STORE = flags.DEFINE_string('store', None, 'On-disk store directory.')
_X64 = flags.DEFINE_bool('x64', False, 'Compute in float64.')
_SOLVE = flags.DEFINE_bool(
    'solve', False, 'With --store: also predicts test points by kernel '
    'regression solved from the store across the processes (CG).')
_OUTPUT = flags.DEFINE_string(
    'output', None, 'Saves the kernels and block counts of this process to '
    '`<output>.<process index>.npz`.')


def start_processes(coordinator_address: Optional[str], num_processes: int,
                    process_id: int, slurm: bool, cpu_devices: int) -> None:
  """Starts JAX's distributed runtime; call before any other use of JAX."""
  if cpu_devices:
    os.environ['XLA_FLAGS'] = (
        os.environ.get('XLA_FLAGS', '') +
        f' --xla_force_host_platform_device_count={cpu_devices}')
  import jax  # pylint: disable=g-import-not-at-top
  if cpu_devices or jax.default_backend() == 'cpu':
    # Cross-process collectives between CPU devices.
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  if slurm:
    jax.distributed.initialize()  # Layout from SLURM's environment.
  elif coordinator_address is not None:
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes,
                               process_id=process_id)


def cnn_kernel_fn() -> Any:
  """The analytic kernel function of the example CNN."""
  from neural_tangents import stax  # pylint: disable=g-import-not-at-top
  return stax.serial(
      stax.Conv(8, (2, 2)), stax.Relu(), stax.Flatten(),
      stax.Dense(16, W_std=1.5), stax.Relu(), stax.Dense(1))[2]


def example_inputs(n: int) -> tuple[Any, Any]:
  """`(x, images)`: the `n` vectors and images every process computes the
  kernels of (the same on each), in float64 under x64, else float32."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  dtype = np.float64 if jax.config.jax_enable_x64 else np.float32
  x = rng.standard_normal((n, 6)).astype(dtype)
  images = rng.standard_normal((n, 4, 4, 2)).astype(dtype)
  return x, images


def regression_data(n: int, n_test: int) -> tuple[Any, Any, Any]:
  """`(train images, test images, targets)` of the store's regression (the
  train images are those of `example_inputs`)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  _, images = example_inputs(n)
  test = np.random.default_rng(1).standard_normal(
      (n_test, 4, 4, 2)).astype(images.dtype)
  y = np.random.default_rng(2).standard_normal((n, 3)).astype(images.dtype)
  return images, test, y


def predictions_from_store(n: int, n_test: int, batch_size: int, store: str,
                           diag_reg: float = 1e-2, rank: int = 2
                           ) -> tuple[Any, dict[str, Any]]:
  """The CNN's NTK regression of `regression_data`, solved from the store.

  The train-train kernel (from `store`) and the test-train kernel (computed
  into `store + '_test'`) are read by row blocks: under JAX's distributed
  runtime each process reads only its row blocks (block `i` is process
  `i % P`'s) and conjugate gradients sum the products over the processes,
  so every process ends with the same predictions.

  Returns:
    `(test means, {'train': reads, 'test': reads})`, the row blocks this
    process read (`{block: times}`).
  """
  import neural_tangents as nt  # pylint: disable=g-import-not-at-top
  images, test, y = regression_data(n, n_test)
  kernel_fn = cnn_kernel_fn()
  options = dict(store_on_device=False)
  k_train = nt.predict.StoredKernel(nt.batch(
      kernel_fn, batch_size, store=store, **options)(images, None, 'ntk'))
  k_test = nt.predict.StoredKernel(nt.batch(
      kernel_fn, batch_size, store=store + '_test', **options)(
          test, images, 'ntk'), 'k_test_train')
  predict_fn = nt.predict.gp_inference(
      k_train, y, diag_reg=diag_reg, solver='cg', tol=1e-10,
      preconditioner_rank=rank)
  mean = predict_fn('ntk', k_test)
  return mean, {'train': k_train.reads, 'test': k_test.reads}


def kernels(n: int, batch_size: int, store: Optional[str] = None
            ) -> tuple[dict[str, Any], dict[str, dict[str, int]]]:
  """`(kernels, block counts)` of the example networks, batched.

  The same on every process: the analytic NTK of a CNN with a fully
  connected head (`Conv -> Relu -> Flatten -> Dense -> Relu -> Dense`), an
  empirical NTK of a finite fully connected network and a Monte Carlo NTK
  (4 networks).

  Args:
    n: number of examples (`x1`; `x2=None`).
    batch_size: examples per block.
    store: a directory: the analytic kernel is written there (and resumed
      from there).

  Returns:
    `(kernels, counts)`: arrays by name, and `block_counts` by name.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import neural_tangents as nt  # pylint: disable=g-import-not-at-top
  from neural_tangents import stax  # pylint: disable=g-import-not-at-top

  x, images = example_inputs(n)

  init_fn, apply_fn, _ = stax.serial(
      stax.Dense(32, W_std=1.5, b_std=0.1), stax.Relu(),
      stax.Dense(1, W_std=1.5, b_std=0.1))
  cnn = cnn_kernel_fn()
  _, params = init_fn(jax.random.PRNGKey(1), x.shape)
  empirical_ntk = nt.empirical_ntk_fn(apply_fn)
  monte_carlo = nt.monte_carlo_kernel_fn(init_fn, apply_fn,
                                         jax.random.PRNGKey(2), n_samples=4)

  out, counts = {}, {}
  for name, kernel_fn, inputs, args, kwargs in (
      # Into the store (if any), or gathered into host memory.
      ('cnn', cnn, images, ('ntk',), {'store': store,
                                      'store_on_device': False}),
      # Gathered onto each process's default device.
      ('empirical', empirical_ntk, x, (params,), {}),
      ('monte_carlo', monte_carlo, x, ('ntk',), {'store_on_device': False}),
  ):
    batched = nt.batch(kernel_fn, batch_size,
                       **{k: v for k, v in kwargs.items() if v is not None})
    out[name] = np.asarray(batched(inputs, None, *args))
    counts[name] = batched.block_counts
  return out, counts


def main(argv) -> None:
  del argv
  start_processes(_COORDINATOR.value, _NUM_PROCESSES.value,
                  _PROCESS_ID.value, _SLURM.value, _CPU_DEVICES.value)
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  if _X64.value:
    jax.config.update('jax_enable_x64', True)
  start = time.perf_counter()
  out, counts = kernels(_N.value, _BATCH_SIZE.value, _STORE.value)
  print(f'process {jax.process_index()} of {jax.process_count()}, '
        f'{len(jax.local_devices())} of {len(jax.devices())} devices, '
        f'{time.perf_counter() - start:.1f} s')
  for name, count in counts.items():
    print(f'  {name}: computed {count["computed"]} of {count["total"]} '
          f'blocks (from store: {count["from_store"]})')
  if _SOLVE.value and _STORE.value:
    start = time.perf_counter()
    out['predictions'], reads = predictions_from_store(
        _N.value, _N.value - 2, _BATCH_SIZE.value, _STORE.value)
    counts['reads'] = reads
    print(f'  predictions from the store: {time.perf_counter() - start:.1f} '
          f's, row blocks read: {reads}')
  if _OUTPUT.value:
    np.savez(f'{_OUTPUT.value}.{jax.process_index()}.npz',
             counts=repr(counts), **out)


if __name__ == '__main__':
  # JAX logs at INFO level each backend it probes ("Unable to initialize
  # backend 'tpu'"): show its warnings and errors only
  # (`--logger_levels=jax:INFO` shows all).
  flags.FLAGS.set_default('logger_levels', 'jax:WARNING')
  app.run(main)
