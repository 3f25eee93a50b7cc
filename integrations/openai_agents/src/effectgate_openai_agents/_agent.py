"""A gated agent: `gate_agent` clones an SDK `Agent` with its function tools gated.

Two ways to say what each tool does:

    # the tools you already have, and one effect row per tool name (three lines)
    agent = gate_agent(
        Agent(name="support", tools=[get_order, refund_order]),
        effects={"get_order": read(), "refund_order": money("finance", subject="order_id")},
    )
    gate = gate_of(agent)                     # approvals, the audit, close()

    # or a full effect table (the advanced path: each row's function is the one that runs)
    agent = gate_agent(Agent(name="support", tools=table_tools(gate, agent_id="support")), gate)

With `effects=`, the table is built from the tools themselves (`native_tool`: name, description,
the schema the model is shown, the tool's own function) and deny-by-default: a tool without a row,
or a row without a tool, raises `TableError` here. The agent (`agent_id`, default its name) may
call exactly the tools it was given. The gate opens the store at `db` (the embedded SQLite file
`effectgate.db` in the working directory by default, set up on first use, its key file beside it,
which the `effectgate` CLI and inbox share); other keywords go to `EffectGate`. The gate belongs to
the caller: `gate_of(agent).close()` when done. A tool's own `needs_approval` can only add a
pause (gated rows pause through effectgate whatever it says; on a read or write row it is a
`TableError`), and what a tool's `RunContextWrapper` parameter sees and how its failures reach the
model are documented in `_native`. The SDK's own `state.approve` / `state.reject` are settled
through the gate (`native_approver=`, `_native_decisions`).

Deny by default reaches past `tools` (`_reach`): an MCP server that is not effectgate's MCP proxy
(named in `mcp_proxies=`), a handoff or an `agent.as_tool(...)` whose agent is not gated on the
same gate, and a `Handoff` whose target cannot be inspected are a `TypeError` here, and the
gated agent is checked again on every model answer, before any call of it runs.

`gate_of(agent)` returns the gate of any agent `gate_agent` made (or a clone of one), because the
gate travels in the agent hooks it installs (`StepHooks`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, overload

from agents import Agent, AgentHooks, FunctionTool, ModelResponse, RunContextWrapper
from agents.agent import ToolsToFinalOutputResult
from agents.run_context import TContext
from agents.tool import FunctionToolResult
from openai.types.responses import ResponseFunctionToolCall

from effectgate import EffectGate
from effectgate.adapter import Unknown
from effectgate.rows import DEFAULT_DB, Row, gate_for

from ._context import adapter_state, call_context, check_call_id, resumed
from ._deferred import own_deferred
from ._native import native_tool
from ._native_decisions import NativeApprover
from ._reach import check_current, check_reach, checked_handoffs
from ._records import Turn, record_turn
from ._table import as_function_tool
from ._tools import Mode, gate_tools


class StepHooks(AgentHooks[Any]):
    """Agent hooks that record each model response's function calls in the run context, so the
    gated calls of one turn are registered together; forwards every hook to the agent's own.

    With `gate` (as `gate_agent` installs them), a response that calls a tool of the table also
    signs the run's identity (a new run) or verifies it (a resumed run) before any tool is
    considered, so even a call whose arguments never reach the gate leaves a signed identity.
    With `gate`, each response first checks that the agent can still run nothing outside the gate
    (`_reach.check_current`: its tools, MCP servers and handoffs, which may have been changed
    since it was wrapped); `mcp_proxies` are the MCP connections `gate_agent` accepted."""

    def __init__(
        self,
        inner: AgentHooks[Any] | None = None,
        *,
        gate: EffectGate | None = None,
        agent_id: str = "",
        mcp_proxies: Sequence[Any] = (),
    ) -> None:
        self.inner = inner
        self.gate = gate
        self.agent_id = agent_id
        self.mcp_proxies = tuple(mcp_proxies)

    @property
    def inner(self) -> AgentHooks[Any] | None:
        """The agent's own hooks: every hook but `on_llm_end` is theirs, `on_llm_end` after ours."""
        return self._inner

    @inner.setter
    def inner(self, inner: AgentHooks[Any] | None) -> None:
        # The inner hooks' methods are bound on the instance once (a class-level __getattribute__
        # would tax every attribute the SDK reads from the hooks on every turn of every run).
        for name in [n for n in vars(self) if n.startswith("on_")]:
            delattr(self, name)
        self._inner = inner
        if inner is None:
            return
        for name in dir(inner):
            if name.startswith("on_") and name != "on_llm_end":
                try:
                    setattr(self, name, getattr(inner, name))
                except AttributeError:
                    continue

    async def on_llm_end(
        self, context: RunContextWrapper[Any], agent: Agent[Any], response: ModelResponse
    ) -> None:
        if self.gate is not None:
            check_current(agent, self.gate)  # before any call of this response runs
        if isinstance(context.context, Mapping):
            calls = Turn(
                (item.call_id, [item.name, item.arguments])
                for item in response.output
                if isinstance(item, ResponseFunctionToolCall)
            )
            for call_id in calls:  # before any call of this response registers
                check_call_id(call_id)
            gate = self.gate
            if gate is not None and any(gate.table.get(name) is not None for name, _ in calls.values()):
                call_context(
                    context.context,
                    agent_id=self.agent_id or agent.name,
                    gate=gate,
                    resumed=resumed(context),
                )
            record_turn(adapter_state(context.context), calls)  # the caller's stay behind it
        if self._inner is not None:
            await self._inner.on_llm_end(context, agent, response)


