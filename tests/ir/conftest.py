"""Make ``gen`` (random valid IR for property tests) importable from the tests in this folder."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
