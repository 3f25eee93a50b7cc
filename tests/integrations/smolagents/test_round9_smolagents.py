"""Review round 9 of the smolagents adapter: what a restored memory is judged by."""

from __future__ import annotations

import pytest

from effectgate import Keyring
from effectgate.adapter import DecisionMismatch
from effectgate.testing import Script, call, say
from effectgate_smolagents import Approve, AwaitingApproval, restore_memory, save_memory
from effectgate_smolagents.testing import ScriptedModel
from tests.conformance.adapters import REFUND, ShopGate, grant

from ._harness import support_agent

ADA = {"session_id": "s-ada", "user_id": "u1"}
GRACE = {"session_id": "s-grace", "user_id": "u2"}
GRACE_TASK = "Grace here: refund order 2001, my card ends 4242"
GRACE_REFUND = {"order_id": "2001", "amount": 500, "currency": "GBP"}


def _seen(script: Script) -> str:
    return "\n".join(str(m) for messages in script.seen for m in messages)


def test_a_pause_resumed_in_memory_restored_for_another_user_is_refused(shop_gate: ShopGate) -> None:
    """One worker's agent: Grace's paused run is saved; Ada's run pauses next; then Grace's memory
    is restored into the agent (for Grace's own pause, so it verifies) and Ada's pause is resumed
    in it (the application picked the wrong blob or record). Continuing Ada's run there would
    show Grace's conversation to the model acting for Ada, and carry Ada's run on in it: as for
    memory a run of another user left behind, the resume is refused before anything is decided,
    nothing runs, and Ada's approval stays approved for a resume in her own memory."""
    keyring = Keyring.generate()
    script = Script(
        [
            call("get_order", order_id="2001"),
            call("refund_order", **GRACE_REFUND),
            call("get_order", order_id="1042"),
            call("refund_order", **REFUND),
            say("Done."),
        ]
    )
    gated = support_agent(shop_gate.gate, ScriptedModel(script))
    grace = gated.run(GRACE_TASK, origin_message_id="g1", **GRACE)
    assert isinstance(grace, AwaitingApproval)
    blob = save_memory(gated.agent, keyring, awaiting=grace, **GRACE)
    ada = gated.run("Refund order 1042", origin_message_id="m3", **ADA)
    assert isinstance(ada, AwaitingApproval)
    restore_memory(gated.agent, blob, keyring, awaiting=grace, **GRACE)
    [paused] = ada.pending
    token = grant(shop_gate.gate, paused)
    seen = len(script.seen)
    with pytest.raises(DecisionMismatch, match="another session's or user's conversation"):
        gated.resume(ada, {paused.approval_id: Approve(token)})
    assert shop_gate.shop.receiver.count("refund") == 0
    assert GRACE_TASK not in "\n".join(str(m) for messages in script.seen[seen:] for m in messages)
    row = shop_gate.store.get_approval(paused.approval_id)
    assert row is not None
    assert row.status == "approved"


def test_a_run_continued_in_memory_restored_for_another_user_is_refused(shop_gate: ShopGate) -> None:
    """As above, with Ada's next message continuing the run (`reset=False`) after Grace's memory
    was restored: refused before the model is asked anything (as in memory a run of Grace left)."""
    keyring = Keyring.generate()
    script = Script([call("refund_order", **GRACE_REFUND), say("Hello Ada."), say("Done.")])
    gated = support_agent(shop_gate.gate, ScriptedModel(script))
    grace = gated.run(GRACE_TASK, origin_message_id="g1", **GRACE)
    assert isinstance(grace, AwaitingApproval)
    blob = save_memory(gated.agent, keyring, awaiting=grace, **GRACE)
    gated.run("Hello", origin_message_id="m1", **ADA)
    restore_memory(gated.agent, blob, keyring, awaiting=grace, **GRACE)
    seen = len(script.seen)
    with pytest.raises(ValueError, match="another session's or user's conversation"):
        gated.run("And my refund?", origin_message_id="m2", reset=False, **ADA)
    assert len(script.seen) == seen
