"""The tests of arke.models need transformers and safetensors (the ``models`` extra); without them they are skipped."""

from __future__ import annotations

from importlib.util import find_spec

collect_ignore_glob = [] if find_spec("transformers") and find_spec("safetensors") else ["test_*.py"]
