"""Decoder layers from the ecosystem, compiled: :func:`from_transformers` and :func:`from_pretrained`.

Both return an :class:`~arke.models.layer.CompiledLayer` (see :mod:`arke.models.layer`)."""

from arke.models.hf import SUPPORTED, from_pretrained, from_transformers, layer_config

__all__ = ["SUPPORTED", "from_pretrained", "from_transformers", "layer_config"]
