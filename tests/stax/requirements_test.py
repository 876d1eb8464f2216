"""Tests of the layer machinery: `get`, inputs, representations, `Kernel`."""
import functools
import operator
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

import neural_tangents as nt
from neural_tangents import stax
from neural_tangents._src.stax import layout
from neural_tangents._src.stax import protocol
from neural_tangents._src.stax import requirements
from neural_tangents._src.utils import kernel as kernel_lib
from tests import test_utils


def _net():
  return stax.serial(stax.Dense(64, 1.5, 0.2), stax.Relu(),
                     stax.Dense(64, 1.2, 0.1), stax.Erf(), stax.Dense(1))


def _inputs(shape1=(3, 5), shape2=(4, 5)):
  return test_utils.random_inputs(shape1, shape2)


class GetTest(test_utils.NeuralTangentsTestCase):

  def test_get_variants(self):
    _, _, kernel_fn = _net()
    x1, x2 = _inputs()
    k = kernel_fn(x1, x2)
    self.assertIsInstance(k, nt.Kernel)
    self.assertAllClose(kernel_fn(x1, x2, 'ntk'), k.ntk)
    both = kernel_fn(x1, x2, ('nngp', 'ntk'))
    self.assertEqual(type(both).__name__, 'Kernel')
    self.assertEqual(both._fields, ('nngp', 'ntk'))
    self.assertAllClose(both.nngp, k.nngp)
    self.assertAllClose(kernel_fn(x1, x2, 'cov1'), k.cov1)
    self.assertAllClose(kernel_fn(x1, x2, 'cov2'), k.cov2)
    self.assertEqual(k.nngp.shape, (3, 4))
    self.assertEqual(k.cov1.shape, (3,))

  def test_get_names_in_any_case(self):
    _, _, kernel_fn = _net()
    x1, x2 = _inputs()
    k = kernel_fn(x1, x2)
    upper = kernel_fn(x1, x2, ('NTK', 'NNGP'))
    self.assertEqual(upper._fields, ('ntk', 'nngp'))
    self.assertAllClose(upper.ntk, k.ntk)
    self.assertAllClose(upper.nngp, k.nngp)
    self.assertAllClose(kernel_fn(x1, x2, 'Ntk'), k.ntk)

  def test_apply_fn_of_a_kernel_is_a_type_error(self):
    init_fn, apply_fn, kernel_fn = _net()
    x1, _ = _inputs()
    _, params = init_fn(jax.random.PRNGKey(0), x1.shape)
    with self.assertRaisesRegex(TypeError, r'`inputs` is .*`nt.Kernel`.*'
                                r'pass `apply_fn\(params, x\)`.*kernel_fn'):
      apply_fn(params, kernel_fn(x1, None))

  @parameterized.parameters(('ntkk',), (('nngp', 'foo'),), (3,), ((),))
  def test_unknown_get_raises(self, get):
    _, _, kernel_fn = _net()
    x1, _ = _inputs()
    with self.assertRaises(ValueError) as e:
      kernel_fn(x1, None, get)
    message = str(e.exception)
    self.assertRegex(message, r"`get.*Pass one of \('nngp', 'ntk', 'cov1', "
                     r"'cov2'\), a tuple of them, e\.g\. get=\('nngp', 'ntk'\), "
                     r"or None for the whole `nt\.Kernel`\.$")
    # Metadata fields can be asked for (as published) but are no choices.
    for field in ('x1_is_x2', 'is_gaussian', 'mask1', 'shape1'):
      self.assertNotIn(field, message)

  def test_unknown_get_message_says_it_once(self):
    _, _, kernel_fn = _net()
    x1, _ = _inputs()
    with self.assertRaises(ValueError) as e:
      kernel_fn(x1, None, 'ntkk')
    self.assertEqual(
        str(e.exception),
        "`get='ntkk'` asks for 'ntkk', which is not available here (did you "
        "mean 'ntk'?). Pass one of ('nngp', 'ntk', 'cov1', 'cov2'), a tuple "
        "of them, e.g. get=('nngp', 'ntk'), or None for the whole "
        "`nt.Kernel`.")
    # Any `Kernel` field stays a valid `get`, as published.
    self.assertEqual(kernel_fn(x1, None, 'is_gaussian'),
                     kernel_fn(x1, None).is_gaussian)

  def test_nngp_never_builds_ntk(self):
    seen = []

    @stax.layer
    def Spy():
      @stax.requires()
      def kernel_fn(k, **kwargs):
        seen.append(k.ntk is None)
        return k
      return (lambda rng, s: (s, ()), lambda p, x, **kw: x, kernel_fn)

    _, _, kernel_fn = stax.serial(stax.Dense(4), Spy(), stax.Relu(), Spy())
    x1, x2 = _inputs()
    kernel_fn(x1, x2, 'nngp')
    kernel_fn(x1, x2, ('nngp', 'cov1'))
    self.assertEqual(seen, [True] * 4)
    kernel_fn(x1, x2, 'ntk')
    self.assertEqual(seen[4:], [False] * 2)


  def test_any_kernel_field_is_a_get(self):
    _, _, kernel_fn = stax.Dense(2, b_std=0.1)
    x1, x2 = _inputs()
    k = kernel_fn(x1, x2)
    out = kernel_fn(x1, x2, ('ntk', 'shape1', 'shape2'))
    self.assertEqual(out._fields, ('ntk', 'shape1', 'shape2'))
    self.assertAllClose(out.ntk, k.ntk)
    self.assertEqual((out.shape1, out.shape2), ((3, 2), (4, 2)))
    self.assertEqual(kernel_fn(x1, x2, 'is_gaussian'), k.is_gaussian)
    self.assertIsNone(kernel_fn(x1, x2, 'mask1'))


