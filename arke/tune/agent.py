"""The tuner as tools for an agent (``akc mcp``, the Model Context Protocol over stdio).

An agent picks decisions inside Arke's closed, checked vocabulary; the compiler checks them and the
tuner's worker measures them (the Arke roadmap's thesis: an LLM choosing strategies beats one writing
raw kernels). The tools: list a file's kernels and their plans, the legal decisions and values of a
kernel at given dims, check a proposed strategy (``akc check``'s diagnostics, plus the decisions a
target would drop), measure it (the worker's oracle check on fresh inputs, then the candidate and the
defaults in interleaved rounds: a speedup only counts beyond the measured noise), and record a
measured result with a rationale in the tuning database. Nothing else can be run or timed. Every
call and its result is appended to a trajectory log (JSON lines).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import stat
import statistics
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from arke.tune import db as tdb

#: Interleaved rounds of a measurement (candidate, defaults, candidate, ...), samples per round.
ROUNDS, SAMPLES = 3, 5


class Agent:
    """The state behind the tools: the database, the worker, the trajectory log, what was measured."""

    def __init__(self, db: str | None = None, log: str | None = None, timeout_s: float = 120.0):
        from arke.tune.worker import Worker

        self.db_url = db
        base = Path.home() / ".cache" / "arke"
        self.log_path = Path(log) if log else base / "agent-trajectory.jsonl"
        self.worker = Worker()
        self.timeout_s = timeout_s
        self.measured: dict[tuple[str, str, str, str, str, str], dict[str, Any]] = {}  # ..., the file's digest

    def close(self) -> None:
        self.worker.stop()

    def _append(self, text: str) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # opened without blocking (a FIFO with no reader would hang the server), appended to a regular file only
        fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NONBLOCK", 0), 0o644)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(errno.EINVAL, "not a regular file")
            os.write(fd, text.encode("utf-8"))
        finally:
            os.close(fd)

    def check_log(self) -> None:
        """Raise a ValueError now (before serving) where the trajectory log cannot be appended to."""
        try:
            self._append("")
        except OSError as err:
            raise ValueError(f"the trajectory log {self.log_path} cannot be written ({err.strerror or err}): give "
                             "another file with --log") from None

    def check_db(self) -> None:
        """Raise a ValueError now (before serving) where the tuning database cannot be used: else an agent
        measures for minutes and only ``record`` says so."""
        from arke.tune import db as tdb

        try:
            database = tdb.Database(self.db_url)
            try:
                database.count()
            finally:
                database.close()
        except tdb.TuningDatabaseError as err:
            raise ValueError(f"{err}; give another database with --db") from None

    def _log(self, tool: str, arguments: Mapping[str, Any], result: Any) -> None:
        try:
            self._append(json.dumps({"time": time.time(), "tool": tool, "arguments": dict(arguments),
                                     "result": result}, default=str) + "\n")
        except OSError as err:  # the tool's answer stands; a log that fails is said once, not per call
            if not getattr(self, "_log_failed", False):
                self._log_failed = True
                warnings.warn(f"arke agent: the trajectory log {self.log_path} cannot be written ({err})",
                              RuntimeWarning, stacklevel=3)

    def call(self, tool: str, **arguments: Any) -> Any:
        """Run one tool by name (what the MCP server and the tests call); errors come back as ``{"error"}``."""
        method = getattr(self, f"tool_{tool}", None)
        if method is None:
            result: Any = {"error": f"no tool `{tool}`"}
        else:
            try:
                result = method(**arguments)
            except (ValueError, KeyError, OSError, TypeError) as err:
                result = {"error": f"{type(err).__name__}: {err}"}
            except Exception as err:  # a CheckError and the like: an answer, never a dead server
                result = {"error": f"{type(err).__name__}: {str(err)[:2000]}"}
        self._log(tool, arguments, result)
        return result

    # -------------------------------------------------------------- the tools
    def tool_list_kernels(self, path: str) -> dict[str, Any]:
        """The kernels a file defines: signatures, `where` clauses, the dispatches of their default plans."""
        import arke
        from arke.targets import base as targets

        module = arke.load(path)
        t = targets.get("llvm")
        out = []
        for name in module.names:
            ir_name = _ir_name(module, name)
            if ir_name in module.generics:
                out.append({"kernel": name, "generic": True})
                continue
            fn = module.semantic.get(ir_name)
            plan = t.plan(module.semantic, ir_name, None)
            out.append({"kernel": name, "params": [f"{p.name}: {p.type.dtype.value}{list(map(str, p.type.shape))}"
                                                   for p in fn.params],
                        "where": [g.text for g in fn.guards],
                        "dispatches": [d.family for d in plan.dispatches]})
        return {"path": path, "kernels": out}

    def tool_legal_decisions(self, path: str, kernel: str, dims: Mapping[str, int],
                             target: str = "llvm") -> dict[str, Any]:
        """Every decision the target honours for the kernel at these dims, with the values to try."""
        import arke
        from arke.tune.space import knobs

        module = arke.load(path)
        space = knobs(module, _ir_name(module, kernel), target, _dims(module, kernel, dims))
        return {"kernel": kernel, "target": target, "decisions": [
            {"decision": k.decision, "subject": k.subject, "values": [v for v in k.values if v != "default"]}
            for k in space]}

    def tool_check_strategy(self, path: str, kernel: str, strategy: str, target: str = "llvm",
                            dims: Mapping[str, int] | None = None) -> dict[str, Any]:
        """``akc check``'s diagnostics for the strategy (its decisions, one per line, as in a block), and
        the decisions no dispatch would honour as written."""
        from arke.lang.checker import check_text
        from arke.tune.space import prune

        if dims:  # as measure takes them (a dim of 0 or one the kernel lacks is an error, not "ok")
            import arke

            dims = _dims(arke.load(path), kernel, dims)
        _, source_path, full = self._with_strategy(path, kernel, strategy, target)
        result = check_text(full, source_path)
        header = full[:full.rindex("@strategy(")].count("\n") + 1  # the generated `@strategy(...) {` line
        lines = strategy.splitlines()
        kept = [(n + 1, len(line) - len(line.lstrip())) for n, line in enumerate(lines) if line.strip()]

        def where(line: int, col: int) -> tuple[int, int]:  # in the agent's own text (the block re-indents it)
            k = line - header - 1
            if 0 <= k < len(kept):
                return kept[k][0], max(1, col - 2 + kept[k][1])
            return 0, col  # the generated header or closing brace

        diagnostics = [{"code": d.code, "severity": d.severity.name.lower(), "message": d.message,
                        "line": line, "column": col, "hint": d.hint}
                       for d in result.diagnostics if d.span.line >= header
                       for line, col in (where(d.span.line, d.span.col),)]
        errors = [d for d in diagnostics if d["severity"] == "error"]
        dropped = None
        if not errors:
            import arke

            module = arke.loads(full, path=source_path)
            ir_name = _ir_name(module, kernel)
            found = module.strategies.for_kernel(ir_name, target)
            if found:  # the strategy added last is the agent's
                dropped = prune(module, ir_name, found[-1], dict(dims or {}))
        # a warning on the strategy's lines is a decision the checker knows the target drops (AK4009, AK4014)
        return {"ok": not diagnostics and dropped is None, "diagnostics": diagnostics, "not_honoured": dropped}

    def tool_measure(self, path: str, kernel: str, dims: Mapping[str, int], strategy: str,
                     target: str = "llvm") -> dict[str, Any]:
        """Check the strategy against the interpreter on fresh inputs, then time it and the defaults in
        interleaved rounds; the speedup counts only beyond the measured noise."""
        import arke

        dims = _dims(arke.load(path), kernel, dims)
        checked = self.tool_check_strategy(path, kernel, strategy, target, dims)
        if not checked["ok"]:
            return {"outcome": "rejected", **checked}

        text, source_path, full = self._with_strategy(path, kernel, strategy, target)
        module = arke.loads(full, path=source_path)
        mine = module.strategies.for_kernel(_ir_name(module, kernel), target)[-1]
        seed = random.SystemRandom().randrange(1 << 30)  # fresh inputs every call
        base = {"source": text, "path": source_path, "kernel": kernel, "target": target, "dims": dims,
                "samples": SAMPLES}
        times: dict[str, list[float]] = {"candidate": [], "defaults": []}
        for r in range(ROUNDS):
            for name, strat in (("candidate", tdb.strategy_json(mine)), ("defaults", "")):
                reply = self.worker.request({**base, "strategy": strat, "seed": seed + 7 * r}, self.timeout_s)
                if reply.get("status") != "ok":
                    return {"outcome": reply.get("status", "failed"), "error": reply.get("error", ""), "measured": name}
                times[name] += reply["samples"]
        medians = {k: statistics.median(v) for k, v in times.items()}
        noise = max(_spread(times["candidate"]), _spread(times["defaults"]), 0.02)
        speedup = medians["defaults"] / medians["candidate"]
        out = {"outcome": "ok", "candidate_s": medians["candidate"], "defaults_s": medians["defaults"],
               "speedup": speedup, "noise": noise, "wins": speedup > 1 + noise}
        self.measured[(path, kernel, target, json.dumps(dims, sort_keys=True), strategy.strip(), _digest(text))] = {
            **out, "samples": times["candidate"], "strategy": mine}
        return out

    def tool_record(self, path: str, kernel: str, dims: Mapping[str, int], strategy: str, rationale: str,
                    target: str = "llvm") -> dict[str, Any]:
        """Store a strategy measured in this session, with the agent's rationale; a confirmed win (beyond the
        noise) also becomes the key's choice, which ``arke.build`` uses."""
        import arke

        text = Path(path).read_text(encoding="utf-8")
        dims = _dims(arke.loads(text, path=path), kernel, dims)
        asked = (path, kernel, target, json.dumps(dims, sort_keys=True), strategy.strip())
        found = self.measured.get((*asked, _digest(text)))
        if found is None:
            if any(k[:5] == asked for k in self.measured):
                return {"error": f"{path} changed since this strategy was measured: measure it again (a record is "
                                 "kept under the kernel it was measured on)"}
            return {"error": "measure this strategy at these dims first: only measured results are recorded"}
        module = arke.loads(text, path=path)
        key = tdb.Key.make(module.semantic, _ir_name(module, kernel), target, dims)
        database = tdb.Database(self.db_url)
        try:
            record = tdb.Record(key, dims, found["strategy"], "ok", tuple(found["samples"]),
                                f"agent: {rationale}", kernel)
            database.add(record)
            if found["wins"]:
                database.add(tdb.Record(key, dims, found["strategy"], tdb.CHOSEN, tuple(found["samples"]),
                                        f"agent: {rationale}", kernel))
        finally:
            database.close()
        return {"recorded": True, "chosen": bool(found["wins"]), "database": database.shown()}

    # -------------------------------------------------------------- helpers
    @staticmethod
    def _with_strategy(path: str, kernel: str, strategy: str, target: str) -> tuple[str, str, str]:
        text = Path(path).read_text(encoding="utf-8")
        body = "\n".join(f"  {line.strip()}" for line in strategy.strip().splitlines() if line.strip())
        full = text + ("" if text.endswith("\n") else "\n") + f"@strategy({kernel}, target = {target}) {{\n{body}\n}}\n"
        return text, path, full


