"""The tuner's tools for agents (arke.tune.agent): in process, and over the Model Context Protocol from a
scripted client talking to ``akc mcp`` on stdio (no LLM involved)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from arke.tune import db as tdb
from arke.tune.agent import TOOLS, Agent

SOURCE = "kernel mm(a: f32[M, K], b: f32[K, N]) -> f32[M, N] {\n  return sum(a[m, k] * b[k, n] for k)\n}\n"
DIMS = {"M": 40, "N": 48, "K": 24}


@pytest.fixture()
def program(tmp_path: Path) -> str:
    path = tmp_path / "mm.ak"
    path.write_text(SOURCE, encoding="utf-8")
    return str(path)


def test_tools_in_process(program: str, tmp_path: Path) -> None:
    url, log = f"sqlite:///{tmp_path / 't.db'}", tmp_path / "trajectory.jsonl"
    agent = Agent(url, str(log))
    try:
        kernels = agent.call("list_kernels", path=program)
        assert kernels["kernels"][0]["kernel"] == "mm" and kernels["kernels"][0]["dispatches"] == ["contraction"]
        legal = agent.call("legal_decisions", path=program, kernel="mm", dims=DIMS)
        assert any(d["decision"] == "tile" and d["subject"] == "m" for d in legal["decisions"])
        bad = agent.call("check_strategy", path=program, kernel="mm", strategy="tile q = 4")
        assert not bad["ok"] and bad["diagnostics"][0]["code"].startswith("AK4")
        dropped = agent.call("check_strategy", path=program, kernel="mm", strategy="warps = 4")
        assert not dropped["ok"]
        zero = agent.call("check_strategy", path=program, kernel="mm", strategy="tile m = 4", dims={**DIMS, "M": 0})
        assert "error" in zero and "positive" in zero["error"], zero  # as measure refuses them, never "ok"
        assert agent.call("record", path=program, kernel="mm", dims=DIMS, strategy="tile m = 4",
                          rationale="untested")["error"].startswith("measure this strategy")
        measured = agent.call("measure", path=program, kernel="mm", dims=DIMS, strategy="tile m = 4")
        assert measured["outcome"] == "ok" and measured["candidate_s"] > 0 and measured["defaults_s"] > 0
        rec = agent.call("record", path=program, kernel="mm", dims=DIMS, strategy="tile m = 4",
                         rationale="fewer rows, fewer spills")
        assert rec["recorded"]
        assert agent.call("nonsense")["error"] == "no tool `nonsense`"
        assert agent.call("measure", path=str(tmp_path / "missing.ak"), kernel="mm", dims=DIMS,
                          strategy="tile m = 4")["error"]
    finally:
        agent.close()
    import arke

    module = arke.loads(SOURCE)
    records = tdb.Database(url).records(tdb.Key.make(module.semantic, "mm", "llvm", DIMS))
    assert records and records[0].note == "agent: fewer rows, fewer spills"
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [entry["tool"] for entry in lines][:3] == ["list_kernels", "legal_decisions", "check_strategy"]
    assert len(lines) == 10  # every call, the failed ones included


def _result(call: Any) -> dict[str, Any]:
    structured = getattr(call, "structured_content", None) or getattr(call, "structuredContent", None)
    if structured:
        return dict(structured.get("result", structured)) if "result" in structured and len(structured) == 1 \
            else dict(structured)
    return dict(json.loads(call.content[0].text))


def test_mcp_over_stdio(program: str, tmp_path: Path) -> None:
    """A scripted MCP client starts ``akc mcp`` and drives every tool."""
    mcp = pytest.importorskip("mcp")
    from mcp.client.stdio import StdioServerParameters

    url, log = f"sqlite:///{tmp_path / 't.db'}", tmp_path / "trajectory.jsonl"
    params = StdioServerParameters(command=sys.executable, args=["-m", "arke", "mcp", "--db", url, "--log", str(log)],
                                   env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})

    async def script() -> None:
        async with mcp.Client(params) as client:
            tools = await client.list_tools()
            assert set(TOOLS) <= {t.name for t in tools.tools}
            kernels = _result(await client.call_tool("list_kernels", {"path": program}))
            assert kernels["kernels"][0]["kernel"] == "mm"
            checked = _result(await client.call_tool("check_strategy", {"path": program, "kernel": "mm",
                                                                        "strategy": "tile m = 6"}))
            assert checked["ok"]
            measured = _result(await client.call_tool("measure", {"path": program, "kernel": "mm", "dims": DIMS,
                                                                  "strategy": "tile m = 6"}))
            assert measured["outcome"] == "ok"
            recorded = _result(await client.call_tool("record", {"path": program, "kernel": "mm", "dims": DIMS,
                                                                 "strategy": "tile m = 6", "rationale": "scripted"}))
            assert recorded["recorded"]
            failed = await client.call_tool("list_kernels", {"path": str(tmp_path / "missing.ak")})
            assert failed.is_error and "missing.ak" in failed.content[0].text  # a tool error, as MCP says one

    asyncio.run(script())
    assert [json.loads(line)["tool"] for line in log.read_text().splitlines()] == [
        "list_kernels", "check_strategy", "measure", "record", "list_kernels"]


def test_a_database_that_cannot_be_used_is_said_before_serving(tmp_path: Path) -> None:
    from arke.tune.agent import Agent

    text = tmp_path / "notes.db"
    text.write_text("not a database\n")
    agent = Agent(str(text), str(tmp_path / "log.jsonl"))
    try:
        with pytest.raises(ValueError, match=r"file is not a database.*--db"):
            agent.check_db()
    finally:
        agent.close()
    assert text.read_text() == "not a database\n"
