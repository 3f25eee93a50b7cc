"""The file tools (`effectgate.tools.files`) through a real adapter: a smolagents agent built from
the effect table (`table_tools`), gated by `GatedAgent`. What happened is counted on disk."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from smolagents import CodeAgent, ToolCallingAgent
from smolagents.monitoring import LogLevel

from effectgate import (
    Approver,
    EffectGate,
    EffectTable,
    Executed,
    Grant,
    Keyring,
    PartialApproval,
    open_store,
)
from effectgate.testing import FakeClock, Script, call, say
from effectgate.tools import file_tools
from effectgate_smolagents import Approve, AwaitingApproval, Finished, GatedAgent, table_tools
from effectgate_smolagents.testing import ScriptedModel

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


@pytest.mark.parametrize("kind", ["tool_calling", "code"])
def test_file_tools_run_through_smolagents_confined_and_gated(
    kind: str, work: Path, gate: EffectGate
) -> None:
    """A write lands inside the work directory once, reads outside it are refused (the model is
    told why, never the secret), and a delete waits for two ops approvers, then runs once."""
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
    cls = CodeAgent if kind == "code" else ToolCallingAgent
    agent = cls(
        tools=table_tools(gate, agent_id=AGENT),
        model=ScriptedModel(script),
        verbosity_level=LogLevel.OFF,
        max_steps=8,
    )
    coder = GatedAgent(agent, gate, agent_id=AGENT)
    out = coder.run("Plan, then clean up", session_id="s1", origin_message_id="m1", user_id="u1")

    assert isinstance(out, AwaitingApproval)
    assert (work / "notes" / "plan.md").read_text() == "step 1\n"
    assert (work / "old.txt").exists()
    shown = json.dumps([str(m) for m in script.seen], ensure_ascii=False)  # what the model was given
    assert SECRET not in shown
    assert "escapes the work directory" in shown
    assert "symlinks are not followed" in shown
    assert "step 1" in shown
    assert [r.status for r in gate.store.executions(tool="write_file")] == ["succeeded"]

    [pending] = out.pending
    assert pending.card.tool == "delete_file"
    assert pending.card.subject == {"path": "old.txt"}
    first = gate.approve(pending.approval_id, version=pending.version, approver=Approver("olga", "ops"))
    assert isinstance(first, PartialApproval)
    grant = gate.approve(pending.approval_id, version=pending.version, approver=Approver("omar", "ops"))
    assert isinstance(grant, Grant)
    done = coder.resume(out, {pending.approval_id: Approve(grant)})

    assert isinstance(done, Finished)
    [(_, outcome)] = done.decided
    assert isinstance(outcome, Executed)
    assert not (work / "old.txt").exists()
    assert (work.parent / "outside" / "secret.txt").read_text() == SECRET
    assert sorted(p.name for p in work.parent.joinpath("outside").iterdir()) == ["secret.txt"]
    assert script.remaining == 0