class ParseGetOnceTest(test_utils.NeuralTangentsTestCase):

  @parameterized.named_parameters(('name', 'ntk'), ('names', ('nngp', 'ntk')),
                                  ('none', None))
  def test_get_is_parsed_once_per_call(self, get):
    _, _, kernel_fn = stax.serial(stax.Dense(2), stax.Relu(), stax.Dense(1))
    x1, x2 = _inputs()
    parse_get = requirements.arguments.parse_get
    calls = []

    def counting(*args, **kwargs):
      calls.append(args[0])
      return parse_get(*args, **kwargs)

    with mock.patch.object(requirements.arguments, 'parse_get', counting):
      out = kernel_fn(x1, x2, get)
      self.assertEqual(calls, [get])
      k = kernel_fn(x1, x2)  # A call with get=None.
      kernel_fn(k, None, get)  # A `Kernel` input.
      self.assertEqual(calls, [get, None, get])
    if get == 'ntk':
      self.assertEqual(out.shape, (3, 4))


class KeywordsTest(test_utils.NeuralTangentsTestCase):

  def test_unknown_keyword_raises(self):
    _, _, kernel_fn = stax.serial(stax.Dense(2), stax.Relu())
    x1, _ = _inputs()
    with self.assertRaisesRegex(
        TypeError, r"unexpected keyword argument\(s\) \['diagonal_spatail'\]"
        r".*Accepted keywords: \['batch_axis', 'channel_axis', "
        r"'diagonal_batch', 'diagonal_spatial', 'mask_constant', 'pattern'\]. "
        r"Check the spelling"):
      kernel_fn(x1, None, 'nngp', diagonal_spatail=True)
    with self.assertRaisesRegex(TypeError, 'diagonal_spatail'):
      kernel_fn(kernel_fn(x1, None), get='nngp', diagonal_spatail=True)

  def test_keywords_read_by_a_layer_pass(self):
    _, _, kernel_fn = stax.serial(stax.Dense(2), stax.Aggregate())
    x = jnp.ones((2, 3, 2))
    pattern = jnp.ones((2, 3, 3))
    kernel_fn(x, None, 'nngp', pattern=(pattern, pattern))
    with self.assertRaisesRegex(TypeError, r"\['patern'\].*'pattern'"):
      kernel_fn(x, None, 'nngp', patern=(pattern, pattern))
    # A hand-written `kernel_fn(k, **kwargs)` may read any keyword.
    seen = []

    def kernel_fn_by_hand(k, **kwargs):
      seen.append(kwargs)
      return k

    layer = (lambda rng, s: (s, ()), lambda p, x, **kw: x, kernel_fn_by_hand)
    _, _, kernel_fn = stax.serial(stax.Dense(2), layer)
    kernel_fn(x, None, 'nngp', scale=2.)
    self.assertEqual(seen, [{'scale': 2.}])


