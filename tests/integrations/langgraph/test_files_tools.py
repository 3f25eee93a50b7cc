"""The file tools (`effectgate.tools.files`) through LangGraph: a `GatedToolNode` built from the
effect table, in a graph with a checkpointer. What happened is counted on disk."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import GraphOutput

from effectgate import Approver, EffectGate, EffectTable, Grant, Keyring, PartialApproval, open_store
from effectgate.testing import FakeClock, Script, call, say
from effectgate.tools import file_tools
from effectgate_langgraph import GatedToolNode, approve, resume
from effectgate_langgraph.testing import ScriptedChatModel

from ._graph import shop_graph

AGENT = "coder"
SECRET = "SECRET"


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text(SECRET)
    root = tmp_path / "work"
    root.mkdir()
    (root / "old.txt").write_text("stale\n")
    (root / "lo").symlink_to("../outside")
    return root


@pytest.fixture
def gate(work: Path, sqlite_url: str, clock: FakeClock) -> Iterator[EffectGate]:
    table = EffectTable(file_tools(work, approver_role="ops"))
    table.allow_all(AGENT)
    store = open_store(sqlite_url, clock=clock)
    store.setup()
    made = EffectGate(table, store, keyring=Keyring.generate(), clock=clock)
    yield made
    made.close()
    store.close()


def tool_texts(out: GraphOutput[object]) -> list[str]:
    value = out.value
    assert isinstance(value, dict)
    return [str(m.content) for m in value["messages"] if isinstance(m, ToolMessage)]


def test_file_tools_run_through_a_gated_tool_node(work: Path, gate: EffectGate) -> None:
    """A write lands inside once, reads out of the work directory are refused with the reason (never
    the secret; `handle_tool_errors=True` turns the refusal into the tool's error message, as for
    any tool), and a delete pauses in one interrupt until two ops approvers grant it."""
    script = Script(
        [
            call("write_file", path="notes/plan.md", content="step 1\n"),
            call("read_file", path="../outside/secret.txt"),
            call("read_file", path="lo/secret.txt"),
            call("read_file", path="notes/plan.md"),
            call("delete_file", path="old.txt"),
            say("Done."),
        ]
    )
    model = ScriptedChatModel(script=script)
    graph = shop_graph(
        gate,
        model,
        checkpointer=InMemorySaver(),
        node=GatedToolNode(gate, agent_id=AGENT, handle_tool_errors=True),
    )
    config: RunnableConfig = {"configurable": {"thread_id": "s1"}}
    out = graph.invoke(
        {"messages": [HumanMessage("Plan, then clean up", id="m1")]},
        config,
        context={"user_id": "u1"},
        version="v2",
    )

    assert (work / "notes" / "plan.md").read_text() == "step 1\n"
    assert (work / "old.txt").exists()
    texts = tool_texts(out)
    assert all(SECRET not in t for t in texts)
    assert any("escapes the work directory" in t for t in texts)
    assert any("symlinks are not followed" in t for t in texts)
    assert "step 1\n" in texts
    [paused] = out.interrupts
    [request] = paused.value["requests"]
    assert request["tool"] == "delete_file"

    first = gate.approve(request["approval_id"], version=request["version"], approver=Approver("olga", "ops"))
    assert isinstance(first, PartialApproval)
    grant = gate.approve(request["approval_id"], version=request["version"], approver=Approver("omar", "ops"))
    assert isinstance(grant, Grant)
    done = graph.invoke(
        resume({request["approval_id"]: approve(grant.token)}, out.interrupts),
        config,
        context={"user_id": "u1"},
        version="v2",
    )

    assert done.interrupts == ()
    assert not (work / "old.txt").exists()
    assert (work.parent / "outside" / "secret.txt").read_text() == SECRET
    assert [r.status for r in gate.store.executions(tool="delete_file")] == ["succeeded"]
    assert script.remaining == 0
