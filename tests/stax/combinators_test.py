"""Tests of `serial`, `parallel` and `repeat` (against `serial`)."""
from absl.testing import absltest
from absl.testing import parameterized
import jax
from jax import random
import jax.numpy as jnp
import numpy as np

import neural_tangents as nt
from neural_tangents import stax
from neural_tangents._src.stax import combinators
from tests import test_utils


_GETS = ('nngp', 'ntk', 'cov1', 'cov2')


@stax.layer
def _Noise(scale: float = 0.1):
  """Adds `scale * N(0, 1)` noise drawn from `rng=`: a layer with randomness."""
  def apply_fn(params, x, rng=None, **kwargs):
    return x + scale * random.normal(rng, x.shape)

  @stax.requires()
  def kernel_fn(k, **kwargs):
    return k

  return lambda rng, s: (s, ()), apply_fn, kernel_fn


def _dense():
  return stax.Dense(16, W_std=1.3, b_std=0.2)


_BLOCKS = {
    'identity': lambda: stax.Identity(),
    'dense': lambda: _dense(),
    'dense_relu': lambda: stax.serial(_dense(), stax.Relu()),
    'dense_relu_dense': lambda: stax.serial(_dense(), stax.Relu(), _dense()),
    # Reads 5 input features first: shapes change at the first application.
    'shape_changing': lambda: stax.serial(stax.Dense(16, 1.5, 0.1),
                                          stax.Erf()),
    'noise': lambda: stax.serial(_dense(), _Noise()),
    'dropout': lambda: stax.serial(_dense(), stax.Dropout(0.8)),
}

# Convolutional blocks, on (N, H, W, C) inputs with 4 channels.
_CONV_BLOCKS = {
    'conv_relu_same': lambda: stax.serial(
        stax.Conv(4, (3, 3), padding='SAME', W_std=1.3, b_std=0.1),
        stax.Relu()),
    'conv_circular': lambda: stax.Conv(4, (2, 3), padding='CIRCULAR',
                                       W_std=1.2),
}


def _inputs(shape1=(3, 5), shape2=(2, 5)):
  return test_utils.random_inputs(shape1, shape2, x2_scale=2.)


