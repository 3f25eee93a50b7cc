"""`effectgate mcp proxy`: an upstream MCP server's tools behind the gate, driven by the SDK's client.

In process: the upstream is the SDK's `MCPServer` (tests/mcp/upstream_server.py) reached over
memory streams, the proxy's `Server` is reached by a real `ClientSession` over memory streams,
on SQLite and PostgreSQL. Every effect is counted at the upstream. Subprocess upstreams and the
command itself: test_proxy_command.py.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import mcp.types as types
import pytest
from mcp import ClientSession
from mcp.client._memory import InMemoryTransport
from mcp.server.mcpserver import MCPServer

from effectgate import Approver, Grant, Keyring, PartialApproval
from effectgate.audit import audit
from effectgate.effects import Effect
from effectgate.errors import PolicyViolation
from effectgate.mcp._common import Grants, Identity, annotations_for, describe
from effectgate.mcp._config import Row, Upstream
from effectgate.mcp._proxy import GRANT_META, GatedProxy
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from ._serving import outcome, run, text
from .upstream_server import SEND_MAIL, change_send_mail_schema, files_server, reword_send_mail
from .upstream_server import Effect as Done

IDENTITY = Identity(user_id="u1", session_id="s-proxy", agent_id="desk")
SUPPORT = Approver("sam", "support")
OPS = (Approver("olga", "ops"), Approver("omar", "ops"))
MAIL = {"to": "ada@example.com", "body": "hello"}

ROWS: dict[str, Row] = {
    "stat": Row(effect=Effect.READ),
    "append": Row(effect=Effect.WRITE),
    "truncate": Row(effect=Effect.WRITE),  # the upstream claims destructiveHint: raised
    "delete": Row(effect=Effect.DESTRUCTIVE, approver_role="ops", subject=("path",)),  # claims read-only
    "send_mail": Row(effect=Effect.SEND, approver_role="support"),
    "bounce": Row(effect=Effect.SEND, approver_role="support"),
    "page": Row(effect=Effect.SEND, approver_role="support"),
    "rotate": Row(effect=Effect.WRITE),
}


@dataclass
class Rig:
    """The upstream (and what it did), the proxy, and the client session in front of it."""

    upstream: MCPServer
    proxy: GatedProxy
    session: ClientSession
    effects: list[Done] = field(default_factory=list[Done])

    def count(self, tool: str) -> int:
        return sum(1 for e in self.effects if e.tool == tool)

    async def call(self, name: str, args: Mapping[str, Any], **options: Any) -> types.CallToolResult:
        return await self.session.call_tool(f"files__{name}", dict(args), **options)

    def approve(self, result: types.CallToolResult, *approvers: Approver) -> Grant:
        meta = outcome(result)
        decision: Grant | PartialApproval | None = None
        for approver in approvers:
            decision = self.proxy.gate.approve(
                meta["approval_id"], version=meta["version"], approver=approver
            )
        assert isinstance(decision, Grant)
        return decision


@pytest.fixture
def keyring() -> Keyring:
    return Keyring.generate()


@asynccontextmanager
async def proxied(
    store: SQLStore,
    keyring: Keyring,
    clock: FakeClock,
    *,
    rows: Mapping[str, Row] = ROWS,
    default: Row | None = None,
    identity: Identity = IDENTITY,
    **options: Any,
) -> AsyncIterator[Rig]:
    effects: list[Done] = []
    upstream = files_server(effects.append)
    config = Upstream(
        name="files",
        target=InMemoryTransport(upstream, raise_exceptions=True),
        prefix="files",
        tools=rows,
        default=default,
        approver_role="ops",
    )
    proxy = GatedProxy([config], store, identity=identity, keyring=keyring, clock=clock, **options)
    async with (
        proxy,
        InMemoryTransport(proxy.server, raise_exceptions=True) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield Rig(upstream, proxy, session, effects)


@pytest.fixture
def rig_args(store: SQLStore, keyring: Keyring, clock: FakeClock) -> tuple[SQLStore, Keyring, FakeClock]:
    return store, keyring, clock


def test_the_served_tools_show_the_effective_class(rig_args: tuple[SQLStore, Keyring, FakeClock]) -> None:
    """Each row's tool is served under its prefixed name with the upstream's schema; hints and
    description show the class the table and the annotations make it: truncate (a write row the
    upstream calls destructive) is destructive, delete's read-only claim lowers nothing, and shred,
    which has no row, is not served."""

    async def scenario() -> tuple[list[types.Tool], list[types.Tool], GatedProxy]:
        async with proxied(*rig_args) as rig:
            served = (await rig.session.list_tools()).tools
            upstream = await rig.upstream.list_tools()
            return served, upstream, rig.proxy

    served, upstream, proxy = run(scenario)
    table = proxy.gate.table
    assert [t.name for t in served] == [f"files__{t.name}" for t in upstream if t.name in ROWS]
    assert {t.name for t in served} == {f"files__{n}" for n in ROWS}
    effects = {t.name: table[t.name].effect for t in served}
    assert effects == {
        "files__stat": Effect.READ,
        "files__append": Effect.WRITE,
        "files__truncate": Effect.DESTRUCTIVE,
        "files__delete": Effect.DESTRUCTIVE,
        "files__send_mail": Effect.SEND,
        "files__bounce": Effect.SEND,
        "files__page": Effect.SEND,
        "files__rotate": Effect.WRITE,
    }
    schemas = {f"files__{t.name}": t.input_schema for t in upstream}
    for tool in served:
        spec = table[tool.name]
        assert tool.input_schema == schemas[tool.name]
        assert tool.annotations == annotations_for(spec)
        assert tool.description == describe(spec, policy=proxy.gate.policy)
        assert tool.output_schema is None
    by_name = {t.name: t for t in served}
    delete = by_name["files__delete"].annotations
    assert delete is not None
    assert (delete.read_only_hint, delete.destructive_hint) == (False, True)
    assert (by_name["files__truncate"].description or "").startswith(
        "[destructive: needs 2 distinct approvers with role ops] Empty a file."
    )
    assert by_name["files__send_mail"].description == f"[send: needs approval by support] {SEND_MAIL}"


def test_a_read_runs_once_at_the_upstream(rig_args: tuple[SQLStore, Keyring, FakeClock]) -> None:
    """A read row runs at once, once, with the upstream's own answer and no idempotency key."""

    async def scenario() -> tuple[types.CallToolResult, Rig]:
        async with proxied(*rig_args) as rig:
            return await rig.call("stat", {"path": "a.txt"}), rig

    result, rig = run(scenario)
    assert result.is_error is False
    assert text(result) == "a.txt: 12 bytes"
    assert result.structured_content == {"result": "a.txt: 12 bytes"}
    assert outcome(result)["status"] == "executed"
    assert rig.effects == [Done("stat", {"path": "a.txt"}, None)]


