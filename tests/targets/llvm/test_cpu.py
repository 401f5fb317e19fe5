"""The CPU runtime (llvmlite JIT, worker threads): what happens around a compiled kernel.

* guards: every bad call is a GuardError (a ValueError) naming the kernel and the parameter
  or clause, raised before any dispatch runs;
* run-time errors: out-of-range gather ids and integer division by zero raise GuardError with
  the interpreter's exact message, never a crash (these run in a subprocess, so a SIGSEGV or
  SIGFPE fails the test instead of killing pytest);
* arguments: non-contiguous views, NumPy in / NumPy out, torch in / torch out, results that
  never alias the inputs (or each other), inputs left untouched;
* strategies: `parallel` on an inner index and `when` conditions pick the right variant, and
  every variant gives the interpreter's answer;
* the on-disk cache: two processes building the same kernel at once, and a corrupted entry
  (a CacheWarning, then a correct result).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from codegen_support import assert_conforms, assert_matches, tolerance

import arke
from arke.lang.checker import stdlib_path
from arke.library import Library
from arke.runtime.guards import GuardError
from arke.targets.llvm import kernel as cpu

ROOT = Path(__file__).resolve().parents[3]

EXTRA = """
kernel ident(x: f32[N]) -> f32[N] { return x }
kernel both(x: f32[N]) -> (a: f32[N], b: f32[N]) { a = x; b = x }
kernel shared(x: f32[N]) -> (a: f32[N], b: f32[N]) { t = x * 2.0; a = t; b = t }
kernel to_bf16(x: f32[N]) -> bf16[N] { return x }
kernel idiv(a: i32[N], b: i32[N]) -> (q: i32[N], r: i32[N]) { q = a // b; r = a % b }
kernel ldiv(a: i64[N], b: i64[N]) -> i64[N] { return a / b }
kernel bdiv(a: i8[N], b: i8[N]) -> i8[N] { return a % b }
kernel ipow(a: i32[N], e: i32[N]) -> i32[N] { return a ** e }
kernel take(x: f32[M, N], idx: i32[M, K]) -> f32[M, K] { return x[m, idx[m, k]] }
kernel late(x: f32[M, N], idx: i64[M]) -> f32[M] {
  s[m] = sum(x[m, n] for n)
  return s[m] + x[idx[m], 0]
}

kernel scale(x: f32[M, N], s: f32[N]) -> f32[M, N] { return x[m, n] * s[n] }
kernel colsum(x: f32[M, N]) -> f32[N] { return sum(x[m, n] for m) }
kernel rownorm(x: f32[M, N], w: f32[N], eps: f32 = 1e-6) -> f32[M, N] {
  inv[m] = rsqrt(mean(x[m, k] * x[m, k] for k) + eps)
  return x[m, n] * inv[m] * w[n]
}
kernel bmm(a: f32[B, M, K], b: f32[B, K, N]) -> f32[B, M, N] { return sum(a[z, m, k] * b[z, k, n] for k) }

@strategy(scale, target = llvm, when M == 1) { parallel n }
@strategy(scale, target = llvm, when N >= 64 and M > 1) { parallel n }
@strategy(scale, target = llvm) { parallel m }
@strategy(colsum, target = llvm) { parallel n }
@strategy(rownorm, target = llvm, when M < 4) { parallel n }
@strategy(bmm, target = llvm) { parallel n }
"""


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """This module builds into its own cache directory, never the user's."""
    directory = tmp_path_factory.mktemp("arke-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ARKE_CACHE_DIR", str(directory))
        mp.delenv("ARKE_NO_CACHE", raising=False)
        yield directory


_LIBS: dict[str, tuple[arke.Module, Library]] = {}


def lib(name: str) -> Library:
    """The library of std module ``name`` or of this file's EXTRA kernels, built once."""
    if name not in _LIBS:
        module = arke.loads(EXTRA, "<test_cpu>") if name == "extra" else arke.load(stdlib_path(name))
        _LIBS[name] = (module, arke.build(module, "llvm"))
    return _LIBS[name][1]


def reference(name: str, kernel: str) -> arke.Kernel:
    lib(name)
    return _LIBS[name][0].kernels[kernel]


def f32(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ---------------------------------------------------------------- guards, before any dispatch

X, W = f32(4, 8), f32(8, seed=1)
Q, KV = f32(1, 4, 3, 8), f32(1, 2, 5, 8, seed=2)

# (label, library, kernel, args, kwargs, rule, param, texts the message must contain)
GuardCase = tuple[str, str, str, tuple[Any, ...], dict[str, Any], str, "str | None", tuple[str, ...]]
GUARDS: list[GuardCase] = [
    ("x rank 3", "std.nn", "rmsnorm", (X[None], W), {}, "rank", "x", ("rank 3",)),
    ("eps an array", "std.nn", "rmsnorm", (X, W), {"eps": np.ones(3)}, "rank", "eps", ()),
    ("w size", "std.nn", "rmsnorm", (X, W[:7]), {}, "dim", "w", ("N = 8", "has 7")),
    ("matmul K", "std.nn", "matmul", (f32(3, 5), f32(4, 2)), {}, "dim", "b", ("K = 5",)),
    ("x float64", "std.nn", "rmsnorm", (X.astype(np.float64), W), {}, "dtype", "x", ("float64", "f32")),
    ("x torch f16", "std.nn", "rmsnorm", (torch.from_numpy(X).half(), torch.from_numpy(W)), {}, "dtype", "x",
     ("float16",)),
    ("ids int32", "std.nn", "embedding", (np.zeros(3, np.int32), f32(5, 2)), {}, "dtype", "ids", ("i64", "int32")),
    ("H % G", "std.attention", "attention", (f32(1, 3, 2, 8), KV, KV), {}, "where", None, ("H % G == 0", "H = 3")),
    ("T < S", "std.attention", "causal_attention", (f32(1, 4, 7, 8), KV, KV), {}, "where", None, ("T >= S",)),
    ("D odd", "std.attention", "rope", (f32(3, 2, 5), np.arange(3)), {}, "where", None, ("D % 2 == 0",)),
    ("w missing", "std.nn", "rmsnorm", (X,), {}, "missing", "w", ()),
    ("v missing", "std.attention", "attention", (Q, KV), {}, "missing", "v", ()),
    ("unknown epsilon", "std.nn", "rmsnorm", (X, W), {"epsilon": 1.0}, "arity", "epsilon", ()),
    ("x twice", "std.nn", "rmsnorm", (X, W), {"x": X}, "arity", "x", ("twice",)),
    ("eps twice", "std.nn", "rmsnorm", (X, W, 1e-5), {"eps": 1e-5}, "arity", "eps", ("twice",)),
    ("4 arguments", "std.nn", "rmsnorm", (X, W, 1e-6, 4), {}, "arity", None, ("4 were given",)),
    ("M = 0", "std.nn", "rmsnorm", (X[:0], W), {}, "dim", "x", ("M = 0", "at least 1")),
    ("N = 0", "std.nn", "rmsnorm", (X[:, :0], W[:0]), {}, "dim", "x", ("N = 0",)),
    ("T = 0", "std.nn", "embedding", (np.zeros(0, np.int64), f32(5, 2)), {}, "dim", "ids", ("T = 0",)),
    ("k = 2.5", "std.moe", "topk_routing", (f32(3, 4),), {"k": 2.5}, "scalar", "k", ("2.5",)),
    ("k = True", "std.moe", "topk_routing", (f32(3, 4),), {"k": True}, "scalar", "k", ()),
    ("eps a str", "std.nn", "rmsnorm", (X, W), {"eps": "tiny"}, "type", "eps", ("str",)),
    ("x a list", "std.nn", "rmsnorm", (X.tolist(), W), {}, "type", "x", ("list",)),
    ("x a float", "std.nn", "rmsnorm", (1.0, W), {}, "rank", "x", ()),
    ("x strings", "std.nn", "rmsnorm", (np.full((4, 8), "a"), W), {}, "dtype", "x", ()),
]


def guard_id(case: tuple[Any, ...]) -> str:
    return f"{case[2]}: {case[0]}"


@pytest.fixture
def no_dispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any dispatch that runs fails the test: guards come first."""
    def run(*_: Any, **__: Any) -> None:
        raise AssertionError("a dispatch ran before the arguments were checked")

    monkeypatch.setattr(cpu.CPUKernel, "_run", run)


def expect_guard(call: Callable[[], Any], kernel: str, rule: str, param: str | None, texts: tuple[str, ...]) -> None:
    with pytest.raises(GuardError) as info:
        call()
    err, message = info.value, str(info.value)
    assert isinstance(err, ValueError)
    assert message.startswith(f"kernel `{kernel}`: "), message
    assert err.rule == rule, (err.rule, message)
    if param is not None:
        assert f"`{param}`" in message, message
    for text in texts:
        assert text in message, message


@pytest.mark.usefixtures("no_dispatch")
@pytest.mark.parametrize("case", GUARDS, ids=guard_id)
def test_bad_calls_raise_guard_errors_before_running(case: tuple[Any, ...]) -> None:
    _, library, kernel, args, kwargs, rule, param, texts = case
    expect_guard(lambda: lib(library).kernels[kernel](*args, **kwargs), kernel, rule, param, texts)


def test_guard_messages_match_the_interpreter() -> None:
    """The compiled kernel and the oracle reject a bad call with the same rule and parameter."""
    for _, library, kernel, args, kwargs, _, _, _ in GUARDS:
        with pytest.raises(GuardError) as compiled:
            lib(library).kernels[kernel](*args, **kwargs)
        with pytest.raises(GuardError) as oracle:
            reference(library, kernel)(*args, **kwargs)
        assert (compiled.value.rule, compiled.value.param) == (oracle.value.rule, oracle.value.param), kernel


# ---------------------------------------------------------------- run-time errors, in a subprocess

RISKY_SCRIPT = """
import json, sys, numpy as np, arke
from arke.lang.checker import stdlib_path
extra = arke.loads({extra!r}, "<test_cpu>")
libs = {{"extra": arke.build(extra), "nn": arke.build(stdlib_path("std.nn"))}}
table = np.arange(15, dtype=np.float32).reshape(5, 3)
x = np.arange(12, dtype=np.float32).reshape(3, 4)
i32, i64, i8 = (np.iinfo(t) for t in (np.int32, np.int64, np.int8))
CASES = {{
    "embedding id = V": ("nn", "embedding", (np.array([0, 5, 1]), table), 1),
    "embedding id = -1": ("nn", "embedding", (np.array([-1, 2]), table), 1),
    "embedding id = 2**40, 2 threads": ("nn", "embedding", (np.array([0, 1, 2, 2**40]), table), 2),
    "take id = N, 3 threads": ("extra", "take", (x, np.array([[0, 1], [2, 4], [3, 0]], np.int32)), 3),
    "late gather after a reduction": ("extra", "late", (x, np.array([0, 3, 1])), 1),
    "i32 // 0": ("extra", "idiv", (np.array([7, -7, 1], np.int32), np.array([2, 0, 1], np.int32)), 1),
    "i32 // 0, 3 threads": ("extra", "idiv", (np.arange(9, dtype=np.int32), np.array([1] * 8 + [0], np.int32)), 3),
    "i64 / 0": ("extra", "ldiv", (np.array([5, 6]), np.array([0, 0])), 1),
    "i8 % 0": ("extra", "bdiv", (np.array([5, -6], np.int8), np.array([3, 0], np.int8)), 1),
    "negative power": ("extra", "ipow", (np.array([2, 2], np.int32), np.array([3, -1], np.int32)), 1),
    "i32 MIN // -1": ("extra", "idiv", (np.array([i32.min, i32.min, 7], np.int32), np.array([-1, 1, -2], np.int32)), 1),
    "i64 MIN / -1": ("extra", "ldiv", (np.array([i64.min, -7]), np.array([-1, 2])), 1),
    "i8 MIN % -1": ("extra", "bdiv", (np.array([i8.min, -7], np.int8), np.array([-1, 2], np.int8)), 1),
}}
for name, (library, kernel, args, threads) in CASES.items():
    record = {{"case": name}}
    try:
        out = libs[library].kernels[kernel](*args, threads=threads)
        outs = out if isinstance(out, tuple) else (out,)
        record.update(outcome="ok", result=[np.asarray(o).tolist() for o in outs])
    except Exception as err:
        record.update(outcome=type(err).__name__, rule=getattr(err, "rule", None), message=str(err),
                      guard=isinstance(err, arke.GuardError))
    print(json.dumps(record), flush=True)
print(json.dumps({{"case": "done"}}), flush=True)
"""


@pytest.fixture(scope="module")
def risky(private_cache: Path) -> dict[str, Any]:
    """Every risky call, run once in a child process: case -> its record (a crash loses the rest)."""
    env = {**os.environ, "ARKE_CACHE_DIR": str(private_cache)}
    done = subprocess.run([sys.executable, "-c", RISKY_SCRIPT.format(extra=EXTRA)], capture_output=True, text=True,
                          env=env, timeout=300, cwd=ROOT)
    records = {r["case"]: r for r in map(json.loads, done.stdout.splitlines()) if r}
    records["_process"] = {"returncode": done.returncode, "stderr": done.stderr[-3000:]}
    return records


def record(risky: dict[str, Any], case: str) -> dict[str, Any]:
    process = risky["_process"]
    assert case in risky, f"the child process died before `{case}`: exit {process['returncode']}\n{process['stderr']}"
    found: dict[str, Any] = risky[case]
    return found


@pytest.mark.parametrize(("case", "kernel", "texts"), [
    ("embedding id = V", "embedding", ("`table`", "is 5", "size 5")),
    ("embedding id = -1", "embedding", ("`table`", "is -1")),
    ("embedding id = 2**40, 2 threads", "embedding", ("`table`", str(2**40))),
    ("take id = N, 3 threads", "take", ("`x`", "is 4")),
    ("late gather after a reduction", "late", ("`x`", "is 3")),
])
def test_out_of_range_ids_raise_the_interpreters_error(risky: dict[str, Any], case: str, kernel: str,
                                                       texts: tuple[str, ...]) -> None:
    got = record(risky, case)
    assert (got["outcome"], got.get("guard"), got.get("rule")) == ("ShapeError", True, "index"), got
    assert got["message"].startswith(f"kernel `{kernel}`: "), got["message"]
    for text in texts:
        assert text in got["message"], got["message"]


@pytest.mark.parametrize(("case", "kernel", "text"), [
    ("i32 // 0", "idiv", "by zero"),
    ("i32 // 0, 3 threads", "idiv", "by zero"),
    ("i64 / 0", "ldiv", "by zero"),
    ("i8 % 0", "bdiv", "by zero"),
    ("negative power", "ipow", "negative power"),
])
def test_integer_division_by_zero_raises_not_traps(risky: dict[str, Any], case: str, kernel: str, text: str) -> None:
    got = record(risky, case)
    assert (got["outcome"], got.get("guard"), got.get("rule")) == ("GuardError", True, "arith"), got
    assert got["message"].startswith(f"kernel `{kernel}`: ") and text in got["message"], got["message"]


@pytest.mark.parametrize(("case", "want"), [
    ("i32 MIN // -1", [[-2**31, -2**31, -4], [0, 0, -1]]),  # wraps, as the interpreter does
    ("i64 MIN / -1", [[-2**63, -4]]),
    ("i8 MIN % -1", [[0, 1]]),
])
def test_min_divided_by_minus_one_wraps_without_a_trap(risky: dict[str, Any], case: str, want: list[Any]) -> None:
    got = record(risky, case)
    assert got["outcome"] == "ok", got
    assert got["result"] == want


def test_the_risky_process_finished(risky: dict[str, Any]) -> None:
    process = risky["_process"]
    assert "done" in risky and process["returncode"] == 0, process["stderr"]


WIDE_SCRIPT = """
import numpy as np, arke
from arke.lang.checker import stdlib_path
a, b = np.ones((2, 1), np.float32), np.ones((1, 4_000_000), np.float32)
lib = arke.build(stdlib_path("std.nn"))
y1, y3 = lib.matmul(a, b, threads=1), lib.matmul(a, b, threads=3)
print("ok", y1.shape, float(y1.sum()), float(y3.sum()))
"""


def test_a_wide_contraction_does_not_crash(private_cache: Path) -> None:
    """A row of 4M accumulators (16 MB) must not live on a thread's stack (8 MB)."""
    env = {**os.environ, "ARKE_CACHE_DIR": str(private_cache)}
    done = subprocess.run([sys.executable, "-c", WIDE_SCRIPT], capture_output=True, text=True, env=env,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    assert done.stdout.split()[0] == "ok" and done.stdout.split()[-2:] == ["8000000.0", "8000000.0"], done.stdout


# ---------------------------------------------------------------- arguments and results


def views() -> list[tuple[str, Callable[[], tuple[Any, ...]]]]:
    return [
        ("numpy transposed", lambda: (f32(17, 5).T, f32(17, seed=1))),
        ("numpy strided slice", lambda: (f32(5, 40)[:, 3:37:2], f32(40, seed=1)[::2][:17])),
        ("numpy rows at an offset", lambda: (f32(9, 17)[2:7], f32(20, seed=1)[3:])),
        ("numpy reversed", lambda: (f32(5, 17)[::-1, ::-1], f32(17, seed=1)[::-1])),
        ("numpy broadcast (read-only, stride 0)", lambda: (np.broadcast_to(f32(17), (5, 17)), f32(17, seed=1))),
        ("torch transposed", lambda: (torch.from_numpy(f32(17, 5)).t(), torch.from_numpy(f32(17, seed=1)))),
        ("torch expanded", lambda: (torch.from_numpy(f32(1, 17)).expand(5, 17), torch.from_numpy(f32(34))[::2])),
    ]


@pytest.mark.parametrize(("label", "make"), views(), ids=[v[0] for v in views()])
def test_non_contiguous_inputs_give_correct_results(label: str, make: Callable[[], tuple[Any, ...]]) -> None:
    x, w = make()
    got = lib("std.nn").rmsnorm(x, w)
    assert_conforms(got, reference("std.nn", "rmsnorm"), x, w)
    dense = lib("std.nn").rmsnorm(*(a.contiguous() if isinstance(a, torch.Tensor) else np.ascontiguousarray(a)
                                    for a in (x, w)))
    assert np.array_equal(np.asarray(got), np.asarray(dense)), "a view gives other bits than its dense copy"


def test_non_contiguous_matmul_operands() -> None:
    a, b = f32(40, 40)[3:20, 5:38], f32(19, 33, seed=1).T  # [17, 33] slice and [33, 19] transposed
    got = lib("std.nn").matmul(a, b)
    assert_conforms(got, reference("std.nn", "matmul"), a, b)


def test_numpy_in_numpy_out_and_torch_in_torch_out() -> None:
    nn = lib("std.nn")
    assert type(nn.rmsnorm(X, W)) is np.ndarray
    t = nn.rmsnorm(torch.from_numpy(X), torch.from_numpy(W))
    assert type(t) is torch.Tensor and t.dtype == torch.float32
    assert type(nn.rmsnorm(X, torch.from_numpy(W))) is torch.Tensor  # any torch input: torch out
    logits, target = f32(3, 5), np.array([0, 4, 2])
    scalar = nn.cross_entropy_mean(logits, target)
    assert type(scalar) is np.ndarray and scalar.shape == ()
    scalar_t = nn.cross_entropy_mean(torch.from_numpy(logits), torch.from_numpy(target))
    assert type(scalar_t) is torch.Tensor and scalar_t.shape == ()
    bf = lib("extra").to_bf16(f32(5))  # NumPy has no bf16: a torch tensor, as the interpreter gives
    assert type(bf) is torch.Tensor and bf.dtype == torch.bfloat16
    pair = lib("extra").both(f32(5))
    assert type(pair) is tuple and len(pair) == 2 and all(type(p) is np.ndarray for p in pair)
    assert np.array_equal(nn.rmsnorm(X, W, eps=np.float32(0.5)), nn.rmsnorm(X, W, eps=np.array(0.5)))
    assert torch.equal(nn.rmsnorm(torch.from_numpy(X), torch.from_numpy(W), eps=torch.tensor(0.5)),
                       torch.from_numpy(nn.rmsnorm(X, W, eps=0.5)))
    grad = nn.rmsnorm(torch.from_numpy(X).requires_grad_(), torch.from_numpy(W))  # inputs that track gradients
    assert not grad.requires_grad and torch.equal(grad, torch.from_numpy(nn.rmsnorm(X, W)))


def test_results_do_not_alias_inputs() -> None:
    x = f32(7)
    y = lib("extra").ident(x)
    assert not np.shares_memory(x, y)
    y[:] = 0
    assert np.array_equal(x, f32(7))
    xt = torch.from_numpy(f32(7))
    yt = lib("extra").ident(xt)
    assert yt.data_ptr() != xt.data_ptr()
    a, b = lib("extra").both(x)
    assert not np.shares_memory(a, x) and not np.shares_memory(b, x) and not np.shares_memory(a, b)
    first, second = lib("std.nn").rmsnorm(X, W), lib("std.nn").rmsnorm(X, W)
    assert not np.shares_memory(first, second)


def test_results_do_not_alias_each_other() -> None:
    a, b = lib("extra").shared(f32(7))
    assert not np.shares_memory(a, b)


def test_inputs_are_left_untouched() -> None:
    args = (f32(2, 4, 5, 8), f32(2, 2, 9, 8, seed=1), f32(2, 2, 9, 8, seed=2))
    copies = [a.copy() for a in args]
    lib("std.attention").causal_attention(*args, threads=3)
    assert all(np.array_equal(a, c) for a, c in zip(args, copies))


def test_concurrent_calls_from_several_threads() -> None:
    """Python threads may call kernels at once (sharing the worker team): every call gets its own answer."""
    inputs = [(f32(19, 33, seed=s), f32(33, 7, seed=s + 100)) for s in range(8)]
    want = [lib("std.nn").matmul(a, b, threads=1) for a, b in inputs]
    for (a, b), first in zip(inputs, want, strict=True):
        assert_conforms(first, reference("std.nn", "matmul"), a, b)
    got: dict[int, list[np.ndarray]] = {}

    def work(k: int) -> None:
        got[k] = [lib("std.nn").matmul(*inputs[k], threads=2) for _ in range(5)]

    workers = [threading.Thread(target=work, args=(k,)) for k in range(len(inputs))]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    for k, results in sorted(got.items()):
        for r in results:
            assert np.array_equal(r, want[k]), "a call from one of several threads gave other bits"
    assert len(got) == len(inputs)


# ---------------------------------------------------------------- strategies


def spy_variants(monkeypatch: pytest.MonkeyPatch, kernel: Any) -> list[int]:
    """Record which strategy index each call of ``kernel`` compiles or reuses."""
    used: list[int] = []
    original = kernel.variant

    def variant(index: int) -> Any:
        used.append(index)
        return original(index)

    monkeypatch.setattr(kernel, "variant", variant)
    return used


@pytest.mark.parametrize(("kernel", "args", "index", "parallel"), [
    ("scale", (f32(1, 70), f32(70, seed=1)), 0, "n"),  # when M == 1
    ("scale", (f32(3, 70), f32(70, seed=1)), 1, "n"),  # when N >= 64 and M > 1
    ("scale", (f32(3, 17), f32(17, seed=1)), 2, "m"),  # the unconditional one
    ("colsum", (f32(9, 33),), 0, "n"),
    ("rownorm", (f32(3, 33), f32(33, seed=1)), 0, "n"),  # M < 4: the map is split over n, the reduction over m
    ("rownorm", (f32(9, 33), f32(33, seed=1)), -1, "m"),  # no strategy holds: the defaults
    ("bmm", (f32(2, 3, 5), f32(2, 5, 7, seed=1)), 0, "n"),  # the innermost output index
])
def test_strategies_select_variants_and_keep_the_meaning(monkeypatch: pytest.MonkeyPatch, kernel: str,
                                                         args: tuple[Any, ...], index: int, parallel: str) -> None:
    compiled = lib("extra").kernels[kernel]
    used = spy_variants(monkeypatch, compiled)
    for threads in (1, 3):
        assert_conforms(compiled(*args, threads=threads), reference("extra", kernel), *args)
    assert used == [index, index]
    plan = compiled.variant(index).plan
    last = plan.dispatches[-1]
    assert last.parallel == parallel, [d.parallel for d in plan.dispatches]
    assert all(d.parallel in {a.name for a in d.op.axes} for d in plan.dispatches)


def test_tensors_given_by_name_select_the_same_variant(monkeypatch: pytest.MonkeyPatch) -> None:
    compiled = lib("extra").kernels["scale"]
    used = spy_variants(monkeypatch, compiled)
    x, s = f32(1, 70), f32(70, seed=1)
    compiled(x, s)
    compiled(x=x, s=s)
    assert used[0] == used[1] == 0


# ---------------------------------------------------------------- the on-disk cache

CACHE_SCRIPT = """
import sys, warnings, numpy as np, arke
sys.path.insert(0, "tests/support")
from codegen_support import assert_conforms
from arke.lang.checker import stdlib_path
from arke.runtime.cache import CacheWarning
warnings.simplefilter("{policy}", CacheWarning)
module = arke.load(stdlib_path("std.nn"))
x = np.random.default_rng(0).standard_normal((5, 33)).astype(np.float32)
w = np.random.default_rng(1).standard_normal(33).astype(np.float32)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always", CacheWarning)
    got = arke.build(module, threads=2).rmsnorm(x, w)
try:
    assert_conforms(got, module.kernels["rmsnorm"], x, w)
    verdict = "close"
except AssertionError:
    verdict = "WRONG"
print(verdict, len(caught))
for c in caught:
    print("warning:", c.category.__name__, c.message)
"""


def run_cache_script(directory: Path, *, wait: bool = True) -> Any:
    env = {**os.environ, "ARKE_CACHE_DIR": str(directory)}
    env.pop("ARKE_NO_CACHE", None)
    args = [sys.executable, "-c", CACHE_SCRIPT.format(policy="default")]
    if not wait:
        return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)


def entries(directory: Path) -> list[Path]:
    return sorted(directory.rglob("*.entry"))


def test_two_processes_build_the_same_kernel(tmp_path: Path) -> None:
    procs = [run_cache_script(tmp_path, wait=False) for _ in range(2)]
    outputs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0, err
        assert out.split()[:2] == ["close", "0"], out + err
    built = entries(tmp_path)
    assert built, "nothing was written to the cache"
    again = run_cache_script(tmp_path)
    assert again.returncode == 0 and again.stdout.split()[:2] == ["close", "0"], again.stdout + again.stderr
    assert entries(tmp_path) == built and not list(tmp_path.rglob("*.tmp"))


def test_a_corrupted_entry_warns_and_still_gives_the_right_answer(tmp_path: Path) -> None:
    first = run_cache_script(tmp_path)
    assert first.returncode == 0 and first.stdout.startswith("close 0"), first.stdout + first.stderr
    for path in entries(tmp_path):
        blob = bytearray(path.read_bytes())
        blob[len(blob) // 2] ^= 0xFF
        path.write_bytes(bytes(blob))
    second = run_cache_script(tmp_path)
    assert second.returncode == 0, second.stderr
    assert second.stdout.startswith("close"), second.stdout
    assert "warning: CacheWarning" in second.stdout and "corrupted entry" in second.stdout, second.stdout
    third = run_cache_script(tmp_path)  # the entry was rebuilt: clean again
    assert third.stdout.startswith("close 0"), third.stdout + third.stderr


def test_the_kernel_source_is_available() -> None:
    text = lib("std.nn").kernels["rmsnorm"].source()
    assert "define void" in text and "rmsnorm" in text


def test_a_library_lists_its_kernels() -> None:
    nn = lib("std.nn")
    assert "rmsnorm" in dir(nn)
    with pytest.raises(AttributeError, match="no kernel `rmsnrom`"):
        _ = nn.rmsnrom



def test_out_receives_the_results_in_place() -> None:
    """`out=` is written in place and returned; every wrong `out` is a GuardError before anything runs."""
    import torch

    rms = lib("std.nn").kernels["rmsnorm"]
    x, w = f32(4, 33), f32(33)
    want = rms(x, w)
    out = np.empty((4, 33), dtype=np.float32)
    assert rms(x, w, out=out) is out
    np.testing.assert_array_equal(out, want)
    t = torch.empty(4, 33)
    assert rms(torch.from_numpy(x), torch.from_numpy(w), out=t) is t
    np.testing.assert_array_equal(t.numpy(), want)
    bad = [(np.empty((4, 32), np.float32), "shape"), (np.empty((4, 33), np.float64), "float64"),
           (np.empty((33, 4), np.float32).T, "contiguous"), ([0.0], "must be a tensor"), (x, "overlaps"),
           ((out, out), "one per result")]
    for o, words in bad:
        with pytest.raises(arke.GuardError, match=words):
            rms(x, w, out=o)


def test_a_threads_decision_sets_the_worker_count() -> None:
    """`threads = 1` in a strategy runs that kernel on one worker (the result does not change)."""
    src = ("kernel f(x: f32[M, N]) -> f32[M, N] { return x * 2.0 }\n"
           "@strategy(f, target = llvm) { threads = 1 }")
    built = arke.build(arke.loads(src), threads=2)
    x = f32(8, 5)
    np.testing.assert_array_equal(built.f(x), x * 2.0)
    assert built.kernels["f"].variant(0).threads == 1


def test_freed_kernels_leave_later_builds_working() -> None:
    """A JIT engine owns its target machine: freeing a kernel must not free one that later
    builds use (it once did, and the next build crashed the process)."""
    import gc

    source = "kernel twice(x: f32[N]) -> f32[N] { return x * 2.0 }"
    for _ in range(3):
        lib = arke.build(arke.loads(source, "<freed>"))
        assert lib.twice(np.ones(5, dtype=np.float32)).tolist() == [2.0] * 5
        del lib
        gc.collect()


HOLDERS = {
    "tensor": lambda t: t,
    "view": lambda t: t[3:7],
    "numpy": lambda t: t.numpy(),
    "dlpack": lambda t: __import__("torch.utils.dlpack").utils.dlpack.to_dlpack(t),
    "storage": lambda t: t.untyped_storage(),  # torch keeps one Python object per storage
}


@pytest.mark.parametrize("holder", HOLDERS)
def test_results_are_reused_only_once_the_caller_lets_go(holder: str) -> None:
    """A result buffer comes back on a later call only when nothing holds it: not the tensor,
    not a view of it, not the NumPy array it was returned as, not a DLPack export, not its storage."""
    import gc

    import torch.utils.dlpack

    k = lib("std.nn").softmax
    x = torch.randn(64, 129)
    softmax = reference("std.nn", "softmax")
    want, (bound,) = softmax(x), tolerance(softmax, (x,))
    first = k(x)
    ptr = first.data_ptr()
    keep = HOLDERS[holder](first)
    del first
    gc.collect()
    second = k(x * 2)  # other values: a wrongly shared buffer would change what `keep` sees
    assert second.data_ptr() != ptr
    if holder == "storage":
        seen = torch.empty(0).set_(keep, 0, tuple(x.shape))
    else:
        seen = torch.utils.dlpack.from_dlpack(keep) if holder == "dlpack" else torch.as_tensor(keep)
    part = slice(3, 7) if holder == "view" else slice(None)
    assert_matches(torch.as_tensor(seen), want[part], bound=[None if bound is None else bound[part]])
    freed = {ptr, second.data_ptr()}
    del keep, seen, second
    gc.collect()
    third = k(x)
    assert third.data_ptr() in freed  # nothing holds them now: one is reused
    assert_matches(third, want, bound=[bound])


def test_no_reuse_knob_keeps_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARKE_NO_REUSE", "1")
    src = "kernel halve(x: f32[N]) -> f32[N] { return x / 2.0 }"
    kernel = arke.build(arke.loads(src, "<no-reuse>")).halve
    for _ in range(3):
        kernel(torch.ones(7))
    assert not any(kernel.variant(-1)._pool._free.values())


def test_the_buffer_pool_keeps_a_bounded_number_of_shapes() -> None:
    """Shapes that keep changing (prefill at many lengths) must not pin memory forever."""
    from arke.runtime.pool import SHAPES

    src = "kernel grow(x: f32[T, D]) -> f32[T, D] { return x * 2.0 }"
    kernel = arke.build(arke.loads(src, "<grow>")).grow
    for t in range(1, 3 * SHAPES):
        kernel(torch.randn(t, 64))
    assert len(kernel.variant(-1)._pool._free) <= SHAPES
