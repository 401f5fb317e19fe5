"""The tuner on input it once mishandled: the defaults measured as the target's own (never a stored choice),
a read-only database left where it is, dims keyed as builds key them, the agent's tools refusing generic
kernels and bad dims and placing diagnostics in the agent's own text, a log it cannot write, bad timeouts
and seeds, `--write` updating its own block, and records that cannot be used."""

from __future__ import annotations

import sqlite3
import warnings
from pathlib import Path
from typing import Any

import pytest

import arke
from arke.ir import strategy as sir
from arke.tune import db as tdb
from arke.tune.agent import Agent
from arke.tune.search import checked_dims

GROUPS = "kernel gsum(x: f32[B, C, L], G: dim = 4) -> f32[B, G] where C % G == 0 {\n" \
         "  let cg = C / G\n  xg[n, g, c, l]: f32[B, G, cg, L] = x[n, g * cg + c, l]\n" \
         "  return sum(xg[n, g, c, l] for c, l)\n}\n" \
         "kernel ema(x: f32[M, N], alpha: f32 = 0.5) -> f32[M, N] { return x[m, n] * alpha }\n"
GENERIC = "kernel lin(x: W[M, K], w: W[N, K]) -> f32[M, N] where W in {f32, bf16} {\n" \
          "  return sum(f32(x[m, k]) * f32(w[n, k]) for k)\n}\n"


def test_the_defaults_are_measured_without_the_database(monkeypatch: pytest.MonkeyPatch) -> None:
    from arke.tune import worker

    seen: list[Any] = []
    real = arke.build

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("tuning"))
        return real(*args, **kwargs)

    monkeypatch.setattr(arke, "build", spy)
    reply = worker.measure({"source": GROUPS, "kernel": "ema", "target": "llvm", "dims": {"M": 3, "N": 5},
                            "strategy": "", "samples": 1})
    assert reply["status"] == "ok" and seen == ["off"]


def test_a_read_only_database_is_an_error_and_stays(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "user.db"
    with sqlite3.connect(path) as c:
        c.execute("create table notes(x)")
        c.execute("insert into notes values ('precious')")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(tdb.TuningDatabaseError, match="cannot be written"):
        tdb.Database(f"sqlite:///file:{path}?mode=ro&uri=true").count()
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["user.db"]
    with sqlite3.connect(path) as c:
        assert c.execute("select x from notes").fetchall() == [("precious",)]


def test_a_file_that_cannot_be_written_is_said_before_a_measurement(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """An immutable file or a read-only mount passed the opening (SQLite finds it at the first write): the
    tuner measured the defaults and lost them, and the agent's check passed. The file's and its folder's
    writability is asked of the OS as a writer opens (root passes a chmod, so the OS's answer is faked here)."""
    import os

    path = tmp_path / "t.db"
    tdb.Database(str(path)).count()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if str(p) == str(path) else real(p, mode))
    with pytest.raises(tdb.TuningDatabaseError, match=r"cannot be written .* is read-only.*nothing was measured"):
        tdb.Database(str(path)).count()
    with pytest.raises(ValueError, match="cannot be written"):
        Agent(str(path), str(tmp_path / "log.jsonl")).check_db()


def test_a_kernel_of_scalars_alone_is_measured() -> None:
    """Its result is a NumPy value: the worker's poisoned out= assumed a torch tensor ("the defaults did not
    run")."""
    from arke.tune import worker

    reply = worker.measure({"source": "kernel s0(x: f32) -> f32 { return x * 2.0 }\n", "kernel": "s0",
                            "target": "llvm", "dims": {}, "strategy": "", "samples": 1})
    assert reply["status"] == "ok", reply


def test_dims_are_keyed_as_a_build_keys_them() -> None:
    fn = arke.loads(GROUPS).semantic.get("gsum")
    assert checked_dims(fn, "gsum", {"B": 2, "C": 8, "L": 4}) == {"G": 4, "B": 2, "C": 8, "L": 4}
    ema = arke.loads(GROUPS).semantic.get("ema")
    with pytest.raises(ValueError, match="has no dim alpha"):
        checked_dims(ema, "ema", {"M": 4, "N": 5, "alpha": 3})
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="positive whole numbers"):
            checked_dims(ema, "ema", {"M": bad, "N": 5})


def test_the_agent_refuses_generic_kernels_and_bad_dims(tmp_path: Path) -> None:
    path = tmp_path / "k.ak"
    path.write_text(GROUPS + GENERIC, encoding="utf-8")
    agent = Agent(str(tmp_path / "t.db"), str(tmp_path / "log.jsonl"))
    try:
        for tool in ("legal_decisions", "measure"):
            args: dict[str, Any] = {"path": str(path), "kernel": "lin", "dims": {"M": 4, "N": 4, "K": 4}}
            if tool == "measure":
                args["strategy"] = "parallel m"
            assert "is generic" in agent.call(tool, **args)["error"]
        bad = agent.call("legal_decisions", path=str(path), kernel="ema", dims={"M": 4, "N": -1})
        assert "positive whole numbers" in bad["error"]
        stray = agent.call("measure", path=str(path), kernel="ema", dims={"M": 4, "N": 4, "Q": 2}, strategy="")
        assert "has no dim Q" in stray["error"]
        where = agent.call("check_strategy", path=str(path), kernel="ema", strategy="parallel m\n\n    tile q = 4")
        assert (where["diagnostics"][0]["line"], where["diagnostics"][0]["column"]) == (3, 10)
    finally:
        agent.close()


