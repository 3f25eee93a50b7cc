"""The file tools (`effectgate.tools.files`) through the OpenAI Agents SDK: FunctionTools built
from the effect table (`table_tools`), gated by `gate_agent`. What happened is counted on disk."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from agents import Agent, Runner
from agents.items import ToolCallOutputItem

from effectgate import Approver, EffectGate, EffectTable, Grant, Keyring, PartialApproval, open_store
from effectgate.testing import FakeClock, Script, call, say
from effectgate.tools import file_tools
from effectgate_openai_agents import approve, gate_agent, pending_approvals, table_tools
from effectgate_openai_agents.testing import ScriptedModel

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


def test_file_tools_run_through_a_gated_openai_agent(work: Path, gate: EffectGate) -> None:
    """A write lands inside once, reads out of the work directory are refused with the reason (never
    the secret), and a delete pauses the run until two ops approvers grant it."""
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
    base = Agent(name="coder", model=ScriptedModel(script), tools=list(table_tools(gate, agent_id=AGENT)))
    agent = gate_agent(base, gate, agent_id=AGENT)
    context = {"session_id": "s1", "origin_message_id": "m1", "user_id": "u1"}
    result = Runner.run_sync(agent, [{"role": "user", "content": "Plan, then clean up"}], context=context)

    assert (work / "notes" / "plan.md").read_text() == "step 1\n"
    assert (work / "old.txt").exists()
    texts = [str(i.output) for i in result.new_items if isinstance(i, ToolCallOutputItem)]
    assert all(SECRET not in t for t in texts)
    assert any("escapes the work directory" in t for t in texts)
    assert any("symlinks are not followed" in t for t in texts)
    assert "step 1\n" in texts
    [paused] = pending_approvals(result)
    assert paused.tool == "delete_file"
    assert paused.approval_id is not None
    assert paused.version is not None

    first = gate.approve(paused.approval_id, version=paused.version, approver=Approver("olga", "ops"))
    assert isinstance(first, PartialApproval)
    grant = gate.approve(paused.approval_id, version=paused.version, approver=Approver("omar", "ops"))
    assert isinstance(grant, Grant)
    state = result.to_state()
    approve(state, paused, grant.token)
    done = Runner.run_sync(agent, state)

    assert done.final_output == "Done."
    assert not (work / "old.txt").exists()
    assert (work.parent / "outside" / "secret.txt").read_text() == SECRET
    assert [r.status for r in gate.store.executions(tool="delete_file")] == ["succeeded"]
    assert script.remaining == 0
