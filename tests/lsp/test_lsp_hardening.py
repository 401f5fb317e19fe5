"""Issue 16, items 11-14: the language server answers every request, survives broken frames, and one
slow document holds up no other.

Each test drives the real server (``akc lsp``) over stdio in a subprocess, through the raw client of
``tests/support/lsp_wire.py``, which can send what a well-behaved client never would; every wait
has a deadline, so a server that hangs fails the test instead of blocking it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from lsp_wire import BAD, GOOD, Wire, frame

from arke.lsp.framing import MAX_BODY, FrameReader

#: The server with two things made slow on purpose (as a 5000-digit literal or a big `where` set made a
#: check, and a 1.1 MB document made formatting, in the issue): a text with ``SLOWCHECK`` in it takes
#: 30 s to check, one with ``SLOWFORMAT`` 30 s to format (both spin: they hold the GIL as the checker
#: does); one with ``CRASHCHECK`` makes the check raise (as the 5000-digit literal did).
SLOW_SERVER = [sys.executable, "-c", """
import time
from arke.lsp import incremental, server

def spin(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(range(1000))

check = incremental.IncrementalChecker.check
def slow_check(self, text):
    if "SLOWCHECK" in text:
        spin(30)
    if "CRASHCHECK" in text:
        raise ValueError("Exceeds the limit (4300 digits) for integer string conversion")
    return check(self, text)
incremental.IncrementalChecker.check = slow_check

format_edits = server.format_edits
def slow_format(text, path):
    if "SLOWFORMAT" in text.text:
        spin(30)
    return format_edits(text, path)
server.format_edits = slow_format

from arke.cli.lsp import main
main()
"""]


def hover(uri: str, line: object = 0, character: object = 0) -> dict[str, object]:
    return {"textDocument": {"uri": uri}, "position": {"line": line, "character": character}}


def started(cwd: Path) -> Iterator[Wire]:
    w = Wire(cwd=cwd)
    w.initialize()
    yield w
    if w.proc.poll() is None:
        w.proc.kill()
        w.proc.wait()


@pytest.fixture
def wire(tmp_path: Path) -> Iterator[Wire]:
    """A server of the test's own."""
    yield from started(tmp_path)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Wire]:
    """One server for the tests of single bad messages (each checks that it still answers)."""
    yield from started(tmp_path_factory.mktemp("lsp-hardening"))


def symbols_request(w: Wire, uri: str) -> tuple[int, bytes]:
    """A documentSymbol request's id and body (not sent)."""
    msg_id = w.request("textDocument/documentSymbol", send=False)
    body = json.dumps({"jsonrpc": "2.0", "id": msg_id, "method": "textDocument/documentSymbol",
                       "params": {"textDocument": {"uri": uri}}}).encode()
    return msg_id, body


def assert_alive(w: Wire, uri: str) -> None:
    """The server still answers a plain request."""
    answer = w.call("textDocument/documentSymbol", {"textDocument": {"uri": uri}}, timeout=20)
    assert "result" in answer, answer


# ---------------------------------------------------------------- item 12: every request is answered


@pytest.mark.parametrize("params", [
    hover("file:///a.ak", line=-1),
    hover("file:///a.ak", line=2 ** 63),
    hover("file:///a.ak", line=2 ** 31),
    hover("file:///a.ak", line="zero", character="one"),
    hover("file:///a.ak", line=0, character=-5),
    {"position": {"line": 0, "character": 0}},
    None,
    [],
    "hover",
], ids=["line -1", "line 2**63", "line 2**31", "string positions", "character -5",
        "no document", "null params", "a list", "a string"])
def test_invalid_params_get_an_invalid_params_error(shared: Wire, params: object) -> None:
    wire = shared
    wire.open("file:///a.ak", GOOD)
    msg_id = wire.request("textDocument/hover", send=False)
    wire.send({"jsonrpc": "2.0", "id": msg_id, "method": "textDocument/hover", "params": params})
    answer = wire.response(msg_id, timeout=20)
    assert answer["error"]["code"] == -32602, answer
    assert "textDocument/hover" in answer["error"]["message"]
    assert "result" in wire.call("textDocument/hover", hover("file:///a.ak")), "the server stopped answering"


