"""Round 17 of the review of the MCP side (`mcp proxy`), on SQLite and PostgreSQL. Upstreams in
process over memory streams; effects counted at the upstream (the names of the calls it ran)."""

from __future__ import annotations

import random
import string

import mcp.types as types
from mcp.client._memory import InMemoryTransport

from effectgate.effects import Effect
from effectgate.mcp._config import Row, Upstream
from effectgate.mcp._upstream import MAX_NAME_BYTES
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from ._serving import outcome, run
from .test_proxy_listing import proxied
from .upstream_server import listing_server

SCHEMA = {"type": "object", "properties": {"to": {"type": "string"}}}


def test_a_tool_name_no_approval_index_can_hold_is_not_served(store: SQLStore, clock: FakeClock) -> None:
    """An upstream lists a send tool whose name is 6,000 letters long. The proxy served it, and a
    call proposed its approval: on SQLite it waited, on PostgreSQL the INSERT failed ("index row
    size 6088 exceeds btree version 4 maximum 2704 for index eg_approvals_subject") and the client
    was answered the database's raw error with its SQL. A served name longer than
    `MAX_NAME_BYTES` is not served (on either store), a call of it is refused as an unknown tool
    and recorded, and the upstream's other tools are served as before."""
    letters = random.Random(17)
    long = "".join(letters.choice(string.ascii_letters) for _ in range(6000))
    calls: list[str] = []

    def listing(cursor: str | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool(name=n, input_schema=SCHEMA) for n in (long, "mail")])

    upstream = Upstream(
        name="up",
        target=InMemoryTransport(listing_server("up", listing, calls)),
        prefix="up",
        default=Row(effect=Effect.SEND, approver_role="ops"),
    )

    async def scenario() -> tuple[list[str], types.CallToolResult, types.CallToolResult]:
        async with proxied(store, clock, upstream) as (_, session):
            served = [t.name for t in (await session.list_tools()).tools]
            refused = await session.call_tool(f"up__{long}", {"to": "x"})
            waiting = await session.call_tool("up__mail", {"to": "x"})
            return served, refused, waiting

    served, refused, waiting = run(scenario)
    assert served == ["up__mail"]
    assert outcome(refused)["status"] == "refused"
    assert outcome(waiting)["status"] == "awaiting_approval"
    assert [a.tool for a in store.approvals()] == ["up__mail"]
    assert calls == []
    assert len(f"up__{long}".encode()) > MAX_NAME_BYTES