class InputsTest(test_utils.NeuralTangentsTestCase):

  def test_kernel_and_x2_raise(self):
    _, _, kernel_fn = stax.serial(stax.Dense(2), stax.Relu())
    x1, x2 = _inputs()
    k = kernel_fn(x1, None)
    with self.assertRaisesRegex(
        ValueError, r'`x2` must be None when `kernel_fn` is given a `Kernel`: '
        r'a Kernel already holds both sides.*Call `kernel_fn\(kernel\)`'):
      kernel_fn(k, x2)

  def test_mismatched_features_raise(self):
    _, _, kernel_fn = _net()
    x1, _ = _inputs()
    x2 = jnp.ones((4, 6))
    with self.assertRaisesRegex(
        ValueError, r'`x1` and `x2` must have the same shape except along the '
        r'batch axis.*x1.shape=\(3, 5\).*x2.shape=\(4, 6\).*Pass `x2`'):
      kernel_fn(x1, x2, 'nngp')

  def test_x2_none_equals_x1(self):
    _, _, kernel_fn = _net()
    x1, _ = _inputs()
    k_none = kernel_fn(x1, None)
    k_same = kernel_fn(x1, x1)
    self.assertTrue(k_none.x1_is_x2)
    self.assertIsNone(k_none.cov2)
    for name in ('nngp', 'ntk', 'cov1'):
      self.assertAllClose(getattr(k_none, name), getattr(k_same, name))
    self.assertAllClose(kernel_fn(x1, None, 'cov2'), k_same.cov2)

  def test_spatial_representations_agree(self):
    _, _, kernel_fn = stax.serial(stax.Dense(8, 1.3, 0.1), stax.Relu(),
                                  stax.Dense(8))
    x1, x2 = _inputs((2, 3, 4, 5), (3, 3, 4, 5))
    full = kernel_fn(x1, x2)
    diag = kernel_fn(x1, x2, diagonal_spatial=True)
    self.assertEqual(full.nngp.shape, (2, 3, 3, 3, 4, 4))
    self.assertEqual(full.cov1.shape, (2, 3, 3, 4, 4))
    self.assertEqual(diag.nngp.shape, (2, 3, 3, 4))
    self.assertEqual(diag.cov1.shape, (2, 3, 4))
    for name, n_batch in (('nngp', 2), ('ntk', 2), ('cov1', 1), ('cov2', 1)):
      f = getattr(full, name)
      for i in range(2):
        f = jnp.moveaxis(jnp.diagonal(f, axis1=n_batch + i,
                                      axis2=n_batch + i + 1), -1, n_batch + i)
      self.assertAllClose(f, getattr(diag, name))

  def test_full_batch_covariance(self):
    _, _, kernel_fn = _net()
    x1, x2 = _inputs()
    k = kernel_fn(x1, x2, diagonal_batch=False)
    self.assertEqual(k.cov1.shape, (3, 3))
    self.assertAllClose(k.cov1, kernel_fn(x1, x1, 'nngp'))
    self.assertAllClose(jnp.diagonal(k.cov1), kernel_fn(x1, x2, 'cov1'))

  def test_float32_matches_float64(self):
    _, _, kernel_fn = _net()
    x1, x2 = _inputs()
    with jax.enable_x64(True):
      k64 = kernel_fn(np.asarray(x1, np.float64), np.asarray(x2, np.float64),
                      'ntk')
      self.assertEqual(k64.dtype, jnp.float64)
    k32 = kernel_fn(x1.astype(jnp.float32), x2.astype(jnp.float32), 'ntk')
    self.assertEqual(k32.dtype, jnp.float32)
    self.assertAllClose(k32, np.asarray(k64, np.float32), rtol=1e-5)


_BOOLS = (stax.Bool.NO, stax.Bool.MAYBE, stax.Bool.YES)
_DIAGONALS = [stax.Diagonal(i, o) for i in _BOOLS for o in _BOOLS]

# `a >> b` in the published release (rows `a`, columns `b`, as `input output`
# with NO=0, MAYBE=1, YES=2): observed outputs, the compat fixture
# `diagonal_compose.md`.
_PUBLISHED_RSHIFT = """
00 01 02 00 01 02 00 01 02
00 01 02 00 01 02 00 01 02
02 02 02 02 02 02 02 02 02
00 01 02 00 01 02 10 11 12
00 01 02 10 11 12 10 11 12
12 12 12 12 12 12 12 12 12
00 01 02 00 01 02 20 21 22
00 01 02 20 21 22 20 21 22
22 22 22 22 22 22 22 22 22
"""


