"""Helpers for the fidelity suites: one conversation run on a plain ToolNode and on a gated node,
with the same langchain tools and the same script, so what the model receives can be compared."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AnyMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langchain_core.tools import BaseTool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import GraphOutput

from effectgate.testing import Script
from effectgate_langgraph.testing import ScriptedChatModel

CONTEXT = {"user_id": "u1"}


def loop(node: ToolNode, model: ScriptedChatModel) -> CompiledStateGraph[Any, Any, Any, Any]:
    """agent -> tools_condition -> node -> agent, checkpointed in memory."""

    def agent(state: MessagesState) -> dict[str, list[AnyMessage]]:
        return {"messages": [model.invoke(state["messages"])]}

    async def aagent(state: MessagesState) -> dict[str, list[AnyMessage]]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", RunnableLambda(agent, afunc=aagent))
    builder.add_node("tools", node)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=InMemorySaver())


def config(thread: str = "s-ada", callbacks: Sequence[BaseCallbackHandler] = ()) -> RunnableConfig:
    cfg: RunnableConfig = {"configurable": {"thread_id": thread}}
    if callbacks:
        cfg["callbacks"] = list(callbacks)
    return cfg


def ask(text: str = "go") -> dict[str, list[HumanMessage]]:
    return {"messages": [HumanMessage(text, id="m1")]}


class Talk:
    """One conversation (thread s-ada, user u1) on `loop(node, ...)` with a scripted model."""

    def __init__(self, node: ToolNode, script: Script, callbacks: Sequence[BaseCallbackHandler] = ()) -> None:
        self.model = ScriptedChatModel(script=script)
        self.graph = loop(node, self.model)
        self.cfg = config(callbacks=callbacks)

    def invoke(self, value: Any = None) -> GraphOutput[Any]:
        out: GraphOutput[Any] = self.graph.invoke(
            ask() if value is None else value, self.cfg, context=CONTEXT, version="v2"
        )
        return out

    async def ainvoke(self, value: Any = None) -> GraphOutput[Any]:
        out: GraphOutput[Any] = await self.graph.ainvoke(
            ask() if value is None else value, self.cfg, context=CONTEXT, version="v2"
        )
        return out


def run(node: ToolNode, script: Script, callbacks: Sequence[BaseCallbackHandler] = ()) -> GraphOutput[Any]:
    """The whole conversation in one invoke (no pause expected)."""
    return Talk(node, script, callbacks).invoke()


def seen(out: GraphOutput[Any]) -> list[tuple[str, Any, str]]:
    """(tool, content, status) of every ToolMessage, in order: what the model was given."""
    return [(str(m.name), m.content, m.status) for m in out.value["messages"] if isinstance(m, ToolMessage)]


class ToolEvents(BaseCallbackHandler):
    """Records the tool callbacks langchain fires: (event, tool name or output)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any, Any]] = []

    def on_tool_start(self, serialized: dict[str, Any], input_str: str, **kwargs: Any) -> None:
        self.events.append(("start", serialized.get("name"), kwargs.get("inputs")))

    def on_tool_end(self, output: Any, **kwargs: Any) -> None:
        content = output.content if isinstance(output, ToolMessage) else output
        self.events.append(("end", content, None))

    def on_tool_error(self, error: BaseException, **kwargs: Any) -> None:
        self.events.append(("error", repr(error), None))


Make = Callable[[Sequence[BaseTool]], ToolNode]
