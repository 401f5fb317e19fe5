"""The measuring worker: a persistent subprocess that checks and times one candidate at a time.

The tuner (:class:`Worker`, the parent side) sends one JSON line per request and reads one JSON line
back, with a timeout: a candidate that crashes the worker (a bad kernel, an illegal instruction),
hangs, or raises is a recorded failure (``failed``, ``timeout``), the worker is started afresh,
and the tuner goes on (pytorch#95542: tune in a subprocess). In the worker (:func:`measure`), a
candidate is first checked against the reference interpreter with THE tolerance rule on fresh
random inputs at two sizes, one of them ragged, its outputs poisoned (NaN, or an integer sentinel)
before the call so a kernel that leaves an element unwritten fails; then checked at the tuning
dims against the interpreter (its max relative error); then timed: the same warm-up for every
candidate, then samples of repeated calls, each at least ``min_sample_s`` long. The inputs are
fresh for every request (a seed per request), and the kernel is the only thing timed.
"""

from __future__ import annotations

import json
import math
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

#: Largest relative error of the result at the tuning dims against the interpreter (a gross check: the
#: tolerance rule proper runs at the smaller check sizes, where its error kernel is affordable).
FULL_SIZE_RTOL = 1e-3
#: The check sizes: each dim at most this (fresh inputs), and a ragged size below it.
CHECK_CAP, RAGGED_CAP = 96, 67


def check_dims(dims: Mapping[str, int]) -> list[dict[str, int]]:
    """The two sizes a candidate is checked at with the full rule: each dim capped, then ragged (odd,
    not a multiple of a tile: ``min(d, 67)`` made odd; dims of 1 to 3 stay)."""
    capped = {k: min(v, CHECK_CAP) for k, v in dims.items()}
    ragged = {k: v if v <= 3 else (min(v, RAGGED_CAP) | 1) for k, v in dims.items()}
    return [capped, ragged]


def _inputs(fn: Any, dims: Mapping[str, int], seed: int) -> list[Any]:
    from arke.cli.build import random_inputs

    return random_inputs(fn, dict(dims), seed)


def _poisoned_like(value: Any) -> Any:
    import torch

    if isinstance(value, tuple):
        return tuple(_poisoned_like(v) for v in value)
    if not isinstance(value, torch.Tensor):  # a kernel of scalars alone gives NumPy values
        value = torch.as_tensor(value)
    if value.is_floating_point():
        return torch.full_like(value, math.nan)
    if value.dtype == torch.bool:
        return torch.ones_like(value)
    return torch.full_like(value, -7)


def _guards_hold(fn: Any, dims: Mapping[str, int]) -> bool:
    from arke.runtime.guards import check_guards

    try:
        check_guards(fn, dims)
    except Exception:
        return False
    return True


def measure(request: Mapping[str, Any]) -> dict[str, Any]:
    """Check and time one candidate (see the module docstring); the reply's ``status`` is ``ok`` (with
    ``samples``, seconds per call), ``mismatch`` or ``failed`` (with ``error``)."""
    import dataclasses

    import torch

    import arke
    from arke.ir import strategy as sir
    from arke.runtime.tolerance import check_results, results, tolerance
    from arke.tune.db import strategy_from

    module = arke.loads(request["source"], path=request.get("path") or "<tune>")
    name, target = request["kernel"], request["target"]
    strategy = strategy_from(request.get("strategy") or "")
    ir_name = module.kernel_map[name]
    others = tuple(s for s in module.strategies.strategies if s.kernel != ir_name)
    mine = (strategy,) if strategy is not None else ()
    module = dataclasses.replace(module, strategies=sir.StrategySet(others + mine))
    lib = arke.build(module, target=target, tuning="off")  # the defaults are the target's, never a stored choice
    kernel, reference = lib.kernels[name], module.kernels[name]
    fn = reference.function
    dims = {k: int(v) for k, v in request["dims"].items()}
    seed = int(request.get("seed", 0))
    for k, shrunk in enumerate(check_dims(dims)):
        check = shrunk if _guards_hold(fn, shrunk) else dims if k == 0 else None
        if check is None:  # shrunk dims break a `where` clause: the first check runs at the tuning dims
            continue
        args = _inputs(fn, check, seed + 17 * (k + 1))
        want = reference(*args)
        got = kernel(*args, out=_poisoned_like(kernel(*args)))
        if request.get("op") == "perturb":  # tests: a candidate whose result is wrong is caught
            first = results(got)[0]
            first.view(-1)[0] += 1.0
        try:
            check_results(got, want, tolerance(reference, args))
        except AssertionError as err:
            return {"status": "mismatch", "error": f"at {check}: {str(err)[:600]}"}
    args = _inputs(fn, dims, seed)
    got = kernel(*args, out=_poisoned_like(kernel(*args)))
    want = reference(*args)
    for g, w in zip(results(got), results(want)):
        g, w = torch.as_tensor(g).double(), torch.as_tensor(w).double()
        scale = float(w.abs().max()) if w.numel() else 0.0
        bad = bool(((g - w).abs() > FULL_SIZE_RTOL * max(scale, 1e-30)).any()) or bool((g.isnan() != w.isnan()).any())
        if bad:
            return {"status": "mismatch", "error": f"at the tuning dims {dims}: off by more than {FULL_SIZE_RTOL:g} "
                                                   f"of the largest value"}
    threads = request.get("threads")
    call = (lambda: kernel(*args)) if threads is None else (lambda: kernel(*args, threads=int(threads)))
    return {"status": "ok", "samples": timed(call, request)}


