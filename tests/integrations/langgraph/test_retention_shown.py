"""Retention keeps the record of what an interrupt showed while any call it showed is open: an
`unclassified` rule (the events that name no effect) used to erase it, and the reviewer's
HumanInTheLoopMiddleware answer to that interrupt was then refused. Once the call is decided and
run, the record is erased like any other."""

from __future__ import annotations

from effectgate.redact import is_redacted, retain
from effectgate.testing import FakeClock, say
from effectgate_langgraph._shown import SHOWN
from tests.conformance.adapters import ShopGate

from ._paused import paused_refund, status_of
from .conftest import MakeLangGraphHarness
from .test_answer_provenance import with_finance
from .test_hitl_decisions import APPROVE, hitl


def _shown_details(shop_gate: ShopGate) -> list[str]:
    return [e.detail_json for e in shop_gate.store.events(kind=SHOWN)]


def test_retention_keeps_an_open_calls_interrupt_record_and_its_answer_applies(
    node_or_agent: MakeLangGraphHarness, shop_gate: ShopGate, clock: FakeClock
) -> None:
    """Paused on the refund of 1042; `retain(unclassified=0)` leaves the interrupt's record (it
    lists the pending approval), so `{"decisions": [approve]}` runs the refund once; a later pass
    erases the record of the call now executed."""
    h, paused = paused_refund(with_finance(node_or_agent), say("Refunded."))
    gate = shop_gate.gate
    assert _shown_details(shop_gate)
    retain(shop_gate.store, gate.keyring, {"unclassified": 0}, by="nightly", now=clock.now() + 1)
    assert not any(is_redacted(d) for d in _shown_details(shop_gate))
    turn = h.invoke(hitl(APPROVE))
    assert turn.paused == ()
    assert shop_gate.shop.receiver.count("refund", order_id="1042") == 1
    assert status_of(shop_gate, paused.approval_id) == ("executed", 1)
    clock.advance(60)
    retain(shop_gate.store, gate.keyring, {"unclassified": 0}, by="nightly", now=clock.now())
    assert all(is_redacted(d) for d in _shown_details(shop_gate))
