"""`effectgate mcp serve`: its options and its run (the MCP SDK is imported only when it runs).

The identity every call is made under comes from these options (or their environment
variables), never from the tool arguments a model writes: one server process serves one
configured agent, user and session. Over stdio nothing but MCP is written to stdout; the
start-up line goes to stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from rich.console import Console

from ..mcp._config import ENV_AGENT, ENV_SESSION, ENV_USER, default_session  # the SDK-free part
from ._render import EXIT_OK
from ._store import (
    StoreUnavailable,
    UsageError,
    _make_gate,
    _open,
    check_listen,
    holds_records,
    keyring_for,
)

if TYPE_CHECKING:  # the MCP SDK is imported only when the command runs
    from ..mcp._common import Identity


def arguments(p: argparse.ArgumentParser) -> None:
    """Add this command's options to `p` (no MCP import here: --help works without the extra)."""
    p.description = (
        "Serve the --app gate's effect table as an MCP server: the tools the agent's allowlist "
        "names, with hints and descriptions from the table, every call through the gate. "
        "Gated calls answer NOT EXECUTED with their approval id; approve them with "
        "`effectgate approve ... --execute` or `effectgate serve --execute` (the approver runs "
        "the call; the client's re-issue gets the stored result) or from your application "
        "with effectgate.mcp's Grants."
    )
    p.add_argument(
        "--agent",
        default=os.environ.get(ENV_AGENT),
        help=f"the agent id whose allowlist is served (default ${ENV_AGENT}; required)",
    )
    p.add_argument(
        "--user",
        default=os.environ.get(ENV_USER),
        help=f"the user every call is made for; scope checks use it (default ${ENV_USER}; required)",
    )
    p.add_argument(
        "--session",
        default=os.environ.get(ENV_SESSION),
        help=f"the session id (default ${ENV_SESSION}, else mcp:AGENT:USER); the same call in the "
        "same session is the same request: it finds its approval, or its stored result",
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
    p.add_argument("--port", type=int, default=8766, help="HTTP: the port (default 8766)")
    p.add_argument(
        "--inbox-url",
        help="the reviewer inbox (effectgate serve), e.g. http://127.0.0.1:8765: pending results "
        "link to the approval's card there",
    )


def identity_of(args: argparse.Namespace) -> Identity:
    """Who every call is made as: --agent and --user, and --session (else one session per agent
    and user, so two agents of one user never share a request or its stored result)."""
    from ..mcp._common import Identity

    session = args.session or default_session(args.agent, args.user)
    return Identity(user_id=args.user, session_id=session, agent_id=args.agent)


def run(args: argparse.Namespace, out: Console) -> int:
    from ..mcp._serve import LOCAL_HOSTS, gated_server, serve_http, serve_stdio

    if not args.app:
        raise UsageError("mcp serve serves your table: pass --app module:factory (or EFFECTGATE_APP)")
    for flag, env in (("agent", ENV_AGENT), ("user", ENV_USER)):
        if not getattr(args, flag):
            raise UsageError(
                f"mcp serve needs --{flag} (or ${env}): identity is configured, never model-written"
            )
    if args.transport == "http" and args.host not in LOCAL_HOSTS:
        raise UsageError(
            f"--host {args.host!r}: mcp serve listens on a local address only "
            f"({', '.join(LOCAL_HOSTS)}); every client acts as --user"
        )
    if args.transport == "http":
        check_listen(args.host, args.port)
    identity = identity_of(args)
    store = _open(args.db)
    try:
        # The server is the application: a fresh SQLite database gets its development key file,
        # as EffectGate creates it; a database holding records never gets a new key (it would
        # verify none of them), and a server database needs $EFFECTGATE_KEYRING.
        keyring_for(args.db, create=not holds_records(store))
        gate = _make_gate(args, store, need_app=True)
        try:
            if not gate.table.allowlist(identity.agent_id):
                raise UsageError(f"agent {identity.agent_id!r} may call no tool of --app {args.app}")
            server = gated_server(gate, identity=identity, inbox_url=args.inbox_url)
            tools = len(gate.table.allowlist(identity.agent_id))
            where = "stdio" if args.transport == "stdio" else f"http://{args.host}:{args.port}/mcp"
            # stdout carries MCP over stdio: say where we are on stderr.
            print(
                f"effectgate mcp serve: {tools} tools for agent {identity.agent_id!r}, user "
                f"{identity.user_id!r}, session {identity.session_id!r} on {where}",
                file=sys.stderr,
            )
            if args.transport == "stdio":
                import anyio

                anyio.run(serve_stdio, server)
            else:
                try:
                    serve_http(server, host=args.host, port=args.port)
                except SystemExit as exc:  # uvicorn's start-up failure: the port taken since the check
                    raise StoreUnavailable(
                        f"cannot listen on {args.host}:{args.port}; choose another --port"
                    ) from exc
        finally:
            gate.close()
    finally:
        store.close()
    return EXIT_OK
