"""Hostile calls of built kernels (issue 16): none may hang, lose data or leak a raw traceback.

* a forked child calls kernels, with the native team and with the thread pool (``ARKE_NO_TEAM``);
* ``threads=`` is a whole number from 1 to 1024; a call starts no more workers than its launches
  have chunks or than a few per core, and an idle team sleeps (it burns no CPU);
* a call that fails while it runs (a gather id out of range) leaves ``out=`` untouched;
* a result dim beyond 64-bit sizes is a GuardError on every target, before anything runs;
* bad arguments (NumPy ``out`` in the wrong byte order or with negative strides, a scalar beyond
  any float, sparse and meta tensors) are GuardErrors naming the kernel and the parameter;
* a broadcast view too big to copy is refused before the copy.

Hangs and thread counts are checked in a child process with a timeout.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap
from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np
import pytest
import torch

import arke
from arke.library import runnable_targets
from arke.runtime import limits
from arke.runtime.errors import GuardError, ShapeError
from arke.runtime.outputs import can_fail

SOURCE = """
kernel emb(ids: i64[T], table: f32[V, D]) -> f32[T, D] { return table[ids[t], d] }
kernel idiv(a: i32[N], b: i32[N]) -> i32[N] { return a // b }
kernel big(x: f32[N]) -> f32[N * 4611686018427387904] { return x[0] }
kernel scaled(x: f32[M, N], eps: f32 = 1e-5) -> f32[M, N] { return x[m, n] * eps }
kernel rowsum(x: f32[M, N]) -> f32[M] { return sum(x[m, n] for n) }
kernel rep(x: f32[N], R: dim) -> y: f32[N, R] { y[n, r] = x[n] }
"""

TARGETS = [t for t in ("llvm", "triton", "mlir") if t in runnable_targets()]
X86_LINUX = platform.machine().lower() in ("x86_64", "amd64") and sys.platform.startswith("linux")


@cache
def _module() -> Any:
    return arke.loads(SOURCE, "<hardening>")


@cache
def _lib(target: str = "llvm") -> Any:
    return arke.build(_module(), target=target)


def _script(code: str, timeout: float = 180, **env: str) -> str:
    """Run ``code`` in a fresh Python (the test's environment plus ``env``); its stdout. A hang fails the test."""
    prelude = f"import arke, torch\nlib = arke.build(arke.loads({SOURCE!r}, '<hardening>'))\n"
    try:
        done = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True,
                              text=True, timeout=timeout, env={**os.environ, **env})
    except subprocess.TimeoutExpired:
        pytest.fail(f"the child process did not finish in {timeout} s")
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


# ---------------------------------------------------------------- 1. fork


@pytest.mark.parametrize("no_team", ["1", "0"])
def test_a_forked_child_runs_parallel_kernels(no_team: str) -> None:
    out = _script("""
        import os, signal
        x = torch.ones(100, 64)
        assert float(lib.rowsum(x, threads=2).sum()) == 6400.0  # the parent's pool (or team) exists
        pid = os.fork()
        if pid == 0:
            signal.alarm(60)  # a hung child dies instead of outliving the test
            ok = float(lib.rowsum(x, threads=2).sum()) == 6400.0
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        print("child", status)
    """, ARKE_NO_TEAM=no_team)
    assert "child 0" in out, out


# ---------------------------------------------------------------- 2. threads=


@pytest.mark.parametrize("bad", [2.5, "4", True, 4.0])
def test_threads_of_the_wrong_type_is_a_guard_error(bad: Any) -> None:
    with pytest.raises(GuardError, match=r"kernel `rowsum`: threads= must be a whole number from 1 to 1024") as err:
        _lib().rowsum(torch.ones(8, 64), threads=bad)
    assert err.value.param == "threads" and err.value.rule == "threads"


def test_threads_out_of_range_is_a_guard_error() -> None:
    _script("""
        from arke.runtime.errors import GuardError
        for bad in (0, -3, 1025, 10000):  # 10000 used to start 9999 workers and not return
            try:
                lib.rowsum(torch.ones(8, 64), threads=bad)
            except GuardError as err:
                assert err.param == "threads" and "kernel `rowsum`" in str(err), err
            else:
                raise AssertionError(f"threads={bad} was accepted")
    """, timeout=120)


def test_no_more_workers_start_than_a_launch_has_chunks() -> None:
    out = _script("""
        import threading, time
        x = torch.ones(8, 64)
        start = time.perf_counter()
        assert torch.equal(lib.rowsum(x, threads=1000), x.sum(1))  # 8 rows: at most 7 workers and the caller
        assert torch.equal(lib.rowsum(x, threads=256), x.sum(1))
        print("threads", threading.active_count(), "seconds", time.perf_counter() - start)
    """, timeout=120)
    counts = out.split()
    assert int(counts[1]) <= 8 and float(counts[3]) < 5.0, out


@pytest.mark.skipif(not X86_LINUX, reason="the native team runs on x86-64 Linux only")
def test_an_idle_team_sleeps_and_wakes_for_the_next_launch() -> None:
    out = _script("""
        import time
        from arke.targets.llvm import team
        x = torch.randn(1000, 64)
        want = lib.rowsum(x, threads=1)
        crew = team.team(33)  # 32 workers, idle from the start
        time.sleep(0.5)  # past their spinning and napping
        used = time.process_time()
        time.sleep(1.0)
        print("idle", time.process_time() - used)
        for k in range(3):  # asleep: a launch wakes its workers
            assert torch.equal(lib.rowsum(x, threads=4), want)
            time.sleep(0.3)
        crew.close()
        print("closed", all(not t.is_alive() for t in crew.threads))
    """, timeout=120)
    idle = float(out.split()[1])
    assert idle < 0.025, out  # 32 napping workers cost ~0.08 s a second
    assert "closed True" in out, out


# ---------------------------------------------------------------- 4. out= after a failed call


def test_can_fail_sees_checked_subscripts_and_divisions() -> None:
    mod = _module()
    fns = {name: mod.semantic.get(mod.kernel_map[name]) for name in ("emb", "idiv", "scaled", "rowsum")}
    assert can_fail(fns["emb"], mod.semantic) and can_fail(fns["idiv"], mod.semantic)
    assert not can_fail(fns["scaled"], mod.semantic) and not can_fail(fns["rowsum"], mod.semantic)


@pytest.mark.parametrize("target", TARGETS)
def test_a_call_that_fails_while_running_leaves_out_untouched(target: str) -> None:
    lib = _lib(target)
    table = torch.arange(40, dtype=torch.float32).reshape(5, 8)
    out = torch.full((3, 8), -1.0)
    with pytest.raises(ShapeError, match=r"kernel `emb`: subscript 0 of `table` is 9"):
        lib.emb(torch.tensor([0, 9, 1]), table, out=out)
    assert bool((out == -1.0).all())
    q = np.full(3, 7, dtype=np.int32)
    with pytest.raises(GuardError, match="by zero"):
        lib.idiv(np.array([1, 2, 3], dtype=np.int32), np.array([1, 0, 1], dtype=np.int32), out=q)
    assert (q == 7).all()
    assert lib.emb(torch.tensor([4, 0, 1]), table, out=out) is out  # a good call still writes out=
    assert torch.equal(out, table[[4, 0, 1]])


# ---------------------------------------------------------------- 7. result dims beyond i64


@pytest.mark.parametrize("target", ["interpreter", *TARGETS])
def test_a_result_dim_beyond_i64_is_a_guard_error(target: str) -> None:
    call: Callable[..., Any] = ((lambda x: arke.interpret(_module().kernels["big"], x)) if target == "interpreter"
                                else _lib(target).big)
    with pytest.raises(ShapeError, match=r"kernel `big`: result 0 .* axis 0 is 4611686018427387904\*N = "
                                         r"18446744073709551616 \(N = 4 from `x` axis 0\), beyond the 64-bit") as err:
        call(torch.ones(4))
    assert err.value.rule == "size"


# ---------------------------------------------------------------- 16. bad arguments


def _bad_calls() -> dict[str, tuple[Callable[[Any], Any], str, str]]:
    """name -> (call, the parameter the error must name, a phrase of its advice)."""
    x = torch.ones(2, 3)
    return {
        "big-endian out": (lambda k: k(x.numpy(), out=np.zeros((2, 3), dtype=">f4")), "out", "byte order"),
        "negative-stride out": (lambda k: k(x.numpy(), out=np.zeros((2, 3), dtype=np.float32)[::-1]), "out",
                                "negative strides"),
        "complex out": (lambda k: k(x.numpy(), out=np.zeros((2, 3), dtype=np.complex64)), "out", "complex64"),
        "huge eps": (lambda k: k(x, eps=10**400), "eps", "beyond any float"),
        "huger eps": (lambda k: k(x, eps=10**5000), "eps", "beyond any float"),  # beyond int -> str too
        "threads=2.5": (lambda k: k(x, threads=2.5), "threads", "whole number"),
        "threads='4'": (lambda k: k(x, threads="4"), "threads", "whole number"),
        "sparse x": (lambda k: k(x.to_sparse()), "x", "to_dense"),
        "sparse out": (lambda k: k(x, out=torch.zeros(2, 3).to_sparse()), "out", "to_dense"),
        "meta x": (lambda k: k(torch.ones(2, 3, device="meta")), "x", "meta device"),
        "meta 0-d eps": (lambda k: k(x, eps=torch.tensor(0.5, device="meta")), "eps", "meta device"),
        "meta out": (lambda k: k(x, out=torch.empty(2, 3, device="meta")), "out", "meta"),
        "nested x": (lambda k: k(torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(1, 3)])), "x",
                     "nested tensor"),
        "out requiring grad": (lambda k: k(x, out=torch.zeros(2, 3, requires_grad=True)), "out", "torch.no_grad()"),
    }


