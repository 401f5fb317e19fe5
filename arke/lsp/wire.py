"""The server's end of the wire: frames in, each message checked before pygls handles it.

pygls reads stdin with a loop that trusts every header (see :mod:`arke.lsp.framing`) and,
when a message does not decode — ``null`` params, a line of −1 or 2⁶³, a string for a
number — logs it and answers nothing, as it answers nothing to a request after
``shutdown``: the client waits for ever. Here every request gets an answer with its id:

* a body that is not JSON: ParseError (−32700), with the id when the broken text shows it
  unambiguously, else ``null``;
* a message that is no JSON-RPC 2.0 request, notification or response: InvalidRequest (−32600);
* params that do not decode into the method's types: InvalidParams (−32602), saying where;
* a request before ``initialize``: ServerNotInitialized (−32002); after ``shutdown``:
  InvalidRequest — only ``exit`` is still accepted.

What goes wrong without a request to answer (junk, a broken frame, a notification with
bad params) is said in a ``window/logMessage`` and logged on stderr.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import sys
import threading
from typing import Any, BinaryIO

import cattrs
from lsprotocol import types
from pygls.exceptions import (
    JsonRpcException,
    JsonRpcInternalError,
    JsonRpcInvalidParams,
    JsonRpcInvalidRequest,
    JsonRpcParseError,
    JsonRpcServerNotInitialized,
)
from pygls.io_ import StdoutWriter
from pygls.protocol import LanguageServerProtocol
from pygls.protocol.json_rpc import JsonRPCNotification, JsonRPCRequestMessage, JsonRPCResponseMessage
from pygls.protocol.language_server import lsp_method
from pygls.server import JsonRPCServer

from arke.lsp.framing import STALL_S, Frame, FrameReader
from arke.targets.base import UsageError

log = logging.getLogger(__name__)

#: A request's ``"id"`` in a body that is not JSON (a string id: at most 200 characters).
_ID = re.compile(rb'"id"\s*:\s*(-?\d{1,18}|"(?:[^"\\\r\n]|\\.){0,200}")')
#: Chunks read from stdin that may wait for the event loop (the reader blocks beyond: back-pressure).
_QUEUED = 16


def _describe(err: Exception) -> str:
    """What was wrong with the params, for the client (cattrs' paths, the validators' own words)."""
    if isinstance(err, cattrs.BaseValidationError):
        def say(exc: BaseException, kind: Any) -> str:
            if isinstance(exc, ValueError) and str(exc) and not isinstance(exc, cattrs.BaseValidationError):
                return f"invalid value ({exc})"
            return cattrs.v.format_exception(exc, kind)
        return "; ".join(cattrs.transform_error(err, format_exception=say))[:2000]
    return f"{type(err).__name__}: {err}"[:2000]


def _leading(body: bytes) -> dict[str, Any] | None:
    """The JSON object a body begins with, when something else follows it (a frame cut too long)."""
    text = body.decode("utf-8", "surrogateescape")  # the rest may be any bytes
    try:
        _, end = json.JSONDecoder().raw_decode(text, len(text) - len(text.lstrip()))
        value = json.loads(text[:end].encode("utf-8", "surrogateescape"))  # the object itself: strictly
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _guess_id(body: bytes) -> int | str | None:
    """The id of a broken request, when its text shows exactly one ``"id"`` and a method."""
    found = _ID.findall(body)
    if len(found) != 1 or b'"method"' not in body:
        return None
    try:
        value = json.loads(found[0])
    except ValueError:
        return None
    return value if isinstance(value, int | str) else None


class ArkeProtocol(LanguageServerProtocol):
    """pygls' protocol, fed by :func:`serve`: decodes and checks each message, answers every request."""

    initialized = False

    def tell(self, message: str, kind: types.MessageType = types.MessageType.Warning) -> None:
        """Say ``message`` to the client (``window/logMessage``) and on stderr."""
        log.warning("%s", message)
        self.notify(types.WINDOW_LOG_MESSAGE, types.LogMessageParams(kind, f"akc lsp: {message}"))

    @lsp_method(types.TEXT_DOCUMENT_DID_CHANGE)
    def lsp_text_document__did_change(self, params: types.DidChangeTextDocumentParams) -> Any:
        """pygls' own, for a document that is open; a change to one that is not is said and ignored (pygls
        raised a KeyError that reached the user as "Error in server")."""
        try:
            for change in params.content_changes:
                self.workspace.update_text_document(params.text_document, change)
        except KeyError:
            self.tell(f"a change to {params.text_document.uri}, which is not open: ignored (didOpen it first)")
            return
        if (handler := self.fm.features.get(types.TEXT_DOCUMENT_DID_CHANGE)) is not None:
            yield handler, (params,), None

    def refuse(self, msg_id: int | str | None, error: JsonRpcException) -> None:
        """Answer request ``msg_id`` (None: unknown) with ``error``."""
        log.warning("answering %r with error %s: %s", msg_id, error.code, error.message)
        self._send_data({"jsonrpc": "2.0", "id": msg_id, "error": {"code": error.code, "message": error.message}})

    def receive(self, frame: Frame) -> None:
        """Handle one event of the frame reader."""
        if frame.problem is not None:
            self.tell(frame.problem, types.MessageType.Error if frame.body is None else types.MessageType.Warning)
        if frame.body is None:
            return
        try:
            data = json.loads(frame.body)
        except (ValueError, RecursionError) as err:
            data = _leading(frame.body)
            if data is None:
                why = "nested too deeply" if isinstance(err, RecursionError) else str(err)
                self.refuse(_guess_id(frame.body), JsonRpcParseError(f"the message is not JSON: {why}"[:2000]))
                return
            self.tell("a frame held more than its message (its Content-Length was too long?): the rest is ignored")
        self.accept(data)

    def accept(self, data: Any) -> None:
        """Check one decoded JSON message and hand it to pygls (or answer the error)."""
        if not isinstance(data, dict):
            self.refuse(None, JsonRpcInvalidRequest("a message must be one JSON object"))
            return
        msg_id, method = data.get("id"), data.get("method")
        has_id = "id" in data
        good_id = isinstance(msg_id, int | str) and not isinstance(msg_id, bool)
        answer = msg_id if good_id else None
        if data.get("jsonrpc") != "2.0":
            self._bad(data, answer, 'a message must say "jsonrpc": "2.0"')
            return
        if "method" not in data:
            if not has_id or ("result" not in data and "error" not in data):
                self._bad(data, None, "a message needs a method, or an id and a result or an error")
                return
        elif not isinstance(method, str):
            self._bad(data, answer, '"method" must be a string')
            return
        elif has_id and not good_id:
            self.refuse(None, JsonRpcInvalidRequest('a request\'s "id" must be an integer or a string'))
            return
        request = "method" in data and has_id
        if request and self._shutdown:
            self.refuse(msg_id, JsonRpcInvalidRequest(f"the server is shut down: `{method}` refused "
                                                      "(only the `exit` notification is accepted)"))
            return
        if method is not None and not self.initialized and method not in (types.INITIALIZE, types.EXIT):
            if request:
                self.refuse(msg_id, JsonRpcServerNotInitialized(f"`{method}` before `initialize`"))
            else:
                log.warning("ignoring %r before initialize", method)
            return
        try:
            message = self._decode(data)
        except Exception as err:  # anything the types refuse: answer it, never drop it
            if request:
                self.refuse(msg_id, JsonRpcInvalidParams(f"`{method}`: {_describe(err)}"))
            elif method is not None:
                self.tell(f"ignored `{method}`: {_describe(err)}")
            else:
                log.warning("ignoring a response that does not decode: %s", _describe(err))
            return
        if request and method == types.INITIALIZE:
            self.initialized = True
        try:
            self.handle_message(message)
        except Exception as err:  # a bug in dispatch must still answer
            log.exception("handling %r failed", method)
            if request:
                self.refuse(msg_id, JsonRpcInternalError(f"{type(err).__name__}: {err}"))

    def _bad(self, data: dict[str, Any], msg_id: int | str | None, why: str) -> None:
        if "method" in data and "id" in data:
            self.refuse(msg_id, JsonRpcInvalidRequest(why))
        else:
            self.tell(f"ignored a message: {why}")

    def _decode(self, data: dict[str, Any]) -> Any:
        """The message as pygls' own decoder makes it (:meth:`structure_message`), without its logging."""
        method = data.get("method")
        if method is not None:
            kind = self.get_message_type(method)
            if kind is None:  # a method no type names: pygls answers MethodNotFound (params may be left out)
                kind = JsonRPCRequestMessage if "id" in data else JsonRPCNotification
                data = {"params": None, **data}
        elif "error" in data:
            kind = types.ResponseErrorMessage
        else:
            kind = self._result_types.pop(data["id"], None) or JsonRPCResponseMessage
        return self._converter.structure(data, kind)


