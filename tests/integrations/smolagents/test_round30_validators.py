"""Review round 30, smolagents adapter: the OpenAI Agents defect of round 30, probed here.

smolagents has no argument model: a tool's arguments reach its `forward` as the gate froze them,
so a check of them is the tool's body, whose error after approval is an unknown outcome unless
the row lists it (`definite_failures`), as for any gated tool (not a defect; pinned below). What
does run before the body is the tool's `setup()` (the adapter runs it before the first call): a
setup raising after approval (the limit service it reads is down) was recorded an unknown outcome
and paged a person to reconcile a call whose `forward` never ran, and a write's setup timing out
was held for reconciliation too. Now it is a definite failure, shown as smolagents shows it.

The scripted model drives smolagents' real agents; effects are counted at the receiver; every
test runs on SQLite and PostgreSQL (`store_url`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from smolagents import CodeAgent, Tool, ToolCallingAgent
from smolagents.agents import MultiStepAgent
from smolagents.memory import ActionStep
from smolagents.monitoring import LogLevel

from effectgate import EffectGate, Keyring, Refused, Row, money, write
from effectgate.testing import EffectRecorder, Script, call, say
from effectgate_smolagents import AwaitingApproval, Finished, GatedAgent
from effectgate_smolagents.testing import ScriptedModel

from .test_native import approve_all, ask


class LimitLookupFailed(Exception):
    """The limit service's own error."""


FAULTS: dict[str, Callable[[], Exception]] = {
    "own": lambda: LimitLookupFailed("the limit service could not be read"),
    "type": lambda: TypeError("the limit is not a number"),
    "timeout": lambda: TimeoutError("the limit service did not answer"),
}


class Limits:
    """The limit service; `fault` is what reading it raises (None: it is up)."""

    def __init__(self) -> None:
        self.fault: Exception | None = None

    def read(self) -> None:
        if self.fault is not None:
            raise self.fault


class PayTool(Tool):
    """A money tool that reads the limit service in `setup()` and checks the amount in `forward`."""

    name = "pay"
    description = "Pay an amount on an order."
    inputs = {  # noqa: RUF012 - smolagents documents a Tool's inputs as a class attribute
        "order_id": {"type": "string", "description": "The order."},
        "amount": {"type": "integer", "description": "How much, in minor units."},
    }
    output_type = "string"

    def __init__(self, receiver: EffectRecorder, limits: Limits, check: Limits) -> None:
        super().__init__()
        self.receiver, self.limits, self.check = receiver, limits, check

    def setup(self) -> None:
        self.limits.read()
        self.is_initialized = True

    def forward(self, order_id: str, amount: int) -> str:
        self.check.read()  # a check in the body: what ran is the tool's own code
        self.receiver.record(self.name, order_id=order_id, amount=amount)
        return f"{self.name}: {amount} on {order_id}"


class NoteTool(PayTool):
    """A write with the same setup."""

    name = "note"
    description = "Note an amount on an order."


EFFECTS: dict[str, Row] = {"pay": money("finance", subject="order_id"), "note": write()}


class Shop:
    """A gated agent over `pay` and `note`, and a plain one over the same tools."""

    def __init__(self, store_url: str, kind: str, script: list[Any], effects: dict[str, Row]) -> None:
        self.receiver, self.limits, self.check = EffectRecorder(), Limits(), Limits()
        self.script = script
        self.kind = kind
        self.gated = GatedAgent(self.agent(), effects=effects, db=store_url)
        self.gate: EffectGate = self.gated.gate

    def agent(self) -> MultiStepAgent:
        tools = [
            PayTool(self.receiver, self.limits, self.check),
            NoteTool(self.receiver, self.limits, self.check),
        ]
        cls = CodeAgent if self.kind == "code" else ToolCallingAgent
        return cls(
            tools=tools,
            model=ScriptedModel(Script(list(self.script))),
            verbosity_level=LogLevel.OFF,
            max_steps=4,
        )

    def plain_errors(self, fault: Exception) -> list[str]:
        """The step errors a plain agent over the same tools records when setup raises `fault`."""
        agent, self.limits.fault = self.agent(), fault
        agent.run("go")
        self.limits.fault = None
        return [str(s.error) for s in agent.memory.steps if isinstance(s, ActionStep) and s.error]

    def errors(self) -> list[str]:
        steps = self.gated.agent.memory.steps
        return [str(s.error) for s in steps if isinstance(s, ActionStep) and s.error]


@pytest.fixture
def shop(store_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Shop]]:
    monkeypatch.setenv("EFFECTGATE_KEYRING", Keyring.generate().dumps())  # PostgreSQL needs one
    made: list[Shop] = []

    def make(script: list[Any], *, kind: str = "tool_calling", effects: dict[str, Row] = EFFECTS) -> Shop:
        made.append(Shop(store_url, kind, script, effects))
        return made[-1]

    yield make
    for each in made:
        each.gated.close()


