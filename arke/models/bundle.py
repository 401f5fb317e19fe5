"""Model bundles: a whole model (:class:`~arke.models.lm.CausalLM`) saved to run without the compiler.

``save_bundle(model, DIR)`` writes

* ``layer/``: a kernel bundle (``akc build --bundle``) of the kernels the layers call, with the layers'
  plan (its strategies: every variant a call shape selects);
* ``lm/``: a kernel bundle of the model's own kernels (embeddings, final norm and head, sampling);
* ``weights.safetensors``: every weight as the built model holds it, each storage once (a tied head is
  the embeddings; prepacked panels stay packed, fused matrices stay fused);
* ``model.json``: the format and version, the architecture (each layer's class and config), the weight
  kinds, the kernel each layer call runs, where each weight lies in which storage (shape, strides,
  offset, panel layout), the KV-cache layout and a decode step's dispatch order and memory plan, and
  the sha256 of every file.

``load_bundle(DIR)`` checks all of that (a clear :class:`BundleError` for a changed file, an unknown
version, a CPU that lacks the kernels' features) and rebuilds the model from it with no compiler,
LLVM or packing: it generates token for token as the model it was saved from.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from arke.runtime.bundle import TORCH_BY_NAME, BundleKernel
from arke.runtime.bundle import load_bundle as load_kernels
from arke.runtime.bundle_files import BundleError, check_listed, edited, read_json, sha256, staged, stamped
from arke.runtime.errors import GuardError
from arke.runtime.panels import VNNI_KEY, panels_of, register_panels

if TYPE_CHECKING:
    from arke.models.layer import CompiledLayer
    from arke.models.lm import CausalLM

FORMAT, VERSION = "arke.model-bundle", 1
MODEL, WEIGHTS = "model.json", "weights.safetensors"
#: The model's own kernels (arke.models.lm's LM_SOURCE) a generation may call.
LM_KERNELS = ("embed", "embed_panels", "embed_pos", "embed_pos_panels", "head", "head_ln", "greedy", "penalized",
              "candidates", "candidates_k", "pick", "sample_all")
_DTYPES = {str(d): d for d in (torch.float32, torch.bfloat16, torch.float16, torch.int8, torch.int32, torch.int64,
                               torch.uint8, torch.bool)}


def _layer_classes() -> dict[str, type[CompiledLayer]]:
    from arke.models.deepseek import DeepseekLayer
    from arke.models.gpt2 import Gpt2Layer
    from arke.models.layer import CompiledLayer
    from arke.models.layer_half import HalfLayer

    return {"CompiledLayer": CompiledLayer, "Gpt2Layer": Gpt2Layer, "HalfLayer": HalfLayer,
            "DeepseekLayer": DeepseekLayer}


def _member(name: str, dtypes: dict[str, str]) -> str:
    """The kernel a call of ``name`` with these dtype variables runs (``attn_in__W_f32``)."""
    return name + "".join(f"__{k}_{v}" for k, v in dtypes.items())


def _layer_calls(layer: CompiledLayer) -> dict[str, str]:
    """Each kernel the layer binds, as ``call(name, **dtypes)`` names it, and the member it is."""
    calls: dict[str, str] = {}

    def record(name: str, **dtypes: str) -> None:
        calls[json.dumps([name, dtypes], sort_keys=True)] = _member(name, dtypes)

    type(layer)._bind(copy.copy(layer), record)  # on a copy: the layer keeps its own calls
    return calls


def _lm_members(module: Any, kind: str) -> list[str]:
    """The specialisations of :data:`LM_KERNELS` a model of weight dtype ``kind`` calls."""
    out = []
    for name in LM_KERNELS:
        generic = module.generics.get(module.kernel_map[name])
        if generic is None:
            out.append(name)
            continue
        members = [(combo, name + ir[len(generic.name):]) for combo, ir in generic.members]
        mine = [m for combo, m in members if all(str(d) == kind for d in combo)]
        out += mine or [m for _, m in members]
    return out


class _Storages:
    """The model's tensors, each recorded as a view of a storage saved once."""

    def __init__(self) -> None:
        self.storages: dict[int, tuple[str, torch.Tensor]] = {}
        self.refs: dict[str, dict[str, Any]] = {}

    def add(self, key: str, t: torch.Tensor | None) -> None:
        if t is None:
            return
        t = t.detach().cpu()
        storage = t.untyped_storage()
        found = self.storages.get(storage.data_ptr())
        if found is None:
            raw = torch.empty(0, dtype=torch.uint8).set_(storage)
            found = self.storages[storage.data_ptr()] = (f"s{len(self.storages)}", raw)
        self.refs[key] = {"storage": found[0], "dtype": str(t.dtype), "shape": list(t.shape),
                          "stride": list(t.stride()), "offset": t.storage_offset(), "panels": panels_of(t)}


