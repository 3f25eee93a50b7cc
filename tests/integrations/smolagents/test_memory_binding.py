"""The saved memory blob is signed for the session, user, agent and pause it belongs to: a blob
presented for anyone else is refused before it is unpickled, and the memory is unchanged."""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import TypedDict

import pytest
from smolagents import ToolCallingAgent
from smolagents.monitoring import LogLevel

from effectgate import Keyring
from effectgate.errors import TokenError
from effectgate.testing import Script, call, say
from effectgate_smolagents import (
    Approve,
    AwaitingApproval,
    Finished,
    GatedAgent,
    MissingIdentity,
    restore_memory,
    save_memory,
    table_tools,
)
from effectgate_smolagents.testing import ScriptedModel
from tests.conformance.adapters import REFUND, ShopGate, grant

from ._harness import support_agent


class Who(TypedDict):
    session_id: str
    user_id: str


ADA: Who = {"session_id": "s-ada", "user_id": "u1"}
GRACE: Who = {"session_id": "s-grace", "user_id": "u2"}
ADA_TASK = "Ada here: refund order 1042, my card ends 4242"
GRACE_REFUND = {"order_id": "2001", "amount": 500, "currency": "GBP"}


@dataclass
class Paused:
    out: AwaitingApproval
    blob: bytes


def _pause(shop_gate: ShopGate, keyring: Keyring, who: Who, message_id: str, task: str) -> Paused:
    """One user's run that reads their order and stops at its refund; the memory saved for it."""
    order, refund = ("1042", REFUND) if who is ADA else ("2001", GRACE_REFUND)
    model = ScriptedModel(Script([call("get_order", order_id=order), call("refund_order", **refund)]))
    gated = support_agent(shop_gate.gate, model)
    out = gated.run(task, origin_message_id=message_id, **who)
    assert isinstance(out, AwaitingApproval)
    return Paused(out, save_memory(gated.agent, keyring, awaiting=out, **who))


def _seen(script: Script) -> str:
    return "\n".join(str(m) for messages in script.seen for m in messages)


def test_another_users_memory_is_refused_on_resume(shop_gate: ShopGate) -> None:
    """Grace's resume handed Ada's validly signed blob is refused and changes nothing: her model
    never sees Ada's task or order; her own blob restores and her refund runs once."""
    keyring = Keyring.generate()
    ada = _pause(shop_gate, keyring, ADA, "m3", ADA_TASK)
    grace = _pause(shop_gate, keyring, GRACE, "g1", "Refund 5.00 on order 2001")
    script = Script([say("Done.")])
    later = support_agent(shop_gate.gate, ScriptedModel(script))
    before = list(later.agent.memory.steps)
    with pytest.raises(TokenError, match="another session, user and pause"):
        restore_memory(later.agent, ada.blob, keyring, awaiting=grace.out, **GRACE)
    with pytest.raises(TokenError, match="another session or user"):  # Ada's record with it too
        restore_memory(later.agent, ada.blob, keyring, awaiting=ada.out, **GRACE)
    assert later.agent.memory.steps == before
    restore_memory(later.agent, grace.blob, keyring, awaiting=grace.out, **GRACE)
    [paused] = grace.out.pending
    out = later.resume(grace.out, {paused.approval_id: Approve(grant(shop_gate.gate, paused))})
    assert isinstance(out, Finished)
    seen = _seen(script)
    assert "'status': 'delivered'" in seen  # Grace's order 2001, from her own memory
    assert "4242" not in seen
    assert "1042" not in seen
    assert "'status': 'shipped'" not in seen
    assert shop_gate.shop.receiver.count("refund") == 1


def test_memory_of_another_session_or_agent_is_refused(shop_gate: ShopGate) -> None:
    """The same user's memory from another session, or saved by another gated agent, is refused."""
    keyring = Keyring.generate()
    gated = support_agent(shop_gate.gate, ScriptedModel(Script([say("hi")])))
    assert isinstance(gated.run("hello", origin_message_id="m1", **ADA), Finished)
    blob = save_memory(gated.agent, keyring, **ADA)
    fresh = support_agent(shop_gate.gate, ScriptedModel(Script([])))
    with pytest.raises(TokenError, match="another session"):
        restore_memory(fresh.agent, blob, keyring, session_id="s-ada-2", user_id="u1")
    summarizer = GatedAgent(
        ToolCallingAgent(
            tools=table_tools(shop_gate.gate, agent_id="queue_summarizer"),
            model=ScriptedModel(Script([])),
            verbosity_level=LogLevel.OFF,
        ),
        shop_gate.gate,
        agent_id="queue_summarizer",
    )
    with pytest.raises(TokenError, match="another agent"):
        restore_memory(summarizer.agent, blob, keyring, **ADA)
    assert fresh.agent.memory.steps == []
    assert summarizer.agent.memory.steps == []
    restore_memory(fresh.agent, blob, keyring, **ADA)
    assert len(fresh.agent.memory.steps) == len(gated.agent.memory.steps)


