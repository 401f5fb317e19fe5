"""The llvm target's prepacked weights: the registry and the packing live in :mod:`arke.runtime.panels`
(bundles read them without the compiler); this module keeps the target's names for them."""

from arke.runtime.panels import (
    _PANELS,
    VNNI_COLUMNS,
    VNNI_DEPTH,
    VNNI_KEY,
    _panels_of,
    pack_panels,
    pack_vnni_panels,
    panels_of,
    register_panels,
)

__all__ = [
    "VNNI_COLUMNS",
    "VNNI_DEPTH",
    "VNNI_KEY",
    "_PANELS",
    "_panels_of",
    "pack_panels",
    "pack_vnni_panels",
    "panels_of",
    "register_panels",
]
