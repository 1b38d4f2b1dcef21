"""Where things are, for tests at any depth under tests/: the repository's root and the tests' own data."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
