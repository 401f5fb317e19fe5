"""The VS Code files: the manifest is consistent, and the TextMate grammar highlights real programs right.

The grammar's regexes are kept to what Python's ``re`` and Oniguruma both read, so a small
TextMate engine here (first match wins, ``begin``/``end`` rules on a stack, captures,
includes) can run it over the examples, the standard library and the spec's programs.
The parser's lexer and AST say what each token is, and the test checks its scope.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from arke.ir.dtypes import DTYPES
from arke.lang import ast
from arke.lang.exprs import BUILTINS, REDUCTIONS
from arke.lang.lark_parser import _lark
from arke.lang.parser import parse
from arke.lsp.words import KEYWORDS

ROOT = Path(__file__).resolve().parents[2]
VSCODE = ROOT / "editors" / "vscode"
GRAMMAR = json.loads((VSCODE / "syntaxes" / "arke.tmLanguage.json").read_text(encoding="utf-8"))


# ---------------------------------------------------------------- a small TextMate engine


@dataclass
class Rule:
    raw: dict[str, Any]

    @property
    def patterns(self) -> list[dict[str, Any]]:
        return _flatten(self.raw.get("patterns", []))


def _flatten(patterns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for p in patterns:
        if "include" in p:
            assert p["include"].startswith("#"), p
            target = GRAMMAR["repository"][p["include"][1:]]
            out += _flatten(target["patterns"]) if "match" not in target and "begin" not in target else [target]
        elif "match" in p or "begin" in p:
            out.append(p)
        else:
            out += _flatten(p.get("patterns", []))
    return out


def _paint(scopes: list[str | None], m: re.Match[str], name: str | None, captures: dict[str, Any]) -> None:
    if name:
        for k in range(m.start(), m.end()):
            scopes[k] = name
    for group, spec in captures.items():
        if m.group(int(group)) is not None:
            for k in range(m.start(int(group)), m.end(int(group))):
                scopes[k] = spec["name"]


def tokenize(text: str) -> list[list[str | None]]:
    """For each line, the innermost scope name of each character (None where nothing matched)."""
    stack: list[Rule] = [Rule(GRAMMAR)]
    out = []
    for line in text.split("\n"):
        scopes: list[str | None] = [None] * len(line)
        pos = 0
        while pos <= len(line):
            top = stack[-1]
            best: tuple[int, int, str, dict[str, Any] | None, re.Match[str]] | None = None
            if len(stack) > 1:
                m = re.compile(top.raw["end"]).search(line, pos)
                if m:
                    best = (m.start(), 0, "end", None, m)
            for order, p in enumerate(top.patterns, start=1):
                m = re.compile(p.get("match") or p["begin"]).search(line, pos)
                if m and (best is None or m.start() < best[0]):
                    best = (m.start(), order, "begin" if "begin" in p else "match", p, m)
            if best is None:
                break
            _, _, kind, rule, m = best
            if kind == "end":
                _paint(scopes, m, None, top.raw.get("endCaptures", {}))
                stack.pop()
            elif kind == "begin":
                assert rule is not None
                _paint(scopes, m, rule.get("name"), rule.get("beginCaptures", {}))
                stack.append(Rule(rule))
            else:
                assert rule is not None
                _paint(scopes, m, rule.get("name"), rule.get("captures", {}))
            pos = m.end() if m.end() > pos or kind != "match" else pos + 1
        out.append(scopes)
    return out


# ---------------------------------------------------------------- programs to run it on


def _spec_programs() -> list[tuple[str, str]]:
    text = (ROOT / "spec" / "language.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```ak\n(.*?)```", text, re.S)
    return [(f"spec block {k}", b) for k, b in enumerate(blocks) if "# error:" not in b]


PROGRAMS = [(str(p.relative_to(ROOT)), p.read_text(encoding="utf-8"))
            for p in sorted([*(ROOT / "examples").glob("*.ak"), *(ROOT / "arke" / "stdlib").glob("*.ak")])]
PROGRAMS += _spec_programs()


def _scope_at(scopes: list[list[str | None]], text: str, offset: int) -> str:
    line = text.count("\n", 0, offset)
    col = offset - (text.rfind("\n", 0, offset) + 1)
    return scopes[line][col] or ""


def _spans(module: ast.Module) -> dict[int, str]:
    """Expected scopes at AST positions: kernel names, decisions, built-in calls, reductions."""
    want: dict[int, str] = {}
    for k in module.kernels:
        want[k.name_span.start] = "entity.name.function"

        def walk(e: ast.Expr) -> None:
            if isinstance(e, ast.Call) and e.func in BUILTINS and e.func not in DTYPES:
                # `max(a, b)` and `max(e for i)` look alike to a regex: both are support functions
                want[e.func_span.start] = "support.function" + ("" if e.func in REDUCTIONS else ".builtin")
            if isinstance(e, ast.Reduce) and e.op in REDUCTIONS:
                want[e.op_span.start] = "support.function.reduction"
            for v in vars(e).values():
                for x in v if isinstance(v, tuple) else (v,):
                    if isinstance(x, ast.Expr):
                        walk(x)

        for st in k.body:
            for v in vars(st).values():
                for x in v if isinstance(v, tuple) else (v,):
                    if isinstance(x, ast.Expr):
                        walk(x)
    for s in module.strategies:
        for d in s.decisions:
            want[d.name_span.start] = "keyword.other.decision"
    return want


@pytest.mark.parametrize("name, text", PROGRAMS, ids=[n for n, _ in PROGRAMS])
def test_grammar_scopes_every_token(name: str, text: str) -> None:
    scopes = tokenize(text)
    module, diags = parse(text, name)
    assert not [d for d in diags if d.code.startswith("AK1")], name
    special = _spans(module)
    for offset, want in special.items():
        assert _scope_at(scopes, text, offset).startswith(want), (name, text[offset:offset + 20], want)
    tokens = list(_lark().lex(text, dont_ignore=True))
    checked = 0
    for tok in tokens:
        if not str(tok).strip():
            continue  # white space
        start = tok.start_pos or 0
        got = _scope_at(scopes, text, start)
        word = str(tok)
        if tok.type == "COMMENT":
            want = "comment.line"
        elif tok.type in ("INT", "FLOAT"):
            want = "constant.numeric"
        elif word in KEYWORDS and tok.type != "NAME":
            want = "keyword"
        elif tok.type == "NAME" and word in DTYPES:
            want = "storage.type.dtype"
        elif word == "@" and text[tok.end_pos or 0:].startswith("strategy"):
            want = "punctuation.definition.annotation"
        elif tok.type == "NAME" and word in ("true", "false", "inf"):
            want = "constant.language"
        elif tok.type == "NAME":
            # Any other name is no keyword: `tile` or `target` used as a tensor stays plain.
            assert not got.startswith("keyword") or start in special, (name, word, got)
            continue
        else:
            continue
        assert got.startswith(want), (name, text.count("\n", 0, start) + 1, word, got, want)
        checked += 1
    assert checked > 0


def test_plain_names_that_look_like_words_stay_plain() -> None:
    text = "kernel f(tile: f32[N], target: f32[N]) -> f32[N] {\n  warps[i] = tile[i] + target[i]\n  return warps\n}\n"
    scopes = tokenize(text)
    for word in ("tile[i]", "target[i]", "warps[i]"):
        assert _scope_at(scopes, text, text.index(word)) == ""
    strategy = "@strategy(f, target = llvm, when N in {1, 2}) {\n  tile i = 16; vectorize i = 8\n}\nkernel g"
    scopes = tokenize(strategy)
    assert _scope_at(scopes, strategy, strategy.index("llvm")) == "constant.language.target.arke"
    assert _scope_at(scopes, strategy, strategy.index("tile")) == "keyword.other.decision.arke"
    assert _scope_at(scopes, strategy, strategy.index("vectorize")) == "keyword.other.decision.arke"
    assert _scope_at(scopes, strategy, strategy.index("kernel g")) == "keyword.other.kernel.arke"


def test_every_regex_compiles_in_python() -> None:
    def regexes(node: Any) -> list[str]:
        if isinstance(node, dict):
            found = [node[k] for k in ("match", "begin", "end") if isinstance(node.get(k), str)]
            return found + [r for v in node.values() for r in regexes(v)]
        if isinstance(node, list):
            return [r for v in node for r in regexes(v)]
        return []

    found = regexes(GRAMMAR)
    assert len(found) > 20
    for r in found:
        re.compile(r)


def test_manifest_wires_the_language_grammar_and_server() -> None:
    manifest = json.loads((VSCODE / "package.json").read_text(encoding="utf-8"))
    (language,) = manifest["contributes"]["languages"]
    assert language["extensions"] == [".ak"]
    (grammar,) = manifest["contributes"]["grammars"]
    assert grammar["language"] == language["id"] and grammar["scopeName"] == GRAMMAR["scopeName"]
    assert (VSCODE / grammar["path"]).is_file() and (VSCODE / language["configuration"]).is_file()
    config = json.loads((VSCODE / language["configuration"]).read_text(encoding="utf-8"))
    assert config["comments"]["lineComment"] == "#"
    assert manifest["contributes"]["configuration"]["properties"]["arke.server.command"]["default"] == ["akc", "lsp"]
    main = (VSCODE / manifest["main"]).read_text(encoding="utf-8")
    assert "vscode-languageclient/node" in main and "TransportKind.stdio" in main
