"""An application's effect table as an MCP server (`effectgate mcp serve`), on the SDK's `Server`.

`gated_server(gate, identity=...)` lists the rows the configured agent may call (deny by
default: a row off the agent's allowlist is not listed, and calling it anyway is refused and
recorded), each with the row's schema as its `inputSchema` and hints and description derived
from the row (`_common.annotations_for`, `_common.describe`). Every `tools/call` goes through
`gate.acall` with the identity the server was configured with (`_common.context_for`); the
gate enforces the table whatever the client makes of the hints. A re-issued call that the gate
finds approved runs with the grant the approving side delivered (`_common.gated_call`).

Transports: `serve_stdio` (one process, one configured user and session) and `serve_http`
(streamable HTTP, bound to 127.0.0.1 unless told otherwise, with the SDK's DNS-rebinding
protection for local hosts).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mcp.types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.server.stdio import stdio_server

from .. import __version__
from ..gate import EffectGate
from ._common import Grants, Identity, annotations_for, context_for, describe, error_result, gated_call
from ._common import result_for as _result_for

#: The identity of each request: fixed (stdio, a local HTTP server), or the application's
#: function of the request (e.g. its authenticated HTTP user). Never read from tool arguments.
IdentityFor = Identity | Callable[[ServerRequestContext[Any, Any]], Identity]

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


def card_link(inbox_url: str | None) -> Callable[[str], str | None]:
    """The reviewer inbox's card for an approval id (`effectgate serve`: /approvals/ID)."""
    base = inbox_url.rstrip("/") if inbox_url else None
    return lambda approval_id: f"{base}/approvals/{approval_id}" if base else None


def gated_server(
    gate: EffectGate,
    *,
    identity: IdentityFor,
    grants: Grants | None = None,
    inbox_url: str | None = None,
    name: str = "effectgate",
    instructions: str | None = None,
) -> Server[Any]:
    """An MCP server over `gate`'s table for the agent `identity` names.

    `grants`: where the approving side delivers grants (`Grants.deliver` as an `on_grant`); a
    client's re-issue of an approved call runs with it, once. Without it, an approved call runs
    only where the approver executes it (`effectgate serve --execute`), and the client's
    re-issue gets the stored result. `inbox_url`: the reviewer inbox, linked from each pending
    result's text."""
    link = card_link(inbox_url)

    def who(ctx: ServerRequestContext[Any, Any]) -> Identity:
        found = identity(ctx) if callable(identity) else identity
        if not isinstance(found, Identity):
            raise TypeError(f"the identity function returned {type(found).__name__}, not an Identity")
        return found

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        agent = who(ctx).agent_id
        tools = [
            types.Tool(
                name=spec.name,
                description=describe(spec, policy=gate.policy),
                input_schema=dict(spec.schema or {"type": "object"}),
                annotations=annotations_for(spec),
            )
            for spec in gate.table
            if gate.table.allowed(agent, spec.name)
        ]
        return types.ListToolsResult(tools=tools)

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        tool = params.name
        args: dict[str, Any] = dict(params.arguments or {})
        call = context_for(who(ctx), tool, args, spec=gate.table.get(tool), call_id=ctx.request_id)
        try:
            outcome = await gated_call(gate, tool, args, call, grants=grants)
        except Exception as exc:  # the tool (or an unknown outcome) raised: the model is told
            return error_result(tool, exc)
        approval = getattr(outcome, "approval_id", None)
        return _result_for(outcome, card_url=link(approval) if approval else None)

    return Server(
        name,
        version=__version__,
        instructions=instructions
        or (
            "Tools behind an effectgate effect table. Reads run; writes run once per request; "
            "send, money and destructive calls wait for a person and answer NOT EXECUTED until "
            "approved: call again with the same arguments once approved."
        ),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


async def serve_stdio(server: Server[Any]) -> None:
    """Serve over this process's stdin and stdout until the client closes them."""
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def serve_http(server: Server[Any], *, host: str = "127.0.0.1", port: int = 8000, path: str = "/mcp") -> None:
    """Serve streamable HTTP at http://host:port/path until stopped. Anything but a local host
    is refused here: the identity is the server's configured one, so anyone who could reach the
    port would act as that user (an application serving others passes an identity function
    over its own authenticated app: `server.streamable_http_app(...)`)."""
    import uvicorn

    if host not in LOCAL_HOSTS:
        raise ValueError(
            f"serve_http binds to a local address only ({', '.join(LOCAL_HOSTS)}), not {host!r}: "
            "every client acts as the configured user"
        )
    app = server.streamable_http_app(streamable_http_path=path, host=host)
    uvicorn.run(app, host=host, port=port, log_level="warning")


__all__ = ["IdentityFor", "card_link", "gated_server", "serve_http", "serve_stdio"]
