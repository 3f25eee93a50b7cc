"""create_agent with `gated_middleware` gives the model and the tool what create_agent without it
gives them: arguments the tool's own model refuses get ToolNode's `ToolInvocationError` text (and
the tool never runs), and a parameter ToolNode injects by its name (`runtime`, no annotation) is
supplied by the framework, never by the model.

Each scenario runs the same tools and script on create_agent without the gate and with it;
effects are counted at the receiver (what the tool received)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, tool
from langgraph.prebuilt import InjectedState, ToolRuntime

from effectgate import EffectGate, read
from effectgate.testing import EffectRecorder, Script, call, say
from effectgate_langgraph import gated_middleware
from effectgate_langgraph.testing import ScriptedChatModel

# langchain's own parsing of a ToolRuntime argument warns so without the gate too.
pytestmark = pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")

CFG: RunnableConfig = {"configurable": {"thread_id": "s-ada", "user_id": "u1"}}


def tools_for(receiver: EffectRecorder) -> list[BaseTool]:
    @tool
    def search(query: str, limit: int, state: Annotated[dict[str, Any], InjectedState]) -> str:
        """Search the orders."""
        receiver.record("search", query=query, limit=limit)
        return f"{limit} results for {query}"

    @tool
    def count(x: int, runtime: Any) -> str:
        """Count; `runtime` is injected by its name, as ToolNode does."""
        receiver.record(
            "count",
            x=x,
            runtime=isinstance(runtime, ToolRuntime),
            call_id=getattr(runtime, "tool_call_id", None),
        )
        return f"counted {x}"

    return [search, count]


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/effectgate.db"


def converse(
    script: list[Any],
    receiver: EffectRecorder,
    *,
    gated_on: str | None = None,
    gates: list[EffectGate] | None = None,
    use_async: bool = False,
) -> list[tuple[str, Any, str]]:
    """The conversation on create_agent, without the gate or with one on the store `gated_on`
    (appended to `gates`): (tool, content, status) of every ToolMessage the model was given."""
    tools = tools_for(receiver)
    model = ScriptedChatModel(script=Script(list(script)))
    if gated_on is None:
        agent = create_agent(model, tools=tools)
    else:
        middleware = gated_middleware(tools, {t.name: read() for t in tools}, db=gated_on)
        if gates is not None:
            gates.append(middleware.gate)
        agent = create_agent(model, middleware=[middleware])
    value: Any = {"messages": [HumanMessage("go", id="m1")]}
    if use_async:
        out = asyncio.run(agent.ainvoke(value, CFG, version="v2"))
    else:
        out = agent.invoke(value, CFG, version="v2")
    model.assert_complete()
    messages = out.value["messages"]
    return [(str(m.name), m.content, m.status) for m in messages if isinstance(m, ToolMessage)]


@pytest.mark.parametrize("use_async", [False, True], ids=["invoke", "ainvoke"])
def test_arguments_the_tool_refuses_read_as_without_the_gate(
    use_async: bool, db: str, gates: list[EffectGate]
) -> None:
    """A wrong type, an unknown key and a missing argument: the model gets ToolNode's own text,
    which echoes its arguments and names no injected one; the tool never runs."""
    script = [call("search", query=12345, wrong_arg="value"), say("Sorry.")]
    plain, gated = EffectRecorder(), EffectRecorder()
    expected = converse(script, plain, use_async=use_async)
    got = converse(script, gated, gated_on=db, gates=gates, use_async=use_async)
    assert got == expected
    [(_, content, status)] = got
    assert status == "error"
    assert content.startswith(
        "Error invoking tool 'search' with kwargs {'query': 12345, 'wrong_arg': 'value'}"
    )
    assert "state" not in content
    assert plain.count("search") == 0
    assert gated.count("search") == 0


def test_a_runtime_injected_by_name_comes_from_the_framework(db: str, gates: list[EffectGate]) -> None:
    """An unannotated `runtime` parameter, which langchain shows the model: the tool gets the
    call's ToolRuntime whatever the model sends for it, and the gate neither requires nor sees it."""
    script = [call("count", id="c1", x=42, runtime="forged"), say("Done.")]
    plain, gated = EffectRecorder(), EffectRecorder()
    expected = converse(script, plain)
    got = converse(script, gated, gated_on=db, gates=gates)
    assert got == expected == [("count", "counted 42", "success")]
    assert plain.count("count", x=42, runtime=True, call_id="c1") == 1
    assert gated.count("count", x=42, runtime=True, call_id="c1") == 1
    schema = gates[0].table["count"].schema or {}
    assert set(schema["properties"]) == {"x"}
    assert schema["required"] == ["x"]
