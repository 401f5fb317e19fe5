"""Weights and KV caches on huge pages (arke.runtime.hugepages): the tensors it gives are ordinary
contiguous CPU tensors whatever the system grants, weights share chunks without overlapping, and every
way of not getting a mapping falls back to torch's memory."""

from __future__ import annotations

import gc
import itertools

import pytest
import torch

from arke.runtime import hugepages as hp


def _mappings(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    made: list[int] = []
    real = hp._mapping

    def counted(nbytes: int):  # type: ignore[no-untyped-def]
        made.append(nbytes)
        return real(nbytes)

    monkeypatch.setattr(hp, "_mapping", counted)
    return made


@pytest.mark.skipif(not hp.enabled(), reason="no MADV_HUGEPAGE on this system")
def test_weights_share_chunks_and_keep_their_values(monkeypatch: pytest.MonkeyPatch) -> None:
    made = _mappings(monkeypatch)
    monkeypatch.setattr(hp, "_chunk", None)
    src = [torch.randn(700, 769), torch.randn(512, 1024).to(torch.bfloat16), torch.randint(-128, 127, (3000, 300),
                                                                                         dtype=torch.int8)]
    copies = [hp.weight_copy(t) for t in src]
    assert made == [hp.CHUNK]  # one chunk for all three
    assert copies[0].data_ptr() % (2 << 20) == 0
    ends = sorted((c.data_ptr(), c.data_ptr() + c.numel() * c.element_size()) for c in copies)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(ends)) and all(c.data_ptr() % 64 == 0 for c in copies)
    for c, t in zip(copies, src):
        assert c.is_contiguous() and c.dtype == t.dtype and c.shape == t.shape and torch.equal(c, t)
    big = hp.weight((hp.CHUNK // 8 + 1, 4), torch.float32)  # over half a chunk: a mapping of its own
    assert len(made) == 2 and big.data_ptr() % (2 << 20) == 0
    small = hp.weight((10,), torch.float32)  # below WEIGHT_MIN: torch's allocator
    assert len(made) == 2 and small.shape == (10,)
    del copies, big
    gc.collect()


@pytest.mark.skipif(not hp.enabled(), reason="no MADV_HUGEPAGE on this system")
def test_buffers_map_only_when_rounding_wastes_little(monkeypatch: pytest.MonkeyPatch) -> None:
    made = _mappings(monkeypatch)
    assert hp.buffer((600, 1024), torch.float32).shape == (600, 1024) and made == []  # 2.4 MB -> 4 MB: too much
    z = hp.zeros((8, 1024, 1024), torch.float32)  # 32 MB: whole huge pages
    assert made == [32 << 20] and z.data_ptr() % (2 << 20) == 0 and not z.any()


def test_fallbacks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hp, "_mapping", lambda nbytes: None)  # the system gives no mapping
    monkeypatch.setattr(hp, "_chunk", None)
    for t in (hp.weight((1024, 1024), torch.float32), hp.buffer((16, 1024, 1024), torch.float32)):
        assert t.is_contiguous() and t.numel() == (1 << 20) * (1 if t.dim() == 2 else 16)
    monkeypatch.setenv("ARKE_NO_HUGEPAGES", "1")
    assert not hp.enabled()
    w = torch.randn(1024, 1024)
    assert torch.equal(hp.weight_copy(w), w)
