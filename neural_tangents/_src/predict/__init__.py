"""Outputs of wide networks trained by gradient descent, and GP inference.

Modules: `layout` (kernel and output layout, kernel checks), `posterior`
(what `get` selects, `Gaussian`), `options` (`SolveOptions`, the solver
keywords checked once), `solve` (Cholesky, eigh and conjugate gradient solves
of the train kernel, `SolveInfo`), `kernel_rows` (`KernelRows`, kernels by
blocks of rows, and host kernel products), `stored` (`StoredKernel`:
kernels in an `nt.batch` store, read by row blocks), `train_kernels`
(`TrainKernels`: the train kernels, targets and cached factorizations of one
prediction function), `flow` (relaxation of the gradient flow and posterior
covariances), `mse`
(`gradient_descent_mse`, `max_learning_rate`), `ensemble`
(`gradient_descent_mse_ensemble`), `gp` (`gp_inference`), `likelihood`
(`log_marginal_likelihood`, `fit_hyperparameters`), `ode_descent`
(`gradient_descent` on any loss, `ODEState`) and `low_rank` (`LowRankKernel`,
train kernels `F F^T` solved in feature space). The public names are
re-exported here; the helpers that modules share have public names in the
module that owns them (see `docs/dev/predict.md`).

A network linearized around its initial parameters `theta_0`,
`f_lin(x) = f_0(x) + J(x) (theta - theta_0)`, trained by gradient descent
moves its outputs in function space through the neural tangent kernel
`Theta(x, x') = J(x) J(x')^T`. For MSE these dynamics are linear and solved in
closed form; for infinitely wide networks `f_0` is a Gaussian process (the
NNGP) and so are the trained outputs [1, 2].

Conventions (the published Neural Tangents ones):

* Loss. The MSE is the mean over all `y_train.size` entries,
  `loss = 0.5 * mean((f(x_train) - y_train)**2)`. Gradient descent with
  learning rate `lr` is followed in the continuous-time limit: after `t` steps
  the train outputs solve
  `df/ds = -Theta (f - y_train) / y_train.size`, `s = lr * t`,
  so `t` counts steps and may be fractional.
* Layout. `y_train` has shape `(N, O_1, ..., O_d)`. The output axes in
  `trace_axes` are traced out of the kernel: the kernel is the identity on
  them, and the same kernel acts on each of their entries. A kernel relating
  `N1` to `N2` points therefore has shape `(N1, N2)` followed by one pair of
  axes `(O_i, O_i')` for each output axis not in `trace_axes`, interleaved as
  in `nt.Kernel`: `trace_axes=(-1,)` and `y_train` of shape `(N, O)` need an
  `(N, N)` kernel, `trace_axes=()` an `(N, N, O, O)` one. The batch axis 0
  may be traced too: the kernel then has no batch axes (`trace_axes=(0, -1)`
  needs a scalar kernel) and each training example evolves on its own.
* Kernels. Functions of one kernel take arrays. `gp_inference` also takes
  `nt.Kernel` objects or namedtuples with `nngp` / `ntk` fields, and selects
  with `get`: 'nngp' (the NNGP posterior, or training only the readout),
  'ntk' (training the whole network) or 'ntkgp' (the GP posterior with the
  NTK as prior, He et al. 2020).
* Regularization. `diag_reg` adds `diag_reg * trace(K) / n` (or `diag_reg`
  itself when `diag_reg_absolute_scale`) to the diagonal of the `n x n`
  train-train kernel `K` that is inverted (the NTK for 'ntk' and 'ntkgp', the
  NNGP for 'nngp'); no other kernel is changed (in particular not the NNGP
  prior of 'ntk' covariances). It acts as observation noise (GP inference)
  or ridge regularization (kernel regression). Predictions on the training
  points themselves ignore it: at infinite time they are `y_train`.
* Singular kernels. Eigenvalues of the (regularized) `n x n` train-train
  kernel at or below `4 sqrt(n) eps(dtype) lambda_max`, the round-off level of
  a computed kernel, are treated as exactly zero: those directions do not move
  under the flow and carry nothing to test points (as for an exactly singular
  PSD kernel), and infinite-time predictions use the pseudo-inverse, i.e. the
  minimum-norm least-squares interpolant (the default Cholesky solve falls
  back to it with a warning naming the `diag_reg` that would avoid it).
  Results stay finite; pass `diag_reg > 0` for a ridge answer instead. A
  kernel with an eigenvalue negative beyond round-off, a visibly asymmetric
  train-train kernel, and `diag_reg < 0` raise a `ValueError`.

[1] Jacot, Gabriel, Hongler. "Neural Tangent Kernel: Convergence and
    Generalization in Neural Networks." NeurIPS 2018.
[2] Lee, Xiao, Schoenholz, Bahri, Novak, Sohl-Dickstein, Pennington. "Wide
    Neural Networks of Any Depth Evolve as Linear Models Under Gradient
    Descent." NeurIPS 2019.
"""
# pylint: disable=unused-import
from neural_tangents._src.predict.ensemble import gradient_descent_mse_ensemble
from neural_tangents._src.predict.gp import gp_inference
from neural_tangents._src.predict.layout import Array
from neural_tangents._src.predict.layout import ArrayOrScalar
from neural_tangents._src.predict.likelihood import fit_hyperparameters
from neural_tangents._src.predict.likelihood import FitResult
from neural_tangents._src.predict.likelihood import log_marginal_likelihood
from neural_tangents._src.predict.likelihood import LogMarginalLikelihood
from neural_tangents._src.predict.low_rank import LowRankKernel
from neural_tangents._src.predict.mse import gradient_descent_mse
from neural_tangents._src.predict.mse import max_learning_rate
from neural_tangents._src.predict.ode_descent import gradient_descent
from neural_tangents._src.predict.ode_descent import ODEState
from neural_tangents._src.predict.posterior import Gaussian
from neural_tangents._src.predict.kernel_rows import KernelRows
from neural_tangents._src.predict.solve import SolveInfo
from neural_tangents._src.predict.stored import StoredKernel
