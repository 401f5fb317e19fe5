"""Arke's first run: example kernels, then a whole model generating text, compiled and checked.

    make demo                   # sets up .venv, then runs this
    .venv/bin/python examples/demo.py [--kernels | --layer]

1. Loads examples/rmsnorm.ak (rmsnorm, softmax) and examples/attention.ak (grouped-query
   causal attention) with ``arke.load``, runs each kernel on the reference interpreter and
   compiled for this CPU on random inputs (ragged sizes included), computes the same with
   plain torch, and prints a table of the differences.
2. Saves a Llama-3.2-1B-shaped causal LM (2 layers, random weights, made with transformers) to
   a temporary folder, loads it with ``arke.models.from_pretrained``, generates 32 tokens
   greedily, checks them token for token against transformers' ``generate``, and prints the
   decode tokens/s next to transformers in torch eager and under ``torch.compile``
   (``--kernels`` skips this part; ``--layer`` runs the single-layer demo instead: a decoder
   layer's prefill and decode checked against the reference interpreter and transformers).

Exits with status 1 when any result disagrees.
"""

import sys

from arke.cli.demo import main

if __name__ == "__main__":
    sys.exit(main())
