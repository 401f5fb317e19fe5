"""``akc build FILE --target llvm --bundle DIR [--kernel K ...] [--cpu NAME] [--triple TRIPLE]``."""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

from arke.targets.base import UsageError


def cmd_bundle(args: argparse.Namespace, kernels: list[str]) -> int:
    """Build the bundle and print what it holds (a bad choice of kernel, CPU or triple is a usage error)."""
    from arke.cli.build import _library
    from arke.runtime.bundle_files import BundleError  # build's own errors and staged()'s refusal
    from arke.targets.downgrades import StrategyDowngradeWarning
    from arke.targets.llvm.bundle.build import build_bundle

    lib = _library(args.path, "llvm", getattr(args, "dtypes", ""))
    if isinstance(lib, int):
        return lib
    try:
        with warnings.catch_warnings():
            # the file's AK4014 diagnostics were printed with its check; the ones only a plan finds print here
            warnings.simplefilter("default", StrategyDowngradeWarning)
            manifest = build_bundle(lib.module, args.bundle, kernels or None, cpu=args.cpu, triple=args.triple)
    except BundleError as err:
        raise UsageError(str(err)) from None
    out = Path(args.bundle)
    size = (out / manifest["library"]).stat().st_size
    print(f"bundle {out}: {manifest['library']} ({size / 1024:.0f} KiB) for {manifest['triple']}, "
          f"CPU {manifest['cpu']}")
    for k in manifest["kernels"]:
        variants = ", ".join(v["label"] + (f" when {v['when']}" if v["when"] else "") for v in k["variants"])
        print(f"  {k['symbol']}: {len(k['variants'])} variant{'s' if len(k['variants']) > 1 else ''} ({variants})")
    print(f"  C header {out / manifest['header']}; load it with arke.load_bundle({str(out)!r})")
    return 0
