"""MCP and the gate (extra `mcp`, on the official MCP SDK).

- `effectgate mcp proxy`: fronts upstream MCP servers; every call goes through the gate.
- `effectgate mcp serve --app module:app`: an application's effect table as an MCP server.

Annotations from an MCP server are claims, not policy: the effect table decides, and an
annotation can only make a row stricter.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._approving import proxy_app
    from ._common import Grants, Identity, annotations_for, context_for, describe, result_for
    from ._config import ProxyConfig, ProxyConfigError, load_config
    from ._proxy import GatedProxy
    from ._serve import gated_server, serve_http, serve_stdio
    from ._upstream import UpstreamListingError, UpstreamToolError, UpstreamUnreachable

# Imported on first use, so `effectgate.mcp:proxy_app` and the CLI's help work without the SDK
# until something that needs it is touched.
_WHERE = {
    "Grants": "_common",
    "Identity": "_common",
    "annotations_for": "_common",
    "context_for": "_common",
    "describe": "_common",
    "result_for": "_common",
    "ProxyConfig": "_config",
    "ProxyConfigError": "_config",
    "load_config": "_config",
    "GatedProxy": "_proxy",
    "gated_server": "_serve",
    "serve_http": "_serve",
    "serve_stdio": "_serve",
    "UpstreamListingError": "_upstream",
    "UpstreamToolError": "_upstream",
    "UpstreamUnreachable": "_upstream",
    "proxy_app": "_approving",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'effectgate.mcp' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)


__all__ = [
    "GatedProxy",
    "Grants",
    "Identity",
    "ProxyConfig",
    "ProxyConfigError",
    "UpstreamListingError",
    "UpstreamToolError",
    "UpstreamUnreachable",
    "annotations_for",
    "context_for",
    "describe",
    "gated_server",
    "load_config",
    "proxy_app",
    "result_for",
    "serve_http",
    "serve_stdio",
]