@pytest.mark.parametrize("case", list(_bad_calls()))
@pytest.mark.parametrize("target", TARGETS)
def test_a_bad_argument_is_a_guard_error_naming_kernel_and_parameter(target: str, case: str) -> None:
    call, param, advice = _bad_calls()[case]
    with pytest.raises(GuardError) as err:
        call(_lib(target).scaled)
    assert err.value.kernel == "scaled" and err.value.param == param, err.value
    assert str(err.value).startswith("kernel `scaled`: ") and advice in str(err.value), err.value


@cache
def _bundled(folder: str) -> Any:
    from arke.targets.llvm.bundle.build import build_bundle

    build_bundle(_module(), folder)
    return arke.load_bundle(folder)


@pytest.mark.parametrize("case", list(_bad_calls()))
@pytest.mark.skipif(not X86_LINUX, reason="bundles are built for this machine's CPU (x86-64 Linux here)")
def test_a_bad_argument_to_a_bundle_is_the_same_guard_error(tmp_path_factory: pytest.TempPathFactory,
                                                            case: str) -> None:
    call, param, advice = _bad_calls()[case]
    lib = _bundled(str(tmp_path_factory.getbasetemp() / "hardening-bundle"))
    with pytest.raises(GuardError) as err:
        call(lib.scaled)
    assert err.value.kernel == "scaled" and err.value.param == param, err.value
    assert advice in str(err.value), err.value


