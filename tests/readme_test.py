"""README.md's Python example runs as written, and its commands exist."""
import os
import re

from absl.testing import absltest

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def python_blocks(markdown: str) -> list[str]:
  """The ```python fenced blocks of `markdown`, in order."""
  return re.findall(r'^```python\n(.*?)^```$', markdown, re.M | re.S)


class ReadmeTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    with open(os.path.join(_ROOT, 'README.md'), encoding='utf-8') as f:
      self.readme = f.read()

  def test_python_example_runs_as_written(self):
    blocks = python_blocks(self.readme)
    self.assertLen(blocks, 1)
    namespace = {}
    exec(compile(blocks[0], 'README.md', 'exec'), namespace)  # pylint: disable=exec-used
    # The shapes its comments state.
    self.assertEqual(namespace['ntk'].shape, (10, 20))
    self.assertEqual(namespace['both'].nngp.shape, (10, 10))
    self.assertEqual(namespace['k'].nngp.shape, (10, 20))
    self.assertEqual(namespace['y'].shape, (10, 1))
    self.assertEqual(namespace['y2'].shape, (20, 1))

  def test_install_commands_name_existing_extras(self):
    with open(os.path.join(_ROOT, 'setup.py'), encoding='utf-8') as f:
      setup = f.read()
    extras = set(re.findall(r'pip install[^\n]*"\.\[([\w,]+)\]"', self.readme))
    self.assertContainsSubset({'examples', 'test', 'docs', 'notebooks'},
                              extras)
    for extra in extras:
      self.assertIn(f"'{extra}':", setup)


if __name__ == '__main__':
  absltest.main()
