"""Review round 30, LangGraph adapter: the OpenAI Agents defect of round 30, probed here. The gate
checks a langchain tool's arguments with the tool's own pydantic model before the tool runs
(`_fidelity._check`), but caught only a `ValidationError`, which pydantic makes only of a
validator's `ValueError` or `AssertionError`. A validator raising anything else (a `TypeError`, an
error of its own, a `TimeoutError` from the limit service it reads) escaped as itself before the
tool ran: an approved call was recorded an unknown outcome and paged a person to reconcile what
cannot have happened, and a write whose validator timed out was held for reconciliation too.

The validators read a limit service the test switches off between proposal and execution. The
scripted model drives the real graph (a hand-built loop with `gated_node`, or `create_agent` with
`gated_middleware`); what the model gets is compared with a plain ToolNode or agent over the same
tools; effects are counted at the receiver; every test runs on SQLite and PostgreSQL (`db`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Annotated, Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import BaseTool, StructuredTool, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.prebuilt import ToolNode
from langgraph.types import Command
from pydantic import AfterValidator, BaseModel, field_validator

from effectgate import EffectGate, Grant, Row, money, write
from effectgate.testing import EffectRecorder, Script, call, say
from effectgate_langgraph import approve, gated_middleware, gated_node, resume
from effectgate_langgraph.testing import ScriptedChatModel

from ._fidelity import CONTEXT, Talk, config, seen
from .test_fidelity_errors import FIONA


class LimitLookupFailed(Exception):
    """A validator's own error: not one pydantic turns into a ValidationError."""


class Limits:
    """The limit service the validators read; `fault` is what reading it raises (None: it is up)."""

    def __init__(self) -> None:
        self.fault: Exception | None = None

    def check(self, amount: int) -> int:
        if self.fault is not None:
            raise self.fault
        return amount


#: The one limit service of this module (the annotations below name it; `limits` resets it).
LIMITS = Limits()
Amount = Annotated[int, AfterValidator(LIMITS.check)]


class RefundArgs(BaseModel):
    order_id: str
    amount: int

    @field_validator("amount")
    @classmethod
    def within_limit(cls, value: int) -> int:
        return LIMITS.check(value)


@pytest.fixture(autouse=True)
def limits() -> Iterator[Limits]:
    LIMITS.fault = None
    yield LIMITS
    LIMITS.fault = None


def tools_for(receiver: EffectRecorder) -> list[BaseTool]:
    """`pay` (a `@tool` with an AfterValidator), `refund` (an `args_schema` model with a field
    validator), both money; `note`, a write whose validator reads the same service."""

    @tool
    def pay(order_id: str, amount: Amount) -> str:
        """Pay an amount on an order."""
        receiver.record("pay", order_id=order_id, amount=amount)
        return f"paid {amount}"

    def send_refund(order_id: str, amount: int) -> str:
        receiver.record("refund", order_id=order_id, amount=amount)
        return f"refunded {amount}"

    refund = StructuredTool.from_function(
        send_refund, name="refund", description="Refund an order.", args_schema=RefundArgs
    )

    @tool
    def note(text: str, amount: Amount) -> str:
        """Note an amount on a ticket."""
        receiver.record("note", text=text, amount=amount)
        return f"noted {amount}"

    return [pay, refund, note]


EFFECTS: dict[str, Row] = {
    "pay": money("finance", subject="order_id"),
    "refund": money("finance", subject="order_id"),
    "note": write(),
}
FAULTS: dict[str, Callable[[], Exception]] = {
    "own": lambda: LimitLookupFailed("the limit service could not be read"),
    "type": lambda: TypeError("the limit is not a number"),
    "timeout": lambda: TimeoutError("the limit service did not answer"),
}


@pytest.fixture
def db(keyed_db: str) -> str:
    return keyed_db


def _outcome(make: Callable[[], Any]) -> Any:
    """What the model saw, or the type of the exception that failed the run."""
    try:
        return seen(make())
    except Exception as exc:
        return type(exc)


