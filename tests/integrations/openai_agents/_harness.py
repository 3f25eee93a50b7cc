"""The adapter harness on the OpenAI Agents SDK: the support agent, gated, on a scripted model.

Every pause is serialized with `RunState.to_string()` and every answer restores it with
`RunState.from_string(...)`, as a backend that keeps snapshots between requests would.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from agents import Agent, FunctionTool, Runner, RunResult, RunState, function_tool
from agents.items import ToolCallItem, ToolCallOutputItem

from effectgate import Approver, EffectGate
from effectgate.testing import Script
from effectgate_openai_agents import (
    approve,
    gate_agent,
    pending_approvals,
    reject,
    table_tools,
)
from effectgate_openai_agents.testing import ScriptedModel
from tests.conformance.adapters import Paused, ToolResult, Turn

FINANCE = Approver("fiona", "finance")
SESSION = "s-ada"
USER = "u1"
_FAILED = ("Refused (", "Invalid arguments", "An error occurred")


@function_tool
def transfer_funds(to: str, amount: int) -> str:
    """Move money to another account (the effect table has no row for it)."""
    raise AssertionError("transfer_funds must never run")


def support_agent(
    gate: EffectGate, model: ScriptedModel, *, mode: str = "approval", **options: Any
) -> Agent[Any]:
    """The shop's support agent: its table's tools plus one the table lacks, gated."""
    tools: list[FunctionTool] = [*table_tools(gate, agent_id="support"), transfer_funds]
    base = Agent(name="support", instructions="You help shop customers.", model=model, tools=tools)
    return gate_agent(base, gate, agent_id="support", unknown="refuse", mode=mode, **options)  # type: ignore[arg-type]


def context(message_id: str, *, session_id: str = SESSION, user_id: str = USER) -> dict[str, Any]:
    return {"session_id": session_id, "origin_message_id": message_id, "user_id": user_id}


@dataclass(frozen=True)
class Output:
    call_id: str
    result: ToolResult

    def __getattr__(self, name: str) -> Any:
        return getattr(self.result, name)


def tool_results(result: RunResult) -> tuple[Output, ...]:
    """The tool outputs in a run's new items, by call id and tool name."""
    names = {}
    for item in result.new_items:
        if isinstance(item, ToolCallItem):
            raw = item.raw_item
            call_id = getattr(raw, "call_id", None) or (raw.get("call_id") if isinstance(raw, dict) else None)
            names[call_id] = getattr(raw, "name", None) or (
                raw.get("name") if isinstance(raw, dict) else None
            )
    out = []
    for item in result.new_items:
        if isinstance(item, ToolCallOutputItem):
            raw = item.raw_item
            call_id = raw.get("call_id") if isinstance(raw, dict) else getattr(raw, "call_id", None)
            content = item.output if isinstance(item.output, str) else str(item.output)
            ok = not content.startswith(_FAILED) and "not approved" not in content
            tool = ToolResult(tool=str(names.get(call_id, "?")), ok=ok, content=content)
            out.append(Output(call_id=str(call_id), result=tool))
    return tuple(out)


def tamper_user(snapshot: str, user_id: str) -> str:
    """A RunState snapshot with its context's user_id replaced, as a JSON edit would."""
    data = json.loads(snapshot)

    def edit(node: Any) -> None:
        if isinstance(node, dict):
            if "user_id" in node and "origin_message_id" in node:
                node["user_id"] = user_id
            for value in node.values():
                edit(value)
        elif isinstance(node, list):
            for value in node:
                edit(value)

    edit(data)
    return json.dumps(data)


class OpenAIAgentsHarness:
    def __init__(self, gate: EffectGate, script: Script, **options: Any) -> None:
        self.gate = gate
        self.script = script
        self.model = ScriptedModel(script)
        self.agent = support_agent(gate, self.model, **options)
        self.snapshot: str | None = None
        self.last: RunResult | None = None
        self._reported: set[str] = set()

    def _turn(self, result: RunResult) -> Turn:
        self.last = result
        paused = tuple(
            Paused(p.approval_id or "", p.version or 0, p.args_hash or "", p.tool)
            for p in pending_approvals(result)
        )
        self.snapshot = result.to_state().to_string() if result.interruptions else None
        # a resumed run's new_items repeat the outputs of the run it continues: report each once
        fresh = tuple(r for r in tool_results(result) if r.call_id not in self._reported)
        self._reported.update(r.call_id for r in fresh)
        return Turn(paused=paused, results=tuple(r.result for r in fresh))

    def send(self, text: str, *, message_id: str) -> Turn:
        result = Runner.run_sync(self.agent, [{"role": "user", "content": text}], context=context(message_id))
        return self._turn(result)

    def restore(self) -> RunState[Any, Any]:
        assert self.snapshot is not None, "nothing is paused"
        return asyncio.run(RunState.from_string(self.agent, self.snapshot))

    def _paused_in(self, state: RunState[Any, Any], paused: Paused) -> Any:
        # an edited state lists the call unverified (no approval id): decide that entry, which
        # the adapter must then refuse
        listed = pending_approvals(state)
        found = [p for p in listed if p.approval_id == paused.approval_id]
        found = found or [p for p in listed if not p.verified and p.tool == paused.tool]
        [entry] = found
        return entry

    def resume(self, state: RunState[Any, Any]) -> Turn:
        return self._turn(Runner.run_sync(self.agent, state))

    def approve(self, paused: Paused, token: str) -> Turn:
        state = self.restore()
        approve(state, self._paused_in(state, paused), token)
        return self.resume(state)

    def approve_tampered(self, paused: Paused, token: str) -> Turn:
        """The stored RunState snapshot edited (its context's user_id), restored, then approved."""
        assert self.snapshot is not None, "nothing is paused"
        self.snapshot = tamper_user(self.snapshot, "u2")
        return self.approve(paused, token)

    def deny(self, paused: Paused, reason: str) -> Turn:
        state = self.restore()
        reject(self.gate, state, self._paused_in(state, paused), approver=FINANCE, reason=reason)
        return self.resume(state)
