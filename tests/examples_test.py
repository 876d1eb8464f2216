"""Runs every script in `examples/` with tiny flags and checks what it prints.

Each example runs in its own process (as a user runs it), with this checkout
first on `PYTHONPATH`; the checks are on its printed numbers: accuracies
above chance, differences between methods that compute the same thing below
a tolerance. None prints INFO log lines (JAX logs at INFO each backend it
probes, "Unable to initialize backend 'tpu'", which reads like an error).
"""
import importlib.util
import os
import re
import subprocess
import sys

from absl.testing import absltest
import numpy as np

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_EXAMPLES = os.path.join(_ROOT, 'examples')
_TIMEOUT_S = 600
# An absl log line of level INFO: `I1207 12:00:00.000000 1234 file.py:849] ...`.
_INFO_LOG_LINE = re.compile(r'^I\d{4} [\d:.]+ +\d+ \S+:\d+\] .*$', re.M)

try:
  import sklearn  # pylint: disable=g-import-not-at-top,unused-import
  _HAVE_SKLEARN = True
except ImportError:
  _HAVE_SKLEARN = False


def run_example(name: str, *flags: str) -> str:
  """Stdout of `python examples/<name>.py <flags>`; fails on a non-zero exit."""
  env = dict(os.environ)
  env['PYTHONPATH'] = os.pathsep.join(
      p for p in (_ROOT, env.get('PYTHONPATH')) if p)
  process = subprocess.run(
      [sys.executable, os.path.join(_EXAMPLES, f'{name}.py'), *flags],
      capture_output=True, text=True, env=env, timeout=_TIMEOUT_S,
      check=False)
  if process.returncode:
    raise AssertionError(f'examples/{name}.py {" ".join(flags)} exited with '
                         f'{process.returncode}:\n{process.stdout}\n'
                         f'{process.stderr[-4000:]}')
  info_lines = _INFO_LOG_LINE.findall(process.stderr)
  if info_lines:  # e.g. JAX's "Unable to initialize backend 'tpu'".
    raise AssertionError(f'examples/{name}.py printed INFO log lines, which '
                         f'read like errors: {info_lines}')
  return process.stdout


def number(pattern: str, text: str) -> float:
  """The float captured by `pattern`'s first group in `text`."""
  match = re.search(pattern, text)
  if match is None:
    raise AssertionError(f'{pattern!r} not found in:\n{text}')
  return float(match.group(1))


def table(text: str, first_column: str) -> dict[str, list[float]]:
  """Rows of a printed table whose first column matches `first_column`."""
  rows = {}
  for line in text.splitlines():
    fields = line.split()
    if fields and re.fullmatch(first_column, fields[0]):
      rows[fields[0]] = [float(f) for f in fields[1:]
                         if re.fullmatch(r'[-+.\deE]+', f)]
  return rows


@absltest.skipUnless(_HAVE_SKLEARN, 'needs scikit-learn (pip install '
                     '".[examples]")')