class RepeatTest(test_utils.NeuralTangentsTestCase):

  # n = 2 and n = 7 run the same scan, of another length; 7 is in the full
  # tier.
  @test_utils.sample_product(
      block_name=sorted(_BLOCKS),
      n=test_utils.full_tier_cases((0, 1, 2, 3), (7,)))
  def test_repeat_matches_serial(self, block_name, n):
    block = _BLOCKS[block_name]()
    # Blocks that keep the width need the input width to be a fixed point.
    d = 5 if block_name == 'shape_changing' else 16
    x1, x2 = _inputs((3, d), (2, d))
    r_init, r_apply, r_kernel = stax.repeat(block, n)
    s_init, s_apply, s_kernel = stax.serial(*[block] * n, fold_repeats=False)

    for x2_ in (None, x2):
      k_r, k_s = r_kernel(x1, x2_), s_kernel(x1, x2_)
      for get in _GETS:
        self.assertAllClose(getattr(k_r, get), getattr(k_s, get),
                            msg=f'{get}, x2={x2_ is not None}')
      self.assertEqual(k_r.shape1, k_s.shape1)
      self.assertEqual(k_r.is_gaussian, k_s.is_gaussian)

    key = random.PRNGKey(3)
    shape_r, params_r = r_init(key, (-1, d))
    shape_s, params_s = s_init(key, (-1, d))
    self.assertEqual(shape_r, shape_s)
    self.assertAllClose(stax.repeat_params_to_serial(params_r, n), params_s)
    rng = random.PRNGKey(4)
    self.assertAllClose(r_apply(params_r, x1, rng=rng),
                        s_apply(params_s, x1, rng=rng))

  @test_utils.sample_product(block_name=sorted(_CONV_BLOCKS), n=(0, 1, 3))
  def test_repeat_matches_serial_on_conv_blocks(self, block_name, n):
    block = _CONV_BLOCKS[block_name]()
    x1, x2 = _inputs((2, 5, 4, 4), (3, 5, 4, 4))
    r_init, r_apply, r_kernel = stax.repeat(block, n)
    s_init, s_apply, s_kernel = stax.serial(*[block] * n, fold_repeats=False)
    # Compiled whole: one compilation instead of many eager ops.
    r_kernel = jax.jit(r_kernel, static_argnames='diagonal_spatial')
    s_kernel = jax.jit(s_kernel, static_argnames='diagonal_spatial')
    for kwargs in (dict(diagonal_spatial=False), dict(diagonal_spatial=True)):
      k_r, k_s = r_kernel(x1, x2, **kwargs), s_kernel(x1, x2, **kwargs)
      for get in _GETS:
        self.assertAllClose(getattr(k_r, get), getattr(k_s, get),
                            msg=f'{get}, {kwargs}')
    _, params_r = r_init(random.PRNGKey(3), (-1, 5, 4, 4))
    _, params_s = s_init(random.PRNGKey(3), (-1, 5, 4, 4))
    self.assertAllClose(r_apply(params_r, x1), s_apply(params_s, x1))

  # Each implementation differentiates through the scan once, with either
  # `vmap_axes`; AUTO (which compiles all three and picks one) in the full
  # tier.
  @parameterized.named_parameters(*test_utils.full_tier_cases(
      [('jacobian_contraction', (nt.NtkImplementation.JACOBIAN_CONTRACTION,),
        None),
       ('ntk_vector_products', (nt.NtkImplementation.NTK_VECTOR_PRODUCTS,), 0),
       ('structured_derivatives',
        (nt.NtkImplementation.STRUCTURED_DERIVATIVES,), None)],
      [('all_vmap_none', tuple(nt.NtkImplementation), None),
       ('all_vmap_0', tuple(nt.NtkImplementation), 0)]))
  def test_empirical_ntk_of_repeat_matches_jacobian(self, implementations,
                                                    vmap_axes):
    _, apply_fn, _ = net = stax.serial(
        stax.Dense(16), stax.repeat(stax.serial(_dense(), stax.Relu()), 3),
        stax.Dense(2))
    x1, x2 = _inputs((3, 5), (2, 5))
    _, params = net[0](random.PRNGKey(0), (-1, 5))
    jac = lambda x: [j.reshape(j.shape[:2] + (-1,)) for j in
                     jax.tree_util.tree_leaves(jax.jacobian(apply_fn)(params,
                                                                      x))]
    expected = sum(jnp.einsum('iap,jbp->ijab', a, b)
                   for a, b in zip(jac(x1), jac(x2)))
    for implementation in implementations:
      ntk = nt.empirical_ntk_fn(apply_fn, trace_axes=(), vmap_axes=vmap_axes,
                                implementation=implementation)(x1, x2, params)
      self.assertAllClose(ntk, expected, msg=str(implementation))

  # The same params (`test_repeat_matches_serial`) and empirical NTKs
  # (`test_empirical_ntk_of_repeat_matches_jacobian`) give the same Monte
  # Carlo averages; the full tier checks it end to end.
  @test_utils.full_tier_only
  def test_monte_carlo_of_repeat_matches_serial(self):
    block = stax.serial(_dense(), stax.Relu())
    x1, x2 = _inputs((3, 5), (2, 5))
    kernels = []
    for net in (stax.repeat(block, 3), stax.serial(*[block] * 3)):
      init_fn, apply_fn, _ = stax.serial(stax.Dense(16), net, stax.Dense(3))
      mc = nt.monte_carlo_kernel_fn(init_fn, apply_fn, random.PRNGKey(0), 4,
                                    vmap_axes=0)
      kernels.append(mc(x1, x2, ('nngp', 'ntk')))
    self.assertAllClose(kernels[0], kernels[1])

  def test_params_are_stacked(self):
    init_fn, _, _ = stax.repeat(stax.serial(_dense(), stax.Relu()), 4)
    _, params = init_fn(random.PRNGKey(0), (-1, 16))
    (W, b), relu_params = params
    self.assertEqual(W.shape, (4, 16, 16))
    self.assertEqual(b.shape, (4, 1, 16))
    self.assertEqual(relu_params, ())

  def test_shape_changing_params(self):
    init_fn, apply_fn, _ = stax.repeat(stax.serial(stax.Dense(32),
                                                   stax.Relu()), 10)
    out_shape, params = init_fn(random.PRNGKey(0), (-1, 784))
    self.assertEqual(out_shape, (-1, 32))
    self.assertIsInstance(params, stax.RepeatParams)
    self.assertEqual(params.first[0][0].shape, (784, 32))
    self.assertEqual(params.rest[0][0].shape, (9, 32, 32))
    self.assertEqual(apply_fn(params, jnp.ones((2, 784))).shape, (2, 32))

  def test_serial_layout_params_raise(self):
    block = _BLOCKS['dense_relu']()
    x = jnp.ones((2, 16))
    _, serial_params = stax.serial(*[block] * 3)[0](random.PRNGKey(0),
                                                     x.shape)
    _, apply_fn, _ = stax.repeat(block, 3)
    with self.assertRaisesRegex(
        ValueError, r'`repeat\(layer, 3\)` takes the params of its `init_fn`'
        r'.*leading axis of size 3.*`stax.serial_params_to_repeat'):
      apply_fn(serial_params, x)
    self.assertAllClose(
        apply_fn(stax.serial_params_to_repeat(serial_params), x),
        stax.serial(*[block] * 3)[1](serial_params, x))

  @parameterized.parameters(1, 2, 5)
  def test_param_conversion_round_trips(self, n):
    for d, block in ((16, _BLOCKS['dense_relu']()),
                     (5, _BLOCKS['shape_changing']())):
      _, params = stax.serial(*[block] * n)[0](random.PRNGKey(0), (-1, d))
      stacked = stax.serial_params_to_repeat(params)
      self.assertAllClose(stax.repeat_params_to_serial(stacked, n), params)
      _, params_r = stax.repeat(block, n)[0](random.PRNGKey(0), (-1, d))
      self.assertAllClose(stax.serial_params_to_repeat(
          stax.repeat_params_to_serial(params_r, n)), params_r)

  def test_repeat_params_to_serial_deeper_than_stacked_raises(self):
    params = (jnp.zeros((3, 4, 4)), jnp.zeros((3, 4)))  # `Dense`, stacked.
    self.assertLen(stax.repeat_params_to_serial(params, 3), 3)
    with self.assertRaisesRegex(
        ValueError, r'`n`=5 is larger than the depth of the stacked `params` '
        r'\(3 layers\). Pass the `n` of the `repeat'):
      stax.repeat_params_to_serial(params, 5)

  def test_rng_gives_independent_keys_per_iteration(self):
    _, apply_fn, _ = stax.repeat(_Noise(1.), 3)
    x = jnp.zeros((1, 1000))
    y = apply_fn((), x, rng=random.PRNGKey(0))
    # Three independent N(0, 1) draws sum to variance 3 (identical keys: 9).
    self.assertAllClose(float(jnp.var(y)), 3., rtol=0.15, atol=0)

  def test_spatial_and_diagonal_representations(self):
    block = stax.serial(_dense(), stax.Relu())
    x1, x2 = _inputs((2, 3, 16), (3, 3, 16))
    # Compiled whole: one compilation instead of many eager ops.
    static = ('diagonal_spatial', 'diagonal_batch')
    r_kernel = jax.jit(stax.repeat(block, 3)[2], static_argnames=static)
    s_kernel = jax.jit(stax.serial(*[block] * 3, fold_repeats=False)[2],
                       static_argnames=static)
    for kwargs in (dict(diagonal_spatial=True), dict(diagonal_spatial=False),
                   dict(diagonal_batch=False)):
      k_r, k_s = r_kernel(x1, x2, **kwargs), s_kernel(x1, x2, **kwargs)
      for get in _GETS:
        self.assertAllClose(getattr(k_r, get), getattr(k_s, get),
                            msg=f'{get}, {kwargs}')

  def test_jit_vmap_grad(self):
    block = stax.serial(_dense(), stax.Relu())
    # Depth 3: one scan, as at any larger depth.
    _, _, r_kernel = stax.repeat(block, 3)
    _, _, s_kernel = stax.serial(*[block] * 3, fold_repeats=False)
    x1, x2 = _inputs((3, 16), (2, 16))
    f_r = lambda x: r_kernel(x, x2, 'ntk')
    f_s = lambda x: s_kernel(x, x2, 'ntk')
    # Transformations compiled whole: one compilation instead of many eager
    # ops (the transformation rules are the same).
    self.assertAllClose(jax.jit(f_r)(x1), jax.jit(f_s)(x1))
    xs = jnp.stack([x1, 2 * x1])
    self.assertAllClose(jax.jit(jax.vmap(f_r))(xs),
                        jax.jit(jax.vmap(f_s))(xs))
    g_r = jax.jit(jax.grad(lambda x: f_r(x).sum()))(x1)
    self.assertFinite(g_r)
    self.assertAllClose(g_r, jax.jit(jax.grad(lambda x: f_s(x).sum()))(x1))

  def test_kernel_compiles_as_one_scan(self):
    block = stax.serial(_dense(), stax.Relu())
    x = jnp.ones((2, 16))
    n_eqns = [len(jax.make_jaxpr(lambda a: stax.repeat(block, n)[2](
        a, None, 'ntk'))(x).jaxpr.eqns) for n in (3, 300)]
    self.assertEqual(n_eqns[0], n_eqns[1])

  def test_layer_that_keeps_changing_raises(self):
    # Doubles its channels at every application.
    doubling = stax.serial(stax.FanOut(2),
                           stax.parallel(stax.Identity(), stax.Identity()),
                           stax.FanInConcat())
    x = jnp.ones((2, 3))
    with self.assertRaisesRegex(ValueError, r'`repeat` cannot scan this layer.*'
                                r'shape1.*Use `stax.serial\(\*\[layer\] \* n\)'):
      stax.repeat(doubling, 3)[2](x, None)
    with self.assertRaisesRegex(ValueError, r'`repeat` cannot scan this layer.*'
                                r'output shape still changes'):
      stax.repeat(doubling, 3)[0](random.PRNGKey(0), (-1, 3))
    with self.assertRaisesRegex(ValueError, r'`repeat` cannot scan'):
      stax.repeat(stax.FanOut(2), 2)[2](x, None)

  def test_invalid_arguments_raise(self):
    with self.assertRaisesRegex(ValueError, '`n` must be a non-negative int'):
      stax.repeat(_dense(), -1)
    with self.assertRaisesRegex(TypeError, '`n` must be a non-negative int'):
      stax.repeat(_dense(), 2.)
    with self.assertRaisesRegex(TypeError, r'`repeat` takes a layer'):
      stax.repeat(stax.Dense, 2)