def _diagonal(code):
  return stax.Diagonal(stax.Bool(int(code[0])), stax.Bool(int(code[1])))


class DiagonalCompositionTest(test_utils.NeuralTangentsTestCase):

  def test_default_is_published(self):
    self.assertEqual(stax.Diagonal(), stax.Diagonal(stax.Bool.YES,
                                                    stax.Bool.NO))

  def test_rshift_and_lshift_match_published_table(self):
    rows = _PUBLISHED_RSHIFT.split('\n')[1:-1]
    self.assertLen(rows, 9)
    for a, row in zip(_DIAGONALS, rows):
      for b, expected in zip(_DIAGONALS, row.split()):
        self.assertEqual(a >> b, _diagonal(expected), (a, b))
        self.assertEqual(b << a, _diagonal(expected), (a, b))

  def test_rshift_is_associative(self):
    for a in _DIAGONALS:
      for b in _DIAGONALS:
        for c in _DIAGONALS:
          self.assertEqual((a >> b) >> c, a >> (b >> c))
          self.assertEqual((c << b) << a, c << (b << a))

  def test_rshift_composes_the_backward_resolution(self):
    for a in _DIAGONALS:
      for b in _DIAGONALS:
        for s in _BOOLS:
          self.assertEqual(protocol.transfer(a >> b, s),
                           protocol.transfer(a, protocol.transfer(b, s)))

  def test_and(self):
    D, B = stax.Diagonal, stax.Bool
    self.assertEqual(D(B.YES, B.MAYBE) & D(B.MAYBE, B.YES),
                     D(B.MAYBE, B.MAYBE))

  def test_serial_combines_requirements_with_rshift(self):
    layers = [stax.Dense(2), stax.Relu(), stax.Flatten(), stax.Dense(1)]
    _, _, kernel_fn = stax.serial(*layers)
    per_layer = [protocol.kernel_spec(l[2]).requirements
                 for l in layers]
    combined = protocol.kernel_spec(kernel_fn).requirements
    self.assertEqual(combined.diagonal_spatial, functools.reduce(
        operator.rshift, [r.diagonal_spatial for r in per_layer]))
    self.assertEqual(combined.diagonal_batch, functools.reduce(
        operator.rshift, [r.diagonal_batch for r in per_layer]))
    self.assertEqual(combined.diagonal_spatial,
                     stax.Diagonal(stax.Bool.YES, stax.Bool.YES))

  @parameterized.named_parameters(
      # name, layers, input shape, (diagonal_batch, diagonal_spatial) the
      # input kernel gets for the default call and for diagonal_spatial=True
      # (None: that call raises).
      ('mlp', lambda: [stax.Dense(2), stax.Relu()], (2, 3),
       (True, False), (True, True)),
      ('cnn_flatten', lambda: [stax.Conv(2, (2, 2)), stax.Relu(),
                               stax.Flatten()], (2, 4, 4, 2),
       (True, True), (True, True)),
      ('cnn', lambda: [stax.Conv(2, (2, 2)), stax.Relu()], (2, 4, 4, 2),
       (True, False), (True, True)),
      ('cnn_global_pool', lambda: [stax.Conv(2, (2, 2)), stax.Relu(),
                                   stax.Conv(2, (2, 2)), stax.Erf(),
                                   stax.GlobalAvgPool()], (2, 4, 4, 2),
       (True, False), None),
      ('attention', lambda: [stax.Conv(2, (2,)),
                             stax.GlobalSelfAttention(2, 2, 2, 1),
                             stax.Flatten()], (2, 4, 2),
       (True, False), None),
      ('resize_nearest', lambda: [stax.ImageResize((-1, 4, 4, -1),
                                                   'nearest'),
                                  stax.Flatten()], (2, 2, 2, 2),
       (True, True), (True, True)),
      ('resize_linear', lambda: [stax.ImageResize((-1, 4, 4, -1), 'linear'),
                                 stax.Flatten()], (2, 2, 2, 2),
       (True, False), None),
      ('concat_spatial', lambda: [
          stax.FanOut(2), stax.parallel(stax.Conv(2, (2, 2)), stax.Conv(2, (2, 2))),
          stax.FanInConcat(axis=1), stax.Flatten()], (2, 3, 3, 2),
       (True, True), (True, True)),
  )
  def test_input_kernel_representation(self, layers, shape, default, diag):
    """Which covariances the network's input kernel gets (unchanged by the
    published `Diagonal` values: layers translated one to one)."""
    _, _, kernel_fn = stax.serial(*layers())
    spec = protocol.kernel_spec(kernel_fn)
    self.assertEqual(tuple(spec.allowed_inputs(
        protocol.Allowed(True, False))), default)
    if diag is None:
      with self.assertRaisesRegex(
          ValueError, r'`diagonal_spatial=True` cannot be honoured.*needs the '
          r'full spatial covariance.*Pass `diagonal_spatial=False`'):
        kernel_fn(jnp.ones(shape), None, 'nngp', diagonal_spatial=True)
    else:
      self.assertEqual(tuple(spec.allowed_inputs(
          protocol.Allowed(True, True))), diag)