def _failed_definitely(gate: EffectGate, tool: str) -> None:
    assert [(e.status, e.tool) for e in gate.store.executions()] == [("failed", tool)]
    assert [r.status for r in gate.store.idempotency_records()] == ["failed"]


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("kind", ["tool_calling", "code"])
def test_a_setup_failing_after_approval_is_a_definite_failure(
    shop: Callable[..., Shop], kind: str, fault: str
) -> None:
    """The limit service goes down between proposal and execution: the approved call's `setup()`
    raises and its `forward` never runs. Recorded `failed`, never `needs_reconciliation`, and the
    model is told the call failed with the setup's own error."""
    s = shop([call("pay", order_id="1042", amount=500), say("Could not.")], kind=kind)
    out = ask(s.gated, "pay 1042")
    assert isinstance(out, AwaitingApproval)
    s.limits.fault = FAULTS[fault]()
    done = s.gated.resume(out, approve_all(s.gate, out))
    assert isinstance(done, Finished)
    [(_, outcome)] = done.decided
    assert isinstance(outcome, Refused)
    assert outcome.code == "failed"
    assert f"{type(s.limits.fault).__name__}: {s.limits.fault}" in outcome.message
    _failed_definitely(s.gate, "pay")
    [row] = s.gate.store.approvals()
    assert row.status == "failed"
    assert s.receiver.count("pay") == 0


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_writes_failing_setup_is_a_definite_failure_shown_as_smolagents_shows_it(
    shop: Callable[..., Shop], fault: str
) -> None:
    """A write's setup raising (a timeout included, which is an unknown outcome when `forward`
    raises it) is a definite failure: `forward` never ran. The step's error is the plain agent's."""
    s = shop([call("note", order_id="1042", amount=5), say("Could not.")])
    plain = s.plain_errors(FAULTS[fault]())
    s.limits.fault = FAULTS[fault]()
    assert isinstance(ask(s.gated, "note 1042"), Finished)
    assert s.errors() == plain
    assert f"{type(s.limits.fault).__name__}: {s.limits.fault}" in plain[0]
    _failed_definitely(s.gate, "note")
    assert s.receiver.count("note") == 0


def test_a_failing_setup_or_check_runs_nothing_at_proposal(shop: Callable[..., Shop]) -> None:
    """At proposal nothing of the tool runs (neither `setup()` nor `forward`): the whole proposal
    is stored, its arguments as the model sent them, whatever the limit service says then."""
    s = shop([call("pay", order_id="1042", amount=500), say("Waiting.")])
    s.limits.fault, s.check.fault = FAULTS["own"](), FAULTS["type"]()
    assert isinstance(ask(s.gated, "pay 1042"), AwaitingApproval)
    [row] = s.gate.store.approvals()
    assert (row.status, row.tool) == ("pending", "pay")
    assert json.loads(row.args_json) == {"order_id": "1042", "amount": 500}
    assert s.gate.store.executions() == []
    assert s.receiver.count("pay") == 0


@pytest.mark.parametrize("listed", [False, True])
def test_a_check_in_forward_failing_after_approval_is_the_tools_own_failure(
    shop: Callable[..., Shop], listed: bool
) -> None:
    """Not a defect: smolagents has no argument model, so a check of the arguments is the tool's
    body, and the gate cannot tell it from the effect. Its error after approval is an unknown
    outcome, as any gated tool's, unless the row lists it as definite (then `failed`)."""
    effects = dict(EFFECTS)
    if listed:
        effects["pay"] = money("finance", subject="order_id", definite_failures=(LimitLookupFailed,))
    s = shop([call("pay", order_id="1042", amount=500), say("Could not.")], effects=effects)
    out = ask(s.gated, "pay 1042")
    assert isinstance(out, AwaitingApproval)
    s.check.fault = FAULTS["own"]()
    s.gated.resume(out, approve_all(s.gate, out))
    status = "failed" if listed else "needs_reconciliation"
    assert [(e.status, e.tool) for e in s.gate.store.executions()] == [(status, "pay")]
    assert s.receiver.count("pay") == 0


def test_a_setup_that_succeeds_runs_the_approved_call_once(shop: Callable[..., Shop]) -> None:
    """With the limit service up, setup and the approved call run, once."""
    s = shop([call("pay", order_id="1042", amount=40), say("Paid.")])
    out = ask(s.gated, "pay 1042")
    assert isinstance(out, AwaitingApproval)
    s.gated.resume(out, approve_all(s.gate, out))
    assert [e.status for e in s.gate.store.executions()] == ["succeeded"]
    assert s.receiver.count("pay", order_id="1042", amount=40) == 1
