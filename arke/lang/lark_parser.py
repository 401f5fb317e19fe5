"""The `.ak` grammar (``arke/grammar/arke.lark``) loaded into one LALR parser, built once.

The parser, the formatter and the language server all parse with this one.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

from lark import Lark


@lru_cache(maxsize=1)
def _lark() -> Lark:
    text = resources.files("arke.grammar").joinpath("arke.lark").read_text(encoding="utf-8")
    # cache=True keeps the LALR tables in the temp folder: start-up matters for `akc check`.
    # The basic lexer reserves keywords everywhere (`return` is never a name), which keeps
    # syntax errors where the mistake is rather than a statement later.
    return Lark(text, parser="lalr", lexer="basic", keep_all_tokens=True, maybe_placeholders=True, cache=True)
