"""The shop's agent as a hand-built LangGraph graph, and a harness that drives one conversation.

`shop_graph` is the classic loop: agent (the scripted model) -> tools_condition -> the gated node
-> agent. The harness speaks the adapter contract's neutral terms (tests/conformance/adapters.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import Command, GraphOutput, Interrupt

from effectgate import EffectGate
from effectgate.examples.shop import SUPPORT_AGENT
from effectgate_langgraph import EffectGateMiddleware, GatedToolNode, approve, deny, resume
from effectgate_langgraph.testing import ScriptedChatModel
from tests.conformance.adapters import Paused, ToolResult, Turn


def shop_graph(
    gate: EffectGate,
    model: ScriptedChatModel,
    *,
    checkpointer: BaseCheckpointSaver[Any] | None,
    node: GatedToolNode | None = None,
    native_approver: Any = None,
) -> CompiledStateGraph[Any, Any, Any, Any]:
    tools = node or GatedToolNode(gate, agent_id=SUPPORT_AGENT, native_approver=native_approver)
    bound = model.bind_tools(list(tools.tools_by_name.values()))

    def agent(state: MessagesState) -> dict[str, list[AnyMessage]]:
        return {"messages": [bound.invoke(state["messages"])]}

    async def aagent(state: MessagesState) -> dict[str, list[AnyMessage]]:
        return {"messages": [await bound.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", RunnableLambda(agent, afunc=aagent))
    builder.add_node("tools", tools)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=checkpointer)


def edit_paused_call(graph: Any, config: RunnableConfig, changes: Mapping[str, Any]) -> None:
    """Rewrite the last AIMessage's tool calls in the checkpoint (same message id), as an edit of
    the stored checkpoint would: the tools node then runs again from the edited state."""
    state = graph.get_state(config)
    [last] = [m for m in state.values["messages"] if isinstance(m, AIMessage)][-1:]
    calls = [{**c, "args": {**c["args"], **changes}} for c in last.tool_calls]
    edited = AIMessage(content=last.content, id=last.id, tool_calls=calls)
    as_node = "agent" if "agent" in graph.nodes else "model"  # the hand-built graph, or create_agent's
    graph.update_state(config, {"messages": [edited]}, as_node=as_node)


def paused_of(out: GraphOutput[Any]) -> tuple[Paused, ...]:
    return tuple(
        Paused(r["approval_id"], r["version"], r["args_hash"], r["tool"])
        for i in out.interrupts
        for r in i.value["requests"]
    )


class LangGraphHarness:
    """One conversation (thread s-ada, user u1) on the shop graph (or, with `agent=True`, on
    `create_agent` with EffectGateMiddleware); see the adapter contract. `native_approver` goes to
    the gated node or middleware (who decides a HITL answer)."""

    def __init__(
        self,
        gate: EffectGate,
        model: ScriptedChatModel,
        checkpointer: BaseCheckpointSaver[Any],
        *,
        thread_id: str = "s-ada",
        user_id: str = "u1",
        node: GatedToolNode | None = None,
        agent: bool = False,
        native_approver: Any = None,
    ) -> None:
        self.gate = gate
        self.model = model
        self.script = model.script
        if agent:
            self.graph = create_agent(
                model,
                middleware=[
                    EffectGateMiddleware(gate, agent_id=SUPPORT_AGENT, native_approver=native_approver)
                ],
                checkpointer=checkpointer,
            )
        else:
            self.graph = shop_graph(
                gate, model, checkpointer=checkpointer, node=node, native_approver=native_approver
            )
        self.config: RunnableConfig = {"configurable": {"thread_id": thread_id}}
        self.context = {"user_id": user_id}
        self.last: GraphOutput[Any] | None = None
        self._seen: set[str] = set()

    @property
    def interrupt(self) -> Interrupt:
        assert self.last is not None
        [pending] = self.last.interrupts
        return pending

    def invoke(self, value: Any, config: RunnableConfig | None = None) -> Turn:
        out = self.graph.invoke(value, config or self.config, context=self.context, version="v2")
        self.last = out
        return self.turn(out)

    async def ainvoke(self, value: Any) -> Turn:
        out = await self.graph.ainvoke(value, self.config, context=self.context, version="v2")
        self.last = out
        return self.turn(out)

    def turn(self, out: GraphOutput[Any]) -> Turn:
        results = []
        for message in out.value["messages"]:
            if isinstance(message, ToolMessage) and message.id not in self._seen:
                self._seen.add(str(message.id))
                results.append(ToolResult(str(message.name), message.status != "error", str(message.content)))
        return Turn(paused_of(out), tuple(results))

    def send(self, text: str, *, message_id: str) -> Turn:
        return self.invoke({"messages": [HumanMessage(text, id=message_id)]})

    def decide(self, decisions: Mapping[str, Mapping[str, Any]]) -> Turn:
        assert self.last is not None
        return self.invoke(resume(decisions, self.last.interrupts))

    def approve(self, paused: Paused, token: str) -> Turn:
        return self.decide({paused.approval_id: approve(token)})

    def deny(self, paused: Paused, reason: str) -> Turn:
        return self.decide({paused.approval_id: deny(reason)})

    def approve_tampered(self, paused: Paused, token: str) -> Turn:
        """The checkpoint's paused tool call edited after approval (amount 1), then approved."""
        edit_paused_call(self.graph, self.config, {"amount": 1})
        return self.approve(paused, token)

    def messages(self) -> list[AnyMessage]:
        return list(self.graph.get_state(self.config).values["messages"])

    def ai_messages(self) -> list[AIMessage]:
        return [m for m in self.messages() if isinstance(m, AIMessage)]


__all__ = ["Command", "LangGraphHarness", "paused_of", "shop_graph"]