def _ir_name(module: Any, kernel: str) -> str:
    """The IR name of ``kernel`` in ``module``, or a ValueError naming the kernels there are (a generic kernel
    is refused: the tuner takes kernels of fixed dtypes, as ``akc tune`` does)."""
    found = module.kernel_map.get(kernel) if kernel in module.names else None
    if found is None:
        raise ValueError(f"no kernel `{kernel}` in the file; it has: {', '.join(module.names) or 'none'} "
                         "(list_kernels describes them)")
    if found in module.generics:
        raise ValueError(f"`{kernel}` is generic (a kernel per dtype set): the tools take kernels with fixed dtypes; "
                         "write the specialisation you run as a kernel of its own")
    return str(found)


def _dims(module: Any, kernel: str, dims: Mapping[str, Any]) -> dict[str, int]:
    """``dims`` checked as ``akc tune`` checks them (every dim, positive integers, nothing else)."""
    from arke.tune.search import checked_dims

    if not isinstance(dims, Mapping):
        raise ValueError(f"dims is an object of dim names and positive integers, not {dims!r}")
    return checked_dims(module.semantic.get(_ir_name(module, kernel)), kernel, dims)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _spread(samples: list[float]) -> float:
    if len(samples) < 4:
        return 0.0
    q1, _, q3 = statistics.quantiles(samples, n=4)
    return (q3 - q1) / statistics.median(samples)