def test_requests_after_shutdown_get_an_invalid_request_error(wire: Wire) -> None:
    assert wire.call("shutdown")["result"] is None
    for method, params in (("textDocument/hover", hover("file:///a.ak")), ("shutdown", None),
                           ("initialize", {"capabilities": {}})):
        answer = wire.call(method, params, timeout=20)
        assert answer["error"]["code"] == -32600, answer
        assert "shut down" in answer["error"]["message"]
    wire.notify("exit", None)
    assert wire.stop(20) == 0


def test_a_request_before_initialize_is_refused_not_dropped(tmp_path: Path) -> None:
    w = Wire(cwd=tmp_path)
    try:
        answer = w.call("textDocument/hover", hover("file:///a.ak"), timeout=20)
        assert answer["error"]["code"] == -32002, answer
        w.initialize()
        assert "result" in w.call("textDocument/hover", hover("file:///a.ak"))
    finally:
        w.close()


@pytest.mark.parametrize("body, code, answered_id", [
    (b'{"jsonrpc": "2.0", "id": 9041, "method": "textDocument/hover", "params": {', -32700, 9041),
    (b"\xff\xfe not json", -32700, None),
    (b"[" * 100000, -32700, None),
    (b'[{"jsonrpc": "2.0", "id": 9042, "method": "shutdown"}]', -32600, None),
    (b'{"jsonrpc": "1.0", "id": 9043, "method": "shutdown"}', -32600, 9043),
    (b'{"jsonrpc": "2.0", "id": {"x": 1}, "method": "shutdown"}', -32600, None),
    (b'{"jsonrpc": "2.0", "id": 9044, "method": 7}', -32600, 9044),
    (b'{"jsonrpc": "2.0", "id": 9045, "method": "no/such/method"}', -32601, 9045),
], ids=["cut JSON", "not UTF-8", "nested too deeply", "a batch", "JSON-RPC 1.0", "id an object",
        "method a number", "unknown method"])
def test_a_body_that_is_no_request_gets_an_error(shared: Wire, body: bytes, code: int,
                                                  answered_id: int | None) -> None:
    wire = shared
    since = len(wire.messages)
    wire.write(frame(body))
    answer = wire.wait(lambda m: "error" in m and "method" not in m, 20, f"an error {code}", since)
    assert answer["error"]["code"] == code and answer["id"] == answered_id, answer
    assert "id" in answer  # JSON-RPC: null when the id cannot be told
    assert_alive(wire, "file:///a.ak")


# ---------------------------------------------------------------- item 13: framing


def test_a_frame_10_bytes_short_is_answered_and_the_next_one_read(wire: Wire) -> None:
    first, body = symbols_request(wire, "file:///a.ak")
    wire.write(b"Content-Length: %d\r\n\r\n%s" % (len(body) - 10, body))
    second, body2 = symbols_request(wire, "file:///a.ak")
    wire.write(frame(body2))
    assert wire.response(first, timeout=20)["error"]["code"] == -32700  # its id read from the broken text
    assert "result" in wire.response(second, timeout=20)
    wire.wait(lambda m: m.get("method") == "window/logMessage" and "skipped 10 bytes" in m["params"]["message"],
              10, "a message about the skipped bytes")


def test_a_frame_40_bytes_long_is_cut_at_the_next_header(wire: Wire) -> None:
    first, body = symbols_request(wire, "file:///a.ak")
    wire.write(b"Content-Length: %d\r\n\r\n%s" % (len(body) + 40, body))
    second, body2 = symbols_request(wire, "file:///a.ak")
    wire.write(frame(body2))
    assert "result" in wire.response(first, timeout=20)
    assert "result" in wire.response(second, timeout=20)
    wire.wait(lambda m: m.get("method") == "window/logMessage" and "Content-Length" in m["params"]["message"],
              10, "a message about the wrong length")


def test_a_last_frame_40_bytes_long_is_read_once_nothing_more_comes(wire: Wire) -> None:
    first, body = symbols_request(wire, "file:///a.ak")
    wire.write(b"Content-Length: %d\r\n\r\n%s" % (len(body) + 40, body))
    assert "result" in wire.response(first, timeout=20)
    assert_alive(wire, "file:///a.ak")