def save_bundle(model: CausalLM, path: str | os.PathLike[str]) -> Path:
    """Save ``model`` (built for the llvm target) as a model bundle folder ``path``; returns it. A folder that
    exists is replaced only once the new bundle is complete."""
    from safetensors.torch import save_file

    import arke
    from arke.models.layer import REFERENCE
    from arke.models.lm import LM_SOURCE
    from arke.targets import base as targets

    target = targets.get(model.target) if model.target != REFERENCE else None
    if target is None:
        raise ValueError("a model on the reference interpreter has no kernels to bundle: build it for a target")
    out = Path(path)
    with staged(out, MODEL) as stage:
        first = model.layers[0]
        calls: dict[str, str] = {}
        for layer in model.layers:  # a model's layers may differ (DeepSeek-V2's dense first layers)
            calls |= _layer_calls(layer)
        target.build_bundle(first.module, stage / "layer", sorted(set(calls.values())))
        lm_module = arke.loads(LM_SOURCE, "<causal lm>")
        target.build_bundle(lm_module, stage / "lm", _lm_members(lm_module, model.kind))
        tensors = _Storages()
        for i, layer in enumerate(model.layers):
            for name, w in layer.weights.items():
                tensors.add(f"layers.{i}.{name}", w)
        for name in ("head", "embed", "norm", "norm_bias", "positions"):
            tensors.add(name, getattr(model, name))
        save_file({key: raw for key, raw in tensors.storages.values()}, str(stage / WEIGHTS))
        record = _record(model, calls, tensors.refs)
        record["files"] = {WEIGHTS: sha256(stage / WEIGHTS), **{
            f"{part}/manifest.json": sha256(stage / part / "manifest.json") for part in ("layer", "lm")}}
        (stage / MODEL).write_text(json.dumps(stamped(record), indent=1) + "\n")
    return out


