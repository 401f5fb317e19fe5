"""Model bundles (arke.models.save_bundle / load_bundle): a whole model saved with its kernels, plan and packed
weights, loaded where the compiler cannot be imported, and generating token for token as the original."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch
from test_causal_lm import VOCAB, loaded, prompt

import arke.models
from arke.runtime.bundle import BundleError
from arke.runtime.bundle_files import stamped
from arke.runtime.tolerance import same_bits

_NO_COMPILER = """
import importlib.abc, sys
BLOCKED = ("llvmlite", "lark", "arke.lang", "arke.passes", "arke.plan", "arke.targets", "arke.tune", "arke.api",
           "arke.library", "transformers")
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            raise ImportError(f"{name} may not be imported to run a model bundle")
sys.meta_path.insert(0, Block())
import torch, arke.models
model = arke.models.load_bundle(sys.argv[1])
ids = torch.load(sys.argv[2])
out = model.generate(ids, 32)
batch = model.generate([ids[0, :3].tolist(), ids[0].tolist()], 8)
torch.save({"tokens": out, "batch": batch}, sys.argv[3])
print("ran without", [m for m in sys.modules if m.startswith(BLOCKED)])
"""


@cache
def llama_bundle() -> Path:
    """Llama (a tied head read from its packed panels) saved as a model bundle, once per process."""
    return Path(loaded("llama").save_bundle(Path(tempfile.mkdtemp(prefix="arke-model-bundle-")) / "model"))


# GPT-2's and Mixtral's layers restore the same way (CompiledLayer.restore); DeepSeek-V2's MoE bundle is
# tests/models/test_deepseek.py's
@pytest.mark.parametrize("arch", ["llama"])
def test_a_model_bundle_generates_token_for_token_without_the_compiler(arch: str, tmp_path: Path) -> None:
    model = loaded(arch)
    folder = llama_bundle()
    ids = prompt(7, seed=3)
    torch.save(ids, tmp_path / "ids.pt")
    done = subprocess.run([sys.executable, "-c", _NO_COMPILER, str(folder), str(tmp_path / "ids.pt"),
                           str(tmp_path / "out.pt")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ran without []" in done.stdout
    got = torch.load(tmp_path / "out.pt")
    assert torch.equal(got["tokens"], model.generate(ids, 32))
    want_batch = model.generate([ids[0, :3].tolist(), ids[0].tolist()], 8)
    assert all(torch.equal(g, w) for g, w in zip(got["batch"], want_batch, strict=True))
    # in this process too: the same logits, bit for bit
    again = arke.models.load_bundle(folder)
    want = model(ids, model.new_cache(1), every_token=True)
    assert same_bits(again(ids, again.new_cache(1), every_token=True), want)
    record = json.loads((folder / "model.json").read_text())
    assert record["kv_cache"]["kv_heads"] == model.layers[0].config.kv_heads
    assert record["decode_step"]["dispatches"] and len(record["layers"]) == len(model.layers)


def test_a_model_bundle_is_not_saved_over_a_model_folder(tmp_path: Path) -> None:
    """Saving onto a folder that is not a model bundle (here the Hugging Face folder itself) is refused, and the
    folder keeps its files; an existing model bundle is replaced."""
    model = loaded("llama")
    hf = tmp_path / "hf"
    hf.mkdir()
    for name in ("config.json", "model.safetensors"):
        (hf / name).write_text("x")
    with pytest.raises(BundleError, match=r"no model\.json: it is not a bundle"):
        model.save_bundle(hf)
    assert sorted(p.name for p in hf.iterdir()) == ["config.json", "model.safetensors"]
    again = Path(shutil.copytree(llama_bundle(), tmp_path / "again"))
    model.save_bundle(again)
    assert arke.models.load_bundle(again).generate(prompt(4), 2).shape[-1] == 6


def test_a_changed_or_foreign_model_bundle_is_refused(tmp_path: Path) -> None:
    folder = llama_bundle()
    with pytest.raises(BundleError, match="not a model bundle"):
        arke.models.load_bundle(tmp_path)
    copy = Path(shutil.copytree(folder, tmp_path / "copy"))
    weights = copy / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(BundleError, match=r"weights\.safetensors does not match its checksum"):
        arke.models.load_bundle(copy)
    shutil.rmtree(copy)
    copy = Path(shutil.copytree(folder, tmp_path / "copy"))
    record = json.loads((copy / "model.json").read_text())
    record["version"] = 9
    (copy / "model.json").write_text(json.dumps(record))
    with pytest.raises(BundleError, match="format version 9 is unknown"):
        arke.models.load_bundle(copy)
    model = arke.models.load_bundle(folder)
    with pytest.raises(arke.GuardError, match="vocabulary"):
        model.generate([[VOCAB + 1]], 2)


def _edited(tmp_path: Path, edit: Any, stamp: bool = True) -> Path:
    """A copy of the Llama bundle with ``model.json`` edited (``stamp``: its digest made again, as a hand edit
    that knows how would; else the load refuses it for that alone)."""
    copy = Path(shutil.copytree(llama_bundle(), tmp_path / "copy"))
    record = json.loads((copy / "model.json").read_text())
    edit(record)
    (copy / "model.json").write_text(json.dumps(stamped(record) if stamp else record))
    return copy


def test_a_model_json_without_its_checksums_is_refused(tmp_path: Path) -> None:
    """Without the checksum record nothing would be checked: a damaged weights file would load and run."""
    copy = _edited(tmp_path, lambda r: r.update(files={}))
    with pytest.raises(BundleError, match="lists no checksums"):
        arke.models.load_bundle(copy)


def test_a_model_json_edited_after_the_save_is_refused(tmp_path: Path) -> None:
    """``model.json`` has a digest of its own: a tensor's panels or storage edited would load and generate
    other tokens."""
    def change(record: dict[str, Any]) -> None:
        record["tensors"]["layers.0.qkv"]["panels"] = None

    with pytest.raises(BundleError, match=r"model\.json: it was edited after the build"):
        arke.models.load_bundle(_edited(tmp_path, change, stamp=False))


def test_listed_files_outside_the_bundle_or_not_regular_are_refused(tmp_path: Path) -> None:
    copy = _edited(tmp_path, lambda r: r["files"].update({"/etc/hostname": "00"}))
    with pytest.raises(BundleError, match="/etc/hostname, which is not a file inside the bundle"):
        arke.models.load_bundle(copy)
    shutil.rmtree(copy)
    copy = Path(shutil.copytree(llama_bundle(), tmp_path / "copy"))
    (copy / "weights.safetensors").unlink()
    (copy / "weights.safetensors").symlink_to("/dev/zero")
    with pytest.raises(BundleError, match=r"weights\.safetensors is not a regular file"):
        arke.models.load_bundle(copy)


@pytest.mark.parametrize("edit", ["dtype", "config", "vocab", "offset"])
def test_an_edited_model_json_is_a_bundle_error(tmp_path: Path, edit: str) -> None:
    def change(record: dict[str, Any]) -> None:
        ref = record["tensors"]["head"]
        if edit == "dtype":
            ref["dtype"] = "torch.complex64"
        elif edit == "config":
            record["layers"][0]["config"]["surprise"] = 1
        elif edit == "vocab":
            record["vocab"] += 200
        else:
            ref["offset"] = 10**9

    with pytest.raises(BundleError, match=r"model\.json does not describe its weights"):
        arke.models.load_bundle(_edited(tmp_path, change))