@pytest.mark.parametrize("length", [b"1000000000000000", b"9" * 5000, b"%d" % (MAX_BODY + 1)])
def test_a_huge_content_length_is_refused_without_allocating(wire: Wire, length: bytes) -> None:
    since = len(wire.messages)
    wire.write(b"Content-Length: " + length + b"\r\n\r\n" + b'{"jsonrpc": "2.0", "method": "x"}')
    assert_alive(wire, "file:///a.ak")
    wire.wait(lambda m: m.get("method") == "window/logMessage" and "beyond the limit" in m["params"]["message"],
              10, "a message about the refused length", since)
    assert wire.proc.poll() is None and b"MemoryError" not in wire.stderr


def test_junk_between_frames_is_skipped_and_reported(wire: Wire) -> None:
    wire.write(b"\x00\x01 this is not a header\r\nContent-Type: text/plain\r\n\r\n{}\r\n" + bytes(range(256)))
    assert_alive(wire, "file:///a.ak")
    wire.wait(lambda m: m.get("method") == "window/logMessage" and "skipped" in m["params"]["message"],
              10, "a message about the junk")


def test_a_change_to_a_document_never_opened_is_said_and_ignored(wire: Wire) -> None:
    """pygls raised a KeyError for it, which reached the user as "Error in server: KeyError"."""
    wire.notify("textDocument/didChange", {"textDocument": {"uri": "file:///nope2.ak", "version": 2},
                                           "contentChanges": [{"text": "kernel f() {}"}]})
    wire.wait(lambda m: m.get("method") == "window/logMessage" and "not open" in m["params"]["message"],
              10, "a message about the change")
    assert not [m for m in wire.messages if m.get("method") == "window/showMessage"]
    assert_alive(wire, "file:///a.ak")


# ---------------------------------------------------------------- item 14: no document waits on another


def test_a_slow_check_holds_up_no_other_document(tmp_path: Path) -> None:
    w = Wire(SLOW_SERVER, cwd=tmp_path)
    try:
        w.initialize({"debounceMs": 0, "checkTimeoutMs": 1500})
        slow, fast = "file:///slow.ak", "file:///fast.ak"
        w.open(slow, "# SLOWCHECK\n" + GOOD)
        time.sleep(0.5)  # the slow check has started
        start = time.monotonic()
        w.open(fast, BAD)
        assert [d["code"] for d in w.diagnostics(fast, 1, timeout=20)] == ["AK2001"]
        assert time.monotonic() - start < 10, "the other document waited for the slow one"
        notice = w.diagnostics(slow, 1, timeout=20)  # past its bound: a diagnostic says so
        assert len(notice) == 1 and "longer than 1.5 s" in notice[0]["message"], notice
        # A newer text of the slow document supersedes the check still running: a fresh lane checks it.
        start = time.monotonic()
        w.change(slow, BAD, 2)
        assert [d["code"] for d in w.diagnostics(slow, 2, timeout=20)] == ["AK2001"]
        assert time.monotonic() - start < 10, "the newer text waited for the stale check"
        assert "result" in w.call("textDocument/hover", hover(fast, 1, 10), timeout=10)
    finally:
        w.proc.kill()
        w.proc.wait()


def test_a_check_that_fails_says_so_in_a_diagnostic(tmp_path: Path) -> None:
    w = Wire(SLOW_SERVER, cwd=tmp_path)
    try:
        w.initialize({"debounceMs": 0})
        w.open("file:///crash.ak", "# CRASHCHECK\n" + GOOD)
        found = w.diagnostics("file:///crash.ak", 1, timeout=20)
        assert len(found) == 1 and found[0]["severity"] == 1, found
        assert "could not check" in found[0]["message"] and "4300 digits" in found[0]["message"]
        w.change("file:///crash.ak", BAD, 2)  # and the next text is checked as usual
        assert [d["code"] for d in w.diagnostics("file:///crash.ak", 2, timeout=20)] == ["AK2001"]
    finally:
        w.proc.kill()
        w.proc.wait()


def test_slow_formatting_blocks_no_other_request_and_is_bounded(tmp_path: Path) -> None:
    w = Wire(SLOW_SERVER, cwd=tmp_path)
    try:
        w.initialize({"debounceMs": 0, "formatTimeoutMs": 3000})
        big, other = "file:///big.ak", "file:///other.ak"
        w.open(big, "# SLOWFORMAT\n" + GOOD)
        w.open(other, BAD)
        w.diagnostics(other, 1, timeout=20)
        start = time.monotonic()
        formatting = w.request("textDocument/formatting", {"textDocument": {"uri": big},
                                                           "options": {"tabSize": 2, "insertSpaces": True}})
        time.sleep(0.3)
        assert "result" in w.call("textDocument/hover", hover(other, 1, 10), timeout=10)
        assert "result" in w.call("textDocument/documentSymbol", {"textDocument": {"uri": other}}, timeout=10)
        assert time.monotonic() - start < 2.5, "requests waited for the formatting"
        answer = w.response(formatting, timeout=20)
        assert answer["error"]["code"] == -32803 and "formatting takes longer than 3 s" in answer["error"]["message"]
        assert time.monotonic() - start < 10
    finally:
        w.proc.kill()
        w.proc.wait()


