"""`origin_for`'s fallback (arguments that cannot be frozen get an origin from the tool name
alone) raised ArgumentError itself for a client-written tool name holding a lone surrogate, outside
its try block: the MCP call died with a raw error instead of being refused by the gate."""

from __future__ import annotations

from effectgate.mcp._common import Identity, context_for, origin_for


def test_a_tool_name_with_a_lone_surrogate_still_gets_an_origin() -> None:
    bad = "refund\udc80"
    origin = origin_for(bad, {"amount": 1})
    assert origin.startswith("mcp:")
    assert origin.isascii()
    assert origin == origin_for(bad, {"amount": float("nan")})  # the name alone, stable
    assert origin != origin_for("refund", {"amount": 1})
    ctx = context_for(Identity(session_id="s", user_id="u", agent_id="a"), bad, {"amount": 1})
    assert ctx.origin_message_id == origin


def test_the_fallback_origin_of_an_ordinary_name_is_unchanged() -> None:
    from effectgate.canonical import digest

    assert origin_for("refund", {"amount": float("nan")}) == "mcp:" + digest({"tool": "refund"})
