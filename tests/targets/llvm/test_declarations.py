"""One top-level line per symbol in an LLVM module (:mod:`arke.targets.llvm.declarations`).

Two emitters once declared ``llvm.masked.load.v16f32.p0`` in two spellings and LLVM refused the
module (issue 17); tests/targets/test_mla.py builds the kernels that met it.
"""

from __future__ import annotations

import llvmlite.binding as llvm
import pytest

from arke.targets.llvm.declarations import Declarations, masked_load, masked_load_call, masked_store, symbol, vector_fma


def test_symbol_of_each_kind_of_line() -> None:
    assert symbol("declare <16 x float> @llvm.masked.load.v16f32.p0(ptr, <16 x i1>, <16 x float>)") == \
        "@llvm.masked.load.v16f32.p0"
    assert symbol('define internal <8 x float> @"arke.expf.v8"(<8 x float> %x) {') == "@arke.expf.v8"
    assert symbol("declare i64 @syscall(i64, ...)") == "@syscall"
    assert symbol("@timeout = private constant { i64, i64 } { i64 1, i64 0 }") == "@timeout"
    assert symbol('!100001 = distinct !{!100001, !{!"llvm.loop.unroll.count", i32 4}}') == "!100001"


def test_the_same_line_twice_is_one_line() -> None:
    declare = Declarations()
    for _ in range(3):
        declare(masked_load(16, "float")[1])
        declare(vector_fma(16)[1])
    assert declare.lines() == [masked_load(16, "float")[1], vector_fma(16)[1]]
    assert "@llvm.fma.v16f32" in declare


def test_a_second_spelling_of_a_symbol_is_refused_naming_both() -> None:
    declare = Declarations()
    declare(masked_load(16, "float")[1])
    old_form = "declare <16 x float> @llvm.masked.load.v16f32.p0(ptr, i32, <16 x i1>, <16 x float>)"
    with pytest.raises(ValueError, match=r"@llvm\.masked\.load\.v16f32\.p0") as info:
        declare(old_form)
    assert old_form in str(info.value) and masked_load(16, "float")[1] in str(info.value)


@pytest.mark.parametrize("elem", ["float", "i16", "i8"])
def test_the_spellings_parse_and_verify(elem: str) -> None:
    """The one spelling of each shared intrinsic is what this LLVM reads."""
    lanes = 8
    vt = f"<{lanes} x {elem}>"
    body = [
        "define void @f(ptr %p, ptr %q, <8 x i1> %m, <8 x float> %a) {",
        f"  %v = {masked_load_call(lanes, elem, '%p', '%m', 1)}",
        f"  call void {masked_store(lanes, elem)[0]}({vt} %v, ptr align 1 %q, <8 x i1> %m)",
        f"  %f = call <8 x float> {vector_fma(lanes)[0]}(<8 x float> %a, <8 x float> %a, <8 x float> %a)",
        "  ret void", "}"]
    decls = [masked_load(lanes, elem)[1], masked_store(lanes, elem)[1], vector_fma(lanes)[1]]
    module = llvm.parse_assembly("\n".join([*decls, *body]) + "\n")
    module.verify()