@stax.layer
def _Scale(c):
  """The same map as `_user_layer`, declared with `@requires`."""
  @stax.requires(diagonal_batch=stax.Diagonal(),
                 diagonal_spatial=stax.Diagonal())
  def kernel_fn(k, **kwargs):
    return k.replace(nngp=c**2 * k.nngp, cov1=c**2 * k.cov1,
                     cov2=None if k.cov2 is None else c**2 * k.cov2,
                     ntk=None if k.ntk is None else c**2 * k.ntk)
  return lambda rng, s: (s, ()), lambda p, x, **kwargs: c * x, kernel_fn


class UndeclaredLayerTest(test_utils.NeuralTangentsTestCase):

  def test_serial_gives_batch_diagonal_covariances(self):
    seen = []
    x1, x2 = _inputs((2, 3, 4, 5), (3, 3, 4, 5))
    conv = stax.Conv(4, (2, 2), padding='SAME')
    _, _, kernel_fn = stax.serial(conv, test_utils.hand_written_layer(seen), stax.Relu())
    _, _, declared_fn = stax.serial(conv, _Scale(2.), stax.Relu())
    for kw, representation in (({}, (True, False)),
                               ({'diagonal_spatial': True}, (True, True))):
      k = kernel_fn(x1, x2, **kw)
      self.assertEqual(seen[-1], representation)
      desired = declared_fn(x1, x2, **kw)
      for name in ('nngp', 'ntk', 'cov1', 'cov2'):
        self.assertAllClose(getattr(k, name), getattr(desired, name))

  def test_parallel_gives_batch_diagonal_covariances(self):
    seen = []
    x1, x2 = _inputs()
    init_fn, apply_fn, kernel_fn = stax.parallel(test_utils.hand_written_layer(seen),
                                                 stax.Dense(3))
    k = kernel_fn((x1, x1), (x2, x2))
    self.assertEqual(seen, [(True, False)])
    self.assertAllClose(k[0].nngp, 4 * jnp.dot(x1, x2.T) / 5)
    self.assertEqual(k[0].cov1.shape, (3,))
    self.assertEqual(k[0].cov2.shape, (4,))
    self.assertAllClose(k[0].cov1, 4 * jnp.sum(x1**2, axis=1) / 5)
    _, params = init_fn(jax.random.PRNGKey(0), (x1.shape, x1.shape))
    self.assertAllClose(apply_fn(params, (x1, x1))[0], 2 * x1)


@stax.layer
def _DiagonalOnly():
  """Declared local, but always gives only the spatial diagonal."""
  @stax.requires()
  def kernel_fn(k, **kwargs):
    if k.diagonal_spatial or k.n_spatial == 0:
      return k
    return layout.map_covariances(
        k, kernel_lib.spatial_diagonal).replace(diagonal_spatial=True)
  return lambda rng, s: (s, ()), lambda p, x, **kwargs: x, kernel_fn


class ConflictTest(test_utils.NeuralTangentsTestCase):

  def test_full_after_diagonal_only_raises(self):
    x = jnp.ones((2, 4, 3))
    _, _, kernel_fn = stax.serial(stax.Conv(2, (2,), padding='SAME'),
                                  _DiagonalOnly(), stax.GlobalAvgPool())
    with self.assertRaisesRegex(
        ValueError, r'`_DiagonalOnly` and `GlobalAvgPool` cannot agree.*needs '
        r'the full spatial covariance.*Declare'):
      kernel_fn(x, None)

  def test_nested_and_repeated_conflicts_raise(self):
    x = jnp.ones((2, 4, 3))
    conv = stax.Conv(2, (2,), padding='SAME')
    block = stax.serial(conv, _DiagonalOnly(), stax.Relu())
    _, _, kernel_fn = stax.serial(block, stax.serial(stax.GlobalAvgPool()))
    with self.assertRaisesRegex(ValueError, 'cannot agree'):
      kernel_fn(x, None)
    # Layers agreeing on a representation are unaffected.
    _, _, ok_fn = stax.serial(conv, _DiagonalOnly(), stax.Relu(),
                              stax.Flatten())
    self.assertEqual(ok_fn(x, None, 'nngp').shape, (2, 2))


