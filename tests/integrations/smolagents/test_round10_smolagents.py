"""Review round 10 of the smolagents adapter. Each test reproduced a defect before its fix; effects
are counted at the receiver (a counter in the tool)."""

from __future__ import annotations

import json

import pytest
from smolagents import CodeAgent, ToolCallingAgent
from smolagents.monitoring import LogLevel

from effectgate.adapter import TamperedState
from effectgate.testing import Script, call, say
from effectgate_smolagents import AwaitingApproval, Finished, GatedAgent, table_tools
from effectgate_smolagents.testing import ScriptedCodeModel, ScriptedModel
from tests.conformance.adapters import REFUND, ShopGate

from ._harness import support_agent


def _paused(shop_gate: ShopGate) -> AwaitingApproval:
    script = Script([call("refund_order", **REFUND), say("Done.")])
    gated = support_agent(shop_gate.gate, ScriptedModel(script))
    out = gated.run("Refund order 1042", session_id="s-ada", origin_message_id="m3", user_id="u1")
    assert isinstance(out, AwaitingApproval)
    return out


@pytest.mark.parametrize("version", ["1e999", "-1e999"], ids=["inf", "-inf"])
def test_a_stored_record_with_an_infinite_version_is_tampered_state(
    shop_gate: ShopGate, version: str
) -> None:
    """A stored `AwaitingApproval` record (JSON) edited so that a paused call's version reads
    `1e999` (which JSON parses as infinity): `from_dict` refuses it as an edited record
    (`TamperedState`), as it does any other malformed field, not with a raw `OverflowError`."""
    out = _paused(shop_gate)
    stored = json.dumps(out.to_dict())
    data = json.loads(stored.replace('"version": 1', f'"version": {version}'))
    assert data["paused"][0]["version"] in (float("inf"), float("-inf"))
    with pytest.raises(TamperedState):
        AwaitingApproval.from_dict(data, shop_gate.gate)
    assert shop_gate.shop.receiver.count("refund") == 0


ADA = {"session_id": "s-ada", "user_id": "u1"}
GRACE = {"session_id": "s-grace", "user_id": "u2"}
ADA_TASK = "Ada here: look up my order 1042, my card ends 4242"


@pytest.mark.parametrize(
    "peek",
    ["str(orders.memory.steps)", "orders.task", "str(orders.memory.get_full_steps())"],
    ids=["memory", "task", "full-steps"],
)
def test_manager_code_cannot_read_a_members_run_for_another_user(shop_gate: ShopGate, peek: str) -> None:
    """One worker's team: a CodeAgent manager and its gated member `orders`. Ada's run has the
    manager call the member with her task (her card number in it). Grace's run next (another
    session and user): her manager's code is handed the member object itself and reads what the
    member kept of Ada's run (its memory, its task). As for the memory and code variables a run
    of another user leaves in the agent itself (`forget_others`), Grace's run must not see Ada's
    conversation: her final answer does not carry it."""
    member_script = Script([call("get_order", order_id="1042"), say("Order 1042 has shipped.")])
    member = GatedAgent(
        ToolCallingAgent(
            tools=[t for t in table_tools(shop_gate.gate, agent_id="support") if t.name == "get_order"],
            model=ScriptedModel(member_script),
            name="orders",
            description="The orders team member.",
            verbosity_level=LogLevel.OFF,
            max_steps=3,
        ),
        shop_gate.gate,
        agent_id="support",
    )
    code = ScriptedCodeModel([f"final_answer(orders(task={ADA_TASK!r}))", f"final_answer({peek})"])
    manager = GatedAgent(
        CodeAgent(
            tools=[], model=code, managed_agents=[member.agent], verbosity_level=LogLevel.OFF, max_steps=3
        ),
        shop_gate.gate,
        agent_id="support",
    )
    ada = manager.run("Look up my order", origin_message_id="m1", **ADA)
    assert isinstance(ada, Finished)
    assert shop_gate.shop.reads["get_order"] == 1

    grace = manager.run("What did the last customer ask?", origin_message_id="g1", **GRACE)

    assert isinstance(grace, Finished)
    assert "4242" not in str(grace.output)
