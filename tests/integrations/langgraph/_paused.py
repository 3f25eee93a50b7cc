"""Helpers for the paused-call suites (test_paused_call.py, test_signed_payload.py): one
conversation paused on a refund, and what its interrupt and the store say."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langchain_core.messages import ToolMessage
from langgraph.types import Command

from effectgate.testing import Script, call
from tests.conformance.adapters import REFUND, Paused, ShopGate

from ._graph import LangGraphHarness
from .conftest import MakeLangGraphHarness

#: How the model is told that a reviewer changed a call's arguments (effectgate_langgraph._messages).
EDIT_NOTICE = "A reviewer changed the arguments"
#: The refund as an attacker edits it into the checkpoint.
TAMPERED = {**REFUND, "amount": 1}


def paused_refund(make: MakeLangGraphHarness, *later: Any) -> tuple[LangGraphHarness, Paused]:
    """A conversation paused on the refund of 1042 (call-1, message m3); `later`: the next turns."""
    h = make(Script([call("refund_order", id="call-1", **REFUND), *later]))
    [paused] = h.send("Please refund order 1042", message_id="m3").paused
    return h, paused


def only_request(h: LangGraphHarness) -> dict[str, Any]:
    """The one request of the one pending interrupt."""
    [request] = h.interrupt.value["requests"]
    return dict(request)


def tool_messages(h: LangGraphHarness) -> list[ToolMessage]:
    return [m for m in h.messages() if isinstance(m, ToolMessage)]


def told_of_an_edit(h: LangGraphHarness) -> bool:
    """Whether any tool result in the thread, or anything the model was shown, announces an edit."""
    shown = [str(m.content) for seen in h.script.seen for m in seen]
    return any(EDIT_NOTICE in text for text in [*(str(m.content) for m in tool_messages(h)), *shown])


def status_of(shop_gate: ShopGate, approval_id: str) -> tuple[str, int]:
    """The approval's status and version in the store."""
    row = shop_gate.store.get_approval(approval_id)
    assert row is not None
    return row.status, row.version


def assert_answer_refused(h: LangGraphHarness, approval_id: str) -> None:
    """The last answer's decision for `approval_id` arrived and was refused: its refusal is not
    just the step's own note on a mismatch (what the payload repeats when no answer arrived)."""
    [refused] = h.interrupt.value["refused"]
    assert refused["approval_id"] == approval_id
    assert refused["reason"] != only_request(h)["mismatch"]


def plain_resume(decisions: Mapping[str, Mapping[str, Any]]) -> Command[Any]:
    """`Command(resume={approval_id: decision})`: reaches the step even when no interrupt is
    pending (an edited checkpoint starts a new task, whose interrupt id nobody has seen)."""
    return Command(resume={k: dict(v) for k, v in decisions.items()})