class KernelPytreeTest(test_utils.NeuralTangentsTestCase):

  def test_jit_vmap_scan_replace(self):
    _, _, kernel_fn = _net()
    x1, x2 = _inputs()
    k = kernel_fn(x1, x2)
    k_jit = jax.jit(kernel_fn, static_argnames='get')(x1, x2)
    self.assertAllClose(k_jit.ntk, k.ntk)
    self.assertEqual(k_jit.shape1, k.shape1)
    # vmap over a leading axis of stacked inputs.
    ntk_v = jax.vmap(lambda a: kernel_fn(a, x2, 'ntk'))(jnp.stack([x1, x1]))
    self.assertAllClose(ntk_v[1], k.ntk)
    # A Kernel is a valid scan carry, static fields included.
    out, _ = lax.scan(lambda c, _: (c.replace(nngp=2 * c.nngp), None), k,
                      None, length=3)
    self.assertAllClose(out.nngp, 8 * k.nngp)
    self.assertEqual(out.is_gaussian, k.is_gaussian)
    leaves, treedef = jax.tree_util.tree_flatten(k)
    self.assertLen(leaves, 4)  # nngp, ntk, cov1, cov2 (masks are None).
    self.assertEqual(jax.tree_util.tree_unflatten(treedef, leaves).shape2,
                     (4, 1))

  def test_grad_wrt_inputs_is_finite(self):
    _, _, kernel_fn = _net()
    x1, x2 = _inputs()
    g = jax.grad(lambda a: kernel_fn(a, None, 'ntk').sum())(x1)
    self.assertFinite(g)
    self.assertGreater(float(jnp.abs(g).max()), 0)


class InputDtypeTest(parameterized.TestCase):
  """Issue 21 item 1: inputs of any real or bool dtype are cast to float."""

  @parameterized.parameters('bool', 'int32', 'float32')
  def test_kernel_of_inputs_is_kernel_of_float_inputs(self, dtype):
    kernel_fn = stax.serial(stax.Dense(8), stax.Relu(), stax.Dense(1))[2]
    x = np.random.RandomState(0).randn(4, 3)
    x = (x > 0) if dtype == 'bool' else (3 * x).astype(dtype)
    want = kernel_fn(x.astype(np.float64), None, ('nngp', 'ntk'))
    got = kernel_fn(jnp.asarray(x), None, ('nngp', 'ntk'))
    for g, w in zip(got, want):
      np.testing.assert_allclose(g, w, rtol=1e-5)
    # Not a constant kernel (the logical dot product of bool inputs).
    self.assertGreater(np.ptp(np.asarray(got.nngp)), 0.01)

  def test_complex_inputs_raise(self):
    kernel_fn = stax.serial(stax.Dense(8), stax.Relu())[2]
    x = jnp.ones((2, 3)) + 1j
    with self.assertRaisesRegex(TypeError, r'`x1` must be real.*complex.*real'):
      kernel_fn(x, None, 'nngp')
    with self.assertRaisesRegex(TypeError, r'`x2` must be real'):
      kernel_fn(jnp.ones((2, 3)), x, 'nngp')

  def test_input_covariance_exact_beyond_product_range(self):
    # Entries of 1e19 in float32 square to inf, while the covariance
    # (up to ~1e38) is representable: the per-example power-of-2 scaling.
    x = np.random.RandomState(1).randn(3, 4)
    kernel_fn = stax.Dense(1)[2]
    want = kernel_fn(x, None, 'nngp')
    for c in (1e-17, 1e19):
      got = kernel_fn(x.astype(np.float32) * np.float32(c), None, 'nngp')
      np.testing.assert_allclose(np.asarray(got, np.float64) / c**2, want,
                                 rtol=1e-5)


if __name__ == '__main__':
  absltest.main()
