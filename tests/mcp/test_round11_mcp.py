"""Round 11 of the review of the MCP side (`mcp serve`, `mcp proxy`), on SQLite and PostgreSQL.
Upstreams in process over memory streams, as in test_proxy.py; effects counted at the upstream."""

from __future__ import annotations

from typing import Any

import mcp.types as types
import pytest
import sqlalchemy as sa
from mcp.client._memory import InMemoryTransport
from mcp.types import ToolAnnotations

from effectgate import EffectGate, Keyring
from effectgate.effects import Effect, Policy
from effectgate.errors import TamperedRecord
from effectgate.mcp._approving import ApprovingGate, current_row
from effectgate.mcp._common import Identity
from effectgate.mcp._config import ProxyConfig, Row, Upstream
from effectgate.stores import SQLStore
from effectgate.table import EffectTable, ToolSpec
from effectgate.testing import FakeClock

from ._serving import outcome, run, text
from .test_proxy import MAIL, SUPPORT
from .test_proxy import proxied as proxy_rig
from .test_proxy_listing import proxied
from .test_round7_serve import over_the_wire
from .upstream_server import listing_server

SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}}


def test_a_tool_listed_twice_with_a_destructive_claim_is_not_run_as_a_read(
    store: SQLStore, clock: FakeClock
) -> None:
    """An upstream lists `wipe` twice under one name: once claiming readOnlyHint, once claiming
    destructiveHint. The table's default row is a read, and an annotation can only raise a row:
    the proxy took the first entry and served `wipe` as a read, so the call ran upstream at once,
    with no approval, although the upstream's own listing called that name destructive (and the
    approving side, re-listing, would derive whichever entry it met first). A name the upstream
    lists more than once is ambiguous: it is not served, on either side, and nothing runs."""
    calls: list[str] = []
    harmless = types.Tool(name="wipe", input_schema=SCHEMA, annotations=ToolAnnotations(read_only_hint=True))
    wiping = types.Tool(name="wipe", input_schema=SCHEMA, annotations=ToolAnnotations(destructive_hint=True))

    def listing(cursor: str | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[harmless, wiping])

    def upstream() -> Upstream:
        return Upstream(
            name="up",
            target=InMemoryTransport(listing_server("up", listing, calls)),
            prefix="up",
            default=Row(effect=Effect.READ),
            approver_role="ops",
        )

    async def scenario() -> tuple[list[str], dict[str, Any], str | None]:
        async with proxied(store, clock, upstream()) as (_, session):
            served = [t.name for t in (await session.list_tools()).tools]
            result = await session.call_tool("up__wipe", {"path": "/srv"})
        row = await current_row(ProxyConfig(servers=(upstream(),)), Policy())("up__wipe")
        return served, outcome(result), row

    served, answered, row = run(scenario)
    assert calls == []
    assert served == []
    assert answered["status"] == "refused"
    assert row is None


def test_an_edited_approval_is_refused_as_edited_before_the_upstream_is_compared(
    store: SQLStore, clock: FakeClock
) -> None:
    """The approving side (`proxy_app`'s gate) compared an approval's stored row fingerprint with
    the upstream's before the record was verified: an approval whose fingerprint and user were
    edited in the database was refused as "changed upstream" (`reclassified`), and a `mismatch`
    refusal was recorded under the forged user, from a row that does not verify. It is refused
    as the edited record it is (`TamperedRecord`), with nothing recorded from it."""
    keyring = Keyring.generate()

    async def scenario() -> tuple[str, int, str, EffectTable]:
        async with proxy_rig(store, keyring, clock) as rig:
            result = await rig.call("send_mail", MAIL)
            spec = rig.proxy.gate.table["files__send_mail"]
            meta = outcome(result)
            return meta["approval_id"], meta["version"], spec.fingerprint, rig.proxy.gate.table

    approval_id, version, fingerprint, table = run(scenario)
    with store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE eg_approvals SET row_fingerprint = :f, user_id = 'mallory' WHERE id = :i"),
            {"f": "f" * 64, "i": approval_id},
        )

    async def now(tool: str) -> str | None:
        return fingerprint

    gate = ApprovingGate(table, store, keyring=keyring, clock=clock, current_row=now)
    try:
        with pytest.raises(TamperedRecord):
            gate.approve(approval_id, version=version, approver=SUPPORT)
    finally:
        gate.close()
    assert [e for e in store.events(kind="refused") if e.user_id == "mallory"] == []


def test_a_read_returning_an_integer_past_pythons_digit_limit_is_answered(
    store: SQLStore, clock: FakeClock
) -> None:
    """A read returned an object holding an integer of more than 4300 digits (a factorial, a big
    number's exact value). The answer's text was written (pydantic writes any integer), then
    parsed back for the structured content, which Python refuses past its digit limit: the tool
    ran, and the client got a JSON-RPC "Internal error" instead of the answer. It is answered as
    its text (nothing structured that cannot be read back)."""
    runs: list[int] = []
    huge, digits = 10**5000, "1" + "0" * 5000

    def factorial_digits(n: int) -> dict[str, Any]:
        runs.append(n)
        return {"n": n, "value": huge}

    table = EffectTable([ToolSpec(name="big", effect=Effect.READ, fn=factorial_digits)])
    table.allow_all("a11")
    g = EffectGate(table, store, keyring=Keyring.generate(), clock=clock)

    async def scenario() -> types.CallToolResult:
        identity = Identity(user_id="u1", session_id="s11", agent_id="a11")
        async with over_the_wire(g, identity) as session:
            return await session.call_tool("big", {"n": 2000})

    try:
        result = run(scenario)
    finally:
        g.close()
    assert runs == [2000]
    assert outcome(result)["status"] == "executed"
    assert digits in text(result)