def test_a_file_uri_to_a_device_is_not_read(wire: Wire) -> None:
    for uri in ("file:///dev/zero", "file:///dev/stdin"):
        answer = wire.call("textDocument/documentSymbol", {"textDocument": {"uri": uri}}, timeout=20)
        assert answer.get("result") == [], answer


# ---------------------------------------------------------------- item 11: stdin closed


def test_akc_lsp_with_stdin_closed_is_a_usage_error(tmp_path: Path) -> None:
    run = subprocess.run(f"exec '{sys.executable}' -m arke lsp <&-", shell=True, capture_output=True, text=True,
                         timeout=60, cwd=tmp_path)
    assert run.returncode == 2, run.stderr
    assert "standard input is closed" in run.stderr and "internal error" not in run.stderr


def test_akc_lsp_with_stdin_at_its_end_exits_cleanly(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "arke", "lsp"], stdin=subprocess.DEVNULL, capture_output=True,
                         text=True, timeout=60, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "internal error" not in run.stderr and "Traceback" not in run.stderr


def test_exit_ends_the_server_while_a_check_still_runs(tmp_path: Path) -> None:
    w = Wire(SLOW_SERVER, cwd=tmp_path)
    w.initialize({"debounceMs": 0})
    w.open("file:///slow.ak", "# SLOWCHECK\n" + GOOD)
    time.sleep(0.5)
    start = time.monotonic()
    assert w.close(timeout=20) == 0
    assert time.monotonic() - start < 10, "exit waited for the running check"



# ---------------------------------------------------------------- the frame reader alone


@pytest.mark.parametrize("chunk", [1, 7, 1 << 16])
def test_the_frame_reader_finds_the_next_frame_after_any_wrong_length(chunk: int) -> None:
    first = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "a", "params": {"text": "Content-Length: 5\r\n"}})
    second = frame({"jsonrpc": "2.0", "id": 2, "method": "b"})
    for wrong in (*range(-40, 0), *range(1, 60)):
        reader = FrameReader()
        data = b"Content-Length: %d\r\n\r\n%s%s" % (len(first) + wrong, first.encode(), second)
        events = [e for k in range(0, len(data), chunk) for e in reader.feed(data[k:k + chunk])]
        events += reader.stalled() + reader.eof()
        bodies = [e.body for e in events if e.body is not None]
        assert bodies[-1] == second.split(b"\r\n\r\n", 1)[1], (wrong, events)
        if wrong > 0:  # too long: the first body is found whole
            assert bodies[0] == first.encode(), (wrong, events)
        assert any(e.problem for e in events), wrong


def test_a_lone_surrogate_is_a_diagnostic_not_an_internal_error() -> None:
    """JSON text may carry a lone UTF-16 surrogate: its position counts one unit, and the diagnostic is AK1001."""
    from arke.lang.render import Sources, lsp_position

    text = "kernel f(x: f32[N]) -> f32[N] { return x[i] \ud800 }"
    sources = Sources({"<s>": text})
    assert lsp_position("<s>", 1, len(text), sources)["character"] == len(text) - 1


@pytest.mark.parametrize(("shutdown", "status"), [(True, 0), (False, 1)])
def test_akc_lsp_exits_with_the_protocols_status(tmp_path: Path, shutdown: bool, status: int) -> None:
    """`exit` after `shutdown` is status 0, without it 1 (the protocol's rule); never an internal error."""
    w = Wire([sys.executable, "-m", "arke", "lsp"], cwd=tmp_path)
    w.initialize()
    if shutdown:
        assert w.call("shutdown")["result"] is None
    w.notify("exit", None)
    assert w.stop(30) == status
    assert b"internal error" not in w.stderr and b"Traceback" not in w.stderr, w.stderr.decode(errors="replace")
