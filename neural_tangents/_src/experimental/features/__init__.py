"""Feature maps of neural kernels (`nt.experimental.features`'s modules).

One concept per module: `feature_type` (the `Features` pytree and its
layout), `combinators` (`serial`), `linear`, `convolution`, `pooling`,
`normalization`, `aggregate` (the exact layers), `relu` and `elementwise`
(the nonlinearities), `relu_ntk` (a whole ReLU network in one sketch),
`stax_conversion` (`from_stax`: the features of a stax network), and
their building blocks `sketches` (randomized linear maps of tensor
products), `arccos_polynomials` and `hermite` (polynomial expansions of dual
activations) and `gram` (factoring a kernel matrix).
"""
