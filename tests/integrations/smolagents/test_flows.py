"""smolagents beyond the contract: CodeAgent stops, continuation in another process, re-issued calls,
parallel steps, identity and memory integrity."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from smolagents import ToolCallingAgent

from effectgate import Approver, Keyring, open_store
from effectgate.errors import TokenError
from effectgate.stores.base import from_json
from effectgate.testing import Script, call, say, step
from effectgate_smolagents import (
    Approve,
    AwaitingApproval,
    Deny,
    Finished,
    GatedAgent,
    MissingIdentity,
    UnknownTool,
    restore_memory,
    save_memory,
    table_tools,
)
from effectgate_smolagents.testing import ScriptedModel
from tests._helpers import last_json_line, run_checked, run_module
from tests.conformance.adapters import FINANCE, REFUND, ShopGate, grant

from ._harness import support_agent
from .conftest import MakeSmolHarness

TAGS = {"ticket_id": "t-17", "tags": ["urgent"]}
IDENTITY = {"session_id": "s-ada", "user_id": "u1"}


def test_code_agent_stops_at_the_gated_call(smol_harness: MakeSmolHarness, shop_gate: ShopGate) -> None:
    """One code block: a read, the refund, then a write. The read ran, the refund is pending, the write
    after it never ran; the continuation serves the re-issued refund from the store, once."""
    h = smol_harness(
        Script(
            [
                step(
                    call("get_order", order_id="1042"),
                    call("refund_order", **REFUND),
                    call("update_ticket_tags", **TAGS),
                ),
                step(call("refund_order", **REFUND), call("update_ticket_tags", **TAGS)),
                say("Refunded and tagged."),
            ]
        ),
        kind="code",
    )
    turn = h.send("Refund 1042 and tag my ticket", message_id="m3")
    [paused] = turn.paused
    assert paused.tool == "refund_order"
    assert shop_gate.shop.reads["get_order"] == 1
    assert shop_gate.shop.receiver.count("ticket_tags") == 0  # after the gated call: never ran
    assert shop_gate.shop.receiver.count("refund") == 0
    done = h.approve(paused, grant(shop_gate.gate, paused))
    assert done.paused == ()
    assert shop_gate.shop.receiver.count("refund") == 1  # the re-issued call got the stored result
    assert shop_gate.shop.receiver.count("ticket_tags") == 1
    assert [e.status for e in shop_gate.store.executions() if e.tool == "refund_order"] == ["succeeded"]
    assert len(shop_gate.store.events(kind="proposed")) == 1
    assert isinstance(h.gated.agent.memory.steps[-1].__class__.__name__, str)
    h.script.assert_complete()


def test_soft_return_would_not_stop_a_code_agent(shop_gate: ShopGate) -> None:
    """Why CodeAgent needs the BaseException: a tool that returns normally lets the rest of the code run."""
    from smolagents import CodeAgent, tool
    from smolagents.monitoring import LogLevel

    ran: list[str] = []

    @tool
    def soft(x: int) -> str:
        """Pretend to defer.

        Args:
            x: anything.
        """
        return "DEFERRED"

    @tool
    def after(x: int) -> str:
        """Runs after.

        Args:
            x: anything.
        """
        ran.append("after")
        return "ran"

    model = ScriptedModel(Script([step(call("soft", x=1), call("after", x=2)), say("done")]))
    CodeAgent(tools=[soft, after], model=model, verbosity_level=LogLevel.OFF).run("go")
    assert ran == ["after"]


def test_continuation_in_another_process(tmp_path: Path) -> None:
    """Paused in one process (signed memory + the awaiting record), approved by `effectgate approve`,
    continued in a third with the memory restored: one refund, and a second continuation adds none."""
    db = f"sqlite:///{tmp_path}/effectgate.db"
    env = {**os.environ, "EFFECTGATE_KEYRING": Keyring.generate().dumps()}
    env.pop("EFFECTGATE_APP", None)
    module = "tests.integrations.smolagents._process"
    paused = last_json_line(run_module(module, "pause", "--db", db, "--state", str(tmp_path), env=env))
    [approval_id] = paused["awaiting"]["approval_ids"]
    assert paused["refunds_here"] == 0
    cli = Path(sys.executable).with_name("effectgate")
    token = (
        run_checked(
            [
                str(cli),
                *("--db", db, "--app", "effectgate.examples.shop:app", "approve", approval_id),
                *("--version", "1", "--as", "finance", "--approver", "fiona"),
            ],
            env,
        )
        .strip()
        .splitlines()[-1]
    )
    resumed = last_json_line(
        run_module(module, "resume", "--db", db, "--state", str(tmp_path), "--token", token, env=env)
    )
    assert (resumed["output"], resumed["decided"], resumed["refunds_here"]) == (
        "Refunded 120.00 GBP.",
        ["Executed"],
        1,
    )
    assert resumed["memory_kept"]
    again = last_json_line(
        run_module(module, "resume", "--db", db, "--state", str(tmp_path), "--token", token, env=env)
    )
    assert again["refunds_here"] == 0
    store = open_store(db)
    try:
        assert [(e.tool, e.status) for e in store.executions()] == [("refund_order", "succeeded")]
    finally:
        store.close()


def test_reissued_approved_call_is_served_from_the_store(
    smol_harness: MakeSmolHarness, shop_gate: ShopGate
) -> None:
    """ToolCallingAgent: after the resume the model calls the refund again; it gets the stored result."""
    h = smol_harness(
        Script([call("refund_order", **REFUND), call("refund_order", **REFUND), say("Refunded.")])
    )
    [paused] = h.send("Please refund order 1042", message_id="m3").paused
    turn = h.approve(paused, grant(shop_gate.gate, paused))
    assert [(r.tool, r.ok) for r in turn.results] == [("refund_order", True), ("refund_order", True)]
    assert all("re_1" in r.content for r in turn.results)  # the same refund, not a second one
    assert shop_gate.shop.receiver.count("refund") == 1
    assert len(shop_gate.store.approvals()) == 1
    h.script.assert_complete()


def test_denial_reaches_the_model_and_a_retry_is_refused(
    smol_harness: MakeSmolHarness, shop_gate: ShopGate
) -> None:
    """Denied: the continuation says so; a model that calls again gets the recorded denial, no new card."""
    h = smol_harness(
        Script([call("refund_order", **REFUND), call("refund_order", **REFUND), say("It was denied.")])
    )
    [paused] = h.send("Please refund order 1042", message_id="m3").paused
    turn = h.deny(paused, "delivered in full")
    assert turn.paused == ()
    assert [(r.tool, r.ok) for r in turn.results] == [("refund_order", False), ("refund_order", False)]
    assert "delivered in full" in turn.results[1].content
    assert [r.status for r in shop_gate.store.approvals()] == ["denied"]
    assert shop_gate.shop.receiver.count("refund") == 0
    h.script.assert_complete()


def test_a_failing_call_keeps_its_siblings_results(
    smol_harness: MakeSmolHarness, shop_gate: ShopGate
) -> None:
    """smolagents#2457: one call of a parallel step raises. Through the gate the write's observation is
    kept in memory next to the failure, and the write ran once."""
    h = smol_harness(
        Script([step(call("update_ticket_tags", **TAGS), call("get_order", order_id="9999")), say("ok")])
    )
    turn = h.send("Tag my ticket and look up 9999", message_id="m4")
    assert sorted((r.tool, r.ok) for r in turn.results) == [
        ("get_order", False),
        ("update_ticket_tags", True),
    ]
    [action] = [s for s in h.gated.agent.memory.steps if type(s).__name__ == "ActionStep"][:1]
    assert action.tool_calls is not None
    assert "urgent" in action.observations
    assert shop_gate.shop.receiver.count("ticket_tags") == 1
    assert [(e.tool, e.status) for e in shop_gate.store.executions()] == [("update_ticket_tags", "succeeded")]


def test_two_calls_of_one_gated_tool_in_a_step_register_neither(
    smol_harness: MakeSmolHarness, shop_gate: ShopGate
) -> None:
    half = {**REFUND, "amount": 6000}
    h = smol_harness(
        Script([step(call("refund_order", **half), call("refund_order", **half)), say("One at a time.")])
    )
    turn = h.send("Refund 1042 in halves", message_id="m8")
    assert turn.paused == ()
    assert [(r.tool, r.ok) for r in turn.results] == [("refund_order", False), ("refund_order", False)]
    assert [from_json(e.detail_json)["code"] for e in shop_gate.store.events(kind="refused")] == [
        "parallel_calls",
        "parallel_calls",
    ]
    assert shop_gate.store.approvals() == []


def test_parallel_gated_calls_wait_together(smol_harness: MakeSmolHarness, shop_gate: ShopGate) -> None:
    """A refund and an email in one step: both registered, one AwaitingApproval; decided apart."""
    email = {"to": ["ada@example.com"], "subject": "Refund", "body": "Soon."}
    h = smol_harness(
        Script([step(call("refund_order", **REFUND), call("send_email", **email)), say("Done.")])
    )
    turn = h.send("Refund and email", message_id="m7")
    assert sorted(p.tool for p in turn.paused) == ["refund_order", "send_email"]
    awaiting = h.awaiting
    assert awaiting is not None
    by_tool = {p.card.tool: p for p in awaiting.pending}
    out = h.gated.resume(
        awaiting,
        {
            by_tool["refund_order"].approval_id: Approve(
                grant(
                    shop_gate.gate,
                    turn.paused[0] if turn.paused[0].tool == "refund_order" else turn.paused[1],
                )
            ),
            by_tool["send_email"].approval_id: Deny(Approver("sam", "support_lead"), "no emails"),
        },
    )
    assert isinstance(out, Finished)
    assert shop_gate.shop.receiver.count("refund") == 1
    assert shop_gate.shop.receiver.count("email") == 0


def test_a_gated_tool_outside_a_gated_run_fails_loudly(shop_gate: ShopGate) -> None:
    """Running the wrapped agent directly (no identity) raises MissingIdentity before the model is
    asked; nothing is registered or run."""
    model = ScriptedModel(Script([call("refund_order", **REFUND)]))
    gated = support_agent(shop_gate.gate, model)
    with pytest.raises(MissingIdentity, match=r"run it through its GatedAgent"):
        gated.agent.run("refund 1042")
    assert shop_gate.store.approvals() == []
    assert model.script.seen == []


def test_ids_in_arguments_are_not_identity(smol_harness: MakeSmolHarness, shop_gate: ShopGate) -> None:
    h = smol_harness(Script([call("get_order", order_id="2001"), say("Not yours.")]))
    turn = h.send("Show 2001, I am u2", message_id="m11")
    assert [(r.tool, r.ok) for r in turn.results] == [("get_order", False)]
    assert shop_gate.shop.reads["get_order"] == 0


def test_tampered_memory_is_refused_and_changes_nothing(shop_gate: ShopGate) -> None:
    """A blob with changed bytes, or checked with another keyring, is refused; the memory is unchanged."""
    keyring = Keyring.generate()
    gated = support_agent(shop_gate.gate, ScriptedModel(Script([say("hi")])))
    gated.run("hello", origin_message_id="m1", **IDENTITY)
    blob = save_memory(gated.agent, keyring, **IDENTITY)
    fresh = support_agent(shop_gate.gate, ScriptedModel(Script([])))
    before = list(fresh.agent.memory.steps)
    with pytest.raises(TokenError):
        restore_memory(fresh.agent, blob[:-5] + b"XXXXX", keyring, **IDENTITY)
    with pytest.raises(TokenError):
        restore_memory(fresh.agent, blob, Keyring.generate(), **IDENTITY)
    assert fresh.agent.memory.steps == before
    restore_memory(fresh.agent, blob, keyring, **IDENTITY)
    assert len(fresh.agent.memory.steps) == len(gated.agent.memory.steps)


def test_wrapping_refuses_a_tool_without_a_row(shop_gate: ShopGate) -> None:
    from ._harness import transfer_funds

    with pytest.raises(UnknownTool, match="transfer_funds"):
        GatedAgent(
            ToolCallingAgent(tools=[transfer_funds], model=ScriptedModel(Script([]))),
            shop_gate.gate,
            agent_id="support",
        )
    refund = [t for t in table_tools(shop_gate.gate, agent_id="support") if t.name == "refund_order"]
    with pytest.raises(UnknownTool, match="not allowed"):
        GatedAgent(
            ToolCallingAgent(tools=refund, model=ScriptedModel(Script([]))),
            shop_gate.gate,
            agent_id="queue_summarizer",
        )


def test_the_wrapper_keeps_name_description_and_inputs(shop_gate: ShopGate) -> None:
    tools = table_tools(shop_gate.gate, agent_id="support")
    gated = GatedAgent(
        ToolCallingAgent(tools=tools, model=ScriptedModel(Script([]))), shop_gate.gate, agent_id="support"
    )
    for t in tools:
        wrapped = gated.agent.tools[t.name]
        assert (wrapped.name, wrapped.description, wrapped.inputs, wrapped.output_type) == (
            t.name,
            t.description,
            t.inputs,
            t.output_type,
        )


def test_awaiting_round_trips_through_json(smol_harness: MakeSmolHarness, shop_gate: ShopGate) -> None:
    h = smol_harness(Script([call("refund_order", **REFUND)]))
    h.send("Please refund order 1042", message_id="m3")
    assert h.awaiting is not None
    again = AwaitingApproval.from_dict(json.loads(json.dumps(h.awaiting.to_dict())), shop_gate.gate)
    assert again.approval_ids == h.awaiting.approval_ids
    assert again.origin_message_id == "m3"
    assert again.pending[0].card == h.awaiting.pending[0].card
    assert FINANCE.role == "finance"


def test_the_agents_model_id_is_recorded_with_its_approval_and_execution(
    smol_harness: MakeSmolHarness, shop_gate: ShopGate
) -> None:
    """smolagents names its model (`Model.model_id`): the approval and the execution record it."""
    h = smol_harness(Script([call("refund_order", **REFUND), say("Refunded.")]))
    [paused] = h.send("Please refund order 1042", message_id="m3").paused
    h.approve(paused, grant(shop_gate.gate, paused))
    [approval] = shop_gate.store.approvals()
    assert approval.model_id == "effectgate-scripted"
    assert [(e.tool, e.model_id) for e in shop_gate.store.executions()] == [
        ("refund_order", "effectgate-scripted")
    ]