class FoldedSerialTest(test_utils.NeuralTangentsTestCase):

  def test_fold_runs_groups_repeated_blocks(self):
    a, b, c = object(), object(), object()
    segments = combinators.fold_runs([c] + [a, b] * 4 + [a] * 3 + [c])
    self.assertEqual([count for _, count in segments], [1, 4, 3, 1])

  @parameterized.parameters(
      ('same_object', lambda d, r: [stax.serial(d, r)] * 6),
      ('same_sequence', lambda d, r: [d, r] * 6),
      ('mixed', lambda d, r: [stax.Dense(16)] + [d, r] * 3 + [d] * 3),
  )
  def test_folded_matches_unfolded(self, name, make_layers):
    layers = make_layers(_dense(), stax.Relu())
    x1, x2 = _inputs((3, 16), (2, 16))
    folded = stax.serial(*layers)[2](x1, x2)
    unfolded = stax.serial(*layers, fold_repeats=False)[2](x1, x2)
    for get in _GETS:
      self.assertAllClose(getattr(folded, get), getattr(unfolded, get),
                          msg=get)
    n_eqns = lambda fold: len(jax.make_jaxpr(lambda a: stax.serial(
        *layers, fold_repeats=fold)[2](a, None, 'ntk'))(x1).jaxpr.eqns)
    self.assertLess(n_eqns(True), n_eqns(False))

  def test_folding_falls_back_when_not_a_fixed_point(self):
    doubling = stax.serial(stax.FanOut(2),
                           stax.parallel(stax.Identity(), stax.Identity()),
                           stax.FanInConcat())
    x = jnp.ones((2, 3))
    k = stax.serial(*[doubling] * 3)[2](x, None)
    self.assertEqual(k.shape1, (2, 24))

  def test_folding_falls_back_for_shrinking_convolutions(self):
    # Each VALID convolution shrinks the width: not a fixed point (the
    # message naming the changed attributes read `.shape` of a tuple).
    layers = [stax.Conv(1, (1, 2), padding='VALID')] * 4
    x = np.random.RandomState(0).randn(2, 3, 5, 2)
    folded = stax.serial(*layers)[2](x, None, 'nngp')
    unfolded = stax.serial(*layers, fold_repeats=False)[2](x, None, 'nngp')
    self.assertEqual(folded.shape, (2, 2, 3, 3, 1, 1))
    self.assertAllClose(folded, unfolded, rtol=1e-12, atol=0.)


