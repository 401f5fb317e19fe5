"""``akc lsp``: the Arke language server (pygls), spoken over stdio.

Each open document is checked by the same checker as ``akc check`` — when it is opened,
and again a short while (the *debounce*, 30 ms by default) after the last change, so a
burst of changes sent together costs one check. The check is incremental
(:mod:`arke.lsp.incremental`): only the items an edit touched are parsed and checked
again, and the diagnostics are exactly those of ``akc check`` on the whole text. A check
that a newer change has made stale is dropped: if it has not started it never runs, and
if it has, its result is not published. Each document is checked on a thread of its own (its
*lane*), so hover and completion stay answerable while a check runs, and one slow document
holds up no other. A check that runs past its bound (10 s by default) gets a diagnostic saying
so; and when a newer text comes while it still runs, it is left to end on its own (its result
dropped) and the new text is checked on a fresh lane. Formatting and document symbols run off
the event loop too, bounded the same way: past it, the request fails with a message.

A check's result becomes the document's index (:mod:`arke.lsp.index`) when its text has
no syntax error, or when there is no index yet; otherwise the last good index stays, and
requests carry positions across the edit (:mod:`arke.lsp.textmap`), so hover, definition
and completion keep working while a line is half typed. The index is built from the
check's own parse, when a request first needs it: never between a change and its
diagnostics.

Features: diagnostics (published, with related sites and quick-fix data), hover,
go to definition, completion, document symbols, formatting and quick fixes.
Initialization options: ``debounceMs`` (the debounce), ``checkTimeoutMs`` (the bound on a
check), ``formatTimeoutMs`` (on formatting and symbols).

The wire is :mod:`arke.lsp.wire`'s: every request is answered, a broken frame is reported and
read past (:mod:`arke.lsp.framing`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, BinaryIO, TypeVar
from urllib.parse import unquote

from lsprotocol import types
from pygls.capabilities import get_capability
from pygls.exceptions import JsonRpcException
from pygls.lsp.server import LanguageServer
from pygls.workspace import TextDocument

from arke import __version__
from arke.ir.strategy import DECISIONS
from arke.lang.render import Sources, uri_for
from arke.lang.source import Span
from arke.lsp.complete import complete
from arke.lsp.convert import Text, lsp_text, to_diagnostic
from arke.lsp.edits import document_symbols, format_edits, quick_fixes
from arke.lsp.hover import hover_markdown
from arke.lsp.incremental import IncrementalChecker, Outcome
from arke.lsp.index import DocumentIndex, Symbol
from arke.lsp.textmap import TextMap
from arke.lsp.wire import ArkeProtocol, run_stdio
from arke.lsp.workers import Workers, read_regular

log = logging.getLogger(__name__)
_T = TypeVar("_T")

#: Seconds between the last change and the check (changes sent together are checked once). An edit
#: costs the incremental check a few milliseconds, so the wait need only span a burst of changes.
DEBOUNCE_S = 0.03
#: Seconds a check may take before the document gets a diagnostic saying so (and a newer text a fresh lane).
CHECK_TIMEOUT_S = 10.0
#: Seconds formatting or the document's symbols may take before the request fails.
FORMAT_TIMEOUT_S = 10.0
#: Lanes left to finish a stale check past its bound, at most (beyond: a newer text waits its turn).
MAX_ABANDONED = 2
#: The recursion limit the checks need (as ``check_text``'s): set once, so checks on several threads
#: never restore a lower one under each other.
RECURSION_LIMIT = 6000
#: Syntax errors after which the parser had to recover item by item: the AST is partial.
_SYNTAX = frozenset({"AK1001", "AK1002", "AK1003", "AK1006"})
_WORD = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
_ITEM = re.compile(r"^[ \t]*(?:kernel[ \t]+(\w+)|@\s*strategy\s*\(([^)]*)|import\b|from\b)", re.MULTILINE)


@dataclass
class DocState:
    """What the server keeps for one open document."""

    uri: str
    path: str  # the path given to the checker: the file, or `<uri>` for an unsaved buffer
    incremental: IncrementalChecker  # used on `lane` only
    lane: Workers = field(default_factory=lambda: Workers("akc-check"))
    good: Checked | None = None  # the last check of a text without syntax errors (or the first check)
    good_version: int = -1
    index: DocumentIndex | None = None  # built from `good` when a request needs it
    index_version: int = -1
    task: asyncio.Task[None] | None = None
    checked: asyncio.Event = field(default_factory=asyncio.Event)  # set once the first check is in
    indexing: asyncio.Lock = field(default_factory=asyncio.Lock)


def doc_path(uri: str, document: TextDocument | None = None) -> str:
    """The path the checker gets: the file for ``file:`` URIs (imports resolve next to it), else ``<uri>``."""
    if uri.startswith("file:") and document is not None and document.path:
        return document.path
    return f"<{uri}>"


@dataclass
class Checked:
    """One check's outcome, and the index built from it (on demand: after the diagnostics are out)."""

    outcome: Outcome
    broken: bool  # a syntax error: the AST is partial
    index: DocumentIndex | None = None

    def build(self) -> DocumentIndex:
        if self.index is None:
            start = time.perf_counter()
            o = self.outcome
            self.index = DocumentIndex(o.text, o.path, o.document_result())
            log.info("indexed %s in %.1f ms", o.path, (time.perf_counter() - start) * 1e3)
        return self.index


