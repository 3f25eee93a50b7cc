"""The sandboxed file tools served over MCP (`gated_server`): a real client session writes and
reads inside the work directory, cannot read out of it, and a delete waits for two approvers and
then runs once. Counted on disk."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from mcp import ClientSession
from mcp.client._memory import InMemoryTransport

from effectgate import Approver, EffectGate, EffectTable, Grant, Keyring, PartialApproval
from effectgate.mcp import Grants, Identity, gated_server
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock
from effectgate.tools import file_tools

from ._serving import outcome, run, text

CODER = Identity(user_id="u1", session_id="s-files", agent_id="coder")


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "secret.txt").write_text("outside the work directory")
    root = tmp_path / "work"
    root.mkdir()
    return root


@pytest.fixture
def gate(store: SQLStore, clock: FakeClock, work: Path) -> Iterator[EffectGate]:
    table = EffectTable(file_tools(work, approver_role="ops"))
    table.allow_all("coder")
    g = EffectGate(table, store, keyring=Keyring.generate(), clock=clock)
    yield g
    g.close()


@asynccontextmanager
async def client(gate: EffectGate, grants: Grants) -> AsyncIterator[ClientSession]:
    server = gated_server(gate, identity=CODER, grants=grants)
    async with (
        InMemoryTransport(server, raise_exceptions=True) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def test_file_tools_over_mcp_stay_in_the_work_directory(gate: EffectGate, work: Path) -> None:
    grants = Grants()

    async def scenario() -> None:
        async with client(gate, grants) as session:
            names = {t.name: t.annotations for t in (await session.list_tools()).tools}
            assert names["read_file"] is not None
            assert names["read_file"].read_only_hint is True
            assert names["delete_file"] is not None
            assert names["delete_file"].destructive_hint is True

            wrote = await session.call_tool("write_file", {"path": "notes/plan.md", "content": "step 1\n"})
            assert not wrote.is_error, text(wrote)
            assert (work / "notes" / "plan.md").read_text() == "step 1\n"

            escaped = await session.call_tool("read_file", {"path": "../secret.txt"})
            assert escaped.is_error
            assert "outside the work directory" not in text(escaped)

            asked = await session.call_tool("delete_file", {"path": "notes/plan.md"})
            assert text(asked).startswith("NOT EXECUTED")
            assert (work / "notes" / "plan.md").exists()
            waiting = outcome(asked)
            first = gate.approve(
                waiting["approval_id"], version=waiting["version"], approver=Approver("olu", "ops")
            )
            assert isinstance(first, PartialApproval)
            second = gate.approve(
                waiting["approval_id"], version=waiting["version"], approver=Approver("ines", "ops")
            )
            assert isinstance(second, Grant)
            grants.deliver(second)
            ran = await session.call_tool("delete_file", {"path": "notes/plan.md"})
            assert outcome(ran)["status"] == "executed", text(ran)
            assert not (work / "notes" / "plan.md").exists()
            again = await session.call_tool("delete_file", {"path": "notes/plan.md"})
            assert outcome(again)["replay"] is True

    run(scenario)
    assert (work.parent / "secret.txt").read_text() == "outside the work directory"
    assert len(gate.store.executions(tool="delete_file")) == 1
