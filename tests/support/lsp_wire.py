"""A raw JSON-RPC client for ``akc lsp``: it writes any bytes, framed or not, and reads every frame back.

pytest-lsp's client only speaks well-formed protocol; the hardening tests and the fuzzer need to
send broken frames, wrong lengths and bad params, and to see every message the server sends (a
response with a given id, a ``window/logMessage``, each ``publishDiagnostics``). Every wait has a
deadline, so a server that hangs fails the test instead of blocking it.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

#: The server as an editor starts it (the tests' conftest starts it the same way).
SERVER = [sys.executable, "-c", "from arke.cli.lsp import main; main()"]
#: A document the checker accepts without diagnostics, and one with exactly one error.
GOOD = "kernel add(a: f32[N], b: f32[N]) -> f32[N] {\n  return a[i] + b[i]\n}\n"
BAD = "kernel add(a: f32[N], b: f32[N]) -> f32[N] {\n  return a[i] + c[i]\n}\n"


def frame(message: Any) -> bytes:
    """``message`` as JSON with its ``Content-Length`` header."""
    body = message if isinstance(message, bytes) else json.dumps(message).encode()
    return b"Content-Length: %d\r\n\r\n%s" % (len(body), body)


class Wire:
    """One server process, spoken to over its stdin and stdout."""

    def __init__(self, command: Sequence[str] = SERVER, cwd: Path | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(list(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, cwd=cwd, env={**os.environ, **(env or {})})
        self.messages: list[dict[str, Any]] = []  # every message read, in order
        self._incoming: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._ids = iter(range(1, 1 << 60))
        self.stderr = b""
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()
        threading.Thread(target=self._drain, args=(self.proc.stderr,), daemon=True).start()

    # ------------------------------------------------------------ the two directions

    def _read(self, out: IO[bytes]) -> None:
        try:
            while True:
                length = None
                while True:
                    line = out.readline()
                    if not line:
                        return
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                    if line in (b"\r\n", b"\n") and length is not None:
                        break
                self._incoming.put(json.loads(out.read(length)))
        finally:
            self._incoming.put(None)

    def _drain(self, err: IO[bytes]) -> None:
        for line in err:
            self.stderr += line

    def write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send(self, message: dict[str, Any]) -> None:
        self.write(frame(message))

    def request(self, method: str, params: Any = None, *, msg_id: Any = None, send: bool = True) -> Any:
        """Send a request (``params`` left out when None); returns its id."""
        msg_id = next(self._ids) if msg_id is None else msg_id
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": method}
        if params is not None:
            message["params"] = params
        if send:
            self.send(message)
        return msg_id

    def notify(self, method: str, params: Any) -> None:
        self.send({"jsonrpc": "2.0", "method": method, "params": params})

    # ------------------------------------------------------------ waiting

    def wait(self, pred: Callable[[dict[str, Any]], bool], timeout: float, what: str = "a message",
             since: int = 0) -> dict[str, Any]:
        """The first message (from index ``since`` on) for which ``pred`` holds; fails after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        seen = since
        while True:
            for m in self.messages[seen:]:
                if pred(m):
                    return m
            seen = len(self.messages)
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {what} in {timeout} s; the server said on stderr:\n"
                                     + self.stderr.decode(errors="replace")[-3000:])
            try:
                m = self._incoming.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            if m is None:
                if self.proc.poll() is None:
                    time.sleep(0.1)
                raise AssertionError(f"the server closed its output (exit {self.proc.poll()}) before {what}:\n"
                                     + self.stderr.decode(errors="replace")[-3000:])
            self.messages.append(m)

    def pump(self, seconds: float) -> None:
        """Read what the server sends for ``seconds`` (into ``messages``)."""
        try:
            self.wait(lambda m: False, seconds, "nothing")
        except AssertionError:
            if self.proc.poll() is not None:
                raise

    def response(self, msg_id: Any, timeout: float = 20) -> dict[str, Any]:
        """The response (result or error) to request ``msg_id``."""
        return self.wait(lambda m: "method" not in m and m.get("id") == msg_id and ("result" in m or "error" in m),
                         timeout, f"response to request {msg_id!r}")

    def call(self, method: str, params: Any = None, timeout: float = 20) -> dict[str, Any]:
        return self.response(self.request(method, params), timeout)

    def diagnostics(self, uri: str, version: int | None = None, timeout: float = 30,
                    since: int = 0) -> list[dict[str, Any]]:
        """The diagnostics published for ``uri`` (at ``version``, when given)."""
        def published(m: dict[str, Any]) -> bool:
            return (m.get("method") == "textDocument/publishDiagnostics" and m["params"]["uri"] == uri
                    and (version is None or m["params"].get("version") == version))
        found = self.wait(published, timeout, f"diagnostics of {uri} version {version}", since)
        return list(found["params"]["diagnostics"])

    # ------------------------------------------------------------ a session

    def initialize(self, options: dict[str, Any] | None = None, root: Path | None = None) -> None:
        answer = self.call("initialize", {"processId": None, "rootUri": root.as_uri() if root else None,
                                          "capabilities": {}, "initializationOptions": options or {}},
                           timeout=60)  # generous: a loaded 2-core machine may take seconds to start
        assert "result" in answer, answer
        self.notify("initialized", {})

    def open(self, uri: str, text: str, version: int = 1) -> None:
        self.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "arke",
                                                              "version": version, "text": text}})

    def change(self, uri: str, text: str, version: int) -> None:
        self.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": version},
                                               "contentChanges": [{"text": text}]})

    def close(self, timeout: float = 10) -> int:
        """Shut the server down as a client does; returns its exit status (kills it past ``timeout``)."""
        try:
            if self.proc.poll() is None:
                self.request("shutdown")
                self.notify("exit", None)
                assert self.proc.stdin is not None
                self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        return self.stop(timeout)

    def stop(self, timeout: float = 10) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"the server did not exit within {timeout} s") from None
