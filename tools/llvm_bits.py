"""Fingerprint every conformance case's ``llvm`` outputs, bit for bit, to check a refactor changes no result.

    python tools/llvm_bits.py OUT.json            # write {case id: sha256 of the outputs' bytes}
    python tools/llvm_bits.py OUT.json --against BEFORE.json   # and compare with an earlier run

Runs the cases of ``tests/targets/test_conformance.py`` on the ``llvm`` target with the suite's own
inputs (one thread and two, which must agree), hashing each result's dtype, shape and raw bytes.
Exit status 1 when any case differs from ``--against`` or when a case is missing from either side.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests" / "support"), str(ROOT / "tests" / "targets"), str(ROOT)]
os.environ.setdefault("ARKE_CACHE_DIR", tempfile.mkdtemp(prefix="arke-bits-"))


def fingerprint(value: object) -> str:
    import torch

    digest = hashlib.sha256()
    for r in value if isinstance(value, tuple) else (value,):
        t = torch.as_tensor(r).contiguous()
        digest.update(f"{t.dtype}{tuple(t.shape)}".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--against", help="an earlier output of this script")
    args = parser.parse_args()
    from codegen_support import build, random_inputs, seeded, std_module
    from test_conformance import CASES

    prints: dict[str, str] = {}
    for case in CASES:
        module = std_module(case.module)
        lib = build(module, "llvm")
        inputs = random_inputs(module.kernels[case.kernel], case.dims, seeded(case.id), ids=case.ids, ties=case.ties)
        one = fingerprint(lib.kernels[case.kernel](*inputs, threads=1, **case.scalars))
        two = fingerprint(lib.kernels[case.kernel](*inputs, threads=2, **case.scalars))
        if one != two:
            print(f"{case.id}: one thread and two differ", file=sys.stderr)
            return 1
        prints[f"{case.module}.{case.id}"] = one
    Path(args.out).write_text(json.dumps(prints, indent=1, sort_keys=True) + "\n")
    print(f"{len(prints)} cases fingerprinted -> {args.out}")
    if args.against:
        before = json.loads(Path(args.against).read_text())
        differ = sorted(k for k in before.keys() & prints.keys() if before[k] != prints[k])
        missing = sorted(before.keys() ^ prints.keys())
        for k in differ:
            print(f"differs: {k}")
        for k in missing:
            print(f"only on one side: {k}")
        print(f"{len(before.keys() & prints.keys()) - len(differ)} identical, {len(differ)} differ, "
              f"{len(missing)} on one side only")
        return 1 if differ or missing else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