def test_a_write_runs_once_per_request_and_its_key_travels(
    rig_args: tuple[SQLStore, Keyring, FakeClock], store: SQLStore
) -> None:
    """A write runs once; the same call again is the same request (the stored answer); the
    upstream received the write's idempotency key in `_meta`."""

    async def scenario() -> tuple[list[types.CallToolResult], Rig]:
        async with proxied(*rig_args) as rig:
            args = {"path": "a.txt", "text": "hi"}
            return [await rig.call("append", args), await rig.call("append", args)], rig

    (first, again), rig = run(scenario)
    assert [outcome(r)["replay"] for r in (first, again)] == [False, True]
    assert text(first) == text(again) == "appended to a.txt"
    [done] = rig.effects
    [execution] = store.executions(tool="files__append")
    assert done.key == execution.idempotency_key
    assert done.key is not None
    assert done.key.startswith("w_files__append_")


def test_a_lying_read_only_hint_stays_destructive(rig_args: tuple[SQLStore, Keyring, FakeClock]) -> None:
    """delete claims readOnlyHint; its row says destructive: it waits for two distinct approvers,
    and runs once, only after both."""

    async def scenario() -> tuple[list[types.CallToolResult], Rig]:
        async with proxied(*rig_args) as rig:
            waiting = await rig.call("delete", {"path": "a.txt"})
            assert rig.count("delete") == 0
            first = rig.proxy.gate.approve(outcome(waiting)["approval_id"], version=1, approver=OPS[0])
            assert isinstance(first, PartialApproval)
            still = await rig.call("delete", {"path": "a.txt"})
            assert rig.count("delete") == 0
            second = rig.proxy.gate.approve(first.approval_id, version=1, approver=OPS[1])
            assert isinstance(second, Grant)
            rig.proxy.grants.deliver(second)
            ran = await rig.call("delete", {"path": "a.txt"})
            return [waiting, still, ran, await rig.call("delete", {"path": "a.txt"})], rig

    (waiting, still, ran, again), rig = run(scenario)
    assert text(waiting).startswith("NOT EXECUTED: files__delete is awaiting approval by ops")
    assert text(still).startswith("NOT EXECUTED")
    assert (outcome(ran)["status"], outcome(again)["replay"]) == ("executed", True)
    assert text(ran) == text(again) == "deleted a.txt"
    assert rig.count("delete") == 1