def _deferred_behavior(original: Any) -> Callable[..., Any]:
    if original != "run_llm_again" and not callable(original):
        raise ValueError(
            "deferred mode ends the run on a deferred result, so it needs the agent's "
            f"tool_use_behavior to be 'run_llm_again' or a function; got {original!r}"
        )

    async def behavior(context: RunContextWrapper[Any], results: list[FunctionToolResult]) -> Any:
        # only the payloads the gated tools themselves answered in this run (`_deferred`), never
        # a tool's output that merely reads like one
        deferred = [r.output for r in results if own_deferred(context.context, r)]
        if deferred:
            first = deferred[0]
            text = first if isinstance(first, str) else json.dumps(first, sort_keys=True)
            return ToolsToFinalOutputResult(is_final_output=True, final_output=text)
        if callable(original):
            answer = original(context, results)
            return await answer if asyncio.iscoroutine(answer) else answer
        return ToolsToFinalOutputResult(is_final_output=False, final_output=None)

    return behavior


def _function_tools(
    agent: Agent[Any], tools: Sequence[FunctionTool | Callable[..., Any]] | None
) -> list[FunctionTool]:
    source: list[Any] = list(agent.tools) if tools is None else list(tools)
    for t in source:
        if not isinstance(t, FunctionTool) and not (callable(t) and not hasattr(t, "name")):
            raise TypeError(
                f"{getattr(t, 'name', t)!r} is a {type(t).__name__}, which effectgate cannot gate "
                f"(it does not run through on_invoke_tool); remove it or pass tools= without it"
            )
    return [as_function_tool(t) for t in source]


@overload
def gate_agent(
    agent: Agent[TContext],
    gate: EffectGate,
    *,
    agent_id: str | None = None,
    unknown: Unknown = "raise",
    mode: Mode = "approval",
    tools: Sequence[FunctionTool | Callable[..., Any]] | None = None,
    native_approver: NativeApprover | None = None,
    mcp_proxies: Sequence[Any] = (),
) -> Agent[TContext]: ...


@overload
def gate_agent(
    agent: Agent[TContext],
    gate: None = None,
    *,
    effects: Mapping[str, Row],
    agent_id: str | None = None,
    mode: Mode = "approval",
    tools: Sequence[FunctionTool | Callable[..., Any]] | None = None,
    native_approver: NativeApprover | None = None,
    mcp_proxies: Sequence[Any] = (),
    db: str = DEFAULT_DB,
    **gate_options: Any,
) -> Agent[TContext]: ...


