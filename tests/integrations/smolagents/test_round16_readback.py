"""Review round 16 of the smolagents adapter, at its read-back boundaries: a saved memory blob, a
saved agent folder, a tool taken from another gated agent, a resume whose continuation cannot
run. Each test reproduced a defect before its fix; effects are counted at the receiver (the
shop's recorder) and the store's records."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from smolagents import CodeAgent, ToolCallingAgent, tool
from smolagents.memory import ActionStep
from smolagents.monitoring import LogLevel
from smolagents.utils import AgentError

from effectgate import Keyring
from effectgate.adapter import UnknownTool
from effectgate.testing import FakeClock, Script, call, say
from effectgate_smolagents import (
    Approve,
    AwaitingApproval,
    Finished,
    GatedAgent,
    GatedTool,
    restore_memory,
    save_memory,
)
from effectgate_smolagents.testing import ScriptedCodeModel, ScriptedModel
from tests.conformance.adapters import REFUND, ShopGate, grant, open_shop_gate

from ._harness import support_agent

ADA = {"session_id": "s-ada", "user_id": "u1"}
REFUND_CODE = 'refund_order(order_id="1042", amount=12000, currency="GBP")'


@pytest.fixture
def shop_on_both(store_url: str, clock: FakeClock) -> Iterator[ShopGate]:
    """The shop's gate on SQLite and on PostgreSQL."""
    with open_shop_gate(store_url, clock) as parts:
        yield parts


def _seen(model: ScriptedModel | ScriptedCodeModel) -> str:
    seen = model.seen if isinstance(model, ScriptedCodeModel) else model.script.seen
    return "\n".join(str(m) for messages in seen for m in messages)


@pytest.mark.parametrize("kind", ["tool_calling", "code"])
def test_a_paused_memory_holding_a_failed_step_restores_in_another_agent(
    shop_on_both: ShopGate, kind: str
) -> None:
    """A run whose first step failed (a bad argument; in a CodeAgent, a refused call) then paused
    at a refund: its memory is saved for the pause. `restore_memory` in another agent (another
    process) raised a raw TypeError after the MAC verified: smolagents' `AgentError` on the failed
    step takes a logger its pickle does not carry, so such a blob could never be restored, and
    the paused run's conversation was lost. It must restore (the failed step with its error),
    and the resume runs the refund once, with the model shown the earlier error."""
    shop, keyring = shop_on_both, Keyring.generate()
    first: ScriptedModel | ScriptedCodeModel
    later: ScriptedModel | ScriptedCodeModel
    if kind == "code":
        first = ScriptedCodeModel(['get_order(order_id="1042", note="x")', REFUND_CODE])
        later = ScriptedCodeModel(['final_answer("Refunded.")'])
    else:
        first = ScriptedModel(Script([call("get_order", order_id=1042), call("refund_order", **REFUND)]))
        later = ScriptedModel(Script([say("Refunded.")]))
    gated = support_agent(shop.gate, first, kind=kind)
    out = gated.run("Refund order 1042", origin_message_id="m3", **ADA)
    assert isinstance(out, AwaitingApproval)
    failed = gated.agent.memory.steps[1].error
    assert isinstance(failed, AgentError)
    blob = save_memory(gated.agent, keyring, awaiting=out, **ADA)

    other = support_agent(shop.gate, later, kind=kind)
    restore_memory(other.agent, blob, keyring, awaiting=out, **ADA)
    back = other.agent.memory.steps[1].error
    assert type(back) is type(failed)
    assert (back.message, str(back)) == (failed.message, str(failed))
    [paused] = out.pending
    done = other.resume(out, {paused.approval_id: Approve(grant(shop.gate, paused))})
    assert isinstance(done, Finished)
    assert shop.shop.receiver.count("refund") == 1
    shown = "Additional properties are not allowed" if kind == "code" else "1042 is not of type"
    assert shown in failed.message
    assert shown in _seen(later)  # the restored conversation, its error included


