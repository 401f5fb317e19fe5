"""How fast ``akc lsp`` answers an editor: a report, not a test (it never fails the build).

A real client starts the server over stdio (as an editor does), opens a generated
~500-line `.ak` file of many realistic kernels (``check_speed.generate``), then

(a) applies 100 edits, one at a time, each a one-line change that alternately breaks a
    name (an AK2001 error) and fixes it, and times each ``didChange`` to the
    ``publishDiagnostics`` of that version: the raw time an editor waits. Target: p95 under
    100 ms. The breakdown: the server's debounce (``DEBOUNCE_S``: it waits that long after
    the last change, so changes sent together are checked once), the incremental check
    and the conversion to LSP (from the server's log), and the rest (JSON-RPC, pygls,
    scheduling). The full checker alone (``check_text`` in this process) is timed too,
    for reference: what every edit cost before the check was incremental;
(b) the same with edits that break the syntax (an unclosed ``(``) and fix it again;
(c) sends 100 hovers over tensors, indices and kernels spread over the file, twice: the
    first builds the index of the last check (once) and visits each kernel for its types
    (cold), the second is cached (warm).

    .venv/bin/python benchmarks/lsp_speed.py
"""

from __future__ import annotations

import asyncio
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

from lsprotocol import types
from pygls.lsp.client import LanguageClient

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_speed import generate

from arke.lsp.server import DEBOUNCE_S

EDITS = 100
HOVERS = 100
TARGET_S = 0.100
# The server logs how long each check and index build takes (to stderr): the table shows those too.
SERVER = [sys.executable, "-c", "from arke.cli.lsp import main; main()", "--log-level", "info"]


class Client(LanguageClient):
    """A client that notes when each document version's diagnostics arrive."""

    def __init__(self) -> None:
        super().__init__("lsp-speed", "1")
        self.arrived: dict[tuple[str, int | None], float] = {}
        self.log: list[str] = []
        self.events: dict[tuple[str, int | None], asyncio.Event] = {}

        @self.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
        def _published(client: Client, params: types.PublishDiagnosticsParams) -> None:
            key = (params.uri, params.version)
            client.arrived[key] = time.perf_counter()
            client.events.setdefault(key, asyncio.Event()).set()

    async def read_log(self) -> None:
        """Keep the server's stderr (its log lines)."""
        stream = self._server.stderr if self._server else None
        while stream is not None and (line := await stream.readline()):
            self.log.append(line.decode("utf-8", "replace"))

    def logged_ms(self, pattern: str, skip: int = 0) -> list[float]:
        """The durations (in s) the server logged: ``pattern``'s group 1 (milliseconds), in log order."""
        found = [float(m.group(1)) / 1e3 for line in self.log if (m := re.search(pattern, line))]
        return found[skip:]

    async def diagnostics(self, uri: str, version: int) -> float:
        """Wait for the diagnostics of ``uri`` at ``version``; when they arrived."""
        event = self.events.setdefault((uri, version), asyncio.Event())
        await asyncio.wait_for(event.wait(), timeout=60)
        return self.arrived[(uri, version)]


def _percentiles(times: list[float]) -> tuple[float, float]:
    ordered = sorted(times)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return statistics.median(ordered), p95


