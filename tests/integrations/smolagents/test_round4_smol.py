"""Review round 4 of the smolagents adapter, adversarially: what a CodeAgent's executor keeps
between runs of different users, code that catches the gate's refusal, step callbacks, planning
and managed agents. Each runs in smolagents' real agent loop with a scripted model; effects are
counted at the shop's receiver."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from smolagents import CodeAgent, Tool, ToolCallingAgent, tool
from smolagents.default_tools import FinalAnswerTool
from smolagents.monitoring import LogLevel

from effectgate import read, write
from effectgate.testing import EffectRecorder, Script, call, say
from effectgate_smolagents import AwaitingApproval, Finished, GatedAgent, RunOutcome, table_tools
from effectgate_smolagents.testing import ScriptedCodeModel, ScriptedModel
from tests.conformance.adapters import Paused, ShopGate

from ._harness import support_agent

ADA = {"session_id": "s-ada", "user_id": "u1"}
GRACE = {"session_id": "s-grace", "user_id": "u2"}


def _paused(out: RunOutcome) -> list[Paused]:
    assert isinstance(out, AwaitingApproval), out
    return [Paused(p.approval_id, p.version, p.card.args_hash, p.card.tool) for p in out.pending]


def test_a_code_agent_does_not_hand_one_users_variables_to_the_next_users_run(shop_gate: ShopGate) -> None:
    """Ada's code keeps her order in a variable; the same agent then serves Grace (a new
    conversation, reset). smolagents keeps its executor's variables across runs, so Grace's code
    could print Ada's order (the gate's scope check never sees it): it must not be there."""
    model = ScriptedCodeModel(
        [
            'order = get_order(order_id="1042")\nfinal_answer("Your order has shipped.")',
            "final_answer(str(order))",
            'final_answer("I cannot see that.")',
        ]
    )
    gated = support_agent(shop_gate.gate, model, kind="code")
    ada = gated.run("Where is order 1042?", origin_message_id="m1", **ADA)
    assert isinstance(ada, Finished)

    grace = gated.run("What is in `order`?", origin_message_id="g1", **GRACE)

    assert isinstance(grace, Finished)
    assert grace.output == "I cannot see that."  # `order` was not defined in Grace's run
    assert "12000" not in "\n".join(str(m) for messages in model.seen[1:] for m in messages)
    model.assert_complete()


def test_a_managed_code_agent_does_not_hand_one_users_variables_to_the_next(shop_gate: ShopGate) -> None:
    """The same across a team: the `orders` member (a CodeAgent) keeps Ada's order in a variable
    when her manager run calls it; Grace's manager run calls it next and must not find it."""
    member_model = ScriptedCodeModel(
        [
            'order = get_order(order_id="1042")\nfinal_answer("shipped")',
            "final_answer(str(order))",
            'final_answer("no order")',
        ]
    )
    tools = [t for t in table_tools(shop_gate.gate, agent_id="support") if t.name == "get_order"]
    member = GatedAgent(
        CodeAgent(
            tools=tools,
            model=member_model,
            name="orders",
            description="Looks orders up.",
            verbosity_level=LogLevel.OFF,
            max_steps=3,
        ),
        shop_gate.gate,
        agent_id="support",
    )
    ask = call("orders", task="Look the order up")
    manager_script = Script([ask, say("Ada: done."), ask, say("Grace: done.")])
    manager = GatedAgent(
        ToolCallingAgent(
            tools=[],
            model=ScriptedModel(manager_script),
            managed_agents=[member.agent],
            verbosity_level=LogLevel.OFF,
            max_steps=3,
        ),
        shop_gate.gate,
        agent_id="support",
    )
    assert isinstance(manager.run("Where is 1042?", origin_message_id="m1", **ADA), Finished)

    grace = manager.run("What did the last customer order?", origin_message_id="g1", **GRACE)

    assert isinstance(grace, Finished)
    assert "12000" not in "\n".join(text for _, text in grace.observations)
    assert "12000" not in "\n".join(str(m) for messages in member_model.seen[1:] for m in messages)
    member_model.assert_complete()


def test_the_same_users_next_message_keeps_the_code_variables(shop_gate: ShopGate) -> None:
    """Variables are cleared only for another session or user: Ada's next message reads hers."""
    model = ScriptedCodeModel(
        [
            'order = get_order(order_id="1042")\nfinal_answer("It has shipped.")',
            "final_answer(order['status'])",
        ]
    )
    gated = support_agent(shop_gate.gate, model, kind="code")
    assert isinstance(gated.run("Where is order 1042?", origin_message_id="m1", **ADA), Finished)

    again = gated.run("And its status?", origin_message_id="m2", reset=False, **ADA)

    assert isinstance(again, Finished)
    assert again.output == "shipped"
    model.assert_complete()