@pytest.mark.parametrize("kind", [ToolCallingAgent, CodeAgent])
def test_an_agent_of_table_tools_saves_and_pauses_once_wrapped_again(
    shop_on_both: ShopGate, kind: type[ToolCallingAgent | CodeAgent], tmp_path: Path
) -> None:
    """The README promises `agent.save(folder)` works on a gated agent, and shows `table_tools`
    as the way to build one from an effect table. Saving such an agent raised ValueError
    (smolagents' tool validation: the row tool's `forward` named `EffectGateError` and `spec`
    from outside its own code). It must save; loaded back, its tools are plain and refuse to
    run; wrapped again on the gate, the refund pauses and runs once after approval."""
    shop = shop_on_both
    gated = support_agent(shop.gate, ScriptedModel(Script([])), kind="code" if kind is CodeAgent else "tools")
    gated.agent.save(tmp_path / "saved")
    assert (tmp_path / "saved" / "tools" / "refund_order.py").read_text().startswith("# effectgate:")
    model = ScriptedModel(Script([call("refund_order", **REFUND), say("Refunded.")]))
    loaded = kind.from_folder(tmp_path / "saved", model=model)
    assert not any(isinstance(t, GatedTool) for t in loaded.tools.values())
    with pytest.raises(Exception, match="runs only through effectgate"):
        loaded.tools["refund_order"](**REFUND)
    gated = GatedAgent(loaded, shop.gate, agent_id="support", unknown="refuse")
    out = gated.run("Refund order 1042", origin_message_id="m3", **ADA)
    assert isinstance(out, AwaitingApproval)
    assert shop.shop.receiver.count("refund") == 0
    [paused] = out.pending
    done = gated.resume(out, {paused.approval_id: Approve(grant(shop.gate, paused))})
    assert isinstance(done, Finished)
    assert shop.shop.receiver.count("refund") == 1


def test_another_gated_agents_tools_are_refused_when_wrapped_and_when_added(shop_on_both: ShopGate) -> None:
    """Two agents share one gate; the second was built from the first's tools
    (`first.agent.tools.values()`, or one added later). Those `GatedTool`s call back the first
    `GatedAgent`, so the second's calls ran with the first's run identity: with Ada's run in
    progress, Grace's refund was recorded in Ada's session (outside one, her run failed with a
    confusing MissingIdentity). Wrapping such an agent must refuse (TypeError), and a run of an
    agent given one after wrapping is refused before its model is asked: nothing runs."""
    shop = shop_on_both
    first = support_agent(shop.gate, ScriptedModel(Script([])))
    script = Script([call("update_ticket_tags", ticket_id="t-17", tags=["urgent"]), say("Tagged.")])
    shared = ToolCallingAgent(
        tools=list(first.agent.tools.values()), model=ScriptedModel(script), verbosity_level=LogLevel.OFF
    )
    with pytest.raises(TypeError, match="another GatedAgent"):
        GatedAgent(shared, shop.gate, agent_id="support", unknown="refuse")

    second = support_agent(shop.gate, ScriptedModel(script))
    second.agent.tools["update_ticket_tags"] = first.agent.tools["update_ticket_tags"]
    with pytest.raises(UnknownTool, match="update_ticket_tags"):
        second.run("Tag t-17", session_id="s-grace", origin_message_id="g1", user_id="u2")
    assert script.remaining == 2  # the model was never asked
    assert shop.shop.receiver.count("ticket_tags") == 0
    assert shop.store.idempotency_records() == []


@tool
def note_plainly(text: str) -> str:
    """Keep a note (a plain tool, never wrapped).

    Args:
        text: the note.
    """
    raise AssertionError("note_plainly must never run")


def _paused_on_refund(shop: ShopGate, *later: str) -> tuple[GatedAgent, AwaitingApproval, str]:
    """Ada's run stopped at the refund, and finance's grant for it."""
    script = Script([call("refund_order", **REFUND), *(say(text) for text in later)])
    gated = support_agent(shop.gate, ScriptedModel(script))
    out = gated.run("Refund order 1042", origin_message_id="m3", **ADA)
    assert isinstance(out, AwaitingApproval)
    return gated, out, grant(shop.gate, out.pending[0])


def _status(shop: ShopGate, approval_id: str) -> str:
    return {a.id: a.status for a in shop.store.approvals()}[approval_id]