def _grant(gate: EffectGate, out: Any) -> Command[Any]:
    """Approve the one waiting request as finance: the resume that runs it."""
    [pause] = out.interrupts
    [request] = pause.value["requests"]
    grant = gate.approve(request["approval_id"], version=request["version"], approver=FIONA)
    assert isinstance(grant, Grant)
    return Command(resume={request["approval_id"]: approve(grant.token)})


def _failed_definitely(gate: EffectGate, tool_name: str) -> None:
    assert [(e.status, e.tool) for e in gate.store.executions()] == [("failed", tool_name)]
    assert [r.status for r in gate.store.idempotency_records()] == ["failed"]
    assert gate.store.idempotency_records(status="needs_reconciliation") == []


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("tool_name", ["pay", "refund"])
@pytest.mark.parametrize("flag", [True, None])
def test_a_validator_failing_after_approval_is_a_definite_failure_on_the_node(
    db: str, gates: list[EffectGate], limits: Limits, tool_name: str, fault: str, flag: Any
) -> None:
    """The limit service goes down between proposal and execution: the approved call's validator
    raises before the tool runs. Recorded `failed` (nothing ran), never `needs_reconciliation`; the
    model gets what a plain ToolNode gives it for the same validator error (or the run fails with
    the same exception, under the default flag)."""
    options = {} if flag is None else {"handle_tool_errors": flag}

    def script() -> Script:
        return Script([call(tool_name, order_id="1042", amount=500), say("Could not.")])

    limits.fault = FAULTS[fault]()
    plain = _outcome(lambda: Talk(ToolNode(tools_for(EffectRecorder()), **options), script()).invoke())

    receiver = EffectRecorder()
    limits.fault = None
    node = gated_node(tools_for(receiver), EFFECTS, db=db, **options)
    gates.append(node.gate)
    talk = Talk(node, script())
    resumed = _grant(node.gate, talk.invoke())
    limits.fault = FAULTS[fault]()
    assert _outcome(lambda: talk.invoke(resumed)) == plain
    _failed_definitely(node.gate, tool_name)
    [row] = node.gate.store.approvals()
    assert row.status == "failed"
    assert receiver.count(tool_name) == 0


def _agent_outcome(agent: Any, value: Any) -> Any:
    try:
        out = agent.invoke(value, config(), context=CONTEXT, version="v2")
    except Exception as exc:
        return type(exc)
    return out


@pytest.mark.parametrize("fault", ["own", "timeout"])
@pytest.mark.parametrize("tool_name", ["pay", "note"])
def test_a_failing_validator_is_a_definite_failure_in_create_agent(
    db: str, gates: list[EffectGate], limits: Limits, tool_name: str, fault: str
) -> None:
    """The same on create_agent with `gated_middleware` (the money call after approval, the write
    at once): recorded `failed`, nothing ran, and the run fails with the validator's own error, as
    the plain agent's does."""

    def script() -> Script:
        args = {"order_id": "1042"} if tool_name == "pay" else {"text": "x"}
        return Script([call(tool_name, **args, amount=500), say("Could not.")])

    ask = {"messages": [HumanMessage("pay", id="m1")]}
    limits.fault = FAULTS[fault]()
    plain_agent = create_agent(
        ScriptedChatModel(script=script()), tools=tools_for(EffectRecorder()), checkpointer=InMemorySaver()
    )
    plain = _agent_outcome(plain_agent, ask)
    assert plain is type(limits.fault)

    receiver = EffectRecorder()
    middleware = gated_middleware(tools_for(receiver), EFFECTS, db=db)
    gates.append(middleware.gate)
    agent = create_agent(
        ScriptedChatModel(script=script()), middleware=[middleware], checkpointer=InMemorySaver()
    )
    if tool_name == "pay":
        limits.fault = None
        out = agent.invoke(ask, config(), context=CONTEXT, version="v2")
        [pause] = out.interrupts
        [request] = pause.value["requests"]
        grant = middleware.gate.approve(request["approval_id"], version=request["version"], approver=FIONA)
        assert isinstance(grant, Grant)
        limits.fault = FAULTS[fault]()
        ask = resume({request["approval_id"]: approve(grant.token)}, out.interrupts)
    assert _agent_outcome(agent, ask) is plain
    _failed_definitely(middleware.gate, tool_name)
    assert receiver.count(tool_name) == 0


