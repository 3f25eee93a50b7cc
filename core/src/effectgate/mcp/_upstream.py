"""Upstream MCP servers: one live client session each, their tool listings, and the effect-table
rows the proxy builds from them.

**The table decides; annotations only make a row stricter.** Each upstream tool gets the row the
configuration names for it (or the server's explicit `default`; without either it is not served,
and a call to it is refused by the gate as an unknown tool). The upstream's annotations are claims
by someone else's server, so they can raise a row, never lower it:

| upstream annotation | the row |
|---|---|
| destructiveHint: true | at least destructive (1) |
| readOnlyHint: false | a read row becomes a write |
| readOnlyHint: true, destructiveHint: false, anything else | no change: a hint never lowers a row |

(1) A read or write row raised to destructive needs an approver_role, its own or the server's;
without one the tool is not served.

**What the reviewer approves is pinned.** A row's schema is the upstream's `inputSchema` and its
description the upstream's description, and both are part of the row's fingerprint
(`ToolSpec.pin_description`), as is the effective class. An upstream that changes either after a
call was proposed changes the row: the gate refuses to decide or run the old approval
(`reclassified`), and the audit reports an approved call whose tool changed since.

**Errors** follow the gate's rules for the row's class. A transport failure (connection lost,
timeout, a protocol error) is `UpstreamUnreachable`, an `OutcomeUnknown`: the call may or may not
have reached the upstream, so a write or gated call ends `needs_reconciliation` and is never
re-run blindly. An error result (`isError`) from the upstream is `UpstreamToolError`: for a gated
row it is an unknown outcome unless the row says `tool_errors = "definite"` (the upstream's
errors mean nothing happened); for a write it is a definite failure unless the row says
`tool_errors = "unknown"`; a read's error result is returned to the client as it is.

**The idempotency key travels upstream**: a write's or gated call's key is sent in the call's
`_meta` as "effectgate/idempotency_key", for an upstream that can refuse a second effect itself.

**The approving side builds the same table** (`proxy_app`, for `--app` of `effectgate approve`,
`deny`, `serve` and `audit`): from the same configuration and the upstreams' listings read when
it starts, so a decision re-derives its bar from the tool as the upstream describes it. Its rows'
upstream sessions are opened per request (the proxy holds one open per upstream).

An upstream process sees the configured `env` and the SDK's minimal safe environment (PATH,
HOME, ...), never the proxy's own environment, so never $EFFECTGATE_KEYRING.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, cast

import mcp.types as types
from mcp import Client, StdioServerParameters

from ..context import ToolContext
from ..effects import Effect, Policy
from ..errors import EffectGateError, OutcomeUnknown, TableError
from ..gate import EffectGate
from ..stores.protocol import Store
from ..table import EffectTable, ToolSpec
from ..tokens import Keyring
from ._config import ENV_AGENT, ENV_CONFIG, Http, ProxyConfigError, Row, Stdio, Upstream, load_config

log = logging.getLogger(__name__)

#: The `_meta` key that carries the idempotency key of a write or gated call upstream.
IDEMPOTENCY_META = "effectgate/idempotency_key"

#: The parameter through which the gate hands the upstream caller its ToolContext.
CONTEXT_PARAM = "_effectgate_context"


class UpstreamToolError(EffectGateError):
    """The upstream answered a call with an error result (`isError`); `result` is that result as
    stored (content, structuredContent, isError)."""

    def __init__(self, server: str, tool: str, result: dict[str, Any]) -> None:
        self.server = server
        self.tool = tool
        self.result = result
        texts = [b.get("text", "") for b in result.get("content", []) if isinstance(b, dict)]
        super().__init__(f"{server}: {tool} answered with an error: {' '.join(texts)[:200]}")


class UpstreamUnreachable(OutcomeUnknown):
    """The call to the upstream failed in transport: whether it took effect is unknown."""


def client_for(target: Any) -> Client:
    """An `mcp.Client` for a configured upstream (or an in-process server, in tests). Responses
    are never cached: every listing is the upstream's current one."""
    if isinstance(target, Stdio):
        params = StdioServerParameters(
            command=target.command, args=list(target.args), env=dict(target.env) or None, cwd=target.cwd
        )
        return Client(params, cache=None)
    if isinstance(target, Http):
        return Client(target.url, cache=None)
    return Client(target, cache=None)