def test_a_destructive_hint_raises_a_write_row(rig_args: tuple[SQLStore, Keyring, FakeClock]) -> None:
    """truncate's row says write, its upstream says destructiveHint: the call waits, nothing ran."""

    async def scenario() -> tuple[types.CallToolResult, Rig]:
        async with proxied(*rig_args) as rig:
            return await rig.call("truncate", {"path": "a.txt"}), rig

    result, rig = run(scenario)
    assert result.is_error is False
    assert outcome(result)["status"] == "awaiting_approval"
    assert outcome(result)["approver_role"] == "ops"
    card = rig.proxy.gate.card(outcome(result)["approval_id"])
    assert (card.effect, card.approvals_required) == ("destructive", 2)
    assert rig.count("truncate") == 0


def test_a_tool_without_a_row_is_refused(
    rig_args: tuple[SQLStore, Keyring, FakeClock], store: SQLStore
) -> None:
    """shred has no row and the server no default: the call is refused and recorded, and never
    reaches the upstream."""

    async def scenario() -> tuple[types.CallToolResult, Rig]:
        async with proxied(*rig_args) as rig:
            return await rig.call("shred", {"path": "a.txt"}), rig

    result, rig = run(scenario)
    assert result.is_error is True
    assert outcome(result)["code"] == "unknown_tool"
    assert rig.effects == []
    [event] = store.events(kind="refused")
    assert (event.tool, json.loads(event.detail_json)["tool_name"]) == (None, "files__shred")


@pytest.mark.parametrize(("default", "waits"), [("write", False), ("send", True)])
def test_an_explicit_server_default_classifies_tools_without_a_row(
    rig_args: tuple[SQLStore, Keyring, FakeClock], default: str, waits: bool
) -> None:
    """With `default` set for the server, shred (no row) is served under that row: a write runs,
    a send waits for the server's approver role."""
    row = Row(effect=Effect(default), approver_role="ops" if waits else None)

    async def scenario() -> tuple[types.CallToolResult, Rig]:
        async with proxied(*rig_args, default=row) as rig:
            return await rig.call("shred", {"path": "a.txt"}), rig

    result, rig = run(scenario)
    assert result.is_error is False
    assert outcome(result)["status"] == ("awaiting_approval" if waits else "executed")
    assert rig.count("shred") == (0 if waits else 1)


def test_a_gated_call_waits_then_runs_exactly_once(
    rig_args: tuple[SQLStore, Keyring, FakeClock], store: SQLStore
) -> None:
    """send_mail answers NOT EXECUTED with its approval and card link and reaches nobody; approved,
    the client's same call runs it once with the approval's key; a third call gets the stored
    result. No result carries the grant token."""
    grants = Grants()

    async def scenario() -> tuple[list[types.CallToolResult], Rig, str]:
        async with proxied(*rig_args, grants=grants, inbox_url="http://127.0.0.1:8765/") as rig:
            waiting = await rig.call("send_mail", MAIL)
            assert rig.count("send_mail") == 0
            grant = rig.approve(waiting, SUPPORT)
            grants.deliver(grant)
            ran = await rig.call("send_mail", MAIL)
            return [waiting, ran, await rig.call("send_mail", MAIL)], rig, grant.token

    (waiting, ran, again), rig, token = run(scenario)
    meta = outcome(waiting)
    assert waiting.is_error is False
    assert text(waiting).startswith("NOT EXECUTED: files__send_mail is awaiting approval by support")
    assert meta["card_url"] == f"http://127.0.0.1:8765/approvals/{meta['approval_id']}"
    assert meta["card_url"] in text(waiting)
    assert outcome(ran) == {
        "status": "executed",
        "replay": False,
        "approval_id": meta["approval_id"],
        "version": 1,
    }
    assert outcome(again)["replay"] is True
    assert (
        ran.structured_content
        == again.structured_content
        == {"message_id": "msg-ada@example.com", "status": "sent"}
    )
    [done] = rig.effects
    assert done.key == f"eg_{meta['approval_id']}_v1"
    assert len(store.executions(tool="files__send_mail")) == 1
    assert all(token not in r.model_dump_json(by_alias=True) for r in (waiting, ran, again))
    assert audit(store, rig.proxy.gate.table, keyring=rig.proxy.keyring).clean


