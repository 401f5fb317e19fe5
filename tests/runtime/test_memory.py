"""Memory plans (arke.runtime.memory) and the plans of compiled decoder layers (arke.models.layer).

* placement: two buffers alive at a common step never share a byte; offsets are multiples of
  ALIGN; the arena covers every buffer and is at least the peak of live bytes (equal to it for
  a simple chain); checked on many seeded random buffer sets;
* bind: one view per buffer, of its shape and dtype, inside the arena's storage;
* a compiled layer: its plan per (batch, tokens) stays within twice the peak, and decode steps
  reuse one plan and arena.
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from arke.models.config import LayerConfig
from arke.models.layer import CompiledLayer
from arke.runtime.memory import ALIGN, MemoryPlan, Slot

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int8, torch.int64)


def aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def live_peak(slots: list[Slot]) -> int:
    """The peak of live bytes by brute force over every step."""
    if not slots:
        return 0
    return max(sum(s.nbytes for s in slots if s.first <= t <= s.last)
               for t in range(min(s.first for s in slots), max(s.last for s in slots) + 1))


def check_placement(plan: MemoryPlan) -> None:
    """Every property a placed plan must have."""
    for s in plan.slots:
        assert s.offset >= 0 and s.offset % ALIGN == 0, s
        assert s.offset + s.nbytes <= plan.arena_bytes, s
    for i, a in enumerate(plan.slots):
        for b in plan.slots[i + 1:]:
            if a.first <= b.last and b.first <= a.last:  # alive at a common step
                assert a.offset + a.nbytes <= b.offset or b.offset + b.nbytes <= a.offset, (a, b)
    assert plan.arena_bytes == max((s.offset + aligned(s.nbytes) for s in plan.slots), default=0)
    assert plan.peak_live_bytes() == live_peak(plan.slots)
    assert plan.arena_bytes >= plan.peak_live_bytes()
    assert plan.arena_bytes <= sum(aligned(s.nbytes) for s in plan.slots)  # never worse than no reuse


def random_plan(rng: random.Random) -> MemoryPlan:
    plan = MemoryPlan()
    for i in range(rng.randint(1, 24)):
        shape = tuple(rng.randint(1, 40) for _ in range(rng.randint(0, 3)))
        first = rng.randint(0, 15)
        plan.add(f"b{i}", shape, rng.choice(DTYPES), first, first + rng.choice((0, 0, 1, 1, 2, 5, 20)))
    return plan


def test_random_plans_never_overlap_live_buffers() -> None:
    """400 seeded random buffer sets: no two live buffers share bytes; aligned; arena ≥ peak."""
    rng = random.Random(20240601)
    for _ in range(400):
        check_placement(random_plan(rng).place())


@pytest.mark.parametrize("sizes", [[4096] * 6, [64, 128, 256, 512, 1024], [1024, 512, 256, 128, 64],
                                   [256, 64, 256, 64, 256]])
def test_simple_chain_reaches_the_peak(sizes: list[int]) -> None:
    """Buffer i written at step i, read at step i + 1: the arena is exactly the peak (two neighbours)."""
    plan = MemoryPlan()
    for i, n in enumerate(sizes):
        plan.add(f"a{i}", (n // 4,), torch.float32, i, i + 1)
    plan.place()
    check_placement(plan)
    peak = max(a + b for a, b in itertools.pairwise(sizes))
    assert plan.peak_live_bytes() == peak and plan.arena_bytes == peak


def test_disjoint_lifetimes_share_offset_zero() -> None:
    """Buffers never alive together all start at 0; the arena is the largest one."""
    plan = MemoryPlan()
    for i, n in enumerate((100, 300, 200)):
        plan.add(f"t{i}", (n,), torch.int8, i, i)
    plan.place()
    assert [s.offset for s in plan.slots] == [0, 0, 0]
    assert plan.arena_bytes == aligned(300) and plan.peak_live_bytes() == 300


def test_offsets_are_aligned_for_odd_sizes() -> None:
    """Sizes that are no multiple of ALIGN still get aligned offsets (all alive together)."""
    plan = MemoryPlan()
    for i, n in enumerate((3, 5, 1, 7, 13)):
        plan.add(f"x{i}", (n,), torch.float32, 0, 3)
    plan.place()
    check_placement(plan)
    assert sorted(s.offset for s in plan.slots) == [ALIGN * i for i in range(5)]
    assert plan.peak_live_bytes() == 4 * (3 + 5 + 1 + 7 + 13) < plan.arena_bytes == 5 * ALIGN


def test_empty_plan() -> None:
    plan = MemoryPlan().place()
    assert plan.arena_bytes == 0 and plan.peak_live_bytes() == 0
    assert plan.bind(torch.empty(0, dtype=torch.uint8)) == {}


def test_buffer_added_twice_is_an_error() -> None:
    plan = MemoryPlan()
    plan.add("q", (4,), torch.float32, 0, 1)
    with pytest.raises(ValueError, match="'q' is planned twice"):
        plan.add("q", (8,), torch.float32, 2, 3)


def test_last_before_first_lives_one_step() -> None:
    """A buffer whose last step precedes its first lives at its first step only."""
    plan = MemoryPlan()
    plan.add("a", (16,), torch.float32, 3, 1)
    assert (plan.slots[0].first, plan.slots[0].last) == (3, 3)


def test_bind_views() -> None:
    """One view per buffer: its shape and dtype, inside the arena's storage; live buffers do not alias."""
    rng = random.Random(7)
    for _ in range(25):
        plan = random_plan(rng).place()
        arena = torch.zeros(plan.arena_bytes + 5, dtype=torch.uint8)
        views = plan.bind(arena)
        assert set(views) == {s.name for s in plan.slots}
        base = arena.untyped_storage().data_ptr()
        for s in plan.slots:
            v = views[s.name]
            assert v.shape == s.shape and v.dtype == s.dtype and v.is_contiguous()
            assert v.untyped_storage().data_ptr() == base
            assert v.data_ptr() == base + s.offset
        # write every buffer live at one step with its own bytes: each reads back intact
        step = rng.choice([s.first for s in plan.slots])
        live = [s for s in plan.slots if s.first <= step <= s.last]
        for k, s in enumerate(live):
            views[s.name].view(-1).view(torch.uint8).fill_(k + 1)
        for k, s in enumerate(live):
            assert bool((views[s.name].view(-1).view(torch.uint8) == k + 1).all()), s
        assert arena[plan.arena_bytes:].eq(0).all()  # nothing past the plan


