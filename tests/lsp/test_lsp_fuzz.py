"""A fuzzer for the language server: random JSON-RPC frames, lengths, params and edits (issue 16).

It drives the real server (``akc lsp``) over stdio for a fixed budget (``ARKE_LSP_FUZZ_SECONDS``,
20 s by default) from a fixed seed (``ARKE_LSP_FUZZ_SEED``), mixing well-formed requests with
nonsense params, notifications that edit, open and close documents, frames whose
``Content-Length`` is short, long or absurd, bodies that are not JSON or not JSON-RPC, junk
between frames, frames written byte by byte and many in one write. It asserts that

* every request the server can tell apart — sent in an intact frame or in one that is too long,
  with an integer or string id — is answered, with a result or an error, under its own id;
* the server stays up, and a valid document opened after all that still gets its diagnostics;
* ``shutdown`` and ``exit`` still end it with status 0.

A failure names the seed and the last steps, so ``ARKE_LSP_FUZZ_SEED=<seed>`` replays it.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from typing import Any

from lsp_wire import BAD, GOOD, Wire, frame

SEED = int(os.environ.get("ARKE_LSP_FUZZ_SEED", "16"))
BUDGET_S = float(os.environ.get("ARKE_LSP_FUZZ_SECONDS", "20"))

REQUESTS = ["textDocument/hover", "textDocument/definition", "textDocument/completion",
            "textDocument/documentSymbol", "textDocument/formatting", "textDocument/codeAction",
            "textDocument/signatureHelp", "textDocument/references", "workspace/symbol", "no/such/method",
            "$/arke.unknown"]
NOTIFICATIONS = ["textDocument/didOpen", "textDocument/didChange", "textDocument/didClose",
                 "textDocument/didSave", "$/cancelRequest", "$/setTrace", "workspace/didChangeConfiguration",
                 "no/such/notification"]
URIS = ["file:///fuzz/a.ak", "file:///fuzz/b.ak", "untitled:Untitled-1", "file:///dev/zero", "file:///fuzz/c%20d.ak",
        "not a uri", ""]
# Pieces of text for documents: valid kernels, errors, odd characters, long and deep lines.
PIECES = [GOOD, BAD, "from std.nn import softmax\n", "kernel k(x: f32[M, N]) -> f32[M, N] {\n  return softmax(x)\n}\n",
          "@strategy(add, target = triton) {\n  tile i = 128\n}\n", "kernel broken(x: f32[N] -> {\n", "é😋\t\r\n",
          "\x00\x01", "  let R = H / G\n", "(" * 300 + "\n", "x" * 2000 + "\n", "}\n", "# comment\n",
          "kernel w(a: f32[N]) -> f32[N] where N in {1, 2, 3} {\n  return a[i]\n}\n"]
# Keys for random JSON (never "id": a body cut short is answered under the one id it shows).
KEYS = ["textDocument", "uri", "position", "line", "character", "range", "start", "end", "text", "version",
        "contentChanges", "context", "diagnostics", "options", "query", "tabSize", "x", ""]


def junk_value(rng: random.Random, depth: int = 0) -> Any:
    """A random JSON value, biased toward what LSP params hold (and what breaks them)."""
    roll = rng.random()
    if depth > 3 or roll < 0.35:
        return rng.choice([None, True, False, 0, -1, 2 ** 31, 2 ** 63, -(2 ** 70), 1.5, float("1e308"), "",
                           "0", "file:///fuzz/a.ak", "é😋", rng.randint(-5, 50), "x" * rng.randint(0, 50)])
    if roll < 0.55:
        return [junk_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(KEYS): junk_value(rng, depth + 1) for _ in range(rng.randint(0, 5))}


def position(rng: random.Random) -> dict[str, Any]:
    pick = rng.choice([lambda: rng.randint(0, 8), lambda: rng.randint(-3, 3), lambda: rng.choice([2 ** 31, 2 ** 63]),
                       lambda: junk_value(rng, 3)])
    return {"line": pick(), "character": rng.choice([pick(), rng.randint(0, 40)])}


def document_text(rng: random.Random) -> str:
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 6)))[:6000]


class Fuzzer:
    """The random steps, and the ids of the requests that must be answered."""

    def __init__(self, rng: random.Random, wire: Wire) -> None:
        self.rng, self.w = rng, wire
        self.expected: set[Any] = set()
        self.steps: list[str] = []
        self.serial = 1_000_000  # apart from the ids of the Wire's own requests
        self.versions: dict[str, int] = {}

    def next_id(self) -> Any:
        self.serial += 1
        return self.serial if self.rng.random() < 0.7 else f"fuzz-{self.serial}"

    def params(self, method: str) -> Any:
        rng = self.rng
        if rng.random() < 0.25:
            return junk_value(rng)
        doc = {"uri": rng.choice(URIS)}
        if method == "textDocument/didOpen":
            return {"textDocument": {**doc, "languageId": "arke", "version": rng.randint(-2, 9),
                                     "text": document_text(rng)}}
        if method == "textDocument/didChange":
            uri = doc["uri"]
            self.versions[uri] = self.versions.get(uri, 1) + 1
            change: dict[str, Any] = {"text": document_text(rng)[:300]}
            if rng.random() < 0.6:
                change["range"] = {"start": position(rng), "end": position(rng)}
            return {"textDocument": {**doc, "version": self.versions[uri]}, "contentChanges": [change]}
        if method == "$/cancelRequest":
            return {"id": rng.randint(1_000_000, self.serial + 1)}
        return {"textDocument": doc, "position": position(rng), "options": {"tabSize": 2, "insertSpaces": True},
                "context": {"diagnostics": [], "includeDeclaration": True}, "query": ""}

    def request(self) -> tuple[bytes, Any]:
        """A request's body (sometimes with broken JSON-RPC fields) and the id it must be answered under."""
        method = self.rng.choice(REQUESTS)
        msg_id = self.next_id()
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": method}
        if self.rng.random() < 0.9:
            message["params"] = self.params(method)
        roll = self.rng.random()
        if roll < 0.05:
            message["jsonrpc"] = self.rng.choice(["1.0", None, 2])
        elif roll < 0.1:
            message["id"] = self.rng.choice([None, 1.5, [1], True])
            msg_id = None  # answered under null: nothing to wait for
        return json.dumps(message).encode(), msg_id

    def notification(self) -> bytes:
        method = self.rng.choice(NOTIFICATIONS)
        return json.dumps({"jsonrpc": "2.0", "method": method, "params": self.params(method)}).encode()

    def step(self) -> None:
        rng, w = self.rng, self.w
        roll = rng.random()
        if roll < 0.3:
            body, msg_id = self.request()
            self._expect(msg_id)
            self._send(frame(body), "request")
        elif roll < 0.55:
            self._send(frame(self.notification()), "notification")
        elif roll < 0.65:  # too long: the server cuts it at the next header, or takes it on a stall
            body, msg_id = self.request()
            self._expect(msg_id)
            self._send(b"Content-Length: %d\r\n\r\n%s" % (len(body) + rng.randint(1, 300), body), "too long")
        elif roll < 0.72:  # too short: a parse error, perhaps under the id; not required
            body, _ = self.request()
            self._send(b"Content-Length: %d\r\n\r\n%s" % (rng.randint(0, len(body) - 1), body), "too short")
        elif roll < 0.76:
            length = rng.choice([b"1" + b"0" * 15, b"9" * rng.randint(13, 3000), b"-1", b"0x10", b""])
            self._send(b"Content-Length: " + length + b"\r\n\r\n" + self.notification(), "absurd length")
        elif roll < 0.82:
            junk = rng.choice([bytes(rng.randrange(256) for _ in range(rng.randint(1, 200))), b"\r\n" * 5,
                               b"Content-Type: x\r\n\r\n", b"{not json}", b"Content-Length: 5\r\n", b"\xff" * 50])
            self._send(junk, "junk")
        elif roll < 0.87:  # a body that is no JSON-RPC message
            body = rng.choice([b"[]", b"null", b"42", b'"s"', b"{", b"\xff\xfe", b"[" * 5000, json.dumps(
                junk_value(rng)).encode()])
            self._send(frame(body), "no message")
        elif roll < 0.93:  # one frame written in pieces
            body, msg_id = self.request()
            self._expect(msg_id)
            data = frame(body)
            cuts = sorted(rng.sample(range(1, len(data)), min(4, len(data) - 1)))
            for a, b in zip([0, *cuts], [*cuts, len(data)]):
                w.write(data[a:b])
                time.sleep(rng.choice([0, 0.001, 0.02]))
            self.steps.append("in pieces")
        else:  # many in one write
            parts = []
            for _ in range(rng.randint(2, 8)):
                body, msg_id = self.request()
                self._expect(msg_id)
                parts.append(frame(body))
            self._send(b"".join(parts), "burst")

    def _expect(self, msg_id: Any) -> None:
        if msg_id is not None:
            self.expected.add(msg_id)

    def _send(self, data: bytes, what: str) -> None:
        self.steps.append(f"{what}: {data[:160]!r}{'...' if len(data) > 160 else ''}")
        self.w.write(data)

    def unanswered(self) -> set[Any]:
        answered = {m.get("id") for m in self.w.messages if "method" not in m and ("result" in m or "error" in m)}
        return self.expected - answered

    def sync(self, timeout: float = 30) -> None:
        """A plain request, answered: the server has read through everything sent before it."""
        answer = self.w.call("textDocument/documentSymbol", {"textDocument": {"uri": "file:///fuzz/sync.ak"}}, timeout)
        assert "result" in answer, answer

    def report(self) -> str:
        return f"seed {SEED}; the last steps:\n" + "\n".join(self.steps[-25:])