@pytest.mark.parametrize("where", ["build", "bundle"])
def test_a_result_too_big_to_allocate_is_a_guard_error(tmp_path_factory: pytest.TempPathFactory, where: str
                                                       ) -> None:
    """A result within 64-bit sizes that no allocator holds (4 · 2**40 floats): a size error, not torch's."""
    if where == "bundle" and not X86_LINUX:
        pytest.skip("bundles are built for this machine's CPU (x86-64 Linux here)")
    lib = _lib("llvm") if where == "build" else _bundled(str(tmp_path_factory.getbasetemp() / "hardening-bundle"))
    with pytest.raises(GuardError, match="more than this machine could allocate") as err:
        lib.rep(torch.ones(4), 2**40)
    assert err.value.kernel == "rep"


def test_a_bad_argument_to_the_interpreter_is_a_guard_error() -> None:
    kernel = _module().kernels["scaled"]
    for case in ("huge eps", "sparse x", "meta x", "meta 0-d eps"):
        call, param, _ = _bad_calls()[case]
        with pytest.raises(GuardError) as err:
            call(lambda *a, **k: arke.interpret(kernel, *a, **k))
        assert err.value.param == param, (case, err.value)


def test_build_threads_must_be_a_whole_number() -> None:
    for bad in ("4", 2.5, 0, 5000):
        with pytest.raises(ValueError, match="threads must be a whole number from 1 to 1024"):
            arke.build(_module(), threads=bad)  # type: ignore[arg-type]


# ---------------------------------------------------------------- broadcast inputs