class SerialParallelTest(test_utils.NeuralTangentsTestCase):

  def test_serial_params_and_rng(self):
    init_fn, apply_fn, _ = stax.serial(_dense(), _Noise(), _Noise())
    _, params = init_fn(random.PRNGKey(0), (-1, 5))
    self.assertIsInstance(params, list)
    self.assertLen(params, 3)
    x = jnp.ones((2, 5))
    y1 = apply_fn(params, x, rng=random.PRNGKey(1))
    y2 = apply_fn(params, x, rng=random.PRNGKey(2))
    self.assertGreater(float(jnp.abs(y1 - y2).max()), 0)

  def test_serial_params_of_wrong_length_raise(self):
    init_fn, apply_fn, _ = stax.serial(_dense(), stax.Relu(), stax.Dense(1))
    _, params = init_fn(random.PRNGKey(0), (-1, 5))
    x = jnp.ones((2, 5))
    msg = (r'`params` of `serial` of 3 layers must be a list with one entry '
           r'per layer \(3 entries\); got 2 entries. Pass the params')
    with self.assertRaisesRegex(ValueError, msg):
      apply_fn(params[:2], x)
    with self.assertRaisesRegex(ValueError, msg):
      nt.empirical_ntk_fn(apply_fn)(x, None, params[:2])

  @parameterized.parameters(tuple, list)
  def test_parallel_keeps_container_type(self, container):
    init_fn, apply_fn, kernel_fn = stax.parallel(_dense(), stax.Identity())
    shapes = container([(-1, 5), (-1, 4)])
    out_shapes, params = init_fn(random.PRNGKey(0), shapes)
    self.assertIsInstance(out_shapes, container)
    self.assertEqual(list(out_shapes), [(-1, 16), (-1, 4)])
    xs = container([jnp.ones((2, 5)), jnp.ones((2, 4))])
    out = apply_fn(params, xs)
    self.assertIsInstance(out, container)
    self.assertEqual([o.shape for o in out], [(2, 16), (2, 4)])
    ks = kernel_fn(xs, None, 'nngp')
    self.assertIsInstance(ks, container)
    self.assertEqual([k.shape for k in ks], [(2, 2), (2, 2)])
    self.assertAllClose(ks[1], jnp.ones((2, 2)))

  def test_parallel_wrong_number_of_inputs_raises(self):
    init_fn, _, _ = stax.parallel(_dense(), stax.Identity())
    with self.assertRaisesRegex(ValueError, '`parallel` of 2 layers needs.*'
                                'FanOut'):
      init_fn(random.PRNGKey(0), [(-1, 5)])

  def test_nested_tuple_inputs_match_branches(self):
    layers = (stax.Dense(3, 1.5, 0.1), stax.Dense(3, 0.7), stax.Dense(3, 1.2))
    init_fn, apply_fn, kernel_fn = stax.parallel(
        stax.parallel(layers[0], layers[1]), layers[2])
    keys = random.split(random.PRNGKey(3), 6)
    xs = [random.normal(keys[i], (3, 2 + i)) for i in range(3)]
    ys = [random.normal(keys[3 + i], (2, 2 + i)) for i in range(3)]
    nest = lambda v: ((v[0], v[1]), v[2])
    for x2 in (None, nest(ys)):
      ks = kernel_fn(nest(xs), x2)
      self.assertIsInstance(ks, tuple)
      self.assertIsInstance(ks[0], tuple)
      flat = [ks[0][0], ks[0][1], ks[1]]
      for i, (layer, k) in enumerate(zip(layers, flat)):
        desired = layer[2](xs[i], None if x2 is None else ys[i])
        for get in _GETS:
          self.assertAllClose(getattr(k, get), getattr(desired, get))
    out_shapes, params = init_fn(random.PRNGKey(0),
                                 nest([x.shape for x in xs]))
    self.assertEqual(out_shapes, (((3, 3), (3, 3)), (3, 3)))
    out = apply_fn(params, nest(xs))
    self.assertAllClose(out[0][1], layers[1][1](params[0][1], xs[1]))

  def test_init_shapes_match_apply_shapes(self):
    init_fn, apply_fn, _ = stax.serial(
        stax.Dense(7), stax.FanOut(2), stax.parallel(stax.Relu(),
                                                     stax.Dense(3)),
        stax.FanInConcat(), stax.Flatten(), stax.Dense(2))
    out_shape, params = init_fn(random.PRNGKey(0), (-1, 4, 5))
    self.assertEqual(out_shape, (-1, 2))
    self.assertEqual(apply_fn(params, jnp.ones((3, 4, 5))).shape, (3, 2))


