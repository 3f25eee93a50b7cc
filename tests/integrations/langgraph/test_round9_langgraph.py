"""Review round 9 of the LangGraph adapter: values read back from a resume or a checkpoint."""

from __future__ import annotations

import math
from typing import Any

import pytest

from effectgate.testing import Script, call, say
from tests.conformance.adapters import EMAIL, ShopGate

from .conftest import MakeLangGraphHarness


@pytest.mark.parametrize("bad", [[math.nan], [{"a", "b"}]], ids=["nan", "set"])
def test_an_edit_whose_subject_is_no_json_value_is_refused_not_raised(
    node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate, bad: Any
) -> None:
    """A reviewer's edit (a resume value) whose subject list holds what JSON cannot carry is an
    answer the step refuses in its next payload, as any edit it cannot apply: the graph run does
    not crash with the core's ArgumentError, the approval stays pending at its version, nothing
    is sent, and the reviewer can still answer the same pause."""
    h = node_or_agent(Script([call("send_email", **EMAIL), say("Sent.")]))
    [paused] = h.send("email me", message_id="m1").paused
    turn = h.decide({paused.approval_id: {"type": "edit", "args": {**EMAIL, "to": bad}}})
    [again] = turn.paused
    assert (again.approval_id, again.version) == (paused.approval_id, 1)
    [refused] = h.interrupt.value["refused"]
    assert refused["approval_id"] == paused.approval_id
    assert "JSON" in refused["reason"]
    row = shop_gate.store.get_approval(paused.approval_id)
    assert row is not None
    assert (row.status, row.version) == ("pending", 1)
    assert shop_gate.shop.receiver.count("email") == 0
    h.deny(again, "not now")
    row = shop_gate.store.get_approval(paused.approval_id)
    assert row is not None
    assert row.status == "denied"
