"""Soak: processes and threads call kernels and decoder layers at once, building into one cache,
with bad calls mixed in. Every good call gives the single-threaded run's bits, every bad call is a
GuardError that leaves its ``out=`` untouched, and afterwards every cache entry verifies.

Bounded in time: three processes of four threads, a fixed number of calls each (about half a
minute on two cores).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from arke.runtime.cache import Cache, CacheWarning

PROCESSES, THREADS, ROUNDS = 3, 4, 25

# One script is both the reference (one thread, one process) and each soak worker: what it prints
# is, per good call, the set of sha256 digests of the results it saw.
WORKER = r'''
import hashlib, json, random, sys, threading, zlib
import torch
import arke
from arke.models.config import LayerConfig
from arke.models.layer import CompiledLayer
from arke.runtime.errors import GuardError

SOURCE = """
kernel scale_rows(x: f32[M, N], w: f32[N], eps: f32 = 1e-6) -> f32[M, N] {
  s[m] = sum(x[m, n] * x[m, n] for n)
  return x[m, n] * w[n] * rsqrt(s[m] / f32(N) + eps)
}
kernel mm(a: f32[M, K], b: f32[K, N]) -> f32[M, N] { return sum(a[m, k] * b[k, n] for k) }
kernel gather(ids: i64[T], table: f32[V, D]) -> f32[T, D] { return table[ids[t], d] }
kernel probs(x: f32[M, N]) -> f32[M, N] {
  mx[m] = max(x[m, n] for n)
  e[m, n] = exp(x[m, n] - mx[m])
  return e[m, n] / sum(e[m, j] for j)
}
"""
soak, seed = sys.argv[1] == "soak", int(sys.argv[2])
lib = arke.build(arke.loads(SOURCE), target="llvm")


def tensor(tag, *shape):
    return torch.randn(shape, generator=torch.Generator().manual_seed(zlib.crc32(tag.encode())))


CASES = {
    "scale_rows-3x4097": lambda n: lib.scale_rows(tensor("x", 3, 4097), tensor("w", 4097), threads=n),
    "scale_rows-65x33": lambda n: lib.scale_rows(tensor("x2", 65, 33), tensor("w2", 33), eps=1e-3, threads=n),
    "mm-37x70x19": lambda n: lib.mm(tensor("a", 37, 70), tensor("b", 70, 19), threads=n),
    "mm-3x5x4097": lambda n: lib.mm(tensor("a2", 3, 5), tensor("b2", 5, 4097), threads=n),
    "gather": lambda n: lib.gather(torch.tensor([4, 0, 2, 4]), tensor("t", 5, 24), threads=n),
    "probs-9x300": lambda n: lib.probs(tensor("p", 9, 300), threads=n),
}


def bad_calls(rng):
    """Calls that must fail with a GuardError, and the out= each must leave untouched."""
    o = torch.full((3, 24), 7.0)
    return [
        (lambda: lib.mm(tensor("a", 4, 6), tensor("b", 5, 3)), None),
        (lambda: lib.scale_rows(tensor("x", 2, 8).double(), tensor("w", 8)), None),
        (lambda: lib.gather(torch.tensor([0, 9, 1]), tensor("t", 5, 24), out=o), o),
        (lambda: lib.probs(tensor("p", 2, 5), out=torch.empty(2, 4)), None),
        (lambda: lib.probs(tensor("p", 2, 5), threads=0), None),
        (lambda: lib.mm(tensor("a", 4, 6), tensor("b", 6, 3), threads=rng.choice([2.5, "2", -1])), None),
    ]


def make_layer():
    d, h, g, e, f = 32, 4, 2, 8, 48
    gen = torch.Generator().manual_seed(11)
    rand = lambda *shape: torch.randn(shape, generator=gen) * 0.2
    config = LayerConfig(hidden=d, heads=h, kv_heads=g, head_dim=e, intermediate=f, eps=1e-5,
                         inv_freq=tuple(1.0 / 10000 ** (2 * i / e) for i in range(e // 2)))
    w = {"input_norm": rand(d), "post_norm": rand(d), "q": rand(h * e, d), "k": rand(g * e, d),
         "v": rand(g * e, d), "o": rand(d, h * e), "gate": rand(f, d), "up": rand(f, d), "down": rand(d, f)}
    return CompiledLayer(config, w, target="llvm", max_seq=32)


layer = make_layer()


def decode():
    """A prefill of 5 tokens and 3 decode steps on the thread's own KV cache."""
    cache = layer.new_cache(1)
    x = tensor("h", 1, 8, layer.config.hidden)
    pos = torch.arange(8)[None]
    outs = [layer(x[:, :5].contiguous(), pos[:, :5].contiguous(), cache)]
    for t in range(5, 8):
        outs.append(layer(x[:, t:t + 1].contiguous(), pos[:, t:t + 1].contiguous(), cache))
    return torch.cat(outs, dim=1)


