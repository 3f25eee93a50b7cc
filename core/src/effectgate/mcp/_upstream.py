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

**An upstream's schema refers only to itself.** A tool whose inputSchema has a `$ref` (or
`$dynamicRef`, `$recursiveRef`) to anything but a part of itself ("#...") is not served
(`outside_reference`): the row's compiled validator would fetch it when the row is built, so an
upstream could make the proxy request any address it can reach, or read a local file.

**Errors** follow the gate's rules for the row's class. A transport failure (connection lost,
no answer within the server's `timeout`, a protocol error) is `UpstreamUnreachable`, an
`OutcomeUnknown`: the call may or may not have reached the upstream, so a write or gated call
ends `needs_reconciliation` and is never re-run blindly (a held session that closed, its process
gone, is dropped: later requests connect again, each with a session of its own). An error result
(`isError`) is `UpstreamToolError`: for a gated row an unknown outcome unless the row says
`tool_errors = "definite"` (the upstream's errors mean nothing happened); for a write a definite
failure unless the row says `tool_errors = "unknown"`; a read's is returned to the client as is.

**The idempotency key travels upstream**: a write's or gated call's key is sent in the call's
`_meta` as "effectgate/idempotency_key", for an upstream that can refuse a second effect itself.

**The approving side builds the same table** (`_approving.proxy_app`, for `--app` of `effectgate
approve`, `deny`, `serve` and `audit`): from the same configuration and the upstreams' listings
read when it starts, and it re-lists an approval's upstream before approving or executing it, so
a decision re-derives its bar from the tool as the upstream describes it then. Its rows' upstream
sessions are opened per request (the proxy holds one open per upstream).

**Listings are bounded** (`MAX_PAGES` pages, `MAX_TOOLS` tools, no repeated cursor), and a
failure to connect or list raises an error naming the server (`UpstreamListingError`,
`UpstreamUnreachable`), never the SDK's exception group.

An upstream process sees the configured `env` and the SDK's minimal safe environment (PATH,
HOME, ...), never the proxy's own environment, so never $EFFECTGATE_KEYRING.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, cast

import anyio
import mcp.types as types
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError

from .._logging import logger
from ..context import ToolContext
from ..effects import Effect, Policy
from ..errors import EffectGateError, OutcomeUnknown, TableError
from ..table import EffectTable, ToolSpec
from ._config import SEPARATOR, Http, Row, Stdio, Upstream

log = logger(__name__)

#: The `_meta` key that carries the idempotency key of a write or gated call upstream.
IDEMPOTENCY_META = "effectgate/idempotency_key"

#: The parameter through which the gate hands the upstream caller its ToolContext.
CONTEXT_PARAM = "_effectgate_context"


class UpstreamToolError(EffectGateError):
    """The upstream answered a call with an error result (`isError`); `result` is it as stored."""

    def __init__(self, server: str, tool: str, result: dict[str, Any]) -> None:
        self.server, self.tool, self.result = server, tool, result
        texts = [b.get("text", "") for b in result.get("content", []) if isinstance(b, dict)]
        # The upstream's words as repr: the message is logged, and may hold control characters.
        super().__init__(f"{server}: {tool!r} answered with an error: {' '.join(texts)[:200]!r}")


class UpstreamUnreachable(OutcomeUnknown):
    """The upstream could not be reached (started, connected to, answered): a call's outcome is
    unknown. The message names the server."""


class UpstreamListingError(EffectGateError):
    """An upstream's tool listing is out of bounds (more than `MAX_PAGES` pages or `MAX_TOOLS`
    tools, or a page cursor that repeats): none of it is used. The message names the server."""

    def __init__(self, server: str, problem: str) -> None:
        self.server = server
        super().__init__(f"upstream {server!r}: {problem}; its listing was not used")


#: Bounds on one upstream's `tools/list`: every call re-reads its upstream's listing first, so an
#: upstream that pages forever must not hold its calls (or the proxy's memory) for ever.
MAX_PAGES = 100
MAX_TOOLS = 10_000


def _leaf(exc: BaseException) -> BaseException:
    """The first exception inside the SDK's (nested) exception groups: what actually failed."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _closed(exc: BaseException) -> bool:
    """Whether `exc` says the session itself is gone (not a slow or failing request)."""
    leaf = _leaf(exc)
    lost = (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream)
    return isinstance(leaf, lost) or (isinstance(leaf, MCPError) and leaf.code == types.CONNECTION_CLOSED)


def unreachable(server: str, doing: str, exc: BaseException) -> UpstreamUnreachable:
    """`UpstreamUnreachable` naming the server and what failed (its text as repr: control chars)."""
    leaf = _leaf(exc)
    text = str(leaf) or ("no answer within the server's timeout" if isinstance(leaf, TimeoutError) else "")
    return UpstreamUnreachable(f"upstream {server!r}: {doing} failed: {type(leaf).__name__}: {text!r}")


def client_for(target: Any, timeout: float | None = None) -> Client:
    """An `mcp.Client` for a configured upstream (or an in-process server, in tests), each of
    whose requests waits at most `timeout` seconds for its answer (the SDK sends the upstream a
    cancellation, and the session stays usable). Responses are never cached: every listing is the
    upstream's current one."""
    if isinstance(target, Stdio):
        target = StdioServerParameters(
            command=target.command, args=list(target.args), env=dict(target.env) or None, cwd=target.cwd
        )
    elif isinstance(target, Http):
        target = target.url
    return Client(target, cache=None, read_timeout_seconds=timeout)


def _payload(result: types.CallToolResult) -> dict[str, Any]:
    """The part of an upstream result the proxy stores and forwards (never its own `_meta`)."""
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
        """Connect (start the process, or reach the URL); else `UpstreamUnreachable`."""
        up = self.upstream
        try:
            self._client = await stack.enter_async_context(client_for(up.target, up.timeout))
        except Exception as exc:  # the SDK raises an ExceptionGroup, or OSError for a bad command
            raise unreachable(self.name, "connecting", exc) from exc

    @asynccontextmanager
    async def _session(self) -> AsyncIterator[Client]:
        if self._client is not None:
            try:
                yield self._client
            except Exception as exc:
                if _closed(exc):  # the upstream exited or went away: the next request reconnects
                    self._client = None  # (a session per request; the dead one is closed on exit)
                raise
            return
        async with client_for(self.upstream.target, self.upstream.timeout) as client:
            yield client

    async def list_tools(self) -> list[types.Tool]:
        """Every tool the upstream lists now (all pages); `UpstreamListingError` past the bounds
        (see `_pages`), `UpstreamUnreachable` when it fails or outlasts the server's `timeout`."""
        try:
            with anyio.fail_after(self.upstream.timeout):
                async with self._session() as client:
                    return await _pages(self.name, client)
        except UpstreamListingError:
            raise
        except Exception as exc:
            leaf = _leaf(exc)
            if isinstance(leaf, UpstreamListingError):  # ours, wrapped by the session's task group
                raise leaf from None
            raise unreachable(self.name, "listing its tools", exc) from exc

    async def call(self, tool: str, arguments: dict[str, Any], *, key: str | None) -> dict[str, Any]:
        """Call one upstream tool; with `key` (a write or gated call) an error result raises
        `UpstreamToolError`; a transport failure or no answer in `timeout`, `UpstreamUnreachable`."""
        meta = cast(types.RequestParamsMeta, {IDEMPOTENCY_META: key}) if key is not None else None
        try:
            async with self._session() as client:
                result = await client.call_tool(tool, arguments, meta=meta)
        except Exception as exc:  # anything between here and the upstream: the outcome is unknown
            raise unreachable(self.name, f"calling {tool!r}", exc) from exc
        payload = _payload(result)
        if result.is_error and key is not None:
            raise UpstreamToolError(self.name, tool, payload)
        return payload


async def _pages(server: str, client: Client) -> list[types.Tool]:
    """Follow `tools/list` pages within the bounds: `MAX_PAGES`, `MAX_TOOLS`, no repeated cursor."""
    tools: list[types.Tool] = []
    cursors: set[str] = set()
    cursor: str | None = None
    for _ in range(MAX_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        if len(tools) > MAX_TOOLS:
            raise UpstreamListingError(server, f"it lists more than {MAX_TOOLS} tools")
        cursor = page.next_cursor
        if not cursor:
            return tools
        if cursor in cursors:
            raise UpstreamListingError(server, f"its tools/list cursor {cursor[:40]!r} repeats")
        cursors.add(cursor)
    raise UpstreamListingError(server, f"its tools/list has more than {MAX_PAGES} pages")


#: What a read's caller gets for its ToolContext: none (reads carry no idempotency key).
_NO_CONTEXT = cast(ToolContext, None)


def _caller(connection: Connection, tool: str) -> Callable[..., Awaitable[dict[str, Any]]]:
    """The row's `fn`: called with the frozen arguments (and a write's or gated call's ToolContext)."""

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


#: The schema keywords that name another schema by URI.
REFERENCE_KEYWORDS = ("$ref", "$dynamicRef", "$recursiveRef")


def outside_reference(schema: Any) -> str | None:
    """The first reference in an upstream's schema to anything but a part of itself ("#..."),
    or None. The row's compiled validator (fastjsonschema) fetches such a reference with urllib
    when the row is built (any URL, file:// too): an upstream's schema must not make the proxy
    reach an address for it. Walked without recursion (a schema may nest deeply)."""
    stack: list[Any] = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if key in REFERENCE_KEYWORDS and isinstance(value, str) and not value.startswith("#"):
                    return value
                stack.append(value)
        elif isinstance(node, list):
            stack.extend(node)
    return None


def spec_for(upstream: Upstream, connection: Connection, tool: types.Tool, policy: Policy) -> ToolSpec:
    """The table row of one upstream tool (`TableError`, naming why, for one not servable)."""
    name = upstream.served_name(tool.name)
    if not upstream.routes_back(tool.name):
        raise TableError(
            name,
            "name",
            f"{upstream.name}'s {tool.name!r} would route as another server's tool (a served name "
            f"is split at its first {SEPARATOR!r})",
        )
    row = upstream.tools.get(tool.name, upstream.default)
    if row is None:
        raise TableError(name, "effect", f"no row for {upstream.name}'s {tool.name!r} and no server default")
    effect = effective_effect(row, tool.annotations)
    gated = policy.gates(effect)
    role = row.approver_role or (upstream.approver_role if gated else None)
    if gated and role is None:
        raised = " (its annotations raise it to destructive)" if effect is not row.effect else ""
        raise TableError(
            name, "approver_role", f"{effect} row{raised}: name an approver_role for the row or the server"
        )
    properties = tool.input_schema.get("properties", {})
    if not isinstance(properties, dict):
        raise TableError(name, "schema", "its inputSchema's properties is not an object")
    if CONTEXT_PARAM in properties:
        raise TableError(name, "schema", f"the argument {CONTEXT_PARAM!r} is reserved for the proxy")
    outside = outside_reference(tool.input_schema)
    if outside is not None:
        raise TableError(
            name,
            "schema",
            f"its inputSchema refers outside itself ({outside[:80]!r}): only references within the "
            'schema ("#...") are followed, never fetched',
        )
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
    """The rows of an upstream's listing; a tool not servable (or listed twice) is logged, left out."""
    specs: list[ToolSpec] = []
    tools = list(tools)
    listed = Counter(tool.name for tool in tools)
    for tool in tools:
        try:
            if listed[tool.name] > 1:  # which entry is the tool (its hints, schema) is unknown
                raise TableError(upstream.served_name(tool.name), "name", "its upstream lists it twice")
            specs.append(spec_for(upstream, connection, tool, policy))
        except TableError as exc:
            log.warning("not served: %s", exc)
    for missing in sorted(set(upstream.tools) - set(listed)):
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


def __getattr__(name: str) -> Any:
    # `effectgate.mcp._upstream:proxy_app` (as --app) keeps working; it lives in `_approving`.
    if name == "proxy_app":
        from ._approving import proxy_app

        return proxy_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CONTEXT_PARAM",
    "IDEMPOTENCY_META",
    "MAX_PAGES",
    "MAX_TOOLS",
    "REFERENCE_KEYWORDS",
    "Connection",
    "UpstreamListingError",
    "UpstreamToolError",
    "UpstreamUnreachable",
    "client_for",
    "effective_effect",
    "outside_reference",
    "spec_for",
    "specs_for",
    "table_of",
    "unreachable",
]
