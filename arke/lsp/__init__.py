"""The Arke language server (``akc lsp``): diagnostics, hover, definitions, completion and more for `.ak` files.

:func:`arke.lsp.server.create_server` builds the server; ``akc lsp`` (:mod:`arke.cli.lsp`)
runs it over stdio. The modules:

* ``server`` — the pygls server: document states, debounced checks, the LSP features;
* ``incremental`` — checks a document again after an edit, item by item, reusing what did not change;
* ``index`` — what every name in a document refers to; ``facts`` — types and extents from the checker;
* ``hover``, ``complete``, ``edits`` (quick fixes, formatting, outline) — the features' answers;
* ``convert`` (spans ↔ LSP positions), ``textmap`` (positions across an edit), ``words`` (the language's words).
"""
