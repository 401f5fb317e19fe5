"""JSON for SemanticIR and StrategyIR, with a format tag and a version.

``{"format": "arke.semantic", "version": 1, "functions": [...]}`` and
``{"format": "arke.strategy", "version": 1, "strategies": [...]}``. Every record is a JSON
object whose keys are the dataclass's field names; where several node kinds may stand
(scalar expressions, ops, conditions) the object also has ``"node"`` (``"load"``,
``"map"``, ``"rel"`` …). Dims are strings in :func:`arke.ir.shapes.dim_str` form, dtypes
their spellings, and non-finite floats the strings ``"inf"``, ``"-inf"``, ``"nan"`` (the
JSON is strict: no ``NaN`` tokens). ``from_json(to_json(m)) == m`` holds exactly.
The field table below is the format: ``spec/ir.md`` shows it with examples.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from arke.ir import semantic as S
from arke.ir import shapes
from arke.ir.dtypes import DTYPES, DType
from arke.ir.scalars import decode_scalar, encode_scalar
from arke.ir.shapes import dim_str, parse_dim
from arke.ir.strategy import Decision, Strategy, StrategySet
from arke.ir.text import SEMANTIC_FORMAT, STRATEGY_FORMAT, STRATEGY_VERSION

Encode = Callable[[Any], Any]
Decode = Callable[[Any], Any]


class _At(ValueError):
    """A decoding error with the path to where it happened (``ops[2].body.a``)."""

    def __init__(self, path: list[str | int], message: str):
        self.path, self.message = path, message
        super().__init__(message)


def _inside(key: str | int, decode: Decode, x: Any) -> Any:
    try:
        return decode(x)
    except _At as err:
        raise _At([key, *err.path], err.message) from None
    except (ValueError, TypeError) as err:
        raise _At([key], str(err)) from None


class _Codec:
    """How one kind of field travels: an encoder and a decoder."""

    def __init__(self, encode: Encode, decode: Decode):
        self.encode = encode
        self.decode = decode


def _str(x: Any) -> str:
    if not isinstance(x, str):
        raise ValueError(f"expected a string, got {x!r}")
    return x


def _int(x: Any) -> int:
    if not isinstance(x, int) or isinstance(x, bool):
        raise ValueError(f"expected an integer, got {x!r}")
    return x


def _dtype(x: Any) -> DType:
    if x not in DTYPES:
        raise ValueError(f"unknown dtype {x!r}")
    return DTYPES[x]


def _optional(c: _Codec) -> _Codec:
    return _Codec(lambda v: None if v is None else c.encode(v), lambda x: None if x is None else c.decode(x))


def _tuple(c: _Codec) -> _Codec:
    def decode(x: Any) -> tuple[Any, ...]:
        if not isinstance(x, list):
            raise ValueError(f"expected a list, got {x!r}")
        return tuple(_inside(n, c.decode, i) for n, i in enumerate(x))

    return _Codec(lambda v: [c.encode(i) for i in v], decode)


STR = _Codec(lambda v: v, _str)
INT = _Codec(lambda v: v, _int)


def _bool(x: Any) -> bool:
    if not isinstance(x, bool):
        raise ValueError(f"expected true or false, got {x!r}")
    return x


BOOL = _Codec(lambda v: v, _bool)


def _dim(x: Any) -> shapes.Dim:
    try:
        return parse_dim(_str(x))
    except ValueError as err:
        raise ValueError(f"bad dim {x!r}: {err}") from None


DIM = _Codec(dim_str, _dim)
DTYPE = _Codec(lambda v: v.value, _dtype)
SCALAR = _Codec(encode_scalar, decode_scalar)
DECISION_VALUE = _Codec(lambda v: v, lambda x: x if x is None or isinstance(x, str) else _int(x))


class _Record(_Codec):
    """A dataclass as a JSON object of its fields; ``tag`` is set for union members."""

    def __init__(self, cls: type, fields: list[tuple[str, _Codec]], tag: str | None = None,
                 optional: frozenset[str] = frozenset()):
        # ``optional``: fields added after version 1 that an older document may leave out (their default)
        self.cls, self.fields, self.tag, self.optional = cls, fields, tag, optional
        super().__init__(self._encode, self._decode)

    def _encode(self, v: Any) -> dict[str, Any]:
        out: dict[str, Any] = {} if self.tag is None else {"node": self.tag}
        for name, codec in self.fields:
            out[name] = codec.encode(getattr(v, name))
        return out

    def _decode(self, x: Any) -> Any:
        if not isinstance(x, dict):
            raise ValueError(f"expected an object for {self.cls.__name__}, got {x!r}")
        expected = {name for name, _ in self.fields} | ({"node"} if self.tag else set())
        if not set(x) <= expected or expected - set(x) - self.optional:
            missing, extra = sorted(expected - set(x)), sorted(set(x) - expected)
            problems = [f"missing keys {missing}"] * bool(missing) + [f"unknown keys {extra}"] * bool(extra)
            raise ValueError(f"{self.cls.__name__} object: {', '.join(problems)}")
        return self.cls(**{name: _inside(name, codec.decode, x[name]) for name, codec in self.fields if name in x})


class _Union(_Codec):
    """One of several tagged records, chosen by ``"node"``."""

    def __init__(self, what: str):
        self.what = what
        self.by_cls: dict[type, _Record] = {}
        self.by_tag: dict[str, _Record] = {}
        super().__init__(self._encode, self._decode)

    def add(self, record: _Record) -> None:
        assert record.tag is not None
        self.by_cls[record.cls] = record
        self.by_tag[record.tag] = record

    def _encode(self, v: Any) -> Any:
        if type(v) not in self.by_cls:
            raise TypeError(f"not {self.what}: {v!r}")
        return self.by_cls[type(v)].encode(v)

    def _decode(self, x: Any) -> Any:
        tag = x.get("node") if isinstance(x, dict) else None
        if tag not in self.by_tag:
            found = f"\"node\": {tag!r}" if isinstance(x, dict) else repr(x)
            raise ValueError(f"expected {self.what} with \"node\" one of {sorted(self.by_tag)}, got {found}")
        return self.by_tag[tag].decode(x)


# ---------------------------------------------------------------- the format

COND = _Union("a condition")
COND.add(_Record(S.Rel, [("op", STR), ("lhs", DIM), ("rhs", DIM)], "rel"))
COND.add(_Record(S.InSet, [("x", DIM), ("values", _tuple(DIM))], "in"))
COND.add(_Record(S.BoolOp, [("op", STR), ("parts", _tuple(COND))], "bool"))

SEXPR = _Union("a scalar expression")
SEXPR.add(_Record(S.Const, [("value", SCALAR), ("dtype", DTYPE)], "const"))
SEXPR.add(_Record(S.Idx, [("name", STR), ("dtype", DTYPE)], "idx"))
SEXPR.add(_Record(S.DimRef, [("dim", DIM), ("dtype", DTYPE)], "dim"))
LOAD = _Record(S.Load, [("src", STR), ("indices", _tuple(SEXPR)), ("dtype", DTYPE)], "load")
SEXPR.add(LOAD)
SEXPR.add(_Record(S.Unary, [("op", STR), ("x", SEXPR), ("dtype", DTYPE)], "unary"))
SEXPR.add(_Record(S.Binary, [("op", STR), ("a", SEXPR), ("b", SEXPR), ("dtype", DTYPE)], "binary"))
SEXPR.add(_Record(S.Select, [("cond", SEXPR), ("a", SEXPR), ("b", SEXPR), ("dtype", DTYPE)], "select"))
SEXPR.add(_Record(S.Cast, [("x", SEXPR), ("dtype", DTYPE)], "cast"))

TYPE = _Record(S.TensorType, [("dtype", DTYPE), ("shape", _tuple(DIM))])
AXES = _tuple(_Record(S.Axis, [("name", STR), ("extent", DIM)]))
NAME = _optional(STR)
CALL_DIMS = _Codec(lambda v: [[k, dim_str(d)] for k, d in v], lambda x: tuple((_str(k), _dim(d)) for k, d in x))

LIMITS = _Codec(lambda v: [[k, SEXPR.encode(e)] for k, e in v],
                lambda x: tuple((_str(k), SEXPR.decode(e)) for k, e in x))

OP = _Union("an op")
OP.add(_Record(S.MapOp, [("result", STR), ("dtype", DTYPE), ("axes", AXES), ("body", SEXPR), ("name", NAME)], "map"))
OP.add(_Record(S.ReduceOp, [("result", STR), ("dtype", DTYPE), ("kind", STR), ("axes", AXES),
                            ("reduce_axes", AXES), ("body", SEXPR), ("name", NAME),
                            ("limits", LIMITS)], "reduce", optional=frozenset({"limits"})))
OP.add(_Record(S.ContractOp, [("result", STR), ("dtype", DTYPE), ("axes", AXES), ("reduce_axes", AXES),
                              ("lhs", LOAD), ("rhs", LOAD), ("name", NAME)], "contract"))
OP.add(_Record(S.ScanOp, [("result", STR), ("dtype", DTYPE), ("kind", STR), ("axes", AXES), ("axis", STR),
                          ("body", SEXPR), ("coeff", _optional(SEXPR)), ("init", _optional(SEXPR)),
                          ("exclusive", BOOL), ("name", NAME)], "scan"))
OP.add(_Record(S.CallOp, [("results", _tuple(STR)), ("types", _tuple(TYPE)), ("callee", STR),
                          ("args", _tuple(STR)), ("dims", CALL_DIMS), ("name", NAME)], "call"))

FUNCTION = _Record(S.Function, [
    ("name", STR),
    ("params", _tuple(_Record(S.Param, [("name", STR), ("type", TYPE), ("default", _optional(SCALAR))]))),
    ("bindings", _tuple(_Record(S.DimBinding, [("dim", STR), ("param", STR), ("axis", INT)]))),
    ("guards", _tuple(_Record(S.Guard, [("cond", COND), ("text", STR)]))),
    ("ops", _tuple(OP)),
    ("results", _tuple(STR)),
    ("result_types", _tuple(TYPE)),
    ("output_names", _tuple(NAME)),
    ("specialisation", _Codec(lambda v: [[k, d.value] for k, d in v],
                              lambda x: tuple((_str(k), _dtype(d)) for k, d in x))),
])

STRATEGY = _Record(Strategy, [
    ("kernel", STR), ("target", NAME), ("when", _optional(COND)),
    ("decisions", _tuple(_Record(Decision, [("kind", STR), ("subject", NAME), ("value", DECISION_VALUE)]))),
])


# ---------------------------------------------------------------- entry points


def to_json(m: S.Module, indent: int | None = None) -> str:
    """A module as ``{"format": "arke.semantic", "version": 1, "functions": [...]}``."""
    doc = {"format": SEMANTIC_FORMAT, "version": m.version, "functions": [FUNCTION.encode(f) for f in m.functions]}
    return json.dumps(doc, indent=indent, allow_nan=False, ensure_ascii=False)


def from_json(text: str) -> S.Module:
    """Read :func:`to_json`'s output; a wrong format, version or shape raises ``ValueError``."""
    doc = _open(text, SEMANTIC_FORMAT, S.FORMAT_VERSION, "functions")
    return S.Module(_decode(_tuple(FUNCTION), doc["functions"], SEMANTIC_FORMAT, "functions"), S.FORMAT_VERSION)