def _payload(result: types.CallToolResult) -> dict[str, Any]:
    """The part of an upstream result the proxy stores and forwards (the upstream's own `_meta`
    stays with the upstream)."""
    return {
        "content": [
            block.model_dump(by_alias=True, mode="json", exclude_none=True) for block in result.content
        ],
        "structuredContent": result.structured_content,
        "isError": result.is_error,
    }


class Connection:
    """One upstream's client session: held open while the proxy runs (`open`), or, unopened (an
    approving process's table, `proxy_app`), a session of its own for each request."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self._client: Client | None = None

    @property
    def name(self) -> str:
        return self.upstream.name

    async def open(self, stack: AsyncExitStack) -> None:
        self._client = await stack.enter_async_context(client_for(self.upstream.target))

    @asynccontextmanager
    async def _session(self) -> AsyncIterator[Client]:
        if self._client is not None:
            yield self._client
            return
        async with client_for(self.upstream.target) as client:
            yield client

    async def list_tools(self) -> list[types.Tool]:
        """Every tool the upstream lists now (all pages)."""
        tools: list[types.Tool] = []
        cursor: str | None = None
        async with self._session() as client:
            while True:
                page = await client.list_tools(cursor=cursor)
                tools.extend(page.tools)
                cursor = page.next_cursor
                if not cursor:
                    return tools

    async def call(self, tool: str, arguments: dict[str, Any], *, key: str | None) -> dict[str, Any]:
        """Call one upstream tool; with `key` (a write or gated call), an error result raises
        `UpstreamToolError`. A transport failure raises `UpstreamUnreachable`."""
        meta = cast(types.RequestParamsMeta, {IDEMPOTENCY_META: key}) if key is not None else None
        try:
            async with self._session() as client:
                result = await client.call_tool(tool, arguments, meta=meta)
        except Exception as exc:  # anything between here and the upstream: the outcome is unknown
            raise UpstreamUnreachable(f"{self.name}: {tool}: {type(exc).__name__}: {exc}") from exc
        payload = _payload(result)
        if result.is_error and key is not None:
            raise UpstreamToolError(self.name, tool, payload)
        return payload


#: What a read's caller gets for its ToolContext: none (reads carry no idempotency key).
_NO_CONTEXT = cast(ToolContext, None)


def _caller(connection: Connection, tool: str) -> Callable[..., Awaitable[dict[str, Any]]]:
    """The row's `fn`: the gate calls it with the frozen arguments (and, for a write or gated
    call, the ToolContext whose idempotency key travels upstream)."""

    async def call_upstream(
        _effectgate_context: ToolContext = _NO_CONTEXT, **arguments: Any
    ) -> dict[str, Any]:
        key: str | None = getattr(_effectgate_context, "idempotency_key", None)
        return await connection.call(tool, arguments, key=key)

    return call_upstream


def effective_effect(row: Row, hints: types.ToolAnnotations | None) -> Effect:
    """The row's class, raised (never lowered) by the upstream's hints: see the module docstring."""
    if hints is not None and hints.destructive_hint is True:
        return Effect.DESTRUCTIVE
    if hints is not None and hints.read_only_hint is False and row.effect is Effect.READ:
        return Effect.WRITE
    return row.effect


def spec_for(upstream: Upstream, connection: Connection, tool: types.Tool, policy: Policy) -> ToolSpec:
    """The table row of one upstream tool the configuration classifies (raises `TableError`,
    naming why, for a tool that cannot be served)."""
    name = upstream.served_name(tool.name)
    row = upstream.tools.get(tool.name, upstream.default)
    if row is None:
        raise TableError(name, "effect", f"no row for {upstream.name}'s {tool.name} and no server default")
    effect = effective_effect(row, tool.annotations)
    gated = policy.gates(effect)
    role = row.approver_role or (upstream.approver_role if gated else None)
    if gated and role is None:
        raised = " (its annotations raise it to destructive)" if effect is not row.effect else ""
        raise TableError(
            name, "approver_role", f"{effect} row{raised}: name an approver_role for the row or the server"
        )
    if CONTEXT_PARAM in tool.input_schema.get("properties", {}):
        raise TableError(name, "schema", f"the argument {CONTEXT_PARAM!r} is reserved for the proxy")
    errors = row.tool_errors
    spec = ToolSpec(
        name=name,
        effect=effect,
        fn=_caller(connection, tool.name),
        schema=tool.input_schema,
        approver_role=role,
        owner=row.owner,
        reversibility=row.reversibility,
        subject=row.subject,
        definite_failures=(UpstreamToolError,) if gated and errors == "definite" else (),
        unknown_outcome=(UpstreamToolError,) if not gated and errors == "unknown" else (),
        description=tool.description or "",
        pin_description=True,
    )
    spec.check_policy(policy)
    return spec


def specs_for(
    upstream: Upstream, connection: Connection, tools: Iterable[types.Tool], policy: Policy
) -> list[ToolSpec]:
    """The rows of an upstream's listing; a tool that cannot be served is logged and left out."""
    specs: list[ToolSpec] = []
    listed = set()
    for tool in tools:
        listed.add(tool.name)
        try:
            specs.append(spec_for(upstream, connection, tool, policy))
        except TableError as exc:
            log.warning("not served: %s", exc)
    for missing in sorted(set(upstream.tools) - listed):
        log.warning("the configuration names %s's %s, which it does not list", upstream.name, missing)
    return specs


