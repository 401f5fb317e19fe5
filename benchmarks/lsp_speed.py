"""How fast ``akc lsp`` answers an editor: a report, not a test (it never fails the build).

A real client starts the server over stdio (as an editor does), opens a generated
~500-line `.ak` file of many realistic kernels (``check_speed.generate``), then

(a) applies 100 edits, one at a time, each a one-line change that alternately breaks a
    name (an AK2001 error) and fixes it, and times each ``didChange`` to the
    ``publishDiagnostics`` of that version. The server waits for its debounce after the
    last change before it checks (``DEBOUNCE_S``, 150 ms: a typing burst is checked once);
    the table gives the raw time and the time minus the debounce, which is what the
    check, the conversion and the round trip cost. Target: p95 under 100 ms after the
    debounce;
    The checker alone (``check_text`` in this process) is timed too, for reference;
(b) sends 100 hovers over tensors, indices and kernels spread over the file, twice: the
    first visit to a kernel checks it again for its types (cold), the second is cached (warm).

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
SERVER = [sys.executable, "-c", "from arke.cli_lsp import main; main()", "--log-level", "info"]


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

    def logged_ms(self, what: str) -> list[float]:
        """The durations (in s) of the server's ``what`` log lines (``checked``, ``indexed``), after the first."""
        found = [float(m.group(1)) / 1e3 for line in self.log
                 if (m := re.search(rf"\b{what} .* in ([0-9.]+) ms", line))]
        return found[1:]  # the first is the open, not an edit

    async def diagnostics(self, uri: str, version: int) -> float:
        """Wait for the diagnostics of ``uri`` at ``version``; when they arrived."""
        event = self.events.setdefault((uri, version), asyncio.Event())
        await asyncio.wait_for(event.wait(), timeout=60)
        return self.arrived[(uri, version)]


def _percentiles(times: list[float]) -> tuple[float, float]:
    ordered = sorted(times)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return statistics.median(ordered), p95


def _edits(text: str) -> list[tuple[types.Range, str, str]]:
    """One-line edits (range, new text, the text after it): break a name, then fix it, over and over."""
    lines = text.split("\n")
    sites = [k for k, line in enumerate(lines) if re.match(r"\s+inv\[m\] = ", line) or " e[m, n] = " in line]
    out = []
    current = text
    for n in range(EDITS):
        k = sites[(n // 2) % len(sites)]
        line = current.split("\n")[k]
        if n % 2 == 0:  # break: `x[` becomes `xx[` in the line's right side (an unknown name)
            col = line.index("= ") + line[line.index("= "):].index("x[")
            new_line = line[:col] + "x" + line[col:]
        else:  # fix it
            new_line = line.replace("xx[", "x[", 1)
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
    """p50/p95 of ``check_text`` in this process on the file: what no server can go below."""
    from arke.lang.checker import check_text

    check_text(text, "<bench>")  # warm-up: grammar tables, imports
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        check_text(text, "<bench>")
        times.append(time.perf_counter() - start)
    return _percentiles(times)


async def run() -> dict[str, tuple[float, float]]:
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

    changes = []
    for version, (rng, new_line, _) in enumerate(_edits(text), start=2):
        start = time.perf_counter()
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            [types.TextDocumentContentChangePartial(range=rng, text=new_line)]))
        changes.append(await client.diagnostics(uri, version) - start)

    results: dict[str, tuple[float, float]] = {
        "didChange → publishDiagnostics (raw)": _percentiles(changes),
        "didChange → publishDiagnostics − debounce": _percentiles([t - DEBOUNCE_S for t in changes]),
    }
    await asyncio.sleep(0.5)  # the last log lines are on their way: this is a report, not a race
    results["  of which: the check in the server"] = _percentiles(client.logged_ms("checked"))
    results["  (the checker alone, in process, for reference)"] = alone
    results["  then, off the critical path: the index"] = _percentiles(client.logged_ms("indexed"))
    final = _edits(text)[-1][2]
    for label in ("hover, first visit of each kernel", "hover, again (cached)"):
        times = []
        answered = 0
        for pos in _hover_sites(final):
            start = time.perf_counter()
            hover = await client.text_document_hover_async(types.HoverParams(types.TextDocumentIdentifier(uri), pos))
            times.append(time.perf_counter() - start)
            answered += hover is not None
        results[f"{label} ({answered}/{len(times)} answered)"] = _percentiles(times)
    await client.shutdown_async(None)
    client.exit(None)
    await client.stop()
    reader.cancel()
    return results


def main() -> int:
    """Measure and print a table; always returns 0 (a report, not a gate)."""
    from rich.console import Console
    from rich.table import Table

    results = asyncio.run(run())
    lines = generate().count("\n")
    table = Table(title=f"akc lsp speed ({lines}-line file, {EDITS} edits, {HOVERS} hovers; "
                        f"server debounce {DEBOUNCE_S * 1e3:.0f} ms)")
    for column in ("measure", "p50", "p95", "target", "within"):
        table.add_column(column, justify="left" if column == "measure" else "right", no_wrap=True)
    for label, (p50, p95) in results.items():
        gated = ("debounce" in label and "−" in label) or label.startswith("hover")
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