class ArkeLanguageServer(LanguageServer):
    """The language server: document states, their check lanes and the debounce.

    Checks of one document never overlap (one lane, one :class:`IncrementalChecker`); checks of
    different documents do, sharing the checker's cache of imported modules (a dict: a module two
    lanes load at once is loaded twice, nothing worse)."""

    def __init__(self) -> None:
        super().__init__("akc-lsp", __version__, text_document_sync_kind=types.TextDocumentSyncKind.Incremental,
                         protocol_cls=ArkeProtocol)
        self.docs: dict[str, DocState] = {}
        self.said: set[str] = set()  # "shutdown" and "exit", once the client sent them (the exit status)
        self.debounce = DEBOUNCE_S
        self.check_timeout = CHECK_TIMEOUT_S
        self.format_timeout = FORMAT_TIMEOUT_S
        self.abandoned: list[Workers] = []  # lanes left to finish a stale check past its bound
        self.editing = Workers("akc-format", size=2)  # formatting and symbols, off the event loop
        sys.setrecursionlimit(max(sys.getrecursionlimit(), RECURSION_LIMIT))

    # ------------------------------------------------------------ the wire

    def start_io(self, stdin: BinaryIO | None = None, stdout: BinaryIO | None = None) -> None:
        """Serve over stdin and stdout (:mod:`arke.lsp.wire`) until ``exit`` or the end of the input."""
        run_stdio(self, stdin, stdout)

    # ------------------------------------------------------------ checking

    def schedule(self, uri: str, delay: float) -> None:
        """Check ``uri`` after ``delay`` seconds, replacing (cancelling) a check already scheduled."""
        state = self.docs.get(uri)
        if state is None:
            return
        if state.task is not None and not state.task.done():
            state.task.cancel()
        state.task = asyncio.ensure_future(self._check_later(state, delay))

    async def _check_later(self, state: DocState, delay: float) -> None:
        if delay > 0:
            await asyncio.sleep(delay)
        if self.docs.get(state.uri) is not state:
            return  # closed, or opened again (with a state of its own) since
        document = self.workspace.get_text_document(state.uri)
        text, version = lsp_text(document.source), document.version or 0
        uris = {s.path: s.uri for s in self.docs.values()}  # a snapshot: the worker must not read `docs`

        def submit() -> Future[tuple[list[types.Diagnostic], Checked] | None]:
            return state.lane.submit(self._check, state.incremental, state, text, version, document, uris,
                                     tag=version)

        self._unblock(state, version)
        future = submit()
        try:
            if not await _within(future, self.check_timeout):
                if not future.running() and self._unblock(state, version):  # queued behind a stale slow check
                    future.cancel()
                    future = submit()
                    done = await _within(future, self.check_timeout)
                else:
                    done = False
                if not done:
                    self._notice(state, version, f"checking this document takes longer than {self.check_timeout:g}"
                                 " s: its diagnostics come when the check ends", types.DiagnosticSeverity.Information)
            result = await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.cancel()  # not started yet: it never runs (a running one ends, its result dropped)
            raise
        except Exception as err:  # a checker bug must not silence the document for good
            log.exception("checking %s failed", state.uri)
            self._notice(state, version, f"akc could not check this document: {type(err).__name__}: {err}"[:500]
                         + " (an internal error: please report it)", types.DiagnosticSeverity.Error)
            return
        if result is None or state.uri not in self.docs or (document.version or 0) != version:
            return  # a newer change came in while this ran: its own check will publish
        diagnostics, checked = result
        self.text_document_publish_diagnostics(
            types.PublishDiagnosticsParams(uri=state.uri, diagnostics=diagnostics, version=version))
        if (not checked.broken or state.good is None) and version > state.good_version:
            # The index (for hover and completion) is built from it when a request needs it (`ready`).
            state.good, state.good_version = checked, version
        state.checked.set()

    def forget(self, state: DocState) -> None:
        """A document is closed: cancel its check, end its lane (a check running there ends on its own)."""
        if state.task is not None:
            state.task.cancel()
        state.lane.close()

    def _unblock(self, state: DocState, version: int) -> bool:
        """If the document's lane runs a check of an older text past its bound, leave that check to end
        on its own and give the document a fresh lane (and checker); whether it did."""
        running = state.lane.current()
        self.abandoned = [w for w in self.abandoned if w.alive()]
        if running is None or state.lane.closed or running[0] >= version or running[1] < self.check_timeout \
                or len(self.abandoned) >= MAX_ABANDONED:
            return False
        log.warning("the check of %s version %s has run %.0f s: checking version %s on a fresh lane",
                    state.uri, running[0], running[1], version)
        state.lane.close()
        self.abandoned.append(state.lane)
        state.lane, state.incremental = Workers("akc-check"), IncrementalChecker(state.path)
        return True

    def _notice(self, state: DocState, version: int, message: str, severity: types.DiagnosticSeverity) -> None:
        """Publish one diagnostic about the check itself (at the top of ``version``, if still current), and
        let requests answer without the check."""
        state.checked.set()
        document = self.workspace.get_text_document(state.uri)
        if self.docs.get(state.uri) is not state or (document.version or 0) != version:
            return
        where = types.Range(types.Position(0, 0), types.Position(0, 0))
        notice = types.Diagnostic(where, message, severity=severity, source="akc")
        self.text_document_publish_diagnostics(types.PublishDiagnosticsParams(state.uri, [notice], version))

    async def _index(self, state: DocState) -> None:
        """Bring the document's index up to its last good check (built on its lane, once per check)."""
        async with state.indexing:
            good, version = state.good, state.good_version
            if good is None or version <= state.index_version:
                return
            index = await asyncio.wrap_future(state.lane.submit(good.build))
            if version > state.index_version:
                state.index, state.index_version = index, version

    def _check(self, incremental: IncrementalChecker, state: DocState, text: str, version: int,
               document: TextDocument, uris: dict[str, str]) -> tuple[list[types.Diagnostic], Checked] | None:
        """On the document's lane: check ``text`` (None when a newer change made it stale before it started)."""
        if (document.version or 0) != version:
            return None
        start = time.perf_counter()
        outcome = incremental.check(text)
        checked = time.perf_counter()
        found = outcome.result.diagnostics
        sources = Sources({state.path: text})
        diagnostics = [to_diagnostic(d, sources, document.position_codec, uris) for d in found]
        broken = any(d.code in _SYNTAX for d in found if d.span.file == state.path)
        how = (f"whole: {outcome.full}" if outcome.full is not None else
               f"{outcome.parsed} items parsed, {outcome.checked} kernels checked")
        log.info("checked %s (version %s) in %.1f ms (%s); converted in %.1f ms", state.uri, version,
                 (checked - start) * 1e3, how, (time.perf_counter() - checked) * 1e3)
        return diagnostics, Checked(outcome, broken)

    async def ready(self, uri: str) -> DocState | None:
        """The document's state once its first check is in and its index is of its last good check
        (None for a document that is not open); each wait bounded by the check's bound."""
        state = self.docs.get(uri)
        if state is None:
            return None
        try:
            await asyncio.wait_for(state.checked.wait(), timeout=self.check_timeout)
        except asyncio.TimeoutError:
            log.warning("no check of %s yet: answering without one", uri)
        try:
            await asyncio.wait_for(asyncio.shield(self._index(state)), timeout=self.check_timeout)
        except asyncio.TimeoutError:
            log.warning("no index of %s's last check yet: answering from the one before", uri)
        except Exception:  # an index bug must not take the request down: answer from the last index
            log.exception("indexing %s failed", uri)
        return state

    async def off_loop(self, what: str, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` on the editing workers, failing the request past the format bound."""
        future = self.editing.submit(fn, *args)
        if not await _within(future, self.format_timeout):
            future.cancel()
            raise JsonRpcException(f"{what} takes longer than {self.format_timeout:g} s: gave up",
                                   code=types.LSPErrorCodes.RequestFailed)
        return future.result()

    # ------------------------------------------------------------ looking up

    def text(self, uri: str) -> Text:
        """The document's text: an open one's, else its file's when that is a regular file ('' if not)."""
        document = self.workspace.get_text_document(uri)
        if uri in self.docs or unquote(uri) in self.workspace.text_documents:
            return Text(lsp_text(document.source), document.position_codec)
        return Text(lsp_text(read_regular(document.path) or ""), document.position_codec)

    def file_text(self, path: str, codec_of: str) -> Text | None:
        """The text of ``path``: an open document's, else the file's (None when unreadable)."""
        for s in self.docs.values():
            if s.path == path:
                return self.text(s.uri)
        content = read_regular(path)
        if content is None:
            return None
        return Text(lsp_text(content), self.workspace.get_text_document(codec_of).position_codec)

    def lookup(self, state: DocState, text: Text, offset: int) -> tuple[Symbol, int, int, str | None] | None:
        """The symbol at ``offset`` of the current text, its extent there, and the enclosing strategy's target.

        Uses the last good index; a position the edit since then has moved is carried across,
        and one inside the edited region falls back on the word under the cursor.
        """
        index = state.index
        if index is None:
            return None
        change = TextMap.between(index.text, text.text)
        old = change.to_old(offset)
        if old is not None:
            occ = index.at(old)
            start = change.to_new(occ.start) if occ else None
            end = change.to_new(occ.end, end=True) if occ else None
            if occ is not None and start is not None and end is not None:
                strategy = index.strategy_at(occ.start)
                return occ.symbol, start, end, strategy.target if strategy else None
        return self._by_word(index, change, text.text, offset)

    def _by_word(self, index: DocumentIndex, change: TextMap, text: str, offset: int
                 ) -> tuple[Symbol, int, int, str | None] | None:
        word = next((m for m in _WORD.finditer(text, max(0, offset - 64), offset + 64)
                     if m.start() <= offset <= m.end()), None)
        if word is None:
            return None
        items = list(_ITEM.finditer(text, 0, offset))
        item = items[-1] if items else None
        name = word.group()
        if item is not None and item.group(2) is not None:  # in a strategy
            target = re.search(r"\btarget\s*=\s*(\w+)", item.group(2))
            if name in DECISIONS:
                return Symbol("decision", name), word.start(), word.end(), target.group(1) if target else None
        scope = index.scope_named(item.group(1)) if item is not None and item.group(1) else None
        symbol = index.resolve(scope, name, change.prefix)
        if symbol is None and scope is not None:  # an index of the statement being edited: its last binding
            bound = [(s, how) for n, s, _, _, how in scope.indices if n == name]
            if bound:
                symbol = Symbol("index", name, scope.node.name, bound[-1][0], bound[-1][1])
        return (symbol, word.start(), word.end(), None) if symbol is not None else None

    def location(self, state: DocState, decl: Span) -> types.Location | None:
        """Where ``decl`` is now: in this document (carried across edits since the index) or in another file."""
        index = state.index
        if index is not None and decl.file == index.path:
            text = self.text(state.uri)
            change = TextMap.between(index.text, text.text)
            start, end = change.to_new(decl.start), change.to_new(decl.end, end=True)
            if start is None or end is None:
                start = end = change.prefix  # the definition was in the edited region
            return types.Location(state.uri, text.range(start, end))
        other = self.file_text(decl.file, state.uri)
        if other is None:
            return None
        uri = next((s.uri for s in self.docs.values() if s.path == decl.file), uri_for(decl.file))
        return types.Location(uri, other.range(decl.start, decl.end))


async def _within(future: Future[Any], timeout: float) -> bool:
    """Whether ``future`` is done within ``timeout`` seconds (it is not cancelled when not)."""
    done, _ = await asyncio.wait({asyncio.wrap_future(future)}, timeout=timeout)
    return bool(done)


def create_server() -> ArkeLanguageServer:
    """A new language server with every feature registered (start it with ``start_io()``)."""
    server = ArkeLanguageServer()

    @server.feature(types.INITIALIZE)
    def _initialize(ls: ArkeLanguageServer, params: types.InitializeParams) -> None:
        read_options(ls, params.initialization_options)

    @server.feature(types.SHUTDOWN)
    def _shutdown(ls: ArkeLanguageServer, params: Any) -> None:
        ls.said.add("shutdown")

    @server.feature(types.EXIT)
    def _exit(ls: ArkeLanguageServer, params: Any) -> None:
        ls.said.add("exit")

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def _did_open(ls: ArkeLanguageServer, params: types.DidOpenTextDocumentParams) -> None:
        uri = params.text_document.uri
        path = doc_path(uri, ls.workspace.get_text_document(uri))
        old = ls.docs.pop(uri, None)
        if old is not None:  # opened again without a close: its checks end with it
            ls.forget(old)
        ls.docs[uri] = DocState(uri, path, IncrementalChecker(path))
        ls.schedule(uri, 0)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def _did_change(ls: ArkeLanguageServer, params: types.DidChangeTextDocumentParams) -> None:
        ls.schedule(params.text_document.uri, ls.debounce)

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE)
    def _did_save(ls: ArkeLanguageServer, params: types.DidSaveTextDocumentParams) -> None:
        for uri in ls.docs:  # files that import the saved one see its new text now (the cache keys on mtime)
            if uri != params.text_document.uri:
                ls.schedule(uri, ls.debounce)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def _did_close(ls: ArkeLanguageServer, params: types.DidCloseTextDocumentParams) -> None:
        state = ls.docs.pop(params.text_document.uri, None)
        if state is not None:
            ls.forget(state)
        ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(params.text_document.uri, []))

    @server.feature(types.TEXT_DOCUMENT_HOVER)
    async def _hover(ls: ArkeLanguageServer, params: types.HoverParams) -> types.Hover | None:
        state = await ls.ready(params.text_document.uri)
        if state is None or state.index is None:
            return None
        text = ls.text(state.uri)
        found = ls.lookup(state, text, text.offset(params.position))
        if found is None:
            return None
        symbol, start, end, target = found
        markdown = hover_markdown(state.index, symbol, target)
        if markdown is None:
            return None
        formats = get_capability(ls.client_capabilities, "text_document.hover.content_format", None)
        kind = types.MarkupKind.PlainText if formats and types.MarkupKind.Markdown not in formats \
            else types.MarkupKind.Markdown
        return types.Hover(types.MarkupContent(kind, markdown), text.range(start, end))

    @server.feature(types.TEXT_DOCUMENT_DEFINITION)
    async def _definition(ls: ArkeLanguageServer, params: types.DefinitionParams) -> list[types.Location] | None:
        state = await ls.ready(params.text_document.uri)
        if state is None:
            return None
        text = ls.text(state.uri)
        found = ls.lookup(state, text, text.offset(params.position))
        if found is None or found[0].decl is None:
            return None
        where = ls.location(state, found[0].decl)
        return [where] if where is not None else None

    @server.feature(types.TEXT_DOCUMENT_COMPLETION,
                    types.CompletionOptions(trigger_characters=[" ", "(", ",", "[", "=", "."]))
    async def _completion(ls: ArkeLanguageServer, params: types.CompletionParams) -> types.CompletionList | None:
        state = await ls.ready(params.text_document.uri)
        if state is None:
            return None
        text = ls.text(state.uri)
        formats = get_capability(ls.client_capabilities,
                                 "text_document.completion.completion_item.documentation_format", [])
        items = complete(text.text, text.offset(params.position), state.index, state.path,
                         markdown=types.MarkupKind.Markdown in formats)
        return types.CompletionList(is_incomplete=False, items=items)

    @server.feature(types.TEXT_DOCUMENT_DOCUMENT_SYMBOL)
    async def _symbols(ls: ArkeLanguageServer, params: types.DocumentSymbolParams) -> list[types.DocumentSymbol]:
        uri = params.text_document.uri
        state = ls.docs.get(uri)
        return await ls.off_loop("listing the symbols", document_symbols, ls.text(uri),
                                 state.path if state else doc_path(uri))

    @server.feature(types.TEXT_DOCUMENT_FORMATTING)
    async def _formatting(ls: ArkeLanguageServer, params: types.DocumentFormattingParams
                          ) -> list[types.TextEdit] | None:
        uri = params.text_document.uri
        state = ls.docs.get(uri)
        return await ls.off_loop("formatting", format_edits, ls.text(uri), state.path if state else doc_path(uri))

    @server.feature(types.TEXT_DOCUMENT_CODE_ACTION,
                    types.CodeActionOptions(code_action_kinds=[types.CodeActionKind.QuickFix]))
    def _code_action(ls: ArkeLanguageServer, params: types.CodeActionParams) -> list[types.CodeAction]:
        return quick_fixes(params.text_document.uri, ls.text(params.text_document.uri), params.context.diagnostics)

    return server


def read_options(server: ArkeLanguageServer, options: object) -> None:
    """Apply initialization options (``debounceMs``, ``checkTimeoutMs``, ``formatTimeoutMs``; others are ignored)."""
    if not isinstance(options, dict):
        return
    for key, attr, low in (("debounceMs", "debounce", 0.0), ("checkTimeoutMs", "check_timeout", 0.05),
                           ("formatTimeoutMs", "format_timeout", 0.05)):
        value = options.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            setattr(server, attr, min(max(low, float(value) / 1000), 3600.0))


__all__ = ["DEBOUNCE_S", "ArkeLanguageServer", "create_server", "read_options"]
