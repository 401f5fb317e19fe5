"""Arke's first run: example kernels, then a whole decoder layer, compiled and checked.

    make demo                   # sets up .venv, then runs this
    .venv/bin/python examples/demo.py [--kernels]

1. Loads examples/rmsnorm.ak (rmsnorm, softmax) and examples/attention.ak (grouped-query
   causal attention) with ``arke.load``, runs each kernel on the reference interpreter and
   compiled for this CPU on random inputs (ragged sizes included), computes the same with
   plain torch, and prints a table of the differences.
2. Compiles a Llama-3.2-1B-shaped decoder layer (random weights) from transformers, runs a
   128-token prefill and 32 decode steps, checks them against the reference interpreter and
   transformers, and prints the times next to torch eager (``--kernels`` skips this part).

Exits with status 1 when any result disagrees.
"""

import sys

from arke.cli.demo import main

if __name__ == "__main__":
    sys.exit(main())
