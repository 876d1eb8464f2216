"""Experimental parts of Neural Tangents, imported on demand.

`import neural_tangents` does not import them; import a submodule instead:

Example:
  >>> from neural_tangents.experimental import features
  >>> features.DenseFeatures(1)[1](jnp.ones((2, 3)), ()).nngp_feat.shape
  (2, 3)
"""
