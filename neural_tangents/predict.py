"""Predictions of trained wide networks: closed-form MSE dynamics, ensembles
of infinitely wide networks, GP inference, and ODE-solved descent on any loss.

Example:
  >>> import neural_tangents as nt
  >>> predict_fn = nt.predict.gradient_descent_mse(k_train_train, y_train)
  >>> fx_train_t, fx_test_t = predict_fn(t, fx_train_0, fx_test_0,
  ...                                    k_test_train)
"""
# pylint: disable=unused-import
from neural_tangents._src.predict import Gaussian
from neural_tangents._src.predict import gp_inference
from neural_tangents._src.predict import gradient_descent
from neural_tangents._src.predict import gradient_descent_mse
from neural_tangents._src.predict import gradient_descent_mse_ensemble
from neural_tangents._src.predict import max_learning_rate
from neural_tangents._src.predict import ODEState
