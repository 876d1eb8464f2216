"""Empirical NTK speed on stax networks, per implementation and `vmap_axes`.

Usage (from the repository root, with this checkout importable, e.g.
`PYTHONPATH=.`):

  python benchmarks/empirical_ntk.py            # all networks
  python benchmarks/empirical_ntk.py fcn        # some networks
  python benchmarks/empirical_ntk.py --small --formulations   # see below

Prints one JSON line per measurement: the network, the implementation,
`vmap_axes`, the median seconds per call after compilation, and `speedup`,
the median of `JACOBIAN_CONTRACTION` with `vmap_axes=None` (measured first,
in the same process) divided by this one's. Speedups, not seconds, are what
compare across machines.

`--formulations` measures instead whether AUTO's formulation switching
(`auto.other_formulation` and the `SEPARABLE` candidate) earns its keep:
AUTO with it and with it disabled, for `vmap_axes` None and 0, with the
implementation AUTO chose, and the two structured formulations it chooses
between without `vmap_axes` (per-example, `structured_example`, and
whole-batch with per-example cotangents, `structured_separable`); `speedup`
is over AUTO without switching at the same `vmap_axes`, or over
`structured_separable`. `--small` shrinks widths and batches (a few
minutes on 2 CPU cores for all networks).
"""
import argparse
import json
import time
from unittest import mock

import jax
import numpy as np

import neural_tangents as nt
from neural_tangents import stax
from neural_tangents._src.empirical import auto
from neural_tangents._src.empirical import structured


def fcn(width=512, batch=32):
  """The fully connected network users write first."""
  return stax.serial(stax.Dense(width), stax.Relu(), stax.Dense(width),
                     stax.Relu(), stax.Dense(10)), (batch, 100)


def resnet(width=32, batch=8, size=16):
  """A small ResNet: two residual blocks as one `stax.repeat` (a scan)."""
  block = stax.serial(
      stax.FanOut(2),
      stax.parallel(
          stax.serial(stax.Conv(width, (3, 3), padding='SAME', b_std=0.1),
                      stax.Relu(),
                      stax.Conv(width, (3, 3), padding='SAME', b_std=0.1)),
          stax.Identity()),
      stax.FanInSum(), stax.Relu())
  return stax.serial(stax.Conv(width, (3, 3), padding='SAME'), stax.Relu(),
                     stax.repeat(block, 2), stax.GlobalAvgPool(),
                     stax.Dense(10)), (batch, size, size, 3)


def fcn_repeat(width=512, batch=32):
  """The FCN with its hidden layers as one `stax.repeat` (a `lax.scan`)."""
  return stax.serial(stax.Dense(width), stax.Relu(),
                     stax.repeat(stax.serial(stax.Dense(width), stax.Relu()),
                                 2),
                     stax.Dense(10)), (batch, 100)


NETWORKS = {'fcn': fcn, 'resnet': resnet, 'fcn_repeat': fcn_repeat}
SMALL = {'fcn': dict(width=256, batch=16), 'fcn_repeat': dict(width=256,
                                                              batch=16),
         'resnet': dict(width=16, batch=8, size=8)}


def median_time(fn, *args, reps=5):
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(reps):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def network(name, small):
  (init_fn, apply_fn, _), shape = NETWORKS[name](**(SMALL[name] if small
                                                    else {}))
  _, params = init_fn(jax.random.PRNGKey(0), shape)
  x1 = jax.random.normal(jax.random.PRNGKey(1), shape)
  x2 = jax.random.normal(jax.random.PRNGKey(2), shape)
  return apply_fn, params, x1, x2