def test_a_grant_the_client_sends_in_meta_runs_only_its_call(
    rig_args: tuple[SQLStore, Keyring, FakeClock],
) -> None:
    """The client application re-issues the call with the grant in `_meta`: it runs once. The
    same grant sent with another call runs nothing; a malformed one is refused."""

    async def scenario() -> tuple[list[types.CallToolResult], Rig]:
        async with proxied(*rig_args) as rig:
            waiting = await rig.call("send_mail", MAIL)
            grant = rig.approve(waiting, SUPPORT)
            meta = {GRANT_META: grant.token}
            other = await rig.call("send_mail", {**MAIL, "to": "eve@example.com"}, meta=meta)
            bad = await rig.call("send_mail", MAIL, meta={GRANT_META: "not-a-grant"})
            assert rig.count("send_mail") == 0
            ran = await rig.call("send_mail", MAIL, meta=meta)
            return [other, bad, ran, await rig.call("send_mail", MAIL, meta=meta)], rig

    (other, bad, ran, again), rig = run(scenario)
    assert outcome(other)["status"] == "awaiting_approval"  # a new approval of its own
    assert bad.is_error is True
    assert outcome(bad)["code"] == "malformed"
    assert (outcome(ran)["status"], outcome(again)["replay"]) == ("executed", True)
    assert rig.effects == [Done("send_mail", MAIL, rig.effects[0].key)]


def test_an_approved_call_that_leaves_out_a_default_runs_once(
    rig_args: tuple[SQLStore, Keyring, FakeClock],
) -> None:
    """page's `urgent` has a default in the upstream's schema and the client leaves it out: the
    approval records the arguments as sent (validation fills in nothing), the client's re-issue
    (still without it) runs once, and the upstream applies its own default."""
    grants = Grants()

    async def scenario() -> tuple[list[types.CallToolResult], Rig]:
        async with proxied(*rig_args, grants=grants) as rig:
            args = {"team": "ops", "text": "disk full"}
            waiting = await rig.call("page", args)
            grants.deliver(rig.approve(waiting, SUPPORT))
            return [waiting, await rig.call("page", args), await rig.call("page", args)], rig

    (waiting, ran, again), rig = run(scenario)
    card = rig.proxy.gate.card(outcome(waiting)["approval_id"])
    assert card.args == {"team": "ops", "text": "disk full"}
    assert (outcome(ran)["status"], outcome(again)["replay"]) == ("executed", True)
    assert [e.args for e in rig.effects] == [{"team": "ops", "text": "disk full", "urgent": False}]


@pytest.mark.parametrize("change", ["description", "schema"])
def test_a_tool_changed_upstream_after_approval_is_refused_and_audited(
    rig_args: tuple[SQLStore, Keyring, FakeClock], store: SQLStore, keyring: Keyring, change: str
) -> None:
    """send_mail is approved, then the upstream rewords its description (or changes its schema):
    the re-issue is refused and recorded, nothing reaches the upstream, and the audit, from the
    stored records alone and against the table, reports the approval as reclassified."""
    grants = Grants()

    async def scenario() -> tuple[types.CallToolResult, Rig, str]:
        async with proxied(*rig_args, grants=grants) as rig:
            waiting = await rig.call("send_mail", MAIL)
            grants.deliver(rig.approve(waiting, SUPPORT))
            if change == "description":
                reword_send_mail(rig.upstream, rig.effects.append)
            else:
                change_send_mail_schema(rig.upstream, rig.effects.append)
            return await rig.call("send_mail", MAIL), rig, outcome(waiting)["approval_id"]

    refused, rig, approval_id = run(scenario)
    assert refused.is_error is True
    assert outcome(refused) == {"status": "refused", "code": "mismatch", "approval_id": approval_id}
    assert "changed upstream" in text(refused)
    assert rig.effects == []
    assert store.executions(tool="files__send_mail") == []
    [event] = store.events(kind="refused")
    assert json.loads(event.detail_json or "{}")["refused_approval"] == approval_id
    for report in (audit(store, keyring=keyring), rig.proxy.gate.audit()):
        assert [(f.kind, f.tool, f.approval_id) for f in report.findings] == [
            ("reclassified", "files__send_mail", approval_id)
        ]


