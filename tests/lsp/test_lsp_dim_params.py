"""The language server on dim parameters and declared shapes: every token of such a program hovers
without a crash, a dim parameter hovers as a dim the caller passes, and a declared shape's dims and
the tensor it declares resolve."""

from __future__ import annotations

from test_parts import hover_at, index_of

from arke.lsp.hover import hover_markdown

PROGRAM = """\
kernel group_norm(x: f32[B, C, L], w: f32[C], G: dim = 4) -> f32[B, C, L] where C % G == 0 {
  let cg = C / G
  xg[n, g, c, l]: f32[B, G, cg, L] = x[n, g * cg + c, l]
  mu[n, g] = mean(xg[n, g, c, l] for c, l)
  return (x[n, ch, l] - mu[n, ch / cg]) * w[ch] + f32(G)
}
"""


def test_every_token_hovers() -> None:
    index = index_of(PROGRAM)
    for at in range(len(PROGRAM)):
        occ = index.at(at)
        if occ is not None:
            hover_markdown(index, occ.symbol, None)


def test_a_dim_parameter_hovers_as_a_dim() -> None:
    index = index_of(PROGRAM)
    assert "a dim parameter of `group_norm`" in hover_at(index, "G: dim")
    assert "a dim parameter of `group_norm`" in hover_at(index, "f32(G)", delta=4)
    assert "G: dim" in hover_at(index, "G, cg, L]")
    assert "a dim parameter" in hover_at(index, "dim = 4")


def test_a_declared_tensor_has_its_declared_type() -> None:
    index = index_of(PROGRAM)
    assert "xg: f32[B, G, C//G, L]" in hover_at(index, "xg[n, g, c, l]:")
    assert "let cg" in hover_at(index, "cg, L]")