def test_bind_refuses_a_small_arena() -> None:
    plan = MemoryPlan()
    plan.add("a", (100,), torch.float32, 0, 0)
    plan.place()
    with pytest.raises(ValueError, match="the arena has 399 bytes; the plan needs 448"):
        plan.bind(torch.empty(399, dtype=torch.uint8))


def test_table_lists_every_buffer() -> None:
    plan = MemoryPlan()
    plan.add("h", (2, 64), torch.float32, 3, 4)
    plan.add("q", (2, 8, 16), torch.float32, 0, 2)
    lines = plan.place().table().splitlines()
    assert [line.split()[0] for line in lines] == ["q", "h", "arena"]
    assert "1,024 B" in lines[0] and "peak live 1,024 B" in lines[-1]


# ---------------------------------------------------------------- compiled layers


def _layer(experts: int) -> CompiledLayer:
    """A small decoder layer (llama-like, or mixtral-like with ``experts``) with random weights, on llvm."""
    d, h, g, e, f = 64, 8, 2, 16, 96
    gen = torch.Generator().manual_seed(experts)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen) * 0.2

    inv_freq = tuple(1.0 / 10000 ** (2 * i / e) for i in range(e // 2))
    config = LayerConfig(hidden=d, heads=h, kv_heads=g, head_dim=e, intermediate=f, eps=1e-5, inv_freq=inv_freq,
                         experts=experts, top_k=2)
    w = {"input_norm": rand(d), "post_norm": rand(d), "q": rand(h * e, d), "k": rand(g * e, d),
         "v": rand(g * e, d), "o": rand(d, h * e)}
    if experts:
        w |= {"router": rand(experts, d), "experts_gate_up": rand(experts, 2 * f, d),
              "experts_down": rand(experts, d, f)}
    else:
        w |= {"gate": rand(f, d), "up": rand(f, d), "down": rand(d, f)}
    return CompiledLayer(config, w, target="llvm", max_seq=64)


@pytest.fixture(scope="module", params=[0, 8], ids=["dense", "moe"])
def layer(request: pytest.FixtureRequest) -> CompiledLayer:
    return _layer(request.param)


@pytest.mark.parametrize(("batch", "tokens"), [(1, 1), (2, 1), (2, 9), (1, 32)])
def test_layer_plan_is_near_the_peak(layer: CompiledLayer, batch: int, tokens: int) -> None:
    """A layer's plan holds its activations (and the kernels' temporaries) within twice the peak."""
    plan = layer.memory(batch, tokens)
    check_placement(plan)
    assert plan.arena_bytes <= 2 * plan.peak_live_bytes()
    slots = {s.name: s for s in plan.slots}
    c, n = layer.config, batch * tokens
    assert slots["q"].shape == (n, c.heads, c.head_dim) and slots["h"].shape == (n, c.hidden)
    assert slots["o"].shape == (batch, tokens, c.heads, c.head_dim)
    if c.experts:
        assert slots["ys"].shape == (n * c.top_k, c.hidden) and slots["route"].shape == (n, c.experts)
    arena = layer._shapes[(batch, tokens)].arena
    assert arena.numel() >= plan.arena_bytes


def test_decode_steps_reuse_one_plan(layer: CompiledLayer) -> None:
    """A prefill and 16 decode steps use two plans; every decode step runs in the same arena."""
    layer._shapes.clear()
    cache = layer.new_cache(2)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 25, layer.config.hidden, generator=gen)
    pos = torch.arange(25)[None].expand(2, 25).contiguous()
    layer(x[:, :9], pos[:, :9].contiguous(), cache)
    arenas = set()
    for t in range(9, 25):
        layer(x[:, t:t + 1], pos[:, t:t + 1].contiguous(), cache)
        arenas.add(layer._shapes[(2, 1)].arena.data_ptr())
    assert set(layer._shapes) == {(2, 9), (2, 1)}
    assert len(arenas) == 1
    assert layer.memory(2, 1) is layer.memory(2, 1)
    assert cache.length == 25
