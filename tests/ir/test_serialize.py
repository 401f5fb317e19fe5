"""JSON for both IRs: exact round trips, strict JSON, and clear errors for wrong input."""

from __future__ import annotations

import json
import math

import gen
import pytest
from hypothesis import HealthCheck, given, settings

from arke.ir import semantic as S
from arke.ir import shapes
from arke.ir.dtypes import DType
from arke.ir.serialize import from_json, strategies_from_json, strategies_to_json, to_json
from arke.ir.strategy import Decision, Strategy, StrategySet

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _strict(text: str) -> object:
    """json.loads that refuses NaN / Infinity tokens, as other JSON readers do."""
    def refuse(token: str) -> object:
        raise AssertionError(f"non-standard JSON token {token}")

    return json.loads(text, parse_constant=refuse)


@PROPERTY
@given(gen.modules())
def test_module_round_trip(m: S.Module) -> None:
    text = to_json(m)
    _strict(text)
    assert from_json(text) == m


@PROPERTY
@given(gen.modules(max_functions=2).flatmap(gen.strategy_sets))
def test_strategies_round_trip(s: StrategySet) -> None:
    text = strategies_to_json(s, indent=2)
    _strict(text)
    assert strategies_from_json(text) == s


def test_document_shape() -> None:
    doc = json.loads(to_json(gen.rmsnorm_module()))
    assert (doc["format"], doc["version"]) == ("arke.semantic", 1)
    rmsnorm = doc["functions"][0]
    assert rmsnorm["params"][0] == {"name": "x", "type": {"dtype": "f32", "shape": ["M", "N"]}, "default": None}
    assert rmsnorm["guards"] == [{"cond": {"node": "rel", "op": "==", "lhs": "N % 2", "rhs": "0"},
                                  "text": "N % 2 == 0"}]
    assert rmsnorm["ops"][0]["node"] == "reduce"
    assert rmsnorm["ops"][0]["body"]["a"] == {"node": "load", "src": "x", "dtype": "f32", "indices": [
        {"node": "idx", "name": "m", "dtype": "i64"}, {"node": "idx", "name": "n", "dtype": "i64"}]}
    call = doc["functions"][1]["ops"][0]
    assert call["node"] == "call" and call["dims"] == [["M", "M"], ["N", "K"]]


def test_scalars_keep_their_python_type() -> None:
    values = [True, 3, 3.0, -0.0, math.inf, -math.inf, 2**80]
    body = tuple(S.Const(v, DType.F32) for v in values)
    f = S.Function("f", tuple(S.Param(f"p{i}", S.TensorType(DType.F32), c.value) for i, c in enumerate(body)),
                   (), (), (), (), ())
    back = from_json(to_json(S.Module((f,))))
    got = [p.default for p in back.functions[0].params]
    assert [(type(v), repr(v)) for v in got] == [(type(v), repr(v)) for v in values]


def test_nan_is_a_string_in_json() -> None:
    f = S.Function("f", (S.Param("p", S.TensorType(DType.F32), math.nan),), (), (), (), (), ())
    text = to_json(S.Module((f,)))
    assert '"default": "nan"' in text
    assert from_json(text).functions[0].params[0].default is math.nan


def test_strategy_document_shape() -> None:
    s = StrategySet((Strategy("k", None, S.InSet(shapes.sym("D"), (shapes.const(64),)),
                              (Decision("tile", "i", 128), Decision("algorithm", None, "flash"))),))
    doc = json.loads(strategies_to_json(s))
    assert doc == {"format": "arke.strategy", "version": 1, "strategies": [{
        "kernel": "k", "target": None, "when": {"node": "in", "x": "D", "values": ["64"]},
        "decisions": [{"kind": "tile", "subject": "i", "value": 128},
                      {"kind": "algorithm", "subject": None, "value": "flash"}]}]}


GOOD = json.loads(to_json(gen.rmsnorm_module()))


def _with(path: list[str | int], value: object) -> str:
    doc = json.loads(json.dumps(GOOD))
    node = doc
    for key in path[:-1]:
        node = node[key]
    if value is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return json.dumps(doc)


_DELETE = object()

BAD_JSON = [
    ("{", "not arke.semantic JSON"),
    ("[]", "its \"format\" is 'list'"),
    (_with(["format"], "arke.strategy"), "its \"format\" is 'arke.strategy', expected 'arke.semantic'"),
    (_with(["version"], 2), "version 2 is not supported"),
    (_with(["version"], True), "version True is not supported"),
    (_with(["extra"], 1), "expected ['format', 'version', 'functions']"),
    (_with(["functions", 0, "ops", 0, "node"], "loop"),
     "\"node\" one of ['call', 'contract', 'map', 'reduce', 'scan']"),
    (_with(["functions", 0, "ops", 0, "dtype"], "f64"), "unknown dtype 'f64'"),
    (_with(["functions", 0, "ops", 0, "axes", 0, "extent"], "M +"),
     "at functions[0].ops[0].axes[0].extent: bad dim 'M +'"),
    (_with(["functions", 0, "params", 0, "name"], _DELETE), "Param object: missing keys ['name']"),
    (_with(["functions", 0, "params", 0, "colour"], "red"), "unknown keys ['colour']"),
    (_with(["functions", 0, "params", 2, "default"], "one"), "expected a number"),
    (_with(["functions", 0, "bindings", 0, "axis"], "0"), "expected an integer"),
    (_with(["functions", 0, "results"], "2"), "expected a list"),
]


@pytest.mark.parametrize(("text", "message"), BAD_JSON)
def test_bad_json_gives_a_clear_error(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        from_json(text)
    assert message in str(info.value)


def test_bad_strategy_json() -> None:
    with pytest.raises(ValueError, match=r"not arke\.strategy JSON"):
        strategies_from_json(to_json(gen.rmsnorm_module()))
    with pytest.raises(ValueError, match="version 0 is not supported"):
        strategies_from_json('{"format": "arke.strategy", "version": 0, "strategies": []}')
    with pytest.raises(ValueError, match="expected an integer"):
        strategies_from_json('{"format": "arke.strategy", "version": 1, "strategies": [{"kernel": "k", '
                             '"target": null, "when": null, "decisions": [{"kind": "tile", "subject": "i", '
                             '"value": 1.5}]}]}')
