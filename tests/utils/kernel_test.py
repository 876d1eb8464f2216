"""Tests of the `Kernel` layout helpers and the pytree dataclass."""
from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

import neural_tangents as nt
from neural_tangents import stax
from neural_tangents._src.stax import inputs
from neural_tangents._src.utils import arguments
from neural_tangents._src.utils import dataclasses
from neural_tangents._src.utils import kernel as kernel_lib
from tests import test_utils


class LayoutTest(test_utils.NeuralTangentsTestCase):

  def test_spatial_diagonal(self):
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 4, 4, 5, 5))
    d = kernel_lib.spatial_diagonal(x, 2)
    self.assertEqual(d.shape, (2, 3, 4, 5))
    self.assertAllClose(d[1, 2, 3, 4], x[1, 2, 3, 3, 4, 4])

  def test_outer_variances_broadcast_to_pairs(self):
    var1 = jax.random.uniform(jax.random.PRNGKey(0), (2, 3, 4))
    var2 = jax.random.uniform(jax.random.PRNGKey(1), (5, 3, 4))
    v1, v2 = kernel_lib.outer_variances(var1, var2, True, False)
    full = jnp.broadcast_shapes(v1.shape, v2.shape)
    self.assertEqual(full, (2, 5, 3, 3, 4, 4))
    v1, v2 = jnp.broadcast_to(v1, full), jnp.broadcast_to(v2, full)
    # Entry (i, j, h, h', w, w') pairs x1[i] at (h, w) with x2[j] at (h', w').
    self.assertAllClose(v1[1, 4, 2, 0, 3, 1], var1[1, 2, 3])
    self.assertAllClose(v2[1, 4, 2, 0, 3, 1], var2[4, 0, 1])

  def test_batch_diagonal_and_variances(self):
    cov = jax.random.normal(jax.random.PRNGKey(0), (3, 3, 2, 2))
    var = kernel_lib.variances(cov, diagonal_batch=False,
                               diagonal_spatial=False)
    self.assertEqual(var.shape, (3, 2))
    self.assertAllClose(var[2, 1], cov[2, 2, 1, 1])


@dataclasses.dataclass
class _Point:
  x: jax.Array
  label: str = dataclasses.field(pytree_node=False, default='a')


class DataclassTest(test_utils.NeuralTangentsTestCase):

  def test_pytree_and_replace(self):
    p = _Point(jnp.ones(2))
    leaves, treedef = jax.tree_util.tree_flatten(p)
    self.assertLen(leaves, 1)
    q = jax.jit(lambda p: p.replace(x=2 * p.x))(p)
    self.assertEqual(q.label, 'a')
    self.assertAllClose(q.x, 2 * np.ones(2))
    self.assertNotEqual(treedef,
                        jax.tree_util.tree_structure(p.replace(label='b')))
    with self.assertRaises(Exception):
      p.x = 3  # Frozen.


_FIELDS = ('nngp', 'ntk', 'cov1', 'cov2', 'x1_is_x2', 'is_gaussian',
           'is_reversed', 'is_input', 'diagonal_batch', 'diagonal_spatial',
           'shape1', 'shape2', 'batch_axis', 'channel_axis', 'mask1', 'mask2')
_ARRAYS = ('nngp', 'ntk', 'cov1', 'cov2')


def _images(n, key=0, shape=(3, 2, 2)):
  return jax.random.normal(jax.random.PRNGKey(key), (n,) + shape)


def _input_kernel(x1, x2=None, **kwargs):
  """The kernel of the raw inputs: covariances computed from first principles."""
  defaults = dict(diagonal_batch=True, diagonal_spatial=False,
                  compute_ntk=True)
  return inputs.inputs_to_kernel(x1, x2, **{**defaults, **kwargs})


