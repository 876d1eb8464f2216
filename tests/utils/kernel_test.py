"""Tests of the `Kernel` layout helpers and the pytree dataclass."""
from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from neural_tangents._src.utils import dataclasses
from neural_tangents._src.utils import kernel as kernel_lib
from neural_tangents._src.utils import utils
import test_utils


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


class UtilsTest(test_utils.NeuralTangentsTestCase):

  def test_canonicalize_axis_error_names_argument(self):
    self.assertEqual(utils.canonicalize_axis(-1, 3), 2)
    with self.assertRaisesRegex(ValueError, '`trace_axes`=3 is out of range'):
      utils.canonicalize_axis(3, 3, 'trace_axes')
    self.assertEqual(utils.canonicalize_axes((-1, 0, 2), 3), (0, 2))


if __name__ == '__main__':
  absltest.main()