def _record(model: CausalLM, calls: dict[str, str], refs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    import arke

    first = model.layers[0]
    c = first.config
    decode = first.memory(1, 1)
    return {
        "format": FORMAT, "version": VERSION, "arke": arke.__version__, "name": model.name, "target": model.target,
        "vocab": model.vocab, "hidden": model.hidden, "eps": model.eps, "tied": model.tied, "max_seq": model.max_seq,
        "panels": model.panels is not None,
        "layers": [{"class": type(layer).__name__, "name": layer.name, "config": dataclasses.asdict(layer.config),
                    "weights_dtype": layer.kind, "act_dtype": str(layer.act_dtype), "nr": layer.nr,
                    "weights": sorted(layer.weights)} for layer in model.layers],
        "calls": calls, "tensors": refs,
        "kv_cache": {"layout": "[batch, kv_heads, max_seq, head_dim]", "dtype": str(first.act_dtype),
                     "kv_heads": c.kv_heads, "head_dim": c.head_dim, "max_seq": first.max_seq,
                     "bytes_per_sequence": 2 * c.kv_heads * first.max_seq * c.head_dim
                     * torch.empty(0, dtype=first.act_dtype).element_size() * len(model.layers)},
        "decode_step": {"dispatches": first.dispatches(1, 1), "arena_bytes": decode.arena_bytes},
    }


class _Generic:
    """A generic kernel of a bundle: each call runs the specialisation whose parameters' dtypes its arguments have."""

    def __init__(self, name: str, members: list[BundleKernel]):
        self.name, self.members = name, members

    def __call__(self, *args: Any, **scalars: Any) -> Any:
        for k in self.members:
            tensors = [p for p in k.params if p["shape"]]
            dtypes = [getattr(a, "dtype", None) for a in args[:len(tensors)]]
            if all(d is None or d == TORCH_BY_NAME.get(p["dtype"]) for d, p in zip(dtypes, tensors)):
                return k(*args, **scalars)
        raise GuardError(self.name, f"no specialisation in this bundle takes arguments of dtypes {dtypes}",
                         rule="dtype")


def _lm_kernels(lib: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in LM_KERNELS:
        if name in lib.kernels:
            out[name] = lib.kernels[name]
        else:
            members = [k for n, k in lib.kernels.items() if n.startswith(name + "__")]
            if members:
                out[name] = _Generic(name, members)
    return out


class _Call:
    """One kernel of a layer, called as the layer calls its compiled kernels (planned outputs, scalars by name)."""

    def __init__(self, kernel: BundleKernel):
        self.kernel = kernel

    def __call__(self, tensors: list[torch.Tensor], scalars: dict[str, Any], out: Any, temps: Any = None) -> Any:
        return self.kernel(*tensors, out=out, **scalars)


def _fail(path: Path, what: str) -> BundleError:
    return BundleError(f"model bundle {path}: {what}")


def read_model(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The checked ``model.json`` of the model bundle at ``path`` (format, version, checksums)."""
    folder = Path(path)
    record = read_json(folder, MODEL, "this is not a model bundle (save one with arke.models.save_bundle)",
                       "model bundle")
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise _fail(folder, f"{MODEL} is not an Arke model bundle's (format {FORMAT!r})")
    if record.get("version") != VERSION:
        raise _fail(folder, f"format version {record.get('version')!r} is unknown to this Arke (it reads version "
                            f"{VERSION}); save the model again with this Arke")
    changed = edited(record)
    if changed is not None:
        raise _fail(folder, f"{MODEL}: {changed}; save the bundle again")
    files = record.get("files")
    wanted = {WEIGHTS, "layer/manifest.json", "lm/manifest.json"}
    if not isinstance(files, dict) or not wanted <= set(files):
        # the checksums are what tell a damaged bundle from a good one: without them nothing would be checked
        raise _fail(folder, f"{MODEL} lists no checksums of {', '.join(sorted(wanted - set(files or ())))}; save "
                            "the bundle again")
    check_listed(folder, MODEL, files, _fail, "save the bundle again")
    return record


def load_bundle(path: str | os.PathLike[str]) -> CausalLM:
    """The model saved at ``path`` by :func:`save_bundle`, ready to ``generate``: no compiler is imported."""
    from safetensors.torch import load_file

    folder = Path(path)
    record = read_model(folder)
    layer_lib, lm_lib = load_kernels(folder / "layer"), load_kernels(folder / "lm")
    try:
        raw = load_file(str(folder / WEIGHTS))
    except Exception as err:  # safetensors' own errors for a damaged file
        raise _fail(folder, f"{WEIGHTS} cannot be read ({err}); save the bundle again") from None

    try:
        return _restored(folder, record, raw, layer_lib, lm_lib)
    except BundleError:
        raise
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError, AttributeError) as err:  # an edited model.json
        raise _fail(folder, f"{MODEL} does not describe its weights ({type(err).__name__}: {err}); save the bundle "
                            "again") from None


def _restored(folder: Path, record: dict[str, Any], raw: dict[str, torch.Tensor], layer_lib: Any, lm_lib: Any
              ) -> CausalLM:
    """The model a checked bundle records (``raw``: its weight storages; ``*_lib``: its kernel bundles)."""
    from arke.models.lm import CausalLM

    def call(name: str, **dtypes: str) -> _Call:
        member = record["calls"].get(json.dumps([name, dtypes], sort_keys=True))
        if member is None or member not in layer_lib.kernels:
            raise _fail(folder, f"its layers call kernel {_member(name, dtypes)}, which it lacks; save it again")
        return _Call(layer_lib.kernels[member])

    def need(key: str) -> torch.Tensor:
        found = tensor(key)
        if found is None:
            raise _fail(folder, f"{MODEL} records no tensor {key!r}; save the bundle again")
        return found

    def tensor(key: str) -> torch.Tensor | None:
        ref = record["tensors"].get(key)
        if ref is None:
            return None
        base = raw[ref["storage"]].view(_DTYPES[ref["dtype"]])
        t = torch.as_strided(base, ref["shape"], ref["stride"], ref["offset"])
        if ref["panels"] is not None:
            register_panels(t, ref["panels"] if ref["panels"] == VNNI_KEY else int(ref["panels"]))
        return t

    classes = _layer_classes()
    layers = []
    for i, spec in enumerate(record["layers"]):
        if spec["class"] not in classes:
            raise _fail(folder, f"its layers are {spec['class']}, which this Arke does not know; save it again")
        config = classes[spec["class"]].config_type(**{**spec["config"], "inv_freq": tuple(spec["config"]["inv_freq"])})
        weights = {name: need(f"layers.{i}.{name}") for name in spec["weights"]}
        act = _DTYPES[spec["act_dtype"]] if spec["class"] == "HalfLayer" else None
        layers.append(classes[spec["class"]].restore(
            config, weights, call, target=record["target"], max_seq=record["max_seq"],
            weights_dtype=spec["weights_dtype"], name=spec["name"], nr=spec["nr"], act_dtype=act))
    head = need("head")
    panels = None
    if record["panels"]:
        nr = int(record["tensors"]["head"]["panels"])
        p = -(-record["vocab"] // nr)
        panels = torch.as_strided(head, (p, record["hidden"], nr), (record["hidden"] * nr, nr, 1))
    embed = tensor("embed")
    if embed is None and not record["panels"]:
        embed = head  # tied: one copy
    return CausalLM.restore(record["name"], layers, _lm_kernels(lm_lib), eps=record["eps"], vocab=record["vocab"],
                            hidden=record["hidden"], head=head, embed=embed, panels=panels, norm=need("norm"),
                            norm_bias=tensor("norm_bias"), positions=tensor("positions"), tied=record["tied"])