def strategies_to_json(s: StrategySet, indent: int | None = None) -> str:
    """A strategy set as ``{"format": "arke.strategy", "version": 1, "strategies": [...]}``."""
    doc = {"format": STRATEGY_FORMAT, "version": STRATEGY_VERSION,
           "strategies": [STRATEGY.encode(x) for x in s.strategies]}
    return json.dumps(doc, indent=indent, allow_nan=False, ensure_ascii=False)


def strategies_from_json(text: str) -> StrategySet:
    """Read :func:`strategies_to_json`'s output; a wrong format, version or shape raises ``ValueError``."""
    doc = _open(text, STRATEGY_FORMAT, STRATEGY_VERSION, "strategies")
    return StrategySet(_decode(_tuple(STRATEGY), doc["strategies"], STRATEGY_FORMAT, "strategies"))


def _open(text: str, fmt: str, version: int, body: str) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"not {fmt} JSON: {err}") from None
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise ValueError(f"not {fmt} JSON: its \"format\" is {found!r}, expected {fmt!r}")
    if type(doc.get("version")) is not int or doc["version"] != version:
        raise ValueError(f"{fmt} JSON version {doc.get('version')!r} is not supported (this build reads "
                         f"version {version})")
    if set(doc) != {"format", "version", body}:
        raise ValueError(f"{fmt} JSON has keys {sorted(doc)}, expected ['format', 'version', {body!r}]")
    return doc


def _decode(codec: _Codec, x: Any, fmt: str, key: str) -> Any:
    try:
        return _inside(key, codec.decode, x)
    except _At as err:
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.path).lstrip(".")
        raise ValueError(f"malformed {fmt} JSON at {path}: {err.message}") from None