def gate_agent(
    agent: Agent[TContext],
    gate: EffectGate | None = None,
    *,
    effects: Mapping[str, Row] | None = None,
    agent_id: str | None = None,
    unknown: Unknown = "raise",
    mode: Mode = "approval",
    tools: Sequence[FunctionTool | Callable[..., Any]] | None = None,
    native_approver: NativeApprover | None = None,
    mcp_proxies: Sequence[Any] = (),
    db: str = DEFAULT_DB,
    **gate_options: Any,
) -> Agent[TContext]:
    """A clone of `agent` whose function tools (or `tools`, if given) are gated (see `gate_tools`).

    Give either `gate` (its effect table has a row, with its function, per tool) or `effects`
    (one `Row` per tool name, next to the agent's own tools: the gate is built on `db` and
    reachable as `gate_of(agent)`). A tool that does not run through `on_invoke_tool` (hosted
    tools, MCP tools) raises `TypeError`. `agent_id` defaults to the agent's name. In deferred
    mode the clone's `tool_use_behavior` ends the run on the first deferred result.

    `native_approver` (an `Approver`, or a function of the run context returning one) is who the
    SDK's own `state.approve(item)` approves as, through `gate.aapprove`; without it a native
    approve runs nothing. A native `state.reject(item)` always closes the approval
    (`_native_decisions`).

    Nothing else on the agent may run outside the gate (`_reach`, `TypeError` naming the fix):
    its MCP servers must be effectgate's MCP proxy, named in `mcp_proxies`; its handoff targets
    and the agents behind its `agent.as_tool(...)` tools must be made by `gate_agent` on the same
    gate (`gate_agent(..., effects=...)` builds a gate of its own, so several agents share one
    gate through the full-table path)."""
    name = agent_id or agent.name
    function_tools = _function_tools(agent, tools)
    if effects is not None:
        if gate is not None:
            raise TypeError("gate_agent takes a gate or effects=, not both")
        if unknown != "raise":
            raise TypeError("unknown= needs a gate: with effects=, every tool needs its row")
        built = gate_for(
            [native_tool(t) for t in function_tools], effects, agent_id=name, db=db, **gate_options
        )
        try:
            return _gated(
                agent,
                built,
                function_tools,
                agent_id=name,
                unknown="raise",
                mode=mode,
                native=native_approver,
                proxies=mcp_proxies,
            )
        except BaseException:
            built.close()
            raise
    elif gate is None:
        raise TypeError(
            "gate_agent needs the effect of each tool: effects={'get_order': read(), ...} "
            "(or a gate whose effect table has a row per tool)"
        )
    elif db != DEFAULT_DB or gate_options:
        raise TypeError("db= and gate options build a gate from effects=; this gate is already built")
    return _gated(
        agent,
        gate,
        function_tools,
        agent_id=name,
        unknown=unknown,
        mode=mode,
        native=native_approver,
        proxies=mcp_proxies,
    )


def _gated(
    agent: Agent[TContext],
    gate: EffectGate,
    tools: Sequence[FunctionTool],
    *,
    agent_id: str,
    unknown: Unknown,
    mode: Mode,
    native: NativeApprover | None,
    proxies: Sequence[Any],
) -> Agent[TContext]:
    check_reach(agent, gate, proxies=proxies, tools=tools)
    wrapped = gate_tools(tools, gate, agent_id=agent_id, unknown=unknown, mode=mode, native_approver=native)
    changes: dict[str, Any] = {
        "tools": wrapped,
        "hooks": StepHooks(agent.hooks, gate=gate, agent_id=agent_id, mcp_proxies=proxies),
        # lists of the clone's own: a later change to the original agent's lists does not reach it
        "handoffs": checked_handoffs(agent.handoffs, gate),
        "mcp_servers": list(agent.mcp_servers),
    }
    if mode == "deferred":
        changes["tool_use_behavior"] = _deferred_behavior(agent.tool_use_behavior)
    return agent.clone(**changes)


def gate_of(agent: Agent[Any]) -> EffectGate:
    """The gate of an agent `gate_agent` made (or of a clone of one): approve, deny, audit and
    close through it. `ValueError` for an agent `gate_agent` did not make."""
    hooks = agent.hooks
    if isinstance(hooks, StepHooks) and hooks.gate is not None:
        return hooks.gate
    raise ValueError(f"agent {agent.name!r} was not made by gate_agent, so it has no effectgate gate")


__all__ = ["StepHooks", "gate_agent", "gate_of"]
