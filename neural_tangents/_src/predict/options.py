"""The solver options of one `predict` call: `SolveOptions`, checked once.

Every entry point that solves with the regularized train-train kernel
`K + r I` (`gp_inference`, `gradient_descent_mse`,
`gradient_descent_mse_ensemble`) takes the same keywords: `diag_reg` and
`diag_reg_absolute_scale` define `r` (`diag_reg` times the mean diagonal
entry of `K`, or `diag_reg` itself), `solver` picks the solve at infinite
time, and `tol`, `maxiter`, `preconditioner_rank` tune conjugate gradients.
`solve_options` checks them and returns one frozen `SolveOptions`; `solve`
and the train kernels read that record and never check its fields again.

Adding an option: a field here (with its check in `solve_options`), its use
in `solve.py`, and the keyword (signature, docstring, `solve_options` call)
in the entry points that take it.

Example:
  >>> from neural_tangents._src.predict.options import solve_options
  >>> options = solve_options(solver='cg', diag_reg=1e-3, tol=1e-8)
  >>> options.solver, options.maxiter, options.preconditioner_rank
  ('cg', None, 100)
  >>> options.replace(solver='eigh').solver
  'eigh'
"""
import dataclasses
import math
from typing import Any, Optional

import jax
import numpy as np


SOLVERS = ('cholesky', 'eigh', 'cg')


@dataclasses.dataclass(frozen=True)
class SolveOptions:
  """How to solve with `K + r I`; build it with `solve_options` (checked).

  Attributes:
    solver: 'cholesky', 'eigh' or 'cg' (see `solve.py`).
    diag_reg: the regularizer, relative to the mean diagonal entry of `K`
      unless `diag_reg_absolute_scale`; may be traced under `jit`.
    diag_reg_absolute_scale: whether `diag_reg` is absolute.
    tol: 'cg': relative residual at which to stop.
    maxiter: 'cg': maximum iterations (`None`: 10 times the rows).
    preconditioner_rank: 'cg': rank of the pivoted Cholesky preconditioner
      (0: none).
    progress: 'cg': whether to show a `tqdm` progress bar of the iterations
      (with the residual), as `nt.batch(..., progress=True)` does for blocks.
  """
  solver: str = 'cholesky'
  diag_reg: Any = 0.
  diag_reg_absolute_scale: bool = False
  tol: float = 1e-5
  maxiter: Optional[int] = None
  preconditioner_rank: int = 100
  progress: bool = False

  def replace(self, **changes: Any) -> 'SolveOptions':
    """A copy with `changes` (e.g. `solver='eigh'` for finite times)."""
    return dataclasses.replace(self, **changes)

  @property
  def concrete(self) -> bool:
    """Whether `diag_reg` is concrete: factors of a traced one aren't kept."""
    return not isinstance(self.diag_reg, jax.core.Tracer)


def solve_options(solver: str = 'cholesky', diag_reg: Any = 0.,
                  diag_reg_absolute_scale: bool = False, tol: float = 1e-5,
                  maxiter: Optional[int] = None,
                  preconditioner_rank: int = 100,
                  progress: bool = False) -> SolveOptions:
  """The checked `SolveOptions` of a `predict` call.

  Raises:
    ValueError: for an unknown `solver`, `tol` outside `(0, 1)`, `maxiter`
      not a positive int or None, `preconditioner_rank` not an int >= 0, or
      `diag_reg` negative or not finite.
    TypeError: for a `diag_reg` that is not a number.
  """
  check_solver_args(solver, tol, maxiter, preconditioner_rank)
  check_diag_reg(diag_reg)
  if not isinstance(progress, (bool, np.bool_)):
    raise TypeError(f'`progress` must be True or False; got {progress!r}. '
                    'Pass progress=True for a progress bar of the CG '
                    'iterations.')
  return SolveOptions(solver, diag_reg, diag_reg_absolute_scale, tol, maxiter,
                      preconditioner_rank, bool(progress))


def check_solver_args(solver: str, tol: float, maxiter: Optional[int],
                      rank: int) -> None:
  """Raises `ValueError` for a bad `solver`, `tol`, `maxiter` or `rank`."""
  if solver not in SOLVERS:
    raise ValueError(f'`solver` must be one of {SOLVERS}; got {solver!r}. '
                     '"cholesky" (default) for kernels that fit in memory, '
                     '"cg" for larger or host/memory-mapped kernels, "eigh" '
                     'for the pseudo-inverse of singular kernels.')
  if not (isinstance(tol, (int, float, np.integer, np.floating)) and
          not isinstance(tol, (bool, np.bool_)) and 0 < tol < 1):
    raise ValueError(f'`tol` must be a float in (0, 1); got {tol!r}. Pass '
                     'e.g. tol=1e-5 (the relative residual to reach).')
  if maxiter is not None and (not isinstance(maxiter, (int, np.integer))
                              or isinstance(maxiter, (bool, np.bool_))
                              or maxiter < 1):
    raise ValueError(f'`maxiter` must be a positive int or None; got '
                     f'{maxiter!r}. Pass e.g. maxiter=1000, or None for 10 '
                     'times the number of rows.')
  if (not isinstance(rank, (int, np.integer)) or
      isinstance(rank, (bool, np.bool_)) or rank < 0):
    raise ValueError(f'`preconditioner_rank` must be an int >= 0; got '
                     f'{rank!r}. Pass e.g. 100, or 0 for no preconditioner.')


def check_diag_reg(diag_reg: Any) -> None:
  """`diag_reg` must be a finite number >= 0 (when concrete)."""
  if isinstance(diag_reg, jax.core.Tracer):
    return
  try:
    if isinstance(diag_reg, (str, bytes, bool, np.bool_)):
      raise TypeError
    value = float(diag_reg)
  except (TypeError, ValueError):
    raise TypeError(f'`diag_reg` must be a number >= 0; got {diag_reg!r}. '
                    'Pass a float, e.g. 1e-4 (0 for none).') from None
  if not value >= 0. or not math.isfinite(value):
    raise ValueError(
        f'`diag_reg` must be >= 0 and finite; got {diag_reg!r}. It is the '
        'variance added to the diagonal of the train-train kernel (noise or '
        'ridge); a negative value can make the kernel indefinite. Pass 0 for '
        'none, or a small positive value such as 1e-4.')
