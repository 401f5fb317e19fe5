"""Read the IR text form back into SemanticIR and StrategyIR (grammar: ``arke/grammar/ir.lark``).

The reader is the inverse of the printer in ``arke.ir.text``: a node's dtype is the one
written after it (``: f16``) or else the one its form implies (:func:`~arke.ir.text.implied_dtype`),
dims are read by :func:`arke.ir.shapes.parse_dim` from their source text, and ``nan`` reads
as :data:`math.nan` (the same object every time, so equal IR compares equal). Bad input
raises :class:`IRSyntaxError` with a line and column; the reader never evaluates text.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from functools import lru_cache
from importlib import resources
from typing import Any, NoReturn

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from arke.ir import semantic as S
from arke.ir.dtypes import DTYPES, DType
from arke.ir.shapes import Dim, parse_dim
from arke.ir.strategy import Decision, Strategy, StrategySet
from arke.ir.text import SEMANTIC_FORMAT, STRATEGY_FORMAT, STRATEGY_VERSION, cond_text, implied_dtype


class IRSyntaxError(ValueError):
    """IR text that cannot be read; ``line`` and ``column`` (1-based) say where, when known."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None):
        self.message = message
        self.line = line
        self.column = column
        super().__init__(f"line {line}, column {column}: {message}" if line is not None else message)


@lru_cache(maxsize=1)
def _lark() -> Lark:
    grammar = resources.files("arke.grammar").joinpath("ir.lark").read_text(encoding="utf-8")
    return Lark(grammar, parser="lalr", start=["module", "strategies"], propagate_positions=True,
                maybe_placeholders=True, cache=True)


def read_module(text: str) -> S.Module:
    """Read a module printed by :func:`arke.ir.text.print_module`."""
    tree = _parse(text, "module", SEMANTIC_FORMAT)
    return _Reader(text).module(tree)


def read_strategies(text: str) -> StrategySet:
    """Read a strategy set printed by :func:`arke.ir.text.print_strategies`."""
    tree = _parse(text, "strategies", STRATEGY_FORMAT)
    return _Reader(text).strategies(tree)


# ---------------------------------------------------------------- parsing and syntax errors

_LEADING = re.compile(r"(?:\s|#[^\n]*)*")
_COMMENT = re.compile(r"#[^\n]*")


def _parse(text: str, start: str, tag: str) -> Tree:
    head = text[_LEADING.match(text).end():]  # type: ignore[union-attr]  # the pattern matches ""
    if not head.startswith(tag):
        found = head.split(None, 1)[0] if head.strip() else "nothing"
        raise IRSyntaxError(f"this is not {tag} text: it must start with `{tag} <version>`, found {found!r}")
    try:
        return _lark().parse(text, start=start)
    except UnexpectedInput as err:
        raise _syntax_error(err) from None


def _syntax_error(err: UnexpectedInput) -> IRSyntaxError:
    if isinstance(err, UnexpectedCharacters):
        return IRSyntaxError(f"unexpected character {err.char!r}", err.line, err.column)
    if isinstance(err, UnexpectedEOF):
        return IRSyntaxError(f"unexpected end of text: expected {_expected(err.expected)}")
    assert isinstance(err, UnexpectedToken)
    tok = err.token
    what = "end of text" if tok.type == "$END" else repr(str(tok))
    return IRSyntaxError(f"unexpected {what}: expected {_expected(err.accepts or err.expected)}", err.line, err.column)


def _expected(names: Any) -> str:
    words = set()
    for name in names:
        try:
            pattern = _lark().get_terminal(name).pattern
        except KeyError:
            words.add(name)
            continue
        words.add(repr(pattern.value) if pattern.type == "str" else name.lower().replace("_", " "))
    return ", ".join(sorted(words)) or "nothing more"


# ---------------------------------------------------------------- tree -> IR


def _kids(t: Tree) -> list[Any]:
    """A node's children: trees, tokens, and None for an optional part left out."""
    return t.children


def _items(t: Tree | None) -> list[Any]:
    """The children of a list rule, without the placeholders of empty optional parts."""
    return [] if t is None else [c for c in t.children if c is not None]