def timed(call: Callable[[], Any], request: Mapping[str, Any]) -> list[float]:
    """Seconds per call: the same warm-up for every candidate (``warmup`` calls), then ``samples`` samples of
    repeated calls, each at least ``min_sample_s`` long."""
    for _ in range(int(request.get("warmup", 3))):
        call()
    start = time.perf_counter()
    call()
    once = max(time.perf_counter() - start, 1e-7)
    repeat = max(1, int(float(request.get("min_sample_s", 0.02)) / once))
    samples = []
    for _ in range(int(request.get("samples", 7))):
        start = time.perf_counter()
        for _ in range(repeat):
            call()
        samples.append((time.perf_counter() - start) / repeat)
    return samples


def main() -> int:
    """The worker's loop: a JSON request per line on stdin, a JSON reply per line on stdout."""
    out = sys.stdout
    sys.stdout = sys.stderr  # anything a kernel or library prints stays off the reply channel
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            if request.get("op") == "crash":  # tests: the tuner survives a worker that dies
                os._exit(9)
            if request.get("op") == "hang":
                time.sleep(3600)
            if request.get("op") == "layer":  # a whole-layer plan (arke.tune.layer)
                from arke.tune.layer_worker import measure_layer

                reply = measure_layer(request)
            else:
                reply = measure(request)
        except Exception as err:  # a candidate that raises is a failure of that candidate, never of the worker
            reply = {"status": "failed", "error": f"{type(err).__name__}: {str(err)[:600]}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()
    return 0


class Worker:
    """The parent's handle on a measuring subprocess (started on first use, restarted after a crash or a
    timeout); :meth:`request` never raises for what a candidate does."""

    def __init__(self, env: Mapping[str, str] | None = None):
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[str] | None = None
        self.restarts = 0

    def _start(self) -> subprocess.Popen[str]:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen([sys.executable, "-m", "arke.tune.worker"], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                         env=self.env, bufsize=1)
        return self.proc

    def request(self, request: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send one request; its reply, or ``{"status": "timeout"|"failed", "error": ...}``."""
        proc = self._start()
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return self._lost("the worker had exited")
        ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
        if not ready:
            self.stop()
            self.restarts += 1
            return {"status": "timeout", "error": f"no answer within {timeout_s:g} s; the worker was restarted"}
        line = proc.stdout.readline()
        if not line:
            return self._lost(f"the worker died (exit code {proc.wait()})")
        try:
            reply: dict[str, Any] = json.loads(line)
        except ValueError:
            return self._lost("the worker's reply was not JSON")
        return reply

    def _lost(self, why: str) -> dict[str, Any]:
        self.stop()
        self.restarts += 1
        return {"status": "failed", "error": f"{why}; it was restarted"}

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            for stream in (self.proc.stdin, self.proc.stdout):
                if stream is not None:
                    stream.close()
            self.proc = None


if __name__ == "__main__":
    sys.exit(main())