def test_the_server_answers_every_request_and_keeps_publishing_diagnostics(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    w = Wire(cwd=tmp_path)
    fuzz = Fuzzer(rng, w)
    try:
        w.initialize({"debounceMs": 5, "checkTimeoutMs": 5000, "formatTimeoutMs": 5000})
        w.open("file:///fuzz/a.ak", GOOD)
        deadline = time.monotonic() + BUDGET_S
        count = 0
        while time.monotonic() < deadline:
            fuzz.step()
            count += 1
            if count % 40 == 0:
                fuzz.sync()
        fuzz.sync()
        end = time.monotonic() + 30
        while fuzz.unanswered() and time.monotonic() < end:
            w.pump(0.5)
        assert not fuzz.unanswered(), f"requests never answered: {sorted(map(str, fuzz.unanswered()))[:20]}; " \
            + fuzz.report()
        # After all that, a valid document still gets its diagnostics.
        since = len(w.messages)
        w.open("file:///fuzz/final-good.ak", GOOD)
        w.open("file:///fuzz/final-bad.ak", BAD)
        assert w.diagnostics("file:///fuzz/final-good.ak", 1, timeout=30, since=since) == [], fuzz.report()
        bad = w.diagnostics("file:///fuzz/final-bad.ak", 1, timeout=30, since=since)
        assert [d["code"] for d in bad] == ["AK2001"], fuzz.report()
        assert w.proc.poll() is None, fuzz.report()
        assert w.close(timeout=20) == 0, fuzz.report()
    finally:
        if w.proc.poll() is None:
            w.proc.kill()
            w.proc.wait()
