"""The gated MCP proxy (`effectgate mcp proxy`): upstream MCP servers' tools, served to any MCP
client, every call through the gate.

`GatedProxy(config, store, identity=...)` connects to each upstream (`_upstream.Connection`),
builds the effect table from their listings and the configuration (`_upstream.specs_for`: the
table decides, annotations only raise a row), and serves it with the SDK's `Server`
(`proxy.server`): each tool under its served name (`files__delete`), with the upstream's input
schema, and hints and a description that show the effective class (`_common.annotations_for`,
`_common.describe`). The upstream's output schema is not served: a call waiting for approval has
no output to match it.

**Identity** is the configured one (`_common.Identity`: flags, environment, the file), never an
argument; the origin of a call is derived from the call (`_common.origin_for`), so a re-issued
call is the same request.

**Every call re-reads its upstream's listing first** (one `tools/list` round trip), and the
table, and with it the gate, is rebuilt when the listing changed (its rows in a worker thread,
before the lock every call takes). So a call is routed by the class the upstream's tool has now,
and an approval is checked against the tool as it is now: a waiting or approved call whose tool
changed upstream since it was proposed (schema, description, annotations) is refused
(`mismatch`, recorded), nothing runs, and an approved one is an audit finding (`reclassified`).
What is left is the moment between that listing and the call itself, which MCP gives no way to close.

**Approved calls** run when the client re-issues them and the grant has reached this process:
delivered by the approving side (`proxy.grants.deliver`, e.g. the inbox's `on_grant`), or sent
by the client application with the re-issued call (`_meta` "effectgate/grant", e.g. the token
`effectgate approve` printed). Either way it runs once, bound to the approval version and the
arguments (`adapter.bind_decision`); later re-issues get the stored result.

**Results**: an executed call answers with the upstream's own content (stored, so a replay
answers the same); a waiting call with "NOT EXECUTED" and the approval id and card link
(`_common.result_for`); a refusal, an invalid call, an unknown outcome or an upstream error
result as an error result that says so.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Any

import mcp.types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from pydantic import ValidationError

from .. import __version__
from .._clock import Clock
from .._logging import logger
from ..context import CallContext
from ..effects import Policy
from ..errors import TokenError
from ..gate import EffectGate
from ..outcomes import Executed, Grant, Invalid, Outcome, Pending, Refused
from ..stores.protocol import Store
from ..table import EffectTable, SchemaError, ToolSpec
from ..tokens import Keyring, keyring_for
from ._common import (
    META_KEY,
    Grants,
    Identity,
    annotations_for,
    context_for,
    describe,
    error_result,
    result_for,
    run_approved,
)
from ._config import ProxyConfig, Upstream, split_served
from ._prior import call_once
from ._serve import card_link
from ._upstream import CONTEXT_PARAM, Connection, UpstreamToolError, specs_for, table_of

log = logger(__name__)

#: The `_meta` key under which a client application may send a grant token with a re-issued call
#: (set by the application, never by the model: a model writes a tool's name and arguments only).
GRANT_META = "effectgate/grant"

INSTRUCTIONS = (
    "Tools of other MCP servers behind an effectgate effect table. Reads run; writes run once per "
    "request; send, money and destructive calls wait for a person and answer NOT EXECUTED until "
    "approved: call again with the same arguments once approved."
)


class GatedProxy:
    """Upstream MCP servers' tools behind one gate (see the module docstring). An async context
    manager: entering connects to every upstream and reads its tools; leaving disconnects."""

    def __init__(
        self,
        config: ProxyConfig | Sequence[Upstream],
        store: Store,
        *,
        identity: Identity,
        policy: Policy | None = None,
        keyring: Keyring | None = None,
        clock: Clock | None = None,
        grants: Grants | None = None,
        inbox_url: str | None = None,
        name: str = "effectgate-proxy",
    ) -> None:
        config = config if isinstance(config, ProxyConfig) else ProxyConfig(servers=tuple(config))
        self.upstreams = upstreams = config.servers  # a sequence checked as a file is (prefixes)
        self.identity = identity
        self.store = store
        self.policy = policy or Policy()
        self.keyring = keyring or keyring_for(store.url)
        self.clock = clock
        self.grants = grants if grants is not None else Grants()
        self._link = card_link(inbox_url)
        self._connections = {u.name: Connection(u) for u in upstreams}
        self._by_prefix = {u.prefix: u for u in upstreams}
        self._listed: dict[str, tuple[str, list[ToolSpec]]] = {}  # server -> (listing JSON, rows)
        self._gate: EffectGate | None = None
        # Replaced gates that calls still hold, closed when the last lets go (or on exit): a gate
        # closed under a running call would stop renewing its lease.
        self._retired: list[EffectGate] = []
        self._holding: dict[int, int] = {}  # id(gate) -> calls running on it
        self._lock = asyncio.Lock()
        self._stack: AsyncExitStack | None = None
        self.server: Server[Any] = Server(
            name,
            version=__version__,
            instructions=INSTRUCTIONS,
            on_list_tools=self._on_list_tools,
            on_call_tool=self._on_call_tool,
        )

    # -- lifecycle

    async def __aenter__(self) -> GatedProxy:
        async with AsyncExitStack() as stack:
            for connection in self._connections.values():
                await connection.open(stack)
            await self.refresh()
            self._stack = stack.pop_all()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for gate in [*self._retired, *([self._gate] if self._gate else [])]:
            gate.close()
        if self._stack is not None:
            await self._stack.__aexit__(exc_type, exc, tb)

    @property
    def gate(self) -> EffectGate:
        """The gate over the table as the upstreams listed their tools last."""
        if self._gate is None:
            raise RuntimeError("the proxy is not running: enter it first (async with GatedProxy(...))")
        return self._gate

    # -- the table

    async def refresh(self, server: str | None = None) -> EffectGate:
        """Read the tools of one upstream (or all) again; rebuild the table and the gate when the
        rows changed. A listing that fails raises (nothing served from a stale listing), and the
        pass keeps nothing it read: listings are kept only with the table and gate built from
        them (all or nothing)."""
        names = [server] if server is not None else list(self._connections)
        # read, and rows built in a worker thread (validators: seconds for a long listing), unlocked
        built: dict[str, tuple[str, list[ToolSpec] | None, list[types.Tool]]] = {}
        for name in names:
            tools = await self._connections[name].list_tools()
            built[name] = (*await asyncio.to_thread(self._rows, name, tools), tools)
        async with self._lock:  # compared again: a pass may have committed since (rows built here)
            fresh = {
                n: (listing, rows if rows is not None else self._specs(n, tools))
                for n, (listing, rows, tools) in built.items()
                if listing != self._listed.get(n, ("", []))[0]
            }
            if fresh or self._gate is None:
                table = self._table({**self._listed, **fresh})
                if self._gate is None or table.fingerprint != self._gate.table.fingerprint:
                    kw: dict[str, Any] = {"policy": self.policy, "keyring": self.keyring, "clock": self.clock}
                    gate = await asyncio.to_thread(EffectGate, table, self.store, **kw)
                    replaced, self._gate = self._gate, gate
                    if replaced is not None:
                        log.info("the upstream tools changed: the table is now %s", table.fingerprint[:12])
                        if self._holding.get(id(replaced)):
                            self._retired.append(replaced)
                        else:
                            await asyncio.to_thread(replaced.close)
            self._listed.update(fresh)  # committed with the gate built from it, never before
            return self.gate

    def _rows(self, server: str, tools: list[types.Tool]) -> tuple[str, list[ToolSpec] | None]:
        """The listing's text (compared, not hashed: RFC 8785 refuses int64 bounds), and its rows if new."""
        listing = json.dumps([t.model_dump(mode="json") for t in tools], sort_keys=True)
        same = listing == self._listed.get(server, ("", []))[0]
        return listing, None if same else self._specs(server, tools)

    def _specs(self, server: str, tools: list[types.Tool]) -> list[ToolSpec]:
        return specs_for(self._connections[server].upstream, self._connections[server], tools, self.policy)

    def _table(self, listed: dict[str, tuple[str, list[ToolSpec]]]) -> EffectTable:
        rows = (listed.get(name, ("", []))[1] for name in self._connections)
        return table_of(rows, self.identity.agent_id)

    def upstream_of(self, name: str) -> Upstream | None:
        """The upstream a served name routes to: the one whose prefix it starts with (a name
        without the separator: the "" prefix's), if any. Only tools whose served name routes back
        to their own server are served (`Upstream.routes_back`), so this is the one that lists it."""
        prefix, _ = split_served(name)
        return self._by_prefix.get(prefix)

    # -- serving

    async def list_tools(self) -> list[types.Tool]:
        """The served tools, with the effective class in their hints and descriptions."""
        try:
            gate = await self.refresh()
        except Exception as exc:  # one upstream down: serve what the others (and the last listing) have
            log.warning("listing the upstream tools failed: %s: %r", type(exc).__name__, str(exc))
            gate = self.gate
        return [
            types.Tool(
                name=spec.name,
                description=describe(spec, policy=gate.policy),
                input_schema=dict(spec.schema or {"type": "object"}),
                annotations=annotations_for(spec),
            )
            for spec in gate.table
        ]

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        call_id: str | int | None = None,
        grant: str | None = None,
    ) -> types.CallToolResult:
        """One client call, through the gate (see the module docstring). `grant`: a grant token
        the client application sent with the call (`_meta` "effectgate/grant"), used for this call
        only: it runs only the approval version it was minted for, and it never replaces a grant
        the approving side delivered to `grants` (a token from the client is unverified until the
        gate runs it, so a forged one must not displace the real one)."""
        sent: Grant | None = None
        if grant is not None:
            try:
                claims = Keyring.read(grant)
            except TokenError as exc:
                return error_result(name, exc)
            sent = Grant(
                approval_id=claims.approval_id,
                version=claims.version,
                token=grant,
                expires_at=claims.expires_at,
            )
        upstream = self.upstream_of(name)
        try:
            gate = await self.refresh(upstream.name) if upstream is not None else self.gate
        except Exception as exc:  # the listing could not be read: nothing is called on a stale one
            log.warning(
                "call of %r not made: listing %r failed: %r", name, upstream and upstream.name, str(exc)
            )
            return error_result(name, exc)
        spec = gate.table.get(name)
        if spec is not None and CONTEXT_PARAM in arguments:
            # The gate hands the upstream caller its ToolContext under this name: a client's value
            # would be recorded (and shown to the reviewer) but never reach the upstream.
            reserved = SchemaError(f"/{CONTEXT_PARAM}", "this argument name is reserved for the proxy")
            return self._result(Invalid(tool=name, errors=(reserved,)))
        ctx = context_for(self.identity, name, arguments, spec=spec, call_id=call_id)
        self._holding[id(gate)] = self._holding.get(id(gate), 0) + 1
        # A cancelled call keeps its hold: its work may still run in a worker thread, whose lease a
        # closed gate would stop renewing (a replaced gate it holds is closed at exit, not before).
        result = await self._through(gate, name, arguments, ctx, spec, sent)
        if self._let_go(gate) and gate in self._retired:
            self._retired.remove(gate)
            await asyncio.to_thread(gate.close)
        return result

    def _let_go(self, gate: EffectGate) -> bool:
        """A call is done with `gate`; whether no other call holds it now."""
        held = self._holding.pop(id(gate), 1) - 1
        if held:
            self._holding[id(gate)] = held
        return not held

    async def _through(
        self,
        gate: EffectGate,
        name: str,
        arguments: dict[str, Any],
        ctx: CallContext,
        spec: ToolSpec | None,
        sent: Grant | None,
    ) -> types.CallToolResult:
        try:
            outcome = await call_once(gate, name, spec, arguments, ctx)  # answered before?
            if isinstance(outcome, Pending):
                outcome = await self._waiting(gate, name, arguments, ctx, spec, outcome, sent)
        except UpstreamToolError as exc:  # a definite failure, recorded: the upstream's own words
            return types.CallToolResult(
                content=[
                    types.TextContent(text=f"{name} failed upstream; nothing more will run."),
                    *(_content(exc.result) or []),
                ],
                is_error=True,
                meta={META_KEY: {"status": "failed", "code": "upstream_error"}},
            )
        except Exception as exc:  # an unknown outcome, a refused grant, a broken tool
            return error_result(name, exc)
        finally:
            self.grants.prune(gate.clock.now())  # expired ones (after this call took its own)
        return self._result(outcome)

    async def _waiting(
        self,
        gate: EffectGate,
        name: str,
        arguments: dict[str, Any],
        ctx: CallContext,
        spec: ToolSpec | None,
        pending: Pending,
        sent: Grant | None = None,
    ) -> Outcome:
        """A call that has an approval: refused if its tool changed since the proposal; run if
        approved and its grant was sent with the call (`sent`) or delivered; otherwise still
        waiting."""
        if not pending.replay:  # proposed (or amended) just now, under the row as it is now
            return pending
        row = await asyncio.to_thread(_approval_row, gate, pending.approval_id)
        if spec is None or row != spec.fingerprint:
            return gate.refuse(
                name,
                ctx,
                code="mismatch",
                message=(
                    f"{name} changed upstream (its schema, description or annotations) since approval "
                    f"{pending.approval_id} was proposed: the reviewer did not approve this tool. "
                    "Nothing ran; this request cannot run as it is."
                ),
                approval_id=pending.approval_id,
            )
        if pending.status != "approved":
            return pending
        answer: Outcome = pending
        if sent is not None:  # one that lapsed stands aside: a later round's grant may be delivered
            own = Grants()
            own.deliver(sent)
            answer = await run_approved(gate, name, arguments, pending, grants=own)
            if not len(own) and not (isinstance(answer, Refused) and answer.code == "expired"):
                return answer  # the sent grant was for this approval version: its answer stands
        delivered = await run_approved(gate, name, arguments, pending, grants=self.grants)
        return answer if delivered is pending else delivered

    def _result(self, outcome: Outcome) -> types.CallToolResult:
        approval = getattr(outcome, "approval_id", None)
        result = result_for(outcome, card_url=self._link(approval) if approval else None)
        stored = outcome.result if isinstance(outcome, Executed) else None
        if isinstance(stored, dict) and (content := _content(stored)) is not None:  # the upstream's answer
            result.content = content
            result.structured_content = stored.get("structuredContent")
            result.is_error = bool(stored.get("isError"))
        return result

    async def _on_list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=await self.list_tools())

    async def _on_call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        grant = (params.meta or {}).get(GRANT_META)
        return await self.call_tool(
            params.name,
            dict(params.arguments or {}),
            call_id=ctx.request_id,
            grant=grant if isinstance(grant, str) else None,
        )


def _approval_row(gate: EffectGate, approval_id: str) -> str | None:
    """The table-row fingerprint an approval was proposed under (its current version's). Read
    only to refuse: a record that does not verify is refused by the gate itself when decided."""
    with gate.store.reading() as conn:
        row = gate.store.approval(conn, approval_id)
    return row.row_fingerprint if row is not None else None


def _content(stored: dict[str, Any]) -> list[types.ContentBlock] | None:
    """The upstream's content blocks, as stored; None if none (a person's settled result: text)."""
    answer = {"content": stored.get("content"), "structuredContent": stored.get("structuredContent")}
    try:
        return types.CallToolResult.model_validate(answer).content
    except ValidationError:
        return None


__all__ = ["GRANT_META", "INSTRUCTIONS", "GatedProxy"]
