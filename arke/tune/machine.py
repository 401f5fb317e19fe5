"""Who measured a record: the machine (CPU model, ISA features, cores; a GPU's name and SM) and the
versions of arke and of the target's toolchain. A tuning record is used only where all of these
match: a configuration measured on another machine, toolchain or protocol says nothing here
(TVM once served records for the wrong ISA from a JSON database: tvm#15549)."""

from __future__ import annotations

import hashlib
import json
from functools import cache

#: The measurement protocol (arke.tune.worker, arke.tune.search): bumped when what a record's
#: samples mean changes, so records taken another way are never compared with new ones.
PROTOCOL = 1

@cache
def cpu() -> dict[str, object]:
    """This CPU: its model name (``/proc/cpuinfo``), LLVM's name and feature string, the cores we may use."""
    from arke.runtime.host import cores, host_description

    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return {"model": model, "llvm": host_description(), "cores": cores()}


def gpu() -> dict[str, object] | None:
    """The CUDA GPU torch sees (name and SM), or None."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        major, minor = torch.cuda.get_device_capability()
        return {"name": torch.cuda.get_device_name(), "sm": f"sm_{major}{minor}"}
    except Exception:  # no CUDA runtime at all: a CPU-only machine
        return None


def identity(target: str, device: str = "cpu", arch: str | None = None) -> dict[str, object]:
    """The machine a record for ``target`` on ``device`` belongs to (kernels that run off the host: its GPU too)."""
    from arke.targets import base as targets

    found: dict[str, object] = {"cpu": cpu()}
    if not targets.get(target).on_host(device, arch):
        found["gpu"] = gpu()
    return found


def versions(target: str) -> dict[str, str]:
    """arke's version (with its source fingerprint: code changes change speed) and ``target``'s toolchain's."""
    import arke
    from arke.runtime.cache import source_fingerprint
    from arke.targets import base as targets

    return {"arke": f"{arke.__version__}+{source_fingerprint()[:12]}", **targets.get(target).toolchain_versions()}


def digest(value: object) -> str:
    """A short stable hash of a JSON-able value (a machine, a version set)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:24]
