"""`effectgate mcp proxy` and `effectgate mcp serve`: the MCP side of the gate (extra `mcp`).

The argument definitions live here and in `_mcp_proxy` / `_mcp_serve` without importing the MCP SDK,
so `--help` works without the extra; running either command without it is a usage error naming the
install command.
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from . import _mcp_proxy, _mcp_serve
from ._store import UsageError

INSTALL_HINT = "pip install 'effectgate[mcp]'"


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("mcp", help="MCP: a gated proxy in front of MCP servers, or your table as one")
    inner = p.add_subparsers(dest="mcp_command", required=True)
    proxy = inner.add_parser(
        "proxy",
        parents=[common],
        help="serve upstream MCP servers' tools, every call through the gate",
    )
    _mcp_proxy.arguments(proxy)
    serve = inner.add_parser(
        "serve",
        parents=[common],
        help="serve the --app gate's effect table as an MCP server",
    )
    _mcp_serve.arguments(serve)


def run(args: argparse.Namespace, out: Console) -> int:
    command = _mcp_proxy.run if args.mcp_command == "proxy" else _mcp_serve.run
    try:
        return command(args, out)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != "mcp":
            raise
        missing = f"effectgate mcp needs the MCP SDK ({exc.name} is not installed): {INSTALL_HINT}"
        raise UsageError(missing) from exc