CAUGHT = {
    "except_exception": """
        try:
            refund_order(order_id="2001", amount=50000, currency="GBP")
        except Exception as error:
            print(error)
        final_answer("Refund of order 2001 issued.")
        """,
    "bare_except_in_a_loop": """
        for order in ["2001"]:
            try:
                refund_order(order_id=order, amount=50000, currency="GBP")
            except:
                pass
        final_answer("Refund of order 2001 issued.")
        """,
}


@pytest.mark.parametrize("code", CAUGHT.values(), ids=list(CAUGHT))
def test_code_that_catches_a_refusal_cannot_answer_it_done_unread(shop_gate: ShopGate, code: str) -> None:
    """The refund is out of Ada's scope (refused, nothing runs); the code catches the refusal and
    answers that it went through, in the same snippet. The run must not finish on that answer: the
    model reads the refusal first (as the README says of a refusal in a CodeAgent)."""
    model = ScriptedCodeModel([code, 'final_answer("It was refused.")'])
    gated = support_agent(shop_gate.gate, model, kind="code")

    out = gated.run("Refund order 2001", origin_message_id="m1", **ADA)

    assert shop_gate.shop.receiver.count("refund") == 0
    assert isinstance(out, Finished)
    assert out.output == "It was refused."
    model.assert_complete()


class EmailingFinalAnswer(Tool):
    """A final_answer of the user's (gated, with a write row) that emails the answer."""

    name = "final_answer"
    description = FinalAnswerTool.description
    inputs = FinalAnswerTool.inputs
    output_type = "any"

    def __init__(self, receiver: EffectRecorder) -> None:
        super().__init__()
        self.receiver = receiver

    def forward(self, answer: Any) -> Any:
        self.receiver.record("email", answer=answer)
        return answer


@tool
def get_order(order_id: str) -> str:
    """Look up an order.

    Args:
        order_id: The order to look up.
    """
    return f"{order_id}: delivered"


def test_code_that_catches_a_refusal_cannot_send_a_custom_final_answer_unread(tmp_path: Path) -> None:
    """The same with a final_answer of the user's (a write that emails the answer): the claim is
    not emailed; the answer the model gives after reading the refusal is, once."""
    receiver = EffectRecorder()
    code = """
        try:
            get_order(order_id="2001")
        except Exception:
            pass
        final_answer("Order 2001 was delivered.")
        """
    model = ScriptedCodeModel([code, 'final_answer("I cannot look that order up.")'])
    agent = CodeAgent(
        tools=[get_order, EmailingFinalAnswer(receiver)],
        model=model,
        verbosity_level=LogLevel.OFF,
        max_steps=3,
    )
    effects = {"get_order": read(scope=lambda args, ctx: args["order_id"] != "2001"), "final_answer": write()}
    with GatedAgent(agent, effects=effects, db=f"sqlite:///{tmp_path}/effectgate.db") as support:
        out = support.run("Where is order 2001?", origin_message_id="m1", **ADA)

    assert isinstance(out, Finished)
    assert [e.payload["answer"] for e in receiver.effects] == ["I cannot look that order up."]
    model.assert_complete()


def test_a_continued_run_is_not_shown_another_users_conversation(shop_gate: ShopGate) -> None:
    """Grace's run used the agent after Ada's; Ada's next message continues with reset=False. The
    model acting for Ada would read Grace's task and tool results: refused before it is asked."""
    model = ScriptedCodeModel(
        [
            'final_answer("Your order has shipped.")',
            'print(get_order(order_id="2001"))\nfinal_answer("Delivered.")',
            'final_answer("Anything else?")',
        ]
    )
    gated = support_agent(shop_gate.gate, model, kind="code")
    assert isinstance(gated.run("Where is order 1042?", origin_message_id="m1", **ADA), Finished)
    assert isinstance(
        gated.run("Grace: is order 2001 at 9 Elm St?", origin_message_id="g1", **GRACE), Finished
    )

    with pytest.raises(ValueError, match="another session's or user's conversation"):
        gated.run("Thanks", origin_message_id="m2", reset=False, **ADA)

    assert len(model.seen) == 2
    # nothing was changed by the refusal: a fresh run for Ada goes on
    assert isinstance(gated.run("Thanks", origin_message_id="m2", **ADA), Finished)
    assert len(model.seen) == 3


def test_an_agent_gated_already_is_refused_when_wrapped_on_a_gate(shop_gate: ShopGate) -> None:
    """A second GatedAgent over an agent another one gated (a worker re-wrapping a shared agent)
    would run nothing it could name: every call goes to the first one, outside its run, and fails
    with `MissingIdentity` though the identity was given. Refused when wrapped, as with effects=."""
    first = support_agent(shop_gate.gate, ScriptedCodeModel(['final_answer("x")']), kind="code")
    tools = dict(first.agent.tools)

    with pytest.raises(TypeError, match="already gated"):
        GatedAgent(first.agent, shop_gate.gate, agent_id="support")

    assert first.agent.tools == tools