def test_a_tool_changed_upstream_before_approval_cannot_be_approved(
    rig_args: tuple[SQLStore, Keyring, FakeClock],
) -> None:
    """The upstream rewords send_mail while its call waits: the reviewer's approval is refused
    (the row changed), the client's re-issue is refused, and nothing runs."""

    async def scenario() -> tuple[types.CallToolResult, Rig, str]:
        async with proxied(*rig_args) as rig:
            waiting = await rig.call("send_mail", MAIL)
            reword_send_mail(rig.upstream, rig.effects.append)
            return await rig.call("send_mail", MAIL), rig, outcome(waiting)["approval_id"]

    refused, rig, approval_id = run(scenario)
    assert outcome(refused)["code"] == "mismatch"
    with pytest.raises(PolicyViolation) as raised:
        rig.proxy.gate.approve(approval_id, version=1, approver=SUPPORT)
    assert raised.value.code == "reclassified"
    assert rig.effects == []


def test_model_written_identity_changes_nothing(rig_args: tuple[SQLStore, Keyring, FakeClock]) -> None:
    """Identity written into the arguments (or `_meta`) is data, not identity: the approval is
    filed under the configured user, session and agent."""

    async def scenario() -> tuple[types.CallToolResult, Rig]:
        async with proxied(*rig_args) as rig:
            smuggled = {**MAIL, "user_id": "mallory", "session_id": "s-other", "agent_id": "root"}
            return await rig.call("send_mail", smuggled, meta={"user_id": "mallory"}), rig

    result, rig = run(scenario)
    card = rig.proxy.gate.card(outcome(result)["approval_id"])
    assert (card.user_id, card.session_id) == ("u1", "s-proxy")
    [event] = rig.proxy.store.events(kind="proposed")
    assert (event.user_id, event.agent_id) == ("u1", "desk")
    assert rig.effects == []


@pytest.mark.parametrize(
    ("tool_errors", "code"), [("definite", "upstream_error"), (None, "needs_reconciliation")]
)
def test_an_upstream_error_result_of_a_gated_call(
    rig_args: tuple[SQLStore, Keyring, FakeClock], store: SQLStore, tool_errors: Any, code: str
) -> None:
    """bounce answers with an error result. With `tool_errors = "definite"` the approval ends
    failed and the client reads the upstream's error; otherwise the outcome is unknown
    (needs_reconciliation) and the re-issue does not call the upstream again."""
    rows = {**ROWS, "bounce": Row(effect=Effect.SEND, approver_role="support", tool_errors=tool_errors)}
    grants = Grants()
    calls: list[int] = []
    gates: list[Any] = []

    async def scenario() -> tuple[list[types.CallToolResult], str]:
        async with proxied(*rig_args, rows=rows, grants=grants) as rig:
            gates.append(rig.proxy.gate)
            waiting = await rig.call("bounce", {"to": "nobody@example.com"})
            grants.deliver(rig.approve(waiting, SUPPORT))
            failed = await rig.call("bounce", {"to": "nobody@example.com"})
            calls.append(len(store.executions(tool="files__bounce")))
            again = await rig.call("bounce", {"to": "nobody@example.com"})
            return [failed, again], outcome(waiting)["approval_id"]

    (failed, again), approval_id = run(scenario)
    assert failed.is_error is True
    assert outcome(failed)["code"] == code
    if code == "upstream_error":
        assert "mailbox nobody@example.com does not exist" in text(failed)
        assert outcome(again)["code"] == "failed"
        assert gates[0].card(approval_id).status == "failed"
    else:
        assert outcome(again)["code"] == "needs_reconciliation"
    assert calls == [1]
    assert len(store.executions(tool="files__bounce")) == 1


def test_a_lost_reply_is_an_unknown_outcome_never_run_again(
    rig_args: tuple[SQLStore, Keyring, FakeClock], store: SQLStore
) -> None:
    """rotate takes effect upstream, then its reply fails in protocol: the write is
    needs_reconciliation (not failed), and its re-issue does not call the upstream again."""

    async def scenario() -> tuple[list[types.CallToolResult], Rig]:
        async with proxied(*rig_args) as rig:
            args = {"path": "app.log"}
            return [await rig.call("rotate", args), await rig.call("rotate", args)], rig

    (lost, again), rig = run(scenario)
    assert (lost.is_error, again.is_error) == (True, True)
    assert outcome(lost)["code"] == "needs_reconciliation"
    assert outcome(again)["code"] == "needs_reconciliation"
    assert rig.count("rotate") == 1
    [execution] = store.executions(tool="files__rotate")
    assert execution.status == "needs_reconciliation"