def test_a_resume_that_cannot_continue_is_refused_before_the_approved_call_runs(
    shop_on_both: ShopGate,
) -> None:
    """A tool was added to the paused agent after it was wrapped, so its runs are refused
    (`UnknownTool`, before the model is asked). `resume` executed the approved refund first and
    only then raised, as the continued run was refused: the application was told the resume
    failed while the money had moved. The resume must be refused before anything is decided;
    once the agent is runnable again, it runs the refund once and continues."""
    shop = shop_on_both
    gated, out, token = _paused_on_refund(shop, "Refunded.")
    [paused] = out.pending
    gated.agent.tools["note_plainly"] = note_plainly  # after wrapping: its runs are refused
    with pytest.raises(UnknownTool, match="note_plainly"):
        gated.resume(out, {paused.approval_id: Approve(token)})
    assert shop.shop.receiver.count("refund") == 0
    assert _status(shop, paused.approval_id) == "approved"  # decided by finance, not run
    del gated.agent.tools["note_plainly"]
    done = gated.resume(out, {paused.approval_id: Approve(token)})
    assert isinstance(done, Finished)
    assert shop.shop.receiver.count("refund") == 1


def test_a_resume_while_the_agent_runs_is_refused_before_the_approved_call_runs(
    shop_on_both: ShopGate,
) -> None:
    """Finance's approval arrives while the same agent runs Ada's next message (one agent, two
    requests). `resume` ran the refund, then raised RuntimeError ("already running") for the
    continuation. It must raise before anything is decided; after the run, the resume runs
    the refund once."""
    shop = shop_on_both
    gated, out, token = _paused_on_refund(shop, "Anything else?", "Refunded.")
    [paused] = out.pending
    raised: list[BaseException] = []

    def approval_arrives(step: ActionStep) -> None:
        if raised:
            return
        try:
            gated.resume(out, {paused.approval_id: Approve(token)})
        except RuntimeError as exc:
            raised.append(exc)

    gated.agent.step_callbacks.register(ActionStep, approval_arrives)
    gated.run("Thanks", origin_message_id="m4", **ADA)
    assert [type(e) for e in raised] == [RuntimeError]
    assert shop.shop.receiver.count("refund") == 0
    assert _status(shop, paused.approval_id) == "approved"
    done = gated.resume(out, {paused.approval_id: Approve(token)})
    assert isinstance(done, Finished)
    assert shop.shop.receiver.count("refund") == 1


@pytest.mark.parametrize(
    "ended_on",
    [
        "def total(amounts):\n    return sum(amounts)",  # a helper for later steps
        "pending = (x for x in range(3))\npending",
        "import queue\nq = queue.Queue()\nq",
    ],
)
def test_a_paused_code_agents_memory_saves_whatever_a_code_block_ended_on(
    shop_on_both: ShopGate, ended_on: str
) -> None:
    """smolagents keeps, on each CodeAgent step, the value its code block ended on
    (`action_output`): a function the model defined for later steps, a generator, a queue.
    `save_memory` of such a paused run raised a raw pickling error (AttributeError or TypeError),
    so the run could not be moved to another process. The value is never shown to the model: the
    blob keeps its text instead, the live memory keeps the value, the restored agent's model is
    shown the same conversation, and the resume runs the refund once."""
    shop, keyring = shop_on_both, Keyring.generate()
    gated = support_agent(shop.gate, ScriptedCodeModel([ended_on, REFUND_CODE]), kind="code")
    out = gated.run("Refund order 1042", origin_message_id="m3", **ADA)
    assert isinstance(out, AwaitingApproval)
    value = gated.agent.memory.steps[1].action_output
    blob = save_memory(gated.agent, keyring, awaiting=out, **ADA)
    assert gated.agent.memory.steps[1].action_output is value  # the live memory is unchanged

    later = ScriptedCodeModel(['final_answer("Refunded.")'])
    other = support_agent(shop.gate, later, kind="code")
    restore_memory(other.agent, blob, keyring, awaiting=out, **ADA)
    kept = other.agent.memory.steps[1].action_output
    assert isinstance(kept, str)
    assert type(value).__name__ in kept
    shown = other.agent.write_memory_to_messages(), gated.agent.write_memory_to_messages()
    assert shown[0] == shown[1]
    [paused] = out.pending
    done = other.resume(out, {paused.approval_id: Approve(grant(shop.gate, paused))})
    assert isinstance(done, Finished)
    assert shop.shop.receiver.count("refund") == 1
