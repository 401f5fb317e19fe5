// Starts `akc lsp` over stdio for .ak files: everything else is the server's job.
"use strict";
const vscode = require("vscode");
const { LanguageClient, TransportKind } = require("vscode-languageclient/node");

let client;

function activate(context) {
  const settings = vscode.workspace.getConfiguration("arke");
  const [command, ...args] = settings.get("server.command", ["akc", "lsp"]);
  const server = { command, args, transport: TransportKind.stdio };
  client = new LanguageClient("arke", "Arke (akc lsp)", server, {
    documentSelector: [{ scheme: "file", language: "arke" }, { scheme: "untitled", language: "arke" }],
    initializationOptions: { debounceMs: settings.get("server.debounceMs", 30) },
  });
  context.subscriptions.push(client);
  return client.start();
}

function deactivate() {
  return client ? client.stop() : undefined;
}

module.exports = { activate, deactivate };
