"""First-call seconds of kernels, predictions and empirical NTKs (issue 26).

What a user meets first, in a notebook, a script or a test, is the first call
of a function: its tracing, its compilation and its dispatch. Each workload
here runs in a FRESH Python process (so nothing is compiled or cached yet;
JAX's persistent compilation cache is not turned on), which times, with
`time.perf_counter` around the call and `jax.block_until_ready`, the first and
the second call, in wall and in CPU seconds (all threads; on a shared
machine the CPU seconds are the steadier figure). The parent runs the
workloads round robin, `--runs` rounds of one process per workload, and
then prints one JSON line per workload: the medians of its processes, and
the figures of issue 26's table (this project before the issue, `before_s`,
and the published 0.6.5 release, `published_s`, both measured on the same
2-core machine) for comparison. An `*_empirical_auto` line also gives
`auto_over_best`, its median over the best of implementations 1-3 measured
in the same run. Progress goes to stderr.

Workloads:

* `fcn_kernel`: README's FCN, `Dense(512, 1.5, 0.05) - Relu - Dense(512) -
  Erf - Dense(1)`, `kernel_fn(x1, x2, ('nngp', 'ntk'))` with 20 x 64 and
  10 x 64 inputs, unjitted.
* `fcn_kernel_jit`: the same with `jax.jit(kernel_fn, static_argnames='get')`.
* `cnn_kernel`: `Conv(64, (3, 3)) - Relu - Conv(64, (3, 3)) - Relu -
  GlobalAvgPool - Dense(1)` (SAME padding) on 20 and 10 images of
  8 x 8 x 3, unjitted.
* `fcn_predict`: `gradient_descent_mse_ensemble(kernel_fn, x_train, y_train)(
  x_test=x_test, get='ntk', compute_cov=True)` with the FCN on 20 training
  and 10 test points, after the kernel's first call (timed: building the
  predictor and the prediction).
* `{fcn,cnn}_empirical_{1,2,3,auto}`: `nt.empirical_ntk_fn(apply_fn,
  implementation=i, vmap_axes=0)(x1, x2, params)`.
* `{fcn,cnn}_process`: the wall time of the whole process (interpreter, import,
  build, first and second kernel call), timed by the parent.

Usage (from the project root):

  PYTHONPATH=$PWD python benchmarks/first_call.py [--runs 5] [--quick] \
      [workload ...]
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

# Issue 26's table: seconds on this 2-core machine, fresh processes. `before`
# is this project when the issue was filed; `published` the 0.6.5 release.
TABLE = {
    'fcn_kernel': dict(before_s=[5.7, 6.3], published_s=[1.15, 1.33],
                       target_s=1.0),
    'fcn_kernel_jit': dict(before_s=1.8, published_s=0.55),
    'cnn_kernel': dict(before_s=[11.0, 12.5], published_s=[2.0, 2.5],
                       target_s=2.0),
    'fcn_predict': dict(before_s=6.2, published_s=[1.6, 1.9], target_s=1.0),
    'fcn_empirical_1': dict(before_s=5.1, published_s=2.9, target_s=2.9),
    'fcn_empirical_2': dict(before_s=2.0, published_s=1.3, target_s=1.3),
    'fcn_empirical_3': dict(before_s=2.1, published_s=1.9, target_s=1.9),
    'fcn_empirical_auto': dict(),
    'cnn_empirical_1': dict(before_s=5.9, published_s=2.4, target_s=2.4),
    'cnn_empirical_2': dict(before_s=3.3, published_s=1.7, target_s=1.7),
    'cnn_empirical_3': dict(before_s=6.8, published_s=2.9, target_s=2.9),
    'cnn_empirical_auto': dict(),
    'fcn_process': dict(before_s=8.1, published_s=5.6),
    'cnn_process': dict(before_s=13.5, published_s=5.7),
}
WORKLOADS = tuple(TABLE)


def _network(kind: str):
  """`(net, x1, x2)` of the FCN or the CNN."""
  import jax  # pylint: disable=g-import-not-at-top
  from neural_tangents import stax  # pylint: disable=g-import-not-at-top

  k1, k2 = jax.random.split(jax.random.PRNGKey(0))
  if kind == 'fcn':
    net = stax.serial(stax.Dense(512, W_std=1.5, b_std=0.05), stax.Relu(),
                      stax.Dense(512, W_std=1.5, b_std=0.05), stax.Erf(),
                      stax.Dense(1, W_std=1.5, b_std=0.05))
    return net, jax.random.normal(k1, (20, 64)), jax.random.normal(k2,
                                                                   (10, 64))
  net = stax.serial(stax.Conv(64, (3, 3), padding='SAME'), stax.Relu(),
                    stax.Conv(64, (3, 3), padding='SAME'), stax.Relu(),
                    stax.GlobalAvgPool(), stax.Dense(1))
  return (net, jax.random.normal(k1, (20, 8, 8, 3)),
          jax.random.normal(k2, (10, 8, 8, 3)))


def _timed(fn) -> tuple[float, float]:
  """Wall and CPU (all threads of the process) seconds of `fn()`."""
  import jax  # pylint: disable=g-import-not-at-top
  start, cpu = time.perf_counter(), time.process_time()
  jax.block_until_ready(fn())
  return time.perf_counter() - start, time.process_time() - cpu


def child(workload: str) -> dict:
  """Runs in the fresh process: wall and CPU seconds of two calls."""
  import jax  # pylint: disable=g-import-not-at-top
  import neural_tangents as nt  # pylint: disable=g-import-not-at-top

  kind, _, what = workload.partition('_')
  (init_fn, apply_fn, kernel_fn), x1, x2 = _network(kind)
  get = ('nngp', 'ntk')
  if what in ('kernel', 'process'):
    call = lambda: kernel_fn(x1, x2, get)
  elif what == 'kernel_jit':
    jitted = jax.jit(kernel_fn, static_argnames='get')
    call = lambda: jitted(x1, x2, get=get)
  elif what == 'predict':
    jax.block_until_ready(kernel_fn(x1, x2, get))  # The kernel's first call.
    y_train = jax.random.normal(jax.random.PRNGKey(2), (x1.shape[0], 1))
    call = lambda: nt.predict.gradient_descent_mse_ensemble(
        kernel_fn, x1, y_train)(x_test=x2, get='ntk', compute_cov=True)
  elif what.startswith('empirical_'):
    implementation = what[len('empirical_'):]
    implementation = (nt.NtkImplementation.AUTO if implementation == 'auto'
                      else int(implementation))
    _, params = init_fn(jax.random.PRNGKey(1), x1.shape)
    jax.block_until_ready(params)
    ntk_fn = nt.empirical_ntk_fn(apply_fn, implementation=implementation,
                                 vmap_axes=0)
    call = lambda: ntk_fn(x1, x2, params)
  else:
    raise ValueError(f'unknown workload {workload!r}; one of {WORKLOADS}')
  (first, first_cpu), (second, second_cpu) = _timed(call), _timed(call)
  return dict(first_s=first, first_cpu_s=first_cpu, second_s=second,
              second_cpu_s=second_cpu)


def _run_child(workload: str) -> dict:
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  children_cpu = usage.ru_utime + usage.ru_stime
  start = time.perf_counter()
  result = subprocess.run(
      [sys.executable, os.path.abspath(__file__), '--child', workload],
      capture_output=True, text=True, check=False)
  wall = time.perf_counter() - start
  if result.returncode:
    raise RuntimeError(f'{workload}: {result.stderr[-2000:]}')
  out = json.loads(result.stdout.strip().splitlines()[-1])
  out['process_s'] = wall
  out['process_cpu_s'] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime + \
      resource.getrusage(resource.RUSAGE_CHILDREN).ru_stime - children_cpu
  return out


def summarize(workload: str, results: list[dict]) -> dict:
  """Medians over the runs' fresh processes, with the issue's figures."""
  median = lambda key: round(statistics.median(r[key] for r in results), 3)
  line = dict(workload=workload, runs=len(results))
  if workload.endswith('_process'):
    line['seconds'] = median('process_s')
    line['cpu_s'] = median('process_cpu_s')
  else:
    line['first_s'] = median('first_s')
    line['first_cpu_s'] = median('first_cpu_s')
    line['first_runs_s'] = [round(r['first_s'], 3) for r in results]
  line['second_s'] = round(statistics.median(r['second_s'] for r in results),
                           5)
  line['second_cpu_s'] = round(
      statistics.median(r['second_cpu_s'] for r in results), 5)
  line.update(TABLE[workload])
  return line


def add_auto_ratios(lines: dict[str, dict]) -> None:
  """Adds `auto_over_best` to each `*_empirical_auto` line: its median first
  call over the best median first call of implementations 1, 2 and 3 measured
  in the same run (the issue's target: at most 1.5)."""
  for name, line in lines.items():
    if not name.endswith('_empirical_auto') or 'first_s' not in line:
      continue
    prefix = name[:-len('auto')]
    singles = [lines[prefix + i]['first_s'] for i in '123'
               if 'first_s' in lines.get(prefix + i, {})]
    if singles:
      line['auto_over_best'] = round(line['first_s'] / min(singles), 2)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('workloads', nargs='*', default=list(WORKLOADS))
  parser.add_argument('--runs', type=int, default=5,
                      help='fresh processes per workload (median)')
  parser.add_argument('--quick', action='store_true', help='one run each')
  parser.add_argument('--child', help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    print(json.dumps(child(args.child)), flush=True)
    return
  import jax  # pylint: disable=g-import-not-at-top
  runs = 1 if args.quick else args.runs
  # Round robin: each run measures every workload once, so that the host's
  # drift over the minutes of a run falls on all workloads alike and the
  # ratios between them (`auto_over_best`) are of the same moments.
  results = {workload: [] for workload in args.workloads}
  errors = {}
  for run in range(runs):
    for workload in args.workloads:
      if workload in errors:
        continue
      try:
        results[workload].append(_run_child(workload))
      except Exception as e:  # noqa: BLE001  One failing workload, not all.
        errors[workload] = f'{type(e).__name__}: {e}'[-500:]
      print(f'run {run + 1}/{runs}: {workload}', file=sys.stderr, flush=True)
  lines = {workload: (dict(workload=workload, error=errors[workload])
                      if workload in errors else
                      summarize(workload, results[workload]))
           for workload in args.workloads}
  add_auto_ratios(lines)
  for line in lines.values():
    line['jax'] = jax.__version__
    print(json.dumps(line), flush=True)


if __name__ == '__main__':
  main()
