"""The effect-table rows the proxy builds from upstream MCP servers' tool listings (each
upstream's client session, its listing and its errors are `_connection`'s, re-exported here).

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
gone, is started again for the next request: see `_connection`). An error result
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
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, cast

import mcp.types as types

from .._logging import logger
from ..context import ToolContext
from ..effects import Effect, Policy
from ..errors import TableError
from ..table import EffectTable, ToolSpec
from ._config import SEPARATOR, Row, Upstream
from ._connection import (
    IDEMPOTENCY_META,
    MAX_PAGES,
    MAX_TOOLS,
    Connection,
    UpstreamListingError,
    UpstreamToolError,
    UpstreamUnreachable,
    client_for,
    unreachable,
)

log = logger(__name__)

#: The parameter through which the gate hands the upstream caller its ToolContext.
CONTEXT_PARAM = "_effectgate_context"


#: The longest served name (UTF-8 bytes): an approval's index holds the tool's name, and PostgreSQL
#: cannot index a much longer one (the call would fail with the database's error, after listing).
MAX_NAME_BYTES = 1024

#: What a read's caller gets for its ToolContext: none (reads carry no idempotency key).
_NO_CONTEXT = cast(ToolContext, None)


def _caller(connection: Connection, tool: str, defaults: dict[str, Any]) -> Callable[..., dict[str, Any]]:
    """The row's `fn`: called with the frozen arguments (and a write's or gated call's ToolContext),
    in the gate's worker thread; the upstream request runs on the session's loop, so a call the
    client cancels (or whose request timed out) once its tool started runs to its end and its
    outcome is stored, as a thread tool's is (`Connection.call_blocking`). A subject argument
    left out is sent as its schema's default (`defaults`): the subject the gate keyed and the
    reviewer saw (`ToolSpec.subject_of`), never a default of the upstream's own that differs."""

    def call_upstream(_effectgate_context: ToolContext = _NO_CONTEXT, **arguments: Any) -> dict[str, Any]:
        key: str | None = getattr(_effectgate_context, "idempotency_key", None)
        return connection.call_blocking(tool, {**defaults, **arguments}, key=key)

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
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise TableError(name[:80], "name", f"its served name is longer than {MAX_NAME_BYTES} bytes (UTF-8)")
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
        fn=_caller(connection, tool.name, _subject_defaults(properties, row.subject)),
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


def _subject_defaults(properties: dict[str, Any], subject: tuple[str, ...]) -> dict[str, Any]:
    """The schema's default of each subject argument that declares one (`_rules.with_defaults`)."""
    declared = {arg: properties.get(arg) for arg in subject}
    return {arg: d["default"] for arg, d in declared.items() if isinstance(d, dict) and "default" in d}


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


class _Served(EffectTable):
    """A proxy's table: it has no allowlists (every served row is its agent's), so a stored
    call is decided (`Ledger.bar`) whichever agent the proxy that proposed it ran as (a flag, a
    variable or the config named it), also on the approving side (`proxy_app`), whose own agent
    may be another or none: before, its approval was refused `not_allowed`."""

    def allowed(self, agent_id: str, name: str) -> bool:
        return self.get(name) is not None


def table_of(rows: Iterable[Iterable[ToolSpec]], agent: str | None) -> EffectTable:
    """The table of the upstreams' rows (in configuration order), every row allowed to `agent`
    (listed as its allowlist) and, as the proxy has no allowlists, to any agent (`_Served`)."""
    table = _Served()
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
    "MAX_NAME_BYTES",
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
