"""Pytest configuration: makes `import test_utils` work from any test folder."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
