"""Tiles of the CUDA-C attention kernels (:mod:`arke.targets.cuda.attention`): the strategy's
decisions (``tile`` on the query, key, feature and value indices, ``warps``, ``stages``) turned
into a :class:`Blocks`, checked against what each form can run (an
:class:`~arke.targets.artifact.UnsupportedError` names the decision and the values that work).

Defaults: tensor cores, 64 rows (16 for a decode group's split_kv kernel) × 64 keys, the head
dims covered up to 128 (wider ones chunked), 4 warps, 2 stages; SIMT, 16 rows × 32 keys, head
dims up to 128, 4 warps (8 lanes a row).
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from arke.ir import semantic as ir
from arke.ir.shapes import Dim
from arke.plan.attention import FEATURE, KEY, QUERY, VALUE, Attention
from arke.plan.dispatch import Dispatch, KernelPlan
from arke.plan.exprs import decided
from arke.targets.artifact import UnsupportedError
from arke.targets.cuda.expr import c_float

#: A group of at most this many rows (R * S) runs split_kv by default (and fills one row block).
DECODE_ROWS = 16
#: Key tiles per split_kv chunk (without a `split j = n`): 256 keys on tensor cores, 128 in SIMT, so a
#: decode step over a few thousand keys still fills the GPU with blocks.
SPLIT_TILES = 4
#: Scratch words before the counters (word 0: the error word).
HEADER_WORDS = 16
#: Dynamic shared memory a block may use: what every sm_80+ GPU grants (sm_86/89: 99 KB, less the
#: kernel's few bytes of static shared memory), so one source runs on all of them.
SHARED_LIMIT = 98 * 1024
#: The widest feature/value block a default covers (a wider head dim is walked in chunks).
WIDEST = 128
#: Default rows and keys of a tensor-core tile (flash; split_kv's decode blocks have DECODE_ROWS rows).
TC_ROWS, TC_KEYS = 64, 64
NEG_INF = c_float(float("-inf"))


@dataclass(frozen=True)
class Blocks:
    """The shape of one kernel: its form, tiles, warps and how the warps share a tile.

    Tensor cores: warp ``w`` owns rows ``16 * (w / wn)`` .. of the block and keys
    ``(w % wn) * BLOCK_N / wn`` .. of each tile. SIMT: ``rows`` rows per warp, each ``lanes``
    lanes (``wn`` is 1).
    """

    tc: bool
    warps: int
    m: int
    n: int
    d: int
    e: int
    stages: int
    wn: int  # warps sharing a row's keys (tensor cores)
    lanes: int  # lanes of one row (SIMT)

    @property
    def threads(self) -> int:
        return 32 * self.warps

    def shared(self) -> int:
        """Dynamic shared memory bytes (the staged results alias the tiles once the keys are done)."""
        staged = 4 * self.wn * self.m * (self.e + 2)
        if self.tc:
            tiles = 2 * (self.m * (self.d + 8) + self.stages * self.n * (self.d + 8 + self.e + 8))
        else:
            tiles = 4 * (self.m * (self.d + 1) + self.n * (self.d + 1) + self.n * self.e + self.m * (self.n + 1))
        return max(tiles, staged)


def fit(extent: Dim, step: int, widest: int) -> int:
    """A known extent rounded up to a multiple of ``step``, at most ``widest`` (a multiple of ``step``),
    which is also the block of an unknown extent."""
    value = sympy.sympify(extent)
    if value.is_Integer and int(value) > 0:
        return min(widest, -(-int(value) // step) * step)
    return widest


class Choices:
    """The strategy's decisions on one dispatch, and the blocks they make (checked)."""

    def __init__(self, plan: KernelPlan, d: Dispatch, entry: str, split: bool, auto: bool, half: bool):
        p = d.pattern
        assert isinstance(p, Attention)
        self.entry = entry
        names: dict[str, str | None] = {role: a.name for a, role in zip(d.op.axes, p.out_axes)}
        first = d.members[0]
        names[FEATURE] = first.reduce_axes[0].name if not isinstance(first, ir.MapOp) else None
        names[KEY] = p.key_index
        self.names = names
        self.tile = {role: decided(plan, "tile", names.get(role)) if names.get(role) is not None else None
                     for role in (QUERY, KEY, FEATURE, VALUE)}
        self.warps = decided(plan, "warps", None)
        self.stages = decided(plan, "stages", None)
        self.p, self.split, self.auto, self.half = p, split, auto, half

    def fail(self, what: str, works: str, code: str = "AK4004") -> UnsupportedError:
        """A strategy's blocks this kernel cannot run: a value it cannot lower (AK4004), or more shared memory
        than the GPU has (AK4012)."""
        return UnsupportedError(f"{self.entry}: {what} cannot run on the cuda attention kernel; {works}", code=code)

    def decision(self, role: str, default: int | None = None) -> str:
        """The tile decision on ``role``'s index, or (none made) the default it would get."""
        if self.tile[role] is None:
            return f"the default tile of {default} on `{self.names.get(role) or role}`"
        return f"`tile {self.names.get(role) or role} = {self.tile[role]}`"

    def blocks(self) -> Blocks:
        b = self.tensor_cores() if self.half else self.simt()
        if b.shared() > SHARED_LIMIT:
            raise self.fail(f"tiles {b.m} x {b.n} (features {b.d}, values {b.e}, {b.stages} stages) need "
                            f"{b.shared()} bytes of shared memory", f"use smaller tiles (at most {SHARED_LIMIT})",
                            "AK4012")
        return b

    def tensor_cores(self) -> Blocks:
        p, t = self.p, self.tile
        m = t[QUERY] or (DECODE_ROWS if self.split and self.auto else TC_ROWS)
        if m not in (16, 32, 64, 128, 256):
            raise self.fail(self.decision(QUERY, m), "the tensor-core form takes 16 rows a warp: rows in "
                            "{16, 32, 64, 128, 256}")
        wm = m // 16
        n = t[KEY] or TC_KEYS
        if self.warps is None:  # the warps a row block's keys are shared by: up to 4 warps in all
            wn = max(1, 4 // wm)
            while wn > 1 and n % (16 * wn):
                wn //= 2
        elif self.warps % wm:
            raise self.fail(f"`warps = {self.warps}` with {m} rows", f"warps must be a multiple of {wm} (rows / 16)")
        else:
            wn = self.warps // wm
        warps = wm * wn
        if warps > 16:
            raise self.fail(f"{warps} warps", "a block has at most 16 warps (256 rows)")
        if n % (16 * wn) or n // wn > 64:
            raise self.fail(self.decision(KEY, n),
                            f"with {wn} warps per row block the keys of a tile must be a multiple of {16 * wn}, "
                            f"at most {64 * wn}")
        dd = t[FEATURE] or fit(p.extent(FEATURE), 16, WIDEST)
        if dd % 16 or dd > 256:
            raise self.fail(self.decision(FEATURE, dd), "feature tiles are multiples of 16, at most 256")
        e = t[VALUE] or fit(p.extent(VALUE), 8, WIDEST)
        if e % 8 or e > 256:
            raise self.fail(self.decision(VALUE, e), "value tiles are multiples of 8, at most 256")
        stages = self.stages or 2
        if stages > 4:
            raise self.fail(f"`stages = {stages}`", "stages are 1 to 4")
        return Blocks(True, warps, m, n, dd, e, stages, wn, 4)

    def simt(self) -> Blocks:
        p, t = self.p, self.tile
        warps = self.warps or 4
        m = t[QUERY] or DECODE_ROWS
        rows = m // warps if m % warps == 0 else 0
        if rows == 0 or rows & (rows - 1) or rows > 32:
            ok = ", ".join(str(warps * (1 << k)) for k in range(6))
            raise self.fail(f"{self.decision(QUERY, m)} with `warps = {warps}`",
                            f"the SIMT form spreads a power of two of rows over each warp: rows in {{{ok}}}")
        lanes = 32 // rows
        n = t[KEY] or max(32, lanes)
        if n % lanes or n // lanes > 32:
            raise self.fail(self.decision(KEY, n), f"with {lanes} lanes a row the keys of a tile must be a multiple of "
                            f"{lanes}, at most {32 * lanes}")
        dd = t[FEATURE] or fit(p.extent(FEATURE), 1, WIDEST)
        e = t[VALUE] or fit(p.extent(VALUE), lanes, min(WIDEST, 32 * lanes))
        if e % lanes or e // lanes > 32:
            raise self.fail(self.decision(VALUE, e), f"with {lanes} lanes a row value tiles must be a multiple of "
                            f"{lanes}, at most {32 * lanes}")
        return Blocks(False, warps, m, n, dd, e, 1, 1, lanes)


__all__ = ["DECODE_ROWS", "HEADER_WORDS", "NEG_INF", "SPLIT_TILES", "Blocks", "Choices"]