class ArgumentErrorTest(parameterized.TestCase):
  """Issue 21 items 17-19: clear errors for layers, keys and shapes."""

  def test_layer_constructor_not_called(self):
    with self.assertRaisesRegex(
        TypeError, r'`layers\[1\]` of `serial`.*`Dense`.*not called.*'
        r'stax\.Dense\(512\)'):
      stax.serial(stax.Relu(), stax.Dense)

  @parameterized.named_parameters(
      ('int', 0, TypeError, r'`rng` must be a PRNG key; got 0.*'
       r'PRNGKey\(0\)'),
      ('float', jnp.ones(2), TypeError, r'`rng`.*dtype float.*PRNGKey'),
      ('wrong_shape', jnp.zeros(3, jnp.uint32), ValueError,
       r'`rng`.*shape \(2,\), got shape \(3,\).*jax\.random\.key'),
      ('several_raw', random.split(random.PRNGKey(0), 3), ValueError,
       r'`rng` must be one PRNG key; got 3 keys.*keys\[0\].*vmap'),
      ('several_typed', random.split(random.key(0), 2), ValueError,
       r'`rng` must be one PRNG key.*typed keys.*keys\[0\]'),
  )
  def test_bad_keys(self, key, error, message):
    init_fn = stax.serial(stax.Dense(3), stax.Relu())[0]
    with self.assertRaisesRegex(error, message):
      init_fn(key, (2, 4))
    with self.assertRaisesRegex(error, message):
      stax.Dense(3)[0](key, (2, 4))

  def test_raw_and_typed_keys_give_the_same_params(self):
    init_fn = stax.serial(stax.Dense(3), stax.Relu(), stax.Dense(1))[0]
    _, raw = init_fn(random.PRNGKey(1), (2, 4))
    _, typed = init_fn(random.key(1), (2, 4))
    for a, b in zip(jax.tree_util.tree_leaves(raw),
                    jax.tree_util.tree_leaves(typed)):
      np.testing.assert_array_equal(a, b)
    # Keys traced under `jit` and `vmap` are accepted.
    jax.jit(lambda k: init_fn(k, (2, 4))[1])(random.PRNGKey(0))
    jax.vmap(lambda k: init_fn(k, (2, 4))[1])(random.split(random.key(0), 2))

  @parameterized.parameters(((5, 'a'), r"the entry 'a' is not an int"),
                            ('ab', r"'ab' is a str, not a tuple"),
                            ((5, 2.), r'the entry 2.0 is not an int'))
  def test_bad_input_shape(self, shape, why):
    init_fn = stax.serial(stax.Dense(3), stax.Relu())[0]
    with self.assertRaisesRegex(TypeError, r'`input_shape` must be a tuple of '
                                r'ints.*' + why + r'.*x\.shape'):
      init_fn(random.PRNGKey(0), shape)


if __name__ == '__main__':
  absltest.main()