async def serve(protocol: ArkeProtocol, fd: int, stop: threading.Event, stall: float = STALL_S) -> None:
    """Read frames from file descriptor ``fd`` and hand them to ``protocol`` until the input ends or ``stop``."""
    loop = asyncio.get_running_loop()
    chunks: asyncio.Queue[bytes] = asyncio.Queue(_QUEUED)

    def pump() -> None:  # on a daemon thread: a read blocked at exit holds nothing up
        while True:
            try:
                data = os.read(fd, 1 << 16)
            except OSError as err:
                log.error("reading the input failed: %s", err)
                data = b""
            try:
                asyncio.run_coroutine_threadsafe(chunks.put(data), loop).result()
            except (RuntimeError, asyncio.CancelledError):  # the loop is gone
                return
            if not data:
                return

    threading.Thread(target=pump, name="akc-lsp-stdin", daemon=True).start()
    reader = FrameReader()
    ended = False
    while not ended and not stop.is_set():
        try:
            data = await asyncio.wait_for(chunks.get(), stall if reader.waiting else None)
        except asyncio.TimeoutError:
            events = reader.stalled()
        else:
            ended = not data
            events = reader.eof() if ended else reader.feed(data)
        for event in events:
            protocol.receive(event)


def run_stdio(server: JsonRPCServer, stdin: BinaryIO | None = None, stdout: BinaryIO | None = None) -> None:
    """Serve ``server`` (whose protocol is an :class:`ArkeProtocol`) over stdin and stdout until ``exit``
    or the end of the input; a closed standard input or output is a :class:`UsageError`."""
    stdin = stdin or (sys.stdin.buffer if sys.stdin is not None else None)
    stdout = stdout or (sys.stdout.buffer if sys.stdout is not None else None)
    if stdin is None or stdout is None:
        closed = "input" if stdin is None else "output"
        raise UsageError(f"the language server speaks on standard input and output, and standard {closed} "
                         "is closed")
    try:
        fd = stdin.fileno()
        os.fstat(fd)
    except (OSError, ValueError) as err:
        raise UsageError(f"the language server cannot read standard input: {err}") from None
    protocol = server.protocol
    assert isinstance(protocol, ArkeProtocol)
    stop = threading.Event()
    server._stop_event = stop  # pygls' shutdown() sets it
    protocol.set_writer(StdoutWriter(stdout))
    try:
        asyncio.run(serve(protocol, fd, stop))
    except BrokenPipeError:
        log.error("the client closed its end: shutting down")
    except (KeyboardInterrupt, SystemExit):  # `exit` ends the server with SystemExit
        pass
    finally:
        server.shutdown()


__all__ = ["ArkeProtocol", "run_stdio", "serve"]