TOOLS = ("list_kernels", "legal_decisions", "check_strategy", "measure", "record")


def serve(db: str | None = None, log: str | None = None) -> None:
    """``akc mcp``: the tools over the Model Context Protocol on stdin/stdout (the ``mcp`` SDK)."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    agent = Agent(db, log)
    agent.check_log()
    agent.check_db()
    server = MCPServer("arke")

    def answer(result: Any) -> dict[str, Any]:
        # a tool that failed (only an error to say) is an MCP tool error (isError), which clients tell from a
        # result; a failed measurement ({"outcome": "failed", "error": ...}) is a result
        if isinstance(result, dict) and set(result) == {"error"}:
            raise ToolError(str(result["error"]))  # (the SDK's anticipated failure: its text reaches the client)
        return dict(result)

    @server.tool(description=Agent.tool_list_kernels.__doc__)
    def list_kernels(path: str) -> dict[str, Any]:
        return answer(agent.call("list_kernels", path=path))

    @server.tool(description=Agent.tool_legal_decisions.__doc__)
    def legal_decisions(path: str, kernel: str, dims: dict[str, int], target: str = "llvm") -> dict[str, Any]:
        return answer(agent.call("legal_decisions", path=path, kernel=kernel, dims=dims, target=target))

    @server.tool(description=Agent.tool_check_strategy.__doc__)
    def check_strategy(path: str, kernel: str, strategy: str, target: str = "llvm",
                       dims: dict[str, int] | None = None) -> dict[str, Any]:
        return answer(agent.call("check_strategy", path=path, kernel=kernel, strategy=strategy, target=target,
                               dims=dims))

    @server.tool(description=Agent.tool_measure.__doc__)
    def measure(path: str, kernel: str, dims: dict[str, int], strategy: str, target: str = "llvm") -> dict[str, Any]:
        return answer(agent.call("measure", path=path, kernel=kernel, dims=dims, strategy=strategy, target=target))

    @server.tool(description=Agent.tool_record.__doc__)
    def record(path: str, kernel: str, dims: dict[str, int], strategy: str, rationale: str,
               target: str = "llvm") -> dict[str, Any]:
        return answer(agent.call("record", path=path, kernel=kernel, dims=dims, strategy=strategy,
                               rationale=rationale, target=target))

    try:
        server.run("stdio")
    finally:
        agent.close()