def digest(value):
    return hashlib.sha256(value.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


seen, problems, lock = {}, [], threading.Lock()


def note(name, value):
    with lock:
        seen.setdefault(name, set()).add(digest(value))


def worker(k):
    rng = random.Random(seed * 100 + k)
    for _ in range(ROUNDS):
        if rng.random() < 0.3:
            call, out = rng.choice(bad_calls(rng))
            before = None if out is None else out.clone()
            try:
                call()
                problems.append("a bad call returned")
            except GuardError:
                if out is not None and not torch.equal(out, before):
                    problems.append("a failed call wrote its out=")
            except Exception as exc:
                problems.append(f"a bad call raised {type(exc).__name__}: {exc}")
        elif rng.random() < 0.2:
            note("layer", decode())
        else:
            name = rng.choice(sorted(CASES))
            note(name, CASES[name](rng.randint(1, 3)))


ROUNDS = int(sys.argv[3])
if soak:
    pool = [threading.Thread(target=worker, args=(k,)) for k in range(int(sys.argv[4]))]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
else:
    for name, case in CASES.items():
        note(name, case(1))
    note("layer", decode())
print(json.dumps({"seen": {k: sorted(v) for k, v in seen.items()}, "problems": problems}))
'''


def run_worker(args: list[str], cache: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", WORKER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**env, "ARKE_CACHE_DIR": str(cache)})


def finish(proc: subprocess.Popen[str], timeout: float) -> dict[str, object]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"a soak worker hung (killed after {timeout:.0f} s): {err[-2000:]}")
    assert proc.returncode == 0, err[-4000:]
    result: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("team", ["native", "pool"])
def test_threads_and_processes_sharing_one_cache_give_the_single_threaded_bits(tmp_path: Path, team: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("ARKE_NO_TEAM", "ARKE_NO_CACHE")}
    if team == "pool":
        env["ARKE_NO_TEAM"] = "1"  # the Python thread pool instead of the native worker team
    reference = finish(run_worker(["reference", "0", "1"], tmp_path / "reference-cache", env), 300)
    want: dict[str, list[str]] = reference["seen"]  # type: ignore[assignment]
    assert all(len(v) == 1 for v in want.values())

    shared = tmp_path / "shared-cache"
    procs = [run_worker(["soak", str(p), str(ROUNDS), str(THREADS)], shared, env) for p in range(PROCESSES)]
    results = [finish(p, 300) for p in procs]
    calls = 0
    for result in results:
        assert result["problems"] == []
        seen: dict[str, list[str]] = result["seen"]  # type: ignore[assignment]
        for name, digests in seen.items():
            assert digests == want[name], f"{name}: {len(digests)} different results, not the single-threaded bits"
            calls += 1
    assert calls >= PROCESSES * 3, "the soak made too few good calls to mean anything"

    # every entry the concurrent builders left verifies (its checksum and key), and none is half-written
    entries = sorted(shared.glob("*/*.entry"))
    assert entries, "the soak built nothing into the shared cache"
    assert not list(shared.glob("*/*.tmp"))
    cache = Cache(shared, disk=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        for path in entries:
            assert cache.load(path.name.removesuffix(".entry")) is not None, f"{path} does not verify"