def test_a_log_that_cannot_be_written(tmp_path: Path) -> None:
    agent = Agent(str(tmp_path / "t.db"), str(tmp_path))  # a folder
    try:
        with pytest.raises(ValueError, match="cannot be written"):
            agent.check_log()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert agent.call("list_kernels", path=str(tmp_path / "none.ak"))["error"]
        assert any("trajectory log" in str(w.message) for w in caught)
    finally:
        agent.close()


@pytest.mark.parametrize(("option", "value", "says"), [("timeout_s", float("inf"), "timeout"),
                                                        ("timeout_s", float("nan"), "timeout"),
                                                        ("timeout_s", -1.0, "timeout"), ("seed", -1, "seed")])
def test_bad_timeouts_and_seeds_are_refused_before_measuring(option: str, value: Any, says: str,
                                                             tmp_path: Path) -> None:
    from arke.tune import tune

    with pytest.raises(ValueError, match=says):
        tune(GROUPS, "ema", {"M": 4, "N": 4}, budget=1, db=str(tmp_path / "t.db"), **{option: value})
    assert not (tmp_path / "t.db").exists()


def test_writing_again_replaces_the_block_of_the_same_condition(tmp_path: Path) -> None:
    from arke.cli.tune import _replaced

    before = GROUPS + "\n# akc tune: 2.00x\n@strategy(ema, target = llvm, when M > 2) {\n  parallel m\n}\n# after\n"
    block = "# akc tune: 3.00x\n@strategy(ema, target = llvm, when M > 2) {\n  threads = 1\n}\n"
    text = _replaced(before, block, "ema", "llvm")
    assert "parallel m" not in text and "2.00x" not in text
    assert text.endswith(block + "# after\n") and arke.loads(text).strategies.for_kernel("ema", "llvm")
    assert _replaced(GROUPS, block, "ema", "llvm") == GROUPS + "\n" + block  # none yet: appended


@pytest.mark.parametrize("closing", ["}  # reviewed by alice", "  threads = 2 }", "  }"])
def test_rewriting_a_block_keeps_everything_after_its_own_brace(closing: str) -> None:
    """The block's end is the parser's, not the next line that is a bare `}`: a comment after the brace, a
    decision on the brace's line or an indented brace once made the rewrite delete the kernels after it."""
    from arke.cli.tune import _replaced

    body = "  parallel m\n" if closing.startswith("}") or closing == "  }" else ""
    before = GROUPS + f"\n@strategy(ema, target = llvm, when M > 2) {{\n{body}{closing}\n\n" \
        "kernel important(x: f32[N]) -> f32[N] {\n  return x[n] * 2.0\n}\n"
    block = "@strategy(ema, target = llvm, when M > 2) {\n  threads = 1\n}\n"
    text = _replaced(before, block, "ema", "llvm")
    assert "kernel important" in text and text.count("@strategy") == 1 and "threads = 1" in text
    assert set(arke.loads(text).kernels) >= {"ema", "gsum", "important"}


def test_a_new_block_goes_before_the_kernels_other_strategies() -> None:
    """Strategies apply in order: after one without `when`, a tuned `when` block would never apply."""
    from arke.cli.tune import _replaced

    before = GROUPS + "\n@strategy(ema, target = llvm) {\n  threads = 2\n}\n"
    block = "@strategy(ema, target = llvm, when M > 2) {\n  threads = 1\n}\n"
    text = _replaced(before, block, "ema", "llvm")
    assert text.index("when M > 2") < text.index("threads = 2")
    assert not [d for d in arke.check(text) if d.code == "AK4016"]
    crlf = _replaced(before.replace("\n", "\r\n"), block.replace("\n", "\r\n"), "ema", "llvm")
    assert "\n" not in crlf.replace("\r\n", "")  # a CRLF file stays CRLF


def test_records_that_cannot_be_used_run_the_defaults(tmp_path: Path) -> None:
    from arke.tune.lookup import _usable

    module = arke.loads(GROUPS).semantic
    twice = sir.Strategy("ema", "llvm", None, (sir.Decision("threads", None, 1), sir.Decision("threads", None, 2)))
    huge = sir.Strategy("ema", "llvm", None, (sir.Decision("threads", None, 2**70),))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _usable(twice, module, "sqlite:///x") is None and _usable(huge, module, "sqlite:///x") is None
    assert any("given twice" in str(w.message) for w in caught)


def test_a_row_too_deep_to_read_is_skipped(tmp_path: Path) -> None:
    url = str(tmp_path / "t.db")
    database = tdb.Database(url)
    key = tdb.Key.make(arke.loads(GROUPS).semantic, "ema", "llvm", {"M": 4, "N": 4})
    database.add(tdb.Record(key, {"M": 4, "N": 4}, None, "ok", (1e-3,), "", "ema"))
    with sqlite3.connect(tmp_path / "t.db") as c:
        c.execute("update arke_tuning set samples = ?", ("[" * 100000 + "]" * 100000,))
    assert tdb.Database(url).records(key) == []
