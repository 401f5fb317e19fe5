"""Models from the ecosystem, compiled.

:func:`from_pretrained` loads a whole causal LM from a Hugging Face folder (a
:class:`~arke.models.lm.CausalLM`, with ``generate`` and ``stream``); :func:`from_transformers` and
:func:`layer_from_pretrained` compile one decoder layer (a :class:`~arke.models.layer.CompiledLayer`);
:func:`tune` measures a layer's whole-layer plan on this machine (:mod:`arke.tune.layer`).
:func:`save_bundle` saves a built model to run without the compiler, and :func:`load_bundle` loads it
(:mod:`arke.models.bundle`)."""

from collections.abc import Sequence
from typing import Any

from arke.models.bundle import load_bundle, save_bundle
from arke.models.hf import SUPPORTED, from_transformers, layer_config, layer_from_pretrained
from arke.models.lm import CausalLM
from arke.models.pretrained import from_pretrained

__all__ = ["SUPPORTED", "CausalLM", "from_pretrained", "from_transformers", "layer_config", "layer_from_pretrained",
           "load_bundle", "save_bundle", "tune"]


def tune(layer: Any, prefill: Sequence[int] = (), decode_context: Sequence[int] = (), **options: Any) -> Any:
    """Tune ``layer``'s whole-layer plan for prefill of each of ``prefill`` tokens and decode at each of
    ``decode_context``; see :func:`arke.tune.layer.tune` for the options. Returns a
    :class:`~arke.tune.layer.LayerTuneResult`; layers built here afterwards use the chosen plans."""
    from arke.tune.layer import tune as tune_layer

    return tune_layer(layer, prefill, decode_context, **options)