def table_of(rows: Iterable[Iterable[ToolSpec]], agent: str | None) -> EffectTable:
    """The table of the upstreams' rows (in configuration order), every row allowed to `agent`."""
    table = EffectTable()
    for specs in rows:
        for spec in specs:
            try:
                table.register(spec)
            except TableError as exc:  # two upstreams serving one name: the first keeps it
                log.warning("not served: %s", exc)
    if agent is not None:
        table.allow_all(agent)
    return table


def proxy_app(store: Store, *, keyring: Keyring | None = None, policy: Policy | None = None) -> EffectGate:
    """The proxy's gate for the approving side's commands (`--app effectgate.mcp._upstream:proxy_app`
    with `effectgate approve`, `deny`, `serve` and `audit`): the table built the way the proxy
    builds it, from the configuration in $EFFECTGATE_MCP_PROXY_CONFIG and the upstreams' listings
    read now, so a decision is checked against the tool as it is upstream. A call it executes
    (`effectgate serve --execute`) opens a session of its own to the upstream."""
    path = os.environ.get(ENV_CONFIG)
    if not path:
        raise ProxyConfigError(f"proxy_app reads the proxy's configuration from ${ENV_CONFIG}: set it")
    config = load_config(path)
    policy = policy or Policy()

    async def listings() -> list[list[ToolSpec]]:
        rows = []
        for upstream in config.servers:
            connection = Connection(upstream)
            rows.append(specs_for(upstream, connection, await connection.list_tools(), policy))
        return rows

    table = table_of(asyncio.run(listings()), os.environ.get(ENV_AGENT) or config.agent)
    return EffectGate(table, store, policy=policy, keyring=keyring)


__all__ = [
    "CONTEXT_PARAM",
    "IDEMPOTENCY_META",
    "Connection",
    "UpstreamToolError",
    "UpstreamUnreachable",
    "client_for",
    "effective_effect",
    "proxy_app",
    "spec_for",
    "specs_for",
    "table_of",
]
