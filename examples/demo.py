"""Arke's first run: check two example programs, interpret them, compare with torch.

    make demo                   # sets up .venv, then runs this
    .venv/bin/python examples/demo.py

Loads examples/rmsnorm.ak (rmsnorm, softmax) and examples/attention.ak (grouped-query
causal attention) with ``arke.load``, runs each kernel on the reference interpreter on
random inputs (ragged sizes included), computes the same with plain torch, and prints a
table of the differences. Exits with status 1 when any result disagrees.
"""

import sys
from pathlib import Path

from arke.demo import run_demo

if __name__ == "__main__":
    sys.exit(run_demo(Path(__file__).resolve().parent))