class _Absent:
    """An output written without ``as`` (as opposed to ``as _``, an anonymous output)."""


_ABSENT = _Absent()


_LITERALS: dict[str, Any] = {"inf_lit": math.inf, "ninf_lit": -math.inf, "nan_lit": math.nan,
                             "true_lit": True, "false_lit": False}


class _Reader:
    def __init__(self, text: str):
        self.text = text

    def fail(self, at: Tree | Token | None, message: str) -> NoReturn:
        if isinstance(at, Token):
            raise IRSyntaxError(message, at.line, at.column)
        if isinstance(at, Tree) and not at.meta.empty:
            raise IRSyntaxError(message, at.meta.line, at.meta.column)
        raise IRSyntaxError(message)

    # -- tokens
    def string(self, tok: Token) -> str:
        try:
            value = json.loads(str(tok))
        except json.JSONDecodeError:
            self.fail(tok, f"bad string {str(tok)!r}: write it as a JSON string")
        return str(value)

    def name(self, tok: Token) -> str:
        return self.string(tok) if tok.type == "STRING" else str(tok)

    def sigil_name(self, tok: Token) -> str:
        """``%x`` -> ``x``; ``@"a b"`` -> ``a b``."""
        rest = str(tok)[1:]
        return self.string(Token("STRING", rest, line=tok.line, column=tok.column)) if rest.startswith('"') else rest

    def dtype(self, tok: Token) -> DType:
        if str(tok) not in DTYPES:
            self.fail(tok, f"unknown dtype {str(tok)!r}: expected one of {', '.join(DTYPES)}")
        return DTYPES[str(tok)]

    def literal(self, t: Tree) -> float | int | bool:
        if t.data == "int_lit":
            return int(_kids(t)[0])
        if t.data == "float_lit":
            return float(_kids(t)[0])
        return _LITERALS[str(t.data)]

    def dim(self, t: Tree) -> Dim:
        source = _COMMENT.sub(" ", self.text[t.meta.start_pos:t.meta.end_pos])
        try:
            return parse_dim(source)
        except ValueError as err:
            self.fail(t, f"bad dim {source!r}: {err}")

    # -- module and functions
    def module(self, t: Tree) -> S.Module:
        version, *functions = _kids(t)
        if int(version) != S.FORMAT_VERSION:
            self.fail(version, f"{SEMANTIC_FORMAT} version {version} is not supported (this build reads "
                               f"version {S.FORMAT_VERSION})")
        return S.Module(tuple(self.function(f) for f in functions), int(version))

    def function(self, t: Tree) -> S.Function:
        name, params_t, outputs_t, bindings_t, spec_t, *rest = _kids(t)
        params = tuple(self.param(p) for p in _items(params_t))
        outputs = [self.output(o) for o in _items(outputs_t)]
        named = any(label is not _ABSENT for _, label in outputs)
        known: dict[str, DType] = {p.name: p.type.dtype for p in params}
        ops = []
        for op_t in rest[:-1]:
            if op_t.data in ("op", "bare_call"):
                op = self.op(op_t, known)
                ops.append(op)
                known.update((r, ty.dtype) for r, ty in S.op_results(op))
        return S.Function(
            name=self.sigil_name(name),
            params=params,
            bindings=tuple(self.binding(b) for b in _items(bindings_t)),
            guards=tuple(self.guard(g) for g in rest[:-1] if g.data == "guard"),
            ops=tuple(ops),
            results=tuple(self.sigil_name(v) for v in _items(rest[-1])),
            result_types=tuple(ty for ty, _ in outputs),
            output_names=tuple(None if label is _ABSENT else label for _, label in outputs) if named else (),
            specialisation=() if spec_t is None else tuple(self.spec_item(s) for s in _kids(spec_t)),
        )

    def spec_item(self, t: Tree) -> tuple[str, DType]:
        var, dtype = _kids(t)
        return self.name(var), self.dtype(dtype)

    def param(self, t: Tree) -> S.Param:
        name, type_t, default = _kids(t)
        return S.Param(self.sigil_name(name), self.type(type_t), None if default is None else self.literal(default))

    def output(self, t: Tree) -> tuple[S.TensorType, Any]:
        type_t, label = _kids(t)
        if label is None:
            return self.type(type_t), _ABSENT
        return self.type(type_t), None if isinstance(label, Tree) else self.string(label)

    def type(self, t: Tree) -> S.TensorType:
        dtype, *dims = _kids(t)
        return S.TensorType(self.dtype(dtype), tuple(self.dim(d) for d in dims if d is not None))

    def binding(self, t: Tree) -> S.DimBinding:
        dim, param, axis = _kids(t)
        return S.DimBinding(self.name(dim), self.sigil_name(param), -1 if axis is None else int(axis))

    def guard(self, t: Tree) -> S.Guard:
        cond_t, text = _kids(t)
        cond = self.cond(cond_t)
        return S.Guard(cond, cond_text(cond) if text is None else self.string(text))

    # -- ops
    def op(self, t: Tree, known: dict[str, DType]) -> S.Op:
        if t.data == "bare_call":
            call_t, name_t = _kids(t)
            return self.call((), call_t, name_t, known)
        results_t, rhs, name_t = _kids(t)
        results = tuple(self.sigil_name(v) for v in _items(results_t))
        if rhs.data == "call":
            return self.call(results, rhs, name_t, known)
        if len(results) != 1:
            self.fail(t, f"a {rhs.data} op defines one value, not {len(results)}")
        name = None if not _items(name_t) else self.string(_kids(name_t)[0])
        if rhs.data == "map":
            dtype, axes, body = _kids(rhs)
            return S.MapOp(results[0], self.dtype(dtype), self.axes(axes), self.sexpr(body, known), name)
        if rhs.data == "reduce":
            kind, dtype, axes, raxes, limits_t, body = _kids(rhs)
            limits = () if limits_t is None else tuple(
                (self.name(_kids(x)[0]), self.sexpr(_kids(x)[1], known)) for x in _kids(limits_t))
            return S.ReduceOp(results[0], self.dtype(dtype), self.name(kind), self.axes(axes), self.axes(raxes),
                              self.sexpr(body, known), name, limits)
        if rhs.data == "scan":
            return self.scan(results[0], rhs, name, known)
        dtype, axes, raxes, lhs_t, rhs_t = _kids(rhs)
        lhs, rhs_load = self.sexpr(lhs_t, known), self.sexpr(rhs_t, known)
        if not isinstance(lhs, S.Load) or not isinstance(rhs_load, S.Load):
            self.fail(rhs, "the operands of a contract are two loads: { %a[i, k], %b[k, j] }")
        return S.ContractOp(results[0], self.dtype(dtype), self.axes(axes), self.axes(raxes), lhs, rhs_load, name)

    def scan(self, result: str, t: Tree, name: str | None, known: dict[str, DType]) -> S.ScanOp:
        kind_t, dtype, axes, axis, excl, *exprs = _kids(t)
        kind = self.name(kind_t)
        body = [self.sexpr(e, known) for e in exprs]
        if len(body) != (3 if kind == "linear" else 1):
            self.fail(t, "scan.linear has three expressions { coeff, addend, init }, the other scans one")
        if kind == "linear":
            return S.ScanOp(result, self.dtype(dtype), kind, self.axes(axes), self.name(axis), body[1], body[0],
                            body[2], excl is not None, name)
        return S.ScanOp(result, self.dtype(dtype), kind, self.axes(axes), self.name(axis), body[0],
                        exclusive=excl is not None, name=name)

    def call(self, results: tuple[str, ...], t: Tree, name_t: Tree, known: dict[str, DType]) -> S.CallOp:
        callee, args_t, *rest = _kids(t)
        dims_t = rest[-1]
        types = tuple(self.type(x) for x in rest[:-1] if x is not None)
        dims = tuple((self.name(_kids(d)[0]), self.dim(_kids(d)[1])) for d in _items(dims_t))
        name = None if not _items(name_t) else self.string(_kids(name_t)[0])
        return S.CallOp(results, types, self.sigil_name(callee), tuple(self.sigil_name(a) for a in _items(args_t)),
                        dims, name)

    def axes(self, t: Tree) -> tuple[S.Axis, ...]:
        return tuple(S.Axis(self.name(_kids(a)[0]), self.dim(_kids(a)[1])) for a in _items(t))

    # -- scalar expressions
    def sexpr(self, t: Tree, known: dict[str, DType]) -> S.SExpr:
        term, written = _kids(t)
        node = self.term(term, known)
        implied = implied_dtype(node, known)
        if written is None:
            if implied is None:
                self.fail(t, f"write the dtype of this load (`: f32`): {_kids(term)[0]} is not defined before it")
            dtype = implied
        else:
            dtype = self.dtype(written)
            if isinstance(node, S.Cast) and dtype != node.dtype:
                self.fail(written, f"a cast to {node.dtype} cannot have dtype {dtype}")
        return node if node.dtype == dtype else replace(node, dtype=dtype)

    def term(self, t: Tree, known: dict[str, DType]) -> S.SExpr:
        # Nodes are built with a provisional dtype; sexpr() replaces it with the real one.
        if t.data == "const":
            return S.Const(self.literal(_kids(t)[0]), DType.BOOL)
        if t.data == "idx":
            return S.Idx(self.name(_kids(t)[0]))
        if t.data == "dimref":
            return S.DimRef(self.dim(_kids(t)[0]))
        if t.data == "load":
            src, *indices = _kids(t)
            return S.Load(self.sigil_name(src), tuple(self.sexpr(i, known) for i in indices if i is not None),
                          DType.BOOL)
        fn, *args_t = _kids(t)
        args = [self.sexpr(a, known) for a in args_t if a is not None]
        op = str(fn)
        if op in DTYPES:
            if len(args) != 1:
                self.fail(t, f"a cast {op}(x) takes one operand, not {len(args)}")
            return S.Cast(args[0], DTYPES[op])
        if op == "select":
            if len(args) != 3:
                self.fail(t, f"select(cond, a, b) takes three operands, not {len(args)}")
            return S.Select(args[0], args[1], args[2], DType.BOOL)
        if len(args) == 1:
            return S.Unary(op, args[0], DType.BOOL)
        if len(args) == 2:
            return S.Binary(op, args[0], args[1], DType.BOOL)
        self.fail(t, f"{op}(…) with {len(args)} operands: unary ops take one, binary ops two")

    # -- conditions
    def cond(self, t: Tree) -> S.Cond:
        if t.data == "rel":
            lhs, op, rhs = _kids(t)
            return S.Rel(str(op), self.dim(lhs), self.dim(rhs))
        if t.data == "in_set":
            x, *values = _kids(t)
            return S.InSet(self.dim(x), tuple(self.dim(v) for v in values if v is not None))
        if t.data in ("and_cond", "or_cond"):
            return S.BoolOp(str(t.data)[:-5], tuple(self.cond(c) for c in _kids(t)))
        if t.data == "not_cond":
            return S.BoolOp("not", (self.cond(_kids(t)[0]),))
        fn, *parts = _kids(t)  # bool_fn: and(...) / or(...) with fewer than two parts
        if str(fn) not in ("and", "or"):
            self.fail(fn, f"unknown condition {str(fn)!r}(…): expected and(…) or or(…)")
        return S.BoolOp(str(fn), tuple(self.cond(c) for c in parts if c is not None))

    # -- strategies
    def strategies(self, t: Tree) -> StrategySet:
        version, *items = _kids(t)
        if int(version) != STRATEGY_VERSION:
            self.fail(version, f"{STRATEGY_FORMAT} version {version} is not supported (this build reads "
                               f"version {STRATEGY_VERSION})")
        return StrategySet(tuple(self.strategy(s) for s in items))

    def strategy(self, t: Tree) -> Strategy:
        kernel, target, when, *decisions = _kids(t)
        return Strategy(self.sigil_name(kernel), None if target is None else self.name(target),
                        None if when is None else self.cond(when), tuple(self.decision(d) for d in decisions))

    def decision(self, t: Tree) -> Decision:
        kind, subject, value = _kids(t)
        parsed: int | str | None = None
        if value is not None:
            parsed = int(_kids(value)[0]) if value.data == "dv_int" else self.name(_kids(value)[0])
        return Decision(self.name(kind), None if subject is None else self.name(subject), parsed)