class KernelMethodsTest(test_utils.NeuralTangentsTestCase):

  def assertSameArrays(self, actual, desired):
    for name in _ARRAYS:
      a, d = getattr(actual, name), getattr(desired, name)
      if d is None:
        self.assertIsNone(a, name)
      else:
        self.assertAllClose(a, d, msg=name)

  def test_positional_field_order_asdict_astuple(self):
    values = tuple(range(len(_FIELDS)))
    k = nt.Kernel(*values)
    self.assertEqual(tuple(getattr(k, f) for f in _FIELDS), values)
    self.assertEqual(tuple(k.asdict()), _FIELDS)
    self.assertEqual(tuple(k.asdict().values()), values)
    self.assertEqual(k.astuple(), values)

  @parameterized.parameters(False, True)
  def test_slice_is_kernel_of_sliced_inputs(self, diagonal_batch):
    _, _, kernel_fn = stax.serial(stax.Conv(3, (2, 2), padding='SAME'),
                                  stax.Relu())
    x1, x2 = _images(4), _images(3, key=1)
    kw = dict(diagonal_batch=diagonal_batch)
    sliced = kernel_fn(x1, x2, **kw).slice(slice(1, 3), slice(0, 2))
    self.assertSameArrays(sliced, kernel_fn(x1[1:3], x2[:2], **kw))
    self.assertEqual(sliced.shape1, (2, 3, 2, 3))
    self.assertEqual(sliced.shape2, (2, 3, 2, 3))
    k = kernel_fn(x1, None, **kw)
    same = k.slice(slice(1, 3), slice(1, 3))
    self.assertTrue(same.x1_is_x2)
    self.assertSameArrays(same, kernel_fn(x1[1:3], None, **kw))
    other = k.slice(slice(0, 2), slice(1, 4))
    self.assertFalse(other.x1_is_x2)
    self.assertSameArrays(other, kernel_fn(x1[:2], x1[1:4], **kw))

  @parameterized.parameters(False, True)
  def test_transpose_is_kernel_of_transposed_inputs(self, diagonal_spatial):
    x1 = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 4, 2, 2))
    x2 = jax.random.normal(jax.random.PRNGKey(1), (3, 3, 4, 2, 2))
    axes = (2, 0, 1)
    kw = dict(diagonal_spatial=diagonal_spatial)
    actual = _input_kernel(x1, x2, **kw).transpose(axes)
    perm = (0,) + tuple(1 + a for a in axes) + (4,)
    desired = _input_kernel(jnp.transpose(x1, perm), jnp.transpose(x2, perm),
                            **kw)
    self.assertSameArrays(actual, desired)
    self.assertEqual(actual.shape1, desired.shape1)
    reversed_ = _input_kernel(x1, x2, **kw).transpose()
    desired = _input_kernel(jnp.transpose(x1, (0, 3, 2, 1, 4)),
                            jnp.transpose(x2, (0, 3, 2, 1, 4)), **kw)
    self.assertSameArrays(reversed_, desired)
    with self.assertRaisesRegex(ValueError, 'permutation of the 3 spatial'):
      _input_kernel(x1, x2).transpose((0, 1))

  def test_reverse_reverses_spatial_storage(self):
    x1 = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 4, 2))
    k = _input_kernel(x1, None)
    r = k.reverse()
    self.assertTrue(r.is_reversed)
    self.assertEqual(r.shape1, k.shape1)
    self.assertEqual(r.nngp.shape, (2, 2, 4, 4, 3, 3))
    # Entry (n, m, w, w', h, h') of the reversed is (n, m, h, h', w, w').
    self.assertAllClose(r.nngp[1, 0, 3, 2, 1, 0], k.nngp[1, 0, 1, 0, 3, 2])
    self.assertAllClose(r.cov1[1, 3, 2, 1, 0], k.cov1[1, 1, 0, 3, 2])
    back = r.reverse()
    self.assertFalse(back.is_reversed)
    self.assertSameArrays(back, k)
    # Layers restore the order of a reversed kernel.
    _, _, kernel_fn = stax.serial(stax.Conv(2, (2, 3)), stax.Relu())
    self.assertSameArrays(kernel_fn(r), kernel_fn(k))

  def test_mask_zeroes_masked_positions(self):
    x1, x2 = _images(2), _images(3, key=1)
    k = _input_kernel(x1, x2, diagonal_batch=False)
    mask1 = jnp.zeros((2, 3, 2, 1), bool).at[1, 2, 0].set(True)
    mask2 = jnp.zeros((3, 3, 2, 1), bool).at[0, :, 1].set(True)
    m = k.mask(mask1, mask2)
    self.assertIs(m.mask1, mask1)
    # The kernel of inputs zeroed at the masked positions.
    desired = _input_kernel(jnp.where(mask1, 0., x1), jnp.where(mask2, 0., x2),
                            diagonal_batch=False)
    self.assertSameArrays(m, desired)
    self.assertAllClose(m.nngp[1, 2, 2, 1, 0, 0], 0.)
    self.assertGreater(float(jnp.abs(k.nngp[1, 2, 2, 1, 0, 0])), 0.)
    # A position is masked only if all its channels are.
    partial = jnp.zeros((2, 3, 2, 2), bool).at[:, :, :, 0].set(True)
    self.assertSameArrays(k.mask(partial, None), k)

  def test_dot_general_is_kernel_of_dot_general_outputs(self):
    x1, x2 = _images(2), _images(3, key=1)  # (N, 3, 2, C=2)
    k = _input_kernel(x1, x2)
    # Contracts spatial axis 1 (size 3) with a (3, 4) rhs; outputs
    # (N, 2, C, 4): batch 0, channel 2.
    rhs = jax.random.normal(jax.random.PRNGKey(5), (3, 4))
    dn = (((1,), (0,)), ((), ()))
    out = k.dot_general(rhs, None, True, dn)
    y1, y2 = (jax.lax.dot_general(x, rhs, dn) for x in (x1, x2))
    desired = _input_kernel(y1, y2, channel_axis=2)
    self.assertEqual((out.batch_axis, out.channel_axis), (0, 2))
    self.assertEqual((out.shape1, out.shape2), (y1.shape, y2.shape))
    self.assertSameArrays(out, desired)

  @parameterized.parameters(False, True)
  def test_dot_general_per_example_lhs(self, diagonal_batch):
    x1, x2 = _images(2), _images(3, key=1)  # (N, 3, 2, C=2)
    # Per-example (N, 5, 3) lhs constants batched with the example axis.
    o1 = jax.random.normal(jax.random.PRNGKey(6), (2, 5, 3))
    o2 = jax.random.normal(jax.random.PRNGKey(7), (3, 5, 3))
    dn = (((2,), (1,)), ((0,), (0,)))
    out = _input_kernel(x1, x2, diagonal_batch=diagonal_batch).dot_general(
        o1, o2, False, dn)
    y1 = jax.lax.dot_general(o1, x1, dn)  # (N, 5, 2, C)
    y2 = jax.lax.dot_general(o2, x2, dn)
    self.assertSameArrays(out, _input_kernel(y1, y2,
                                             diagonal_batch=diagonal_batch))

  def test_dot_general_errors(self):
    k = _input_kernel(_images(2), None)
    with self.assertRaisesRegex(ValueError, 'channel axis 3'):
      k.dot_general(jnp.ones((2, 4)), None, True, (((3,), (0,)), ((), ())))
    with self.assertRaisesRegex(ValueError, 'full spatial covariance'):
      _input_kernel(_images(2), None, diagonal_spatial=True).dot_general(
          jnp.ones((3, 4)), None, True, (((1,), (0,)), ((), ())))
    self.assertIs(k.dot_general(None, None, True, (((), ()), ((), ()))), k)


class UtilsTest(test_utils.NeuralTangentsTestCase):

  def test_canonicalize_axis_error_names_argument(self):
    self.assertEqual(arguments.canonicalize_axis(-1, 3), 2)
    with self.assertRaisesRegex(ValueError, '`trace_axes`=3 is out of range'):
      arguments.canonicalize_axis(3, 3, 'trace_axes')
    self.assertEqual(arguments.canonicalize_axes((-1, 0, 2), 3), (0, 2))


if __name__ == '__main__':
  absltest.main()