def _edits(text: str, syntax: bool = False) -> list[tuple[types.Range, str, str]]:
    """One-line edits (range, new text, the text after it): break a name (or, with ``syntax``, the
    syntax: an unclosed bracket), then fix it, over and over."""
    lines = text.split("\n")
    sites = [k for k, line in enumerate(lines) if re.match(r"\s+inv\[m\] = ", line) or " e[m, n] = " in line]
    out = []
    current = text
    for n in range(EDITS):
        k = sites[(n // 2) % len(sites)]
        line = current.split("\n")[k]
        if n % 2 == 0:  # break: `x[` becomes `xx[` (an unknown name) or `(x[` (unclosed)
            col = line.index("= ") + line[line.index("= "):].index("x[")
            new_line = line[:col] + ("(" if syntax else "x") + line[col:]
        else:  # fix it
            new_line = line.replace("(x[" if syntax else "xx[", "x[", 1)
        rng = types.Range(types.Position(k, 0), types.Position(k, len(line)))
        lines_now = current.split("\n")
        lines_now[k] = new_line
        current = "\n".join(lines_now)
        out.append((rng, new_line, current))
    return out


def _hover_sites(text: str) -> list[types.Position]:
    """Positions of tensor uses, indices and kernel names, spread over the file."""
    found = []
    for k, line in enumerate(text.split("\n")):
        for m in re.finditer(r"\b(x|inv|mx|e|s|p|g|u)\[|\bfor (\w)|kernel (\w+)", line):
            found.append(types.Position(k, m.start() + (4 if m.group(2) else 7 if m.group(3) else 0)))
    step = max(1, len(found) // HOVERS)
    return found[::step][:HOVERS]


def checker_alone(text: str, runs: int = 20) -> tuple[float, float]:
    """p50/p95 of ``check_text`` of the whole file, in process: what an edit cost before checks were incremental."""
    from arke.lang.checker import check_text

    check_text(text, "<bench>")  # warm-up: grammar tables, imports
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        check_text(text, "<bench>")
        times.append(time.perf_counter() - start)
    return _percentiles(times)


async def _edit_all(client: Client, uri: str, text: str, first: int, syntax: bool) -> list[float]:
    """Apply ``_edits(text)`` from document version ``first``; each edit's time to its diagnostics."""
    times = []
    for version, (rng, new_line, _) in enumerate(_edits(text, syntax), start=first):
        start = time.perf_counter()
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            [types.TextDocumentContentChangePartial(range=rng, text=new_line)]))
        times.append(await client.diagnostics(uri, version) - start)
    return times


Rows = list[tuple[str, tuple[float, float]]]


def _breakdown(client: Client, raw: list[float], skip: int, label: str) -> Rows:
    """The rows of one run of edits: raw, then what the server logged for each of them."""
    checks = client.logged_ms(r"\bchecked .* in ([0-9.]+) ms \(", skip)[:len(raw)]
    converts = client.logged_ms(r"; converted in ([0-9.]+) ms", skip)[:len(raw)]
    rest = [t - DEBOUNCE_S - c - v for t, c, v in zip(raw, checks, converts)]
    return [
        (f"didChange → publishDiagnostics (raw), {label}", _percentiles(raw)),
        ("  of which: the debounce", (DEBOUNCE_S, DEBOUNCE_S)),
        ("  of which: the incremental check", _percentiles(checks)),
        ("  of which: diagnostics to LSP", _percentiles(converts)),
        ("  of which: the rest (JSON-RPC, pygls, scheduling)", _percentiles(rest)),
    ]


async def run() -> tuple[Rows, int]:
    text = generate()
    alone = checker_alone(text)
    folder = Path(tempfile.mkdtemp(prefix="lsp-speed-"))
    path = folder / "bench.ak"
    path.write_text(text, encoding="utf-8")
    uri = path.as_uri()
    client = Client()
    await client.start_io(*SERVER)
    reader = asyncio.ensure_future(client.read_log())
    await client.initialize_async(types.InitializeParams(
        capabilities=types.ClientCapabilities(), initialization_options={"debounceMs": DEBOUNCE_S * 1000}))
    client.initialized(types.InitializedParams())
    client.text_document_did_open(types.DidOpenTextDocumentParams(types.TextDocumentItem(uri, "arke", 1, text)))
    await client.diagnostics(uri, 1)

    names = await _edit_all(client, uri, text, 2, syntax=False)
    final = _edits(text)[-1][2]
    brackets = await _edit_all(client, uri, final, 2 + EDITS, syntax=True)
    await asyncio.sleep(0.5)  # the last log lines are on their way: this is a report, not a race
    results = _breakdown(client, names, 1, "names")  # the first log line is the open's check
    results.append(("  (for reference: check_text of the whole file, in process)", alone))
    results += _breakdown(client, brackets, 1 + EDITS, "syntax")
    whole = sum(1 for line in client.log if re.search(r"\bchecked .*\(whole: ", line))
    for label in ("hover, first visit of each kernel", "hover, again (cached)"):
        times = []
        answered = 0
        for pos in _hover_sites(final):
            start = time.perf_counter()
            hover = await client.text_document_hover_async(types.HoverParams(types.TextDocumentIdentifier(uri), pos))
            times.append(time.perf_counter() - start)
            answered += hover is not None
        results.append((f"{label} ({answered}/{len(times)} answered)", _percentiles(times)))
    await asyncio.sleep(0.2)
    indexed = client.logged_ms(r"\bindexed .* in ([0-9.]+) ms")
    results.append(("  the index, built for the first hover", _percentiles(indexed)))
    await client.shutdown_async(None)
    client.exit(None)
    await client.stop()
    reader.cancel()
    return results, whole


def main() -> int:
    """Measure and print a table; always returns 0 (a report, not a gate)."""
    from rich.console import Console
    from rich.table import Table

    results, whole = asyncio.run(run())
    lines = generate().count("\n")
    table = Table(title=f"akc lsp speed ({lines}-line file, {EDITS} edits twice, {HOVERS} hovers; "
                        f"server debounce {DEBOUNCE_S * 1e3:.0f} ms; {whole} of {2 * EDITS} edits checked whole)")
    for column in ("measure", "p50", "p95", "target", "within"):
        table.add_column(column, justify="left" if column == "measure" else "right", no_wrap=True)
    for label, (p50, p95) in results:
        gated = "(raw)" in label or label.startswith("hover")
        table.add_row(label, f"{p50 * 1e3:.1f} ms", f"{p95 * 1e3:.1f} ms",
                      f"p95 < {TARGET_S * 1e3:.0f} ms" if gated else "",
                      ("yes" if p95 < TARGET_S else "NO") if gated else "")
    console = Console(highlight=False)
    if not console.is_terminal:
        console.width = 130
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