def run(name, small):
  apply_fn, params, x1, x2 = network(name, small)
  cells = [(nt.NtkImplementation.JACOBIAN_CONTRACTION, None)]
  cells += [(i, v) for i in nt.NtkImplementation for v in (None, 0)
            if (i, v) != cells[0]]
  baseline = None
  for implementation, vmap_axes in cells:
    fn = jax.jit(nt.empirical_ntk_fn(apply_fn, vmap_axes=vmap_axes,
                                     implementation=implementation))
    seconds = median_time(fn, x1, x2, params)
    baseline = baseline or seconds
    print(json.dumps(dict(network=name, implementation=implementation.name,
                          vmap_axes=vmap_axes, seconds=round(seconds, 5),
                          speedup=round(baseline / seconds, 2))),
          flush=True)


class _Chosen:
  """Records the implementation AUTO chooses (wraps `auto.choose`)."""

  def __init__(self):
    self.names = []
    self._choose = auto.choose

  def __call__(self, problem, other, *args):
    chosen_problem, fn = self._choose(problem, other, *args)
    choices = args[-1]
    name = next(n for _, n, f in choices.values() if f is fn)
    formulation = 'per-example' if chosen_problem.per_example else 'whole'
    self.names.append(f'{name} ({formulation})')
    return chosen_problem, fn


def _without_switching():
  """Patches that disable formulation switching in AUTO."""
  modes = auto.structured_modes
  return [mock.patch.object(auto, 'other_formulation',
                            lambda *args, **kwargs: None),
          mock.patch.object(auto, 'structured_modes', lambda problem: [
              m for m in modes(problem) if m != structured.Mode.SEPARABLE])]


def _only_separable():
  """Patches under which AUTO runs `structured_separable` alone."""
  candidates = auto.candidates
  return [mock.patch.object(auto, 'other_formulation',
                            lambda *args, **kwargs: None),
          mock.patch.object(auto, 'candidates', lambda *args: {
              k: v for k, v in candidates(*args).items()
              if k == auto.SEPARABLE})]


def _timed(apply_fn, params, x1, x2, vmap_axes, implementation, patches):
  chosen = _Chosen()
  with mock.patch.object(auto, 'choose', chosen):
    for patch in patches:
      patch.start()
    try:
      fn = jax.jit(nt.empirical_ntk_fn(apply_fn, vmap_axes=vmap_axes,
                                       implementation=implementation))
      seconds = median_time(fn, x1, x2, params)
    finally:
      for patch in patches:
        patch.stop()
  return seconds, (chosen.names or [implementation.name])[0]


def run_formulations(name, small):
  apply_fn, params, x1, x2 = network(name, small)
  auto_impl = nt.NtkImplementation.AUTO
  for vmap_axes in (None, 0):
    cells = {}
    for switching in (False, True):
      patches = [] if switching else _without_switching()
      cells[switching] = _timed(apply_fn, params, x1, x2, vmap_axes,
                                auto_impl, patches)
    for switching in (False, True):
      seconds, chosen = cells[switching]
      print(json.dumps(dict(
          network=name, implementation='AUTO', vmap_axes=vmap_axes,
          formulation_switching=switching, chosen=chosen,
          seconds=round(seconds, 5),
          speedup=round(cells[False][0] / seconds, 2))), flush=True)
  separable = _timed(apply_fn, params, x1, x2, None, auto_impl,
                     _only_separable())
  example = _timed(apply_fn, params, x1, x2, 0,
                   nt.NtkImplementation.STRUCTURED_DERIVATIVES, [])
  for cell, (seconds, chosen) in (('structured_separable', separable),
                                  ('structured_example', example)):
    print(json.dumps(dict(network=name, implementation=cell, chosen=chosen,
                          seconds=round(seconds, 5),
                          speedup=round(separable[0] / seconds, 2))),
          flush=True)


if __name__ == '__main__':
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('networks', nargs='*',
                      help=f'some of {list(NETWORKS)} (default: all)')
  parser.add_argument('--small', action='store_true',
                      help='smaller widths and batches')
  parser.add_argument('--formulations', action='store_true',
                      help='AUTO with and without formulation switching')
  arguments = parser.parse_args()
  for network_name in arguments.networks or list(NETWORKS):
    (run_formulations if arguments.formulations else run)(network_name,
                                                          arguments.small)
