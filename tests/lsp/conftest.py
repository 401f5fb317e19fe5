"""Fixtures for the language-server tests: a real client talking to ``akc lsp`` over stdio.

The server runs in its own process, started as an editor would start it. The client keeps
every ``publishDiagnostics`` it receives (pytest-lsp's client keeps only the latest per
document), so tests can wait for the diagnostics of one document version.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import pytest_lsp
from lsprotocol import types
from pygls.protocol import default_converter
from pytest_lsp import ClientServerConfig, LanguageClient
from pytest_lsp.client import DEFAULT_CLIENT_FEATURES, register_lsp_features

SERVER = [sys.executable, "-c", "from arke.cli.lsp import main; main()"]


def _record(client: LanguageClient, params: types.PublishDiagnosticsParams) -> None:
    client.diagnostics[params.uri] = params.diagnostics
    client.published.append(params)  # type: ignore[attr-defined]


def make_client() -> LanguageClient:
    """pytest-lsp's test client, also keeping every publishDiagnostics it receives."""
    client = LanguageClient(converter_factory=default_converter)
    register_lsp_features(client, {**DEFAULT_CLIENT_FEATURES, types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS: _record})
    client.published = []  # type: ignore[attr-defined]
    return client


async def initialize(client: LanguageClient, debounce_ms: int) -> None:
    await client.initialize_session(types.InitializeParams(
        capabilities=types.ClientCapabilities(
            general=types.GeneralClientCapabilities(position_encodings=[types.PositionEncodingKind.Utf16]),
            text_document=types.TextDocumentClientCapabilities(  # as VS Code declares them
                publish_diagnostics=types.PublishDiagnosticsClientCapabilities(related_information=True,
                                                                               version_support=True),
                hover=types.HoverClientCapabilities(content_format=[types.MarkupKind.Markdown]),
                completion=types.CompletionClientCapabilities(completion_item=types.ClientCompletionItemOptions(
                    documentation_format=[types.MarkupKind.Markdown, types.MarkupKind.PlainText])),
            ),
        ),
        initialization_options={"debounceMs": debounce_ms},
    ))


@pytest_lsp.fixture(scope="module", config=ClientServerConfig(server_command=SERVER, client_factory=make_client))
async def client(lsp_client: LanguageClient) -> Any:
    """A server with a short debounce, shared by a test module (each test opens its own files)."""
    await initialize(lsp_client, debounce_ms=20)
    yield
    await lsp_client.shutdown_session()


@pytest_lsp.fixture(scope="module", config=ClientServerConfig(server_command=SERVER, client_factory=make_client))
async def slow_client(lsp_client: LanguageClient) -> Any:
    """A server whose debounce (1 s) is long next to the time to send a few changes."""
    await initialize(lsp_client, debounce_ms=1000)
    yield
    await lsp_client.shutdown_session()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("lsp")