class ExamplesTest(absltest.TestCase):

  def test_infinite_fcn_beats_chance(self):
    out = run_example('infinite_fcn', '--train_size=100', '--test_size=100',
                      '--batch_size=50')
    self.assertGreater(number(r'NNGP test accuracy: ([\d.]+)', out), 0.6)
    self.assertGreater(number(r'NTK test accuracy: ([\d.]+)', out), 0.6)

  def test_fitted_hyperparameters_beat_the_defaults(self):
    out = run_example('fit_hyperparameters', '--train_size=100',
                      '--test_size=100', '--maxiter=8')
    nll = {name: number(name + r': test NLL (\S+),', out)
           for name in ('relu_defaults', 'relu_fitted', 'rbf_fitted')}
    self.assertLess(nll['relu_fitted'], nll['relu_defaults'])
    self.assertLess(nll['rbf_fitted'], nll['relu_defaults'])
    self.assertGreater(number(r'relu_fitted: .*accuracy (\S+)', out), 0.5)

  def test_weight_space_network_tracks_its_linearization(self):
    out = run_example('weight_space', '--train_size=64', '--test_size=64',
                      '--width=512', '--steps=20', '--print_every=10')
    rows = table(out, r'\d+')
    self.assertEqual(sorted(rows, key=int), ['0', '10', '20'])
    first_loss = rows['0'][0]
    for step, (loss, loss_lin, difference) in rows.items():
      self.assertAlmostEqual(difference, abs(loss - loss_lin), places=4)
      self.assertLess(difference, 0.02 * first_loss, msg=step)
    self.assertLess(rows['20'][0], 0.5 * first_loss)  # It trains.
    for kind in ('network', 'linearized'):
      self.assertGreater(number(rf'test_accuracy_{kind}: ([\d.]+)', out), 0.2)

  def test_function_space_prediction_matches_the_trained_network(self):
    out = run_example('function_space', '--train_size=64', '--test_size=64',
                      '--width=512', '--steps=20')
    rows = table(out, r'network|predict')
    (net_train, net_test, net_acc), (pred_train, pred_test, pred_acc) = (
        rows['network'], rows['predict'])
    self.assertAlmostEqual(net_train, pred_train, delta=0.05 * net_train)
    self.assertAlmostEqual(net_test, pred_test, delta=0.05 * net_test)
    self.assertGreater(net_acc, 0.2)
    self.assertGreater(pred_acc, 0.2)
    difference = number(r'test output: ([\d.]+)', out)
    scale = number(r'max \|output\| ([\d.]+)', out)
    self.assertLess(difference, 0.2 * scale)
    # Without one network's random initial function, accuracy is higher.
    mean_acc = number(r'\(f_0 = 0\) predict reaches test accuracy (\d\.\d+)',
                      out)
    self.assertGreater(mean_acc, max(0.6, pred_acc))

  def test_elementwise_closed_forms_match_quadrature_and_monte_carlo(self):
    out = run_example('elementwise', '--train_size=4', '--n_samples=8',
                      '--width=128')
    rows = table(out, r'erf|cos|square|relu')
    self.assertLen(rows, 4)
    for name, (quad_nngp, quad_ntk, mc_nngp, mc_ntk) in rows.items():
      # Quadrature is exact up to float32 for smooth functions; ReLU's
      # derivative (a step) converges slowly in `deg`.
      quad_tol = 0.3 if name == 'relu' else 1e-4
      self.assertLess(max(quad_nngp, quad_ntk), quad_tol, msg=name)
      # 8 networks x 32 outputs: ~10% noise; a wrong kernel is off by O(1).
      self.assertLess(max(mc_nngp, mc_ntk), 0.35, msg=name)

  def test_elementwise_numerical_converges_for_smooth_functions(self):
    out = run_example('elementwise_numerical', '--train_size=8', '--deg=25')
    rows = table(out, r'Relu|Erf|Gelu|Sin|Rbf|Abs|LeakyRelu')
    self.assertLen(rows, 7)
    for name in ('Sin', 'Rbf', 'Gelu'):
      self.assertLess(max(rows[name]), 1e-3, msg=name)
    for name, differences in rows.items():
      self.assertLess(max(differences), 0.5, msg=name)

  def test_empirical_ntk_implementations_agree(self):
    out = run_example('empirical_ntk', '--train_size=2', '--width=2')
    rows = table(out, r'AUTO|JACOBIAN_CONTRACTION|NTK_VECTOR_PRODUCTS|'
                 r'STRUCTURED_DERIVATIVES')
    self.assertEqual(set(rows), {'AUTO', 'JACOBIAN_CONTRACTION',
                                 'NTK_VECTOR_PRODUCTS',
                                 'STRUCTURED_DERIVATIVES'})
    self.assertLess(number(r'\(relative ([\d.e+-]+)\)', out), 1e-4)

  def test_imdb_attention_with_masking_beats_the_majority_class(self):
    out = run_example('imdb', '--train_size=80', '--test_size=80',
                      '--batch_size=40')
    majority = number(r'Majority class: ([\d.]+)', out)
    self.assertGreater(number(r'NNGP test accuracy: ([\d.]+)', out),
                       majority)
    self.assertGreater(number(r'NTK test accuracy: ([\d.]+)', out), majority)

  def test_deep_repeat_matches_serial(self):
    out = run_example('deep_repeat', '--train_size=4', '--depth=1000',
                      '--serial_depth=10')
    self.assertIn('repeat, depth 1000: compiled in', out)
    self.assertIn('depth 10: compiling the unrolled serial network', out)
    self.assertTrue(0 < number(r'NTK diagonal mean ([\d.]+)', out) < 1e3)
    self.assertLess(number(r'NTK: ([\d.e+-]+)', out), 1e-3)


def _datasets_module():
  """`examples/datasets.py`, imported from its path (examples are scripts,
  not a package)."""
  spec = importlib.util.spec_from_file_location(
      'examples_datasets', os.path.join(_EXAMPLES, 'datasets.py'))
  datasets = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(datasets)
  return datasets


@absltest.skipUnless(_HAVE_SKLEARN, 'needs scikit-learn')
class DatasetsTest(absltest.TestCase):

  def test_shapes_and_targets(self):
    datasets = _datasets_module()
    for name, shape, classes in (('digits', (64,), 10),
                                 ('digit_images', (16, 16, 3), 10),
                                 ('digit_sequences', (8, 8), 2)):
      data = datasets.load(name, 30, 20)
      self.assertEqual(data.x_train.shape, (30,) + shape, msg=name)
      self.assertEqual(data.x_test.shape, (20,) + shape, msg=name)
      self.assertEqual(data.y_train.shape, (30, classes), msg=name)
      self.assertEqual(data.x_train.dtype, np.float32, msg=name)
      # One-hot minus 1 / classes: rows sum to zero, argmax is the class.
      np.testing.assert_allclose(data.y_test.sum(-1), 0., atol=1e-6)
      np.testing.assert_allclose(data.y_train.max(-1), 1 - 1 / classes,
                                 rtol=1e-6)

  def test_sequences_are_padded_with_the_mask_constant(self):
    datasets = _datasets_module()
    x = datasets.load('digit_sequences', 200, 1).x_train
    padded = np.all(x == datasets.MASK_CONSTANT, axis=-1)
    lengths = (~padded).sum(-1)
    self.assertEqual((lengths.min(), lengths.max()), (5, 8))
    # Padding only at the end of each sequence.
    for row, length in zip(padded, lengths):
      self.assertFalse(row[:length].any())
      self.assertTrue(row[length:].all())

  def test_bad_arguments(self):
    datasets = _datasets_module()
    with self.assertRaisesRegex(ValueError, "`dataset` must be one of.*'svhn'"):
      datasets.load('svhn', 10, 10)
    with self.assertRaisesRegex(ValueError, '`train_size` must be >= 1; got 0'):
      datasets.load('digits', 0, 10)
    with self.assertRaisesRegex(ValueError, 'at most 1797.*Pass smaller'):
      datasets.load('digits', 1500, 500)

  def test_tfds_without_the_package_names_the_fix(self):
    datasets = _datasets_module()
    with absltest.mock.patch.dict(sys.modules,
                                  {'tensorflow_datasets': None}):
      with self.assertRaisesRegex(ImportError, r'pip install "\.\[tfds\]"'):
        datasets.load('mnist', 10, 10)


if __name__ == '__main__':
  absltest.main()