def test_a_pause_blob_is_restored_only_for_its_own_pause(shop_gate: ShopGate) -> None:
    """A blob saved at one pause is refused with another pause's record of the same user and
    session, and without a record; a blob of a run that did not pause is refused with one."""
    keyring = Keyring.generate()
    first = _pause(shop_gate, keyring, ADA, "m3", ADA_TASK)
    model = ScriptedModel(Script([call("refund_order", order_id="1043", amount=3500, currency="GBP")]))
    other = support_agent(shop_gate.gate, model).run("And refund 1043", origin_message_id="m4", **ADA)
    assert isinstance(other, AwaitingApproval)
    fresh = support_agent(shop_gate.gate, ScriptedModel(Script([])))
    with pytest.raises(TokenError, match="another pause"):
        restore_memory(fresh.agent, first.blob, keyring, awaiting=other, **ADA)
    with pytest.raises(TokenError, match="restore it with its AwaitingApproval"):
        restore_memory(fresh.agent, first.blob, keyring, **ADA)
    unpaused = save_memory(fresh.agent, keyring, **ADA)
    with pytest.raises(TokenError, match="run that did not pause"):
        restore_memory(fresh.agent, unpaused, keyring, awaiting=first.out, **ADA)
    assert fresh.agent.memory.steps == []
    restore_memory(fresh.agent, first.blob, keyring, awaiting=first.out, **ADA)
    assert fresh.agent.memory.steps


def test_a_replayed_pause_blob_runs_nothing_twice(shop_gate: ShopGate) -> None:
    """The pause's blob and record presented again after its resume: the refund is served from the
    store (one refund), and the re-issued call gets the stored result."""
    keyring = Keyring.generate()
    ada = _pause(shop_gate, keyring, ADA, "m3", ADA_TASK)
    [paused] = ada.out.pending
    token = grant(shop_gate.gate, paused)
    for script in (Script([say("Refunded.")]), Script([call("refund_order", **REFUND), say("Again?")])):
        later = support_agent(shop_gate.gate, ScriptedModel(script))
        restore_memory(later.agent, ada.blob, keyring, awaiting=ada.out, **ADA)
        out = later.resume(ada.out, {paused.approval_id: Approve(token)})
        assert isinstance(out, Finished)
        script.assert_complete()
    assert shop_gate.shop.receiver.count("refund") == 1


def test_an_unbound_blob_of_the_old_format_is_refused(shop_gate: ShopGate) -> None:
    """A blob of format 1 (signed for no identity, as 0.1 wrote it) is refused with a message
    saying so; nothing is unpickled and the memory is unchanged."""
    keyring = Keyring.generate()
    data = pickle.dumps([], protocol=pickle.HIGHEST_PROTOCOL)
    old = (
        b"effectgate-smolagents-memory/1\n" + keyring.sign("smolagents-memory", data).encode() + b"\n" + data
    )
    fresh = support_agent(shop_gate.gate, ScriptedModel(Script([])))
    with pytest.raises(TokenError, match="old format, signed for no session"):
        restore_memory(fresh.agent, old, keyring, **ADA)
    assert fresh.agent.memory.steps == []


def test_saving_or_restoring_needs_the_identity(shop_gate: ShopGate) -> None:
    """An empty session or user is MissingIdentity; an agent no GatedAgent wraps is a TypeError."""
    keyring = Keyring.generate()
    gated = support_agent(shop_gate.gate, ScriptedModel(Script([])))
    with pytest.raises(MissingIdentity, match="user_id"):
        save_memory(gated.agent, keyring, session_id="s-ada", user_id=" ")
    plain = ToolCallingAgent(tools=[], model=ScriptedModel(Script([])), verbosity_level=LogLevel.OFF)
    with pytest.raises(TypeError, match="GatedAgent"):
        save_memory(plain, keyring, **ADA)
