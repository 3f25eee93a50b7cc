"""The adapter harness on smolagents: the support agent (ToolCallingAgent or CodeAgent), gated.

A turn's results are what the model was given: each tool call's observation in the run and, for
a resume, how each decided call ended (the continuation message the model reads).
"""

from __future__ import annotations

from typing import Any

from smolagents import CodeAgent, Tool, ToolCallingAgent, tool
from smolagents.monitoring import LogLevel

from effectgate import Approver, EffectGate, Executed
from effectgate.testing import Script
from effectgate_smolagents import Approve, AwaitingApproval, Deny, GatedAgent, RunOutcome, table_tools
from effectgate_smolagents.testing import ScriptedModel
from tests.conformance.adapters import Paused, ToolResult, Turn

FINANCE = Approver("fiona", "finance")
SESSION = "s-ada"
USER = "u1"
_FAILED = ("Refused", "Invalid arguments")


@tool
def transfer_funds(to: str, amount: int) -> str:
    """Move money to another account (the effect table has no row for it).

    Args:
        to: the account to pay.
        amount: how much, in minor units.
    """
    raise AssertionError("transfer_funds must never run")


def support_agent(
    gate: EffectGate, model: ScriptedModel, *, kind: str = "tool_calling", **options: Any
) -> GatedAgent:
    tools: list[Tool] = [*table_tools(gate, agent_id="support"), transfer_funds]
    cls = CodeAgent if kind == "code" else ToolCallingAgent
    agent = cls(tools=tools, model=model, verbosity_level=LogLevel.OFF, max_steps=6, **options)
    return GatedAgent(agent, gate, agent_id="support", unknown="refuse")


def results(outcome: RunOutcome) -> tuple[ToolResult, ...]:
    return tuple(
        ToolResult(
            tool=name,
            ok=not str(text).startswith(_FAILED) and "needs approval" not in str(text),
            content=str(text),
        )
        for name, text in outcome.observations
    )


class SmolagentsHarness:
    def __init__(self, gate: EffectGate, script: Script, **options: Any) -> None:
        self.gate = gate
        self.script = script
        self.model = ScriptedModel(script)
        self.gated = support_agent(gate, self.model, **options)
        self.awaiting: AwaitingApproval | None = None
        self.started = False

    def _turn(self, outcome: RunOutcome, given: tuple[ToolResult, ...] = ()) -> Turn:
        self.awaiting = outcome if isinstance(outcome, AwaitingApproval) else None
        paused = ()
        if self.awaiting is not None:
            paused = tuple(
                Paused(p.approval_id, p.version, p.card.args_hash, p.card.tool) for p in self.awaiting.pending
            )
        return Turn(paused=paused, results=given + results(outcome))

    def send(self, text: str, *, message_id: str) -> Turn:
        outcome = self.gated.run(
            text, session_id=SESSION, origin_message_id=message_id, user_id=USER, reset=not self.started
        )
        self.started = True
        return self._turn(outcome)

    def _resume(self, decisions: dict[str, Any]) -> Turn:
        assert self.awaiting is not None, "nothing is paused"
        awaiting = self.awaiting
        outcome = self.gated.resume(awaiting, decisions)
        given = tuple(
            ToolResult(tool=o.tool, ok=isinstance(o, Executed), content=o.for_model())
            for _, o in outcome.decided
        )
        return self._turn(outcome, given)

    def approve(self, paused: Paused, token: str) -> Turn:
        return self._resume({paused.approval_id: Approve(token)})

    def deny(self, paused: Paused, reason: str) -> Turn:
        return self._resume({paused.approval_id: Deny(FINANCE, reason)})

    def approve_tampered(self, paused: Paused, token: str) -> Turn:
        """The stored AwaitingApproval record edited to another user, restored, then approved."""
        assert self.awaiting is not None, "nothing is paused"
        record = {**self.awaiting.to_dict(), "user_id": "u2"}
        self.awaiting = AwaitingApproval.from_dict(record, self.gate)
        return self.approve(paused, token)
