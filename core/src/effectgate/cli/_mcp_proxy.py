"""`effectgate mcp proxy`: its options and its run (the MCP SDK is imported only when it runs).

The upstream servers and their tools' effect rows come from the --config TOML file
(`effectgate.mcp._config`); the identity every call is made under from --agent, --user and
--session (or their environment variables, or the file's [identity]), never from the arguments
a model writes. Over stdio nothing but MCP is written to stdout; the start-up line goes to
stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import TYPE_CHECKING

from rich.console import Console

from ..mcp._config import ENV_AGENT, ENV_CONFIG, ENV_SESSION, ENV_USER, default_session  # SDK-free
from ._render import EXIT_OK, _text
from ._store import UsageError, _open, check_listen, holds_records, keyring_for

if TYPE_CHECKING:  # the MCP SDK is imported only when the command runs
    from ..mcp._common import Identity
    from ..mcp._config import ProxyConfig
    from ..mcp._proxy import GatedProxy


def arguments(p: argparse.ArgumentParser) -> None:
    """Add this command's options to `p` (no MCP import here: --help works without the extra)."""
    p.description = (
        "Serve the tools of upstream MCP servers (stdio or streamable HTTP, named in --config) to "
        "an MCP client, every call through the gate: the config's effect rows decide each tool's "
        "class (annotations only raise it), a tool without a row is refused, and send, money and "
        "destructive calls answer NOT EXECUTED with their approval id until approved. An approved "
        "call runs once when the client re-issues it with the grant (effectgate approve prints "
        'it; the client application sends it in _meta "effectgate/grant").'
    )
    p.add_argument(
        "--config",
        default=os.environ.get(ENV_CONFIG),
        help=f"the proxy's TOML file: [servers.NAME] upstreams and their tools' rows, optional "
        f"[identity] (default ${ENV_CONFIG}; required)",
    )
    p.add_argument(
        "--agent",
        default=os.environ.get(ENV_AGENT),
        help=f"the agent id the calls are made as (default ${ENV_AGENT}, else the config's "
        "[identity] agent; required)",
    )
    p.add_argument(
        "--user",
        default=os.environ.get(ENV_USER),
        help=f"the user every call is made for (default ${ENV_USER}, else the config's [identity] "
        "user; required)",
    )
    p.add_argument(
        "--session",
        default=os.environ.get(ENV_SESSION),
        help=f"the session id (default ${ENV_SESSION}, else the config's when its agent and user are "
        "the ones in effect, else mcp:AGENT:USER); the "
        "same call in the same session is the same request: it finds its approval, or its stored result",
    )
    p.add_argument(
        "--transport",
        choices=("stdio", "http"),
        default="stdio",
        help="stdio (default: the client starts this process) or streamable HTTP on --host:--port",
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="HTTP: the local address to listen on (127.0.0.1, localhost or ::1; default 127.0.0.1)",
    )
    p.add_argument("--port", type=int, default=8767, help="HTTP: the port (default 8767)")
    p.add_argument(
        "--inbox-url",
        help="the reviewer inbox (effectgate serve), e.g. http://127.0.0.1:8765: pending results "
        "link to the approval's card there",
    )


def _identity(args: argparse.Namespace, config: ProxyConfig) -> Identity:
    from ..mcp._common import Identity

    agent: str | None = args.agent or config.agent
    user: str | None = args.user or config.user
    if not agent or not user:
        flag, env = ("agent", ENV_AGENT) if not agent else ("user", ENV_USER)
        raise UsageError(
            f"mcp proxy needs --{flag} (or ${env}, or {flag} in the config's [identity]): "
            "identity is configured, never model-written"
        )
    # The file's session is its own identity's: never another user's or agent's (they would
    # share requests, and be handed each other's stored results).
    own = config.session if (config.agent, config.user) == (agent, user) else None
    session = args.session or own or default_session(agent, user)
    return Identity(user_id=user, session_id=session, agent_id=agent)


async def _serve(proxy: GatedProxy, args: argparse.Namespace, identity: Identity) -> None:
    from ..mcp._serve import serve_stdio

    async with proxy:
        tools = len(proxy.gate.table)
        servers = ", ".join(u.name for u in proxy.upstreams)
        where = "stdio" if args.transport == "stdio" else f"http://{args.host}:{args.port}/mcp"
        # stdout carries MCP over stdio: say where we are on stderr.
        Console(file=sys.stderr).print(
            _text(
                f"effectgate mcp proxy: {tools} tools from {servers} for agent {identity.agent_id!r}, "
                f"user {identity.user_id!r}, session {identity.session_id!r} on {where}"
            )
        )
        if args.transport == "stdio":
            await serve_stdio(proxy.server)
            return
        import uvicorn

        app = proxy.server.streamable_http_app(streamable_http_path="/mcp", host=args.host)
        await uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning")).serve()


def run(args: argparse.Namespace, out: Console) -> int:
    from ..mcp._config import load_config
    from ..mcp._proxy import GatedProxy
    from ..mcp._serve import LOCAL_HOSTS

    if not args.config:
        raise UsageError(f"mcp proxy needs --config FILE (or ${ENV_CONFIG}): the upstreams and their rows")
    if os.path.exists(args.config) and not os.path.isfile(args.config):  # a named pipe: never waited on
        raise UsageError(f"--config {args.config}: not a regular file (the proxy's TOML file)")
    config = load_config(args.config)
    identity = _identity(args, config)
    if args.transport == "http" and args.host not in LOCAL_HOSTS:
        raise UsageError(
            f"--host {args.host!r}: mcp proxy listens on a local address only "
            f"({', '.join(LOCAL_HOSTS)}); every client acts as --user"
        )
    if args.transport == "http":
        check_listen(args.host, args.port)
    store = _open(args.db)
    try:
        # As `mcp serve`: a database holding records never gets a new key (it would verify none)
        keyring = keyring_for(args.db, create=not holds_records(store))
        proxy = GatedProxy(config, store, identity=identity, keyring=keyring, inbox_url=args.inbox_url)
        asyncio.run(_serve(proxy, args, identity))
    finally:
        store.close()
    return EXIT_OK