@pytest.mark.parametrize("target", TARGETS)
def test_a_broadcast_input_too_big_to_copy_is_refused(target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    lib = _lib(target)
    x = torch.arange(64, dtype=torch.float32)[None].expand(100, 64)  # 25.6 kB as a copy, 256 B stored
    torch.testing.assert_close(torch.as_tensor(lib.rowsum(x)), x.sum(1))  # under the limit: copied and run
    monkeypatch.setattr(limits, "BROADCAST_COPY_LIMIT", 1024)
    with pytest.raises(ShapeError, match=r"kernel `rowsum`: parameter `x` is a broadcast view \(stride 0 on axis 0\)"
                                         r".*pass `x.contiguous\(\)`") as err:
        lib.rowsum(x)
    assert err.value.param == "x" and err.value.rule == "size"
    torch.testing.assert_close(torch.as_tensor(lib.rowsum(x.contiguous())), x.sum(1))  # the caller's own copy


@pytest.mark.parametrize("where", ["build", "bundle", "interpreter"])
def test_a_numpy_broadcast_too_big_to_copy_is_refused(tmp_path_factory: pytest.TempPathFactory,
                                                       monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """``np.broadcast_to`` gives a read-only array with stride 0: it is read in place (not copied before the
    limit is checked), so a huge one is refused as torch's ``expand()`` is, and a small one runs."""
    if where == "bundle" and not X86_LINUX:
        pytest.skip("bundles are built for this machine's CPU (x86-64 Linux here)")
    lib = (_lib("llvm") if where == "build" else
           _bundled(str(tmp_path_factory.getbasetemp() / "hardening-bundle")) if where == "bundle" else None)
    kernel = _module().kernels["rowsum"]
    call = lib.rowsum if lib is not None else (lambda *a: arke.interpret(kernel, *a))
    row = np.arange(64, dtype=np.float32)
    x = np.broadcast_to(row, (100, 64))
    np.testing.assert_allclose(np.asarray(call(x)), np.full(100, row.sum()))
    monkeypatch.setattr(limits, "BROADCAST_COPY_LIMIT", 1024)
    if where != "interpreter":  # (the interpreter reads strided tensors as they are: nothing to copy)
        with pytest.raises(ShapeError, match=r"parameter `x` is a broadcast view \(stride 0 on axis 0\)") as err:
            call(x)
        assert err.value.param == "x" and err.value.rule == "size"
    flipped = np.broadcast_to(row[::-1], (100, 64))  # negative strides are copied: refused before the copy
    with pytest.raises(ShapeError, match=r"stride 0 on axis 0.*np.ascontiguousarray\(x\)"):
        call(flipped)


# ---------------------------------------------------------------- large where sets at call time


def test_a_large_where_set_is_checked_by_lookup_and_quoted_briefly() -> None:
    """A `where N in {...}` of 20,000 values: calls that break it name the clause in a few hundred
    characters (not the 200 kB set), and the set is built once, not on every call."""
    from arke.runtime import guards

    values = ", ".join(str(v) for v in range(2, 40002, 2))
    module = arke.loads(f"kernel k(x: f32[N]) -> f32[N] where N in {{{values}}} {{ return x[n] * 2.0 }}\n", "<big>")
    kernel = module.kernels["k"]
    assert torch.equal(kernel(torch.ones(4)), torch.full((4,), 2.0))
    cond = kernel.function.guards[0].cond
    assert guards._literal_set(cond) is guards._literal_set(cond)  # remembered, not rebuilt
    with pytest.raises(GuardError, match=r"where clause `N in \{2, 4, .* … .*40000\}` does not hold: N = 3") as err:
        kernel(torch.ones(3))
    assert len(str(err.value)) < 400


@pytest.mark.parametrize("target", ["interpreter", *TARGETS])
def test_a_tensor_with_the_negative_bit_is_read_as_its_values(target: str) -> None:
    """``.conj().imag`` of a complex tensor is contiguous, and its memory holds the negated values: kernels read
    its values; as ``out`` it is refused and left as it was."""
    x = torch.tensor([[1 + 2j]]).conj().imag
    assert x.is_neg() and x.is_contiguous()
    call: Callable[..., Any] = ((lambda *a, **k: _module().kernels["rowsum"](*a, **k)) if target == "interpreter"
                                else _lib(target).rowsum)
    assert torch.equal(torch.as_tensor(call(torch.tensor([[5.0]]))), torch.tensor([5.0]))  # the signature memoised
    assert torch.equal(torch.as_tensor(call(x)), torch.tensor([-2.0]))
    if target == "interpreter":  # it takes no out=
        return
    out = torch.tensor([1 + 5j]).conj().imag
    with pytest.raises(GuardError, match="negative bit"):
        call(x, out=out)
    assert torch.equal(out, torch.tensor([-5.0]))


def _zero_tensor() -> torch.Tensor:
    return torch._efficientzerotensor(4, 6)


def _shrunk() -> torch.Tensor:
    t = torch.ones(4, 6)
    t.untyped_storage().resize_(0)
    return t


@pytest.mark.parametrize("make", [_zero_tensor, _shrunk], ids=["zerotensor", "shrunk-storage"])
@pytest.mark.parametrize("where", ["argument", "out"])
def test_a_tensor_without_its_memory_is_refused_not_read(make: Callable[[], torch.Tensor], where: str) -> None:
    """A ZeroTensor (address 0) or a tensor whose storage was resized away would be read or written out of
    bounds (the process died): refused, also after the same shapes took the calls' fast path."""
    k = _lib("llvm").scaled
    good = torch.ones(4, 6)
    k(good)  # the signature is now known: the fast path must check memory too
    with pytest.raises(GuardError, match=r"ZeroTensor|outside its storage"):
        k(make()) if where == "argument" else k(good, out=make())


def test_in_memory_sees_views_inside_and_past_their_storage() -> None:
    base = torch.arange(24.0)
    assert limits.in_memory(base[4:].view(4, 5)) and limits.in_memory(base.view(4, 6).t())
    assert limits.in_memory(torch.empty(0, 3)) and limits.in_memory(torch._efficientzerotensor(0))
    past = torch.arange(24.0).view(4, 6)[1:, ::2]  # elements 6 .. 22
    assert limits.in_memory(past)
    past.untyped_storage().resize_(22 * 4)  # 22 elements left
    assert not limits.in_memory(past)


@pytest.mark.parametrize("where", ["build", "bundle"])
def test_a_wrong_out_dtype_or_rank_is_said_the_same_way(tmp_path_factory: pytest.TempPathFactory, where: str
                                                        ) -> None:
    """A bundle names the dtype and the axes of a wrong ``out=`` as ``arke.build`` does (its library knew only
    "an unknown dtype" and "a dense row-major tensor of the result's shape")."""
    if where == "bundle" and not X86_LINUX:
        pytest.skip("bundles are built for this machine's CPU (x86-64 Linux here)")
    lib = _lib("llvm") if where == "build" else _bundled(str(tmp_path_factory.getbasetemp() / "hardening-bundle"))
    x = torch.ones(3, 4)
    for out, says, rule in [(torch.empty(3, dtype=torch.float64), "out is float64, but the result is f32", "dtype"),
                            (np.empty(3, np.complex64), "out is a NumPy array of complex64", "dtype"),
                            (torch.empty(3, 1), "out has", "dim")]:
        with pytest.raises(GuardError, match=says) as err:
            lib.rowsum(x, out=out)
        assert err.value.rule == rule and err.value.param == "out", err.value


def test_a_clause_dividing_by_zero_is_an_arith_guard_error() -> None:
    """`where M % (N - 1) == 0` at N = 1, and a strategy's `when` alike: spec §9.3's run-time error, not a raw
    ZeroDivisionError (an "internal error" from akc run)."""
    where = arke.loads("kernel f(x: f32[M, N]) -> f32[M, N] where M % (N - 1) == 0 { return x[m, n] }\n")
    when = arke.loads("kernel g(x: f32[M, N]) -> f32[M, N] { return x[m, n] * 2.0 }\n"
                      "@strategy(g, target = llvm, when M // (N - 1) == 3) { parallel m }\n")
    for call in (lambda: where.kernels["f"](torch.ones(4, 1)), lambda: arke.build(where).f(torch.ones(4, 1)),
                 lambda: arke.build(when).g(torch.ones(4, 1))):
        with pytest.raises(GuardError, match=r"divides by zero at M = 4, N = 1") as err:
            call()
        assert err.value.rule == "arith"
    assert torch.equal(torch.as_tensor(arke.build(when).g(torch.ones(6, 3))), torch.full((6, 3), 2.0))


@pytest.mark.parametrize("target", TARGETS)
def test_a_meta_tensor_beside_a_cpu_one_is_called_what_it_is(target: str) -> None:
    """A meta tensor among CPU ones: it holds no values (Triton's device check asked to move it to the CPU)."""
    lib = arke.build(arke.loads("kernel two(x: f32[N], y: f32[N]) -> f32[N] { return x[n] + y[n] }"), target=target)
    with pytest.raises(GuardError, match="`y` is on the meta device, which holds no values") as err:
        lib.two(torch.ones(3), torch.ones(3, device="meta"))
    assert err.value.param == "y"
