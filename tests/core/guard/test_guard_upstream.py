"""A result a guard already handled (the peer's shim, in process or across a pipe) is not handled twice: its cut is
not cut again for the notices it carries, and its padding notice is not repeated."""

from __future__ import annotations

from mcp_token_otel.core.guard import GuardEngine, GuardSettings
from mcp_token_otel.core.measure import Policy


def chars4(text: str) -> int:
    return (len(text) + 3) // 4


def engine(**settings: object) -> GuardEngine:
    return GuardEngine(GuardSettings(mode="enforce", **settings), Policy(estimator=chars4, estimator_name="chars/4"))


def text_result(text: str) -> dict[str, object]:
    return {"content": [{"type": "text", "text": text}], "isError": False}


def test_cut_result_is_not_cut_again() -> None:
    server, client = engine(max_response_tokens=50), engine(max_response_tokens=50)
    original = text_result(" ".join(f"word{i}" for i in range(400)))
    cut = server.on_result("tools/call", original, tool="t").result
    assert cut is not original and len(cut["content"]) == 2  # the kept text and the notice
    again = client.on_result("tools/call", cut, tool="t")
    assert again.result is cut and again.actions == ()


def test_a_larger_result_is_still_cut() -> None:
    """A notice block does not exempt a result whose other blocks are over the cap."""
    server, client = engine(max_response_tokens=500), engine(max_response_tokens=50)
    cut = server.on_result("tools/call", text_result(" ".join(f"w{i}" for i in range(2000))), tool="t").result
    again = client.on_result("tools/call", cut, tool="t")
    assert again.result is not cut and [a.policy for a in again.actions] == ["response_cap"]


def test_padding_notice_is_not_repeated() -> None:
    server, client = engine(), engine()
    noticed = server.on_result("tools/call", text_result("x" + "\u200b" * 10), tool="t").result
    assert noticed["content"][0]["text"].startswith("[mcp-token-otel security notice:")
    again = client.on_result("tools/call", noticed, tool="t")
    assert again.result is noticed
    assert [(a.policy, a.action) for a in again.actions] == [("padding", "found")]


def test_padded_and_cut_result_is_not_cut_again() -> None:
    """A cut result that also got a padding notice (first block) and a truncation notice (last block)."""
    server, client = engine(max_response_tokens=50), engine(max_response_tokens=50)
    original = text_result("\u200b" * 10 + " ".join(f"word{i}" for i in range(400)))
    cut = server.on_result("tools/call", original, tool="t").result
    assert len(cut["content"]) == 3
    again = client.on_result("tools/call", cut, tool="t")
    assert again.result is cut
