"""Predictions of trained wide networks: closed-form MSE dynamics, ensembles
of infinitely wide networks, GP inference, and ODE-solved descent on any loss.

Example:
  >>> from jax import random
  >>> import jax.numpy as jnp
  >>> import neural_tangents as nt
  >>> from neural_tangents import stax
  >>> _, _, kernel_fn = stax.serial(stax.Dense(512), stax.Relu(),
  ...                               stax.Dense(1))
  >>> x_train = random.normal(random.PRNGKey(1), (3, 4))
  >>> x_test = random.normal(random.PRNGKey(2), (2, 4))
  >>> y_train = jnp.ones((3, 1))
  >>> predict_fn = nt.predict.gradient_descent_mse(
  ...     kernel_fn(x_train, None, 'ntk'), y_train)
  >>> fx_train_t, fx_test_t = predict_fn(
  ...     t=10., fx_train_0=0., fx_test_0=0.,
  ...     k_test_train=kernel_fn(x_test, x_train, 'ntk'))
  >>> fx_train_t.shape, fx_test_t.shape
  ((3, 1), (2, 1))
"""
# pylint: disable=unused-import
from neural_tangents._src.predict import Gaussian
from neural_tangents._src.predict import FitResult
from neural_tangents._src.predict import fit_hyperparameters
from neural_tangents._src.predict import gp_inference
from neural_tangents._src.predict import gradient_descent
from neural_tangents._src.predict import gradient_descent_mse
from neural_tangents._src.predict import gradient_descent_mse_ensemble
from neural_tangents._src.predict import KernelRows
from neural_tangents._src.predict import log_marginal_likelihood
from neural_tangents._src.predict import LogMarginalLikelihood
from neural_tangents._src.predict import LowRankKernel
from neural_tangents._src.predict import max_learning_rate
from neural_tangents._src.predict import ODEState
from neural_tangents._src.predict import SolveInfo
from neural_tangents._src.predict import StoredKernel