def test_a_validator_failing_after_approval_under_ainvoke(
    db: str, gates: list[EffectGate], limits: Limits
) -> None:
    """Under ainvoke the approved call's failing validator is a definite failure too."""

    def script() -> Script:
        return Script([call("refund", order_id="1042", amount=500), say("Could not.")])

    receiver = EffectRecorder()
    node = gated_node(tools_for(receiver), EFFECTS, db=db, handle_tool_errors=True)
    gates.append(node.gate)
    talk = Talk(node, script())

    async def both() -> Any:
        resumed = _grant(node.gate, await talk.ainvoke())
        limits.fault = FAULTS["type"]()
        return await talk.ainvoke(resumed)

    [(_, content, status)] = seen(asyncio.run(both()))
    assert (content, status) == (
        "Error: TypeError('the limit is not a number')\n Please fix your mistakes.",
        "error",
    )
    _failed_definitely(node.gate, "refund")
    assert receiver.count("refund") == 0


@pytest.mark.parametrize("tool_name", ["pay", "refund"])
def test_a_validator_failing_at_proposal_stores_the_whole_proposal_and_runs_nothing(
    db: str, gates: list[EffectGate], limits: Limits, tool_name: str
) -> None:
    """The gate proposes on the JSON schema the model is shown, so a validator that would raise
    is not consulted at proposal: the call pauses with its whole proposal stored (one pending
    approval, its arguments as the model sent them, nothing run), where a plain ToolNode fails the
    run; approved while the service is still down, it fails definitely and nothing runs."""
    script = Script([call(tool_name, order_id="1042", amount=500), say("Could not.")])
    receiver = EffectRecorder()
    limits.fault = LimitLookupFailed("down from the start")
    node = gated_node(tools_for(receiver), EFFECTS, db=db, handle_tool_errors=True)
    gates.append(node.gate)
    talk = Talk(node, script)
    out = talk.invoke()
    [row] = node.gate.store.approvals()
    assert (row.status, row.tool) == ("pending", tool_name)
    assert json.loads(row.args_json) == {"order_id": "1042", "amount": 500}
    assert node.gate.store.executions() == []
    [(_, content, status)] = seen(talk.invoke(_grant(node.gate, out)))
    assert status == "error"
    assert "LimitLookupFailed" in str(content)
    _failed_definitely(node.gate, tool_name)
    assert receiver.count(tool_name) == 0


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("flag", [True, None])
def test_a_writes_failing_validator_is_a_definite_failure(
    db: str, gates: list[EffectGate], limits: Limits, fault: str, flag: Any
) -> None:
    """A write runs at once: its validator's error (a timeout from the limit service included,
    which is an unknown outcome when the tool itself raises it) is a definite failure, since the
    tool never ran, and the model gets what a plain ToolNode gives it."""
    options = {} if flag is None else {"handle_tool_errors": flag}

    def script() -> Script:
        return Script([call("note", text="x", amount=5), say("Could not.")])

    limits.fault = FAULTS[fault]()
    plain = _outcome(lambda: Talk(ToolNode(tools_for(EffectRecorder()), **options), script()).invoke())
    receiver = EffectRecorder()
    node = gated_node(tools_for(receiver), EFFECTS, db=db, **options)
    gates.append(node.gate)
    assert _outcome(lambda: Talk(node, script()).invoke()) == plain
    _failed_definitely(node.gate, "note")
    assert receiver.count("note") == 0


def test_arguments_the_validators_accept_still_run_once(
    db: str, gates: list[EffectGate], limits: Limits
) -> None:
    """With the service up the approved call runs once, as before."""
    receiver = EffectRecorder()
    node = gated_node(tools_for(receiver), EFFECTS, db=db)
    gates.append(node.gate)
    talk = Talk(node, Script([call("pay", order_id="1042", amount=40), say("Paid.")]))
    done = talk.invoke(_grant(node.gate, talk.invoke()))
    assert [m.content for m in done.value["messages"] if isinstance(m, ToolMessage)] == ["paid 40"]
    assert [e.status for e in node.gate.store.executions()] == ["succeeded"]
    assert receiver.count("pay", order_id="1042", amount=40) == 1
