"""The proxy's configuration: upstream MCP servers, the effect row of each upstream tool, and who
is calling. Read from TOML (`load_config`), strictly: an unknown key is an error naming it.

```toml
[identity]                     # who is calling: the application's configuration, never the model
agent = "desktop"
user = "u-42"
session = "desktop-u-42"       # optional (default "mcp:AGENT:USER", see `default_session`);
                               # kept only while this agent and user are the ones in effect

[servers.files]                # one upstream: stdio (command) or streamable HTTP (url)
command = ["python", "-m", "files_server"]
env = { ROOT = "/srv/files" }  # the upstream sees this and a minimal safe environment, nothing else
prefix = "files"               # served as files__<tool> (default: the server's name; "" for none)
default = "read"               # optional: the row of a tool the table does not name
approver_role = "ops"          # optional: who approves when annotations raise a row to destructive
timeout = 60.0                 # optional: seconds one request to it may take (default 60)

[servers.files.tools.delete]
effect = "destructive"
approver_role = "ops"
subject = ["path"]
```

A tool row takes `effect` (or a label from another taxonomy), `approver_role`, `owner`,
`subject`, `reversibility` and `tool_errors` ("definite" or "unknown": what an upstream error
result means; unset keeps the gate's rule for the class, see `_upstream`). A server's `default`
is a row too (a string is its effect): without one, a tool the table does not name is refused.

**A served name routes to one server.** A served name is split at its first `__`: the part before
names the server by its prefix, the rest is the upstream tool (`split_served`); a name without
`__` belongs to the server whose prefix is "". So a prefix may not contain `__` or end with `_`
(its tools' names would split elsewhere), and a tool is served only if its served name splits back
into its own server's prefix and its own name (`Upstream.routes_back`): the "" prefix server's
tools may not contain `__`, so no upstream can list a name that routes as another server's tool.

**No wait on an upstream is unbounded.** A server's `timeout` (seconds, a positive finite number;
`DEFAULT_TIMEOUT`, 60, the MCP TypeScript SDK's request timeout, when unset) bounds one
`tools/call`, its handshake, and its whole `tools/list` listing. A call that gets no answer in
time is `UpstreamUnreachable`, an unknown outcome: a write or gated call ends
`needs_reconciliation` (it may have taken effect), a read answers an error. Raise it for tools
that legitimately run longer.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..effects import Effect, Reversibility
from ..errors import EffectGateError

#: Where `proxy_app` (and `effectgate mcp proxy`, by default) finds the configuration file.
ENV_CONFIG = "EFFECTGATE_MCP_PROXY_CONFIG"
#: Who `effectgate mcp serve` and `proxy` act as, when not given as flags (never the model).
ENV_AGENT = "EFFECTGATE_MCP_AGENT"
ENV_USER = "EFFECTGATE_MCP_USER"
ENV_SESSION = "EFFECTGATE_MCP_SESSION"

#: Between the server's prefix and the upstream tool's name in a served name (files__delete).
SEPARATOR = "__"

#: Seconds an upstream may take to answer one request (see the module docstring).
DEFAULT_TIMEOUT = 60.0

ToolErrors = Literal["definite", "unknown"]


class ProxyConfigError(EffectGateError, ValueError):
    """The proxy's configuration is not usable; the message names the key and the fix."""


@dataclass(frozen=True, kw_only=True)
class Row:
    """The effect row of one upstream tool (or a server's default row)."""

    effect: Effect
    approver_role: str | None = None
    owner: str | None = None
    subject: tuple[str, ...] = ()
    reversibility: Reversibility = Reversibility.IRREVERSIBLE
    tool_errors: ToolErrors | None = None


@dataclass(frozen=True, kw_only=True)
class Stdio:
    """An upstream started as a subprocess, spoken to over its stdin and stdout."""

    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict[str, str])
    cwd: str | None = None


@dataclass(frozen=True, kw_only=True)
class Http:
    """An upstream reached over streamable HTTP."""

    url: str


@dataclass(frozen=True, kw_only=True)
class Upstream:
    """One upstream MCP server. `target` is a `Stdio` or `Http`, or (in an application or a
    test) anything `mcp.Client` accepts, such as an in-process `MCPServer`."""

    name: str
    target: Any
    prefix: str
    tools: Mapping[str, Row] = field(default_factory=dict[str, Row])
    default: Row | None = None
    approver_role: str | None = None
    timeout: float = DEFAULT_TIMEOUT

    def served_name(self, tool: str) -> str:
        return f"{self.prefix}{SEPARATOR}{tool}" if self.prefix else tool

    def routes_back(self, tool: str) -> bool:
        """Whether `tool`, served, splits back into this server's prefix and `tool` (only such a
        tool is served: see the module docstring)."""
        return split_served(self.served_name(tool)) == (self.prefix, tool)


def split_served(name: str) -> tuple[str, str]:
    """The (prefix, upstream tool) a served name routes to: split at the first separator; a name
    without one belongs to the "" prefix."""
    prefix, separator, tool = name.partition(SEPARATOR)
    return (prefix, tool) if separator else ("", name)


def default_session(agent: str, user: str) -> str:
    """The session of an MCP process given none: one per agent and user, so two identities never
    share a request (or its stored result). "mcp:AGENT:USER" when the agent holds no ':' (the
    first ':' after "mcp:" then ends the agent, so no two identities meet); otherwise "mcp+" and
    the JSON of [agent, user], which no "mcp:..." session can equal ("desk:eu" of "alice" and
    "desk" of "eu:alice" would both be "mcp:desk:eu:alice")."""
    if ":" not in agent:
        return f"mcp:{agent}:{user}"
    return "mcp+" + json.dumps([agent, user], ensure_ascii=False, separators=(",", ":"))


def check_prefix(where: str, prefix: object) -> str:
    """A usable prefix (see the module docstring), else `ProxyConfigError` naming `where`."""
    if not isinstance(prefix, str) or SEPARATOR in prefix or prefix.endswith("_"):
        raise ProxyConfigError(
            f"{where} must be a string without {SEPARATOR!r} that does not end with '_' "
            "(a served name is split at its first separator)"
        )
    return prefix


def check_timeout(where: str, timeout: object) -> float:
    """A usable timeout in seconds (a positive finite number), else `ProxyConfigError` naming
    `where`."""
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        raise ProxyConfigError(f"{where} must be a positive, finite number of seconds (e.g. 60.0)")
    return float(timeout)


@dataclass(frozen=True, kw_only=True)
class ProxyConfig:
    """The upstreams, and whatever identity the file names (flags and environment override it)."""

    servers: tuple[Upstream, ...]
    agent: str | None = None
    user: str | None = None
    session: str | None = None

    def __post_init__(self) -> None:
        if not self.servers:
            raise ProxyConfigError("the proxy needs at least one [servers.NAME] table")
        prefixes: dict[str, str] = {}
        for server in self.servers:
            check_prefix(f"[servers.{server.name}].prefix", server.prefix)
            check_timeout(f"[servers.{server.name}].timeout", server.timeout)
            if server.prefix in prefixes:
                other = prefixes[server.prefix]
                raise ProxyConfigError(
                    f"servers {other!r} and {server.name!r} share the prefix {server.prefix!r}: "
                    "their tools' names would collide; give one a different prefix"
                )
            prefixes[server.prefix] = server.name


def _unknown(where: str, table: Mapping[str, Any], known: set[str]) -> None:
    for key in sorted(set(table) - known):
        raise ProxyConfigError(f"{where}: unknown key {key!r} (known: {', '.join(sorted(known))})")


def _text(where: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ProxyConfigError(f"{where} must be a non-empty string")
    return value


def _optional(where: str, table: Mapping[str, Any], key: str) -> str | None:
    return _text(f"{where}.{key}", table[key]) if key in table else None


def _row(where: str, value: Any) -> Row:
    if isinstance(value, str):
        value = {"effect": value}
    if not isinstance(value, Mapping):
        raise ProxyConfigError(f"{where} must be a table (effect = ..., approver_role = ...)")
    _unknown(where, value, {"effect", "approver_role", "owner", "subject", "reversibility", "tool_errors"})
    if "effect" not in value:
        raise ProxyConfigError(f"{where} needs an effect (read, write, send, money or destructive)")
    try:
        effect = Effect.from_label(_text(f"{where}.effect", value["effect"]))
        reversibility = Reversibility(str(value.get("reversibility", Reversibility.IRREVERSIBLE)))
    except ValueError as exc:
        raise ProxyConfigError(f"{where}: {exc}") from exc
    subject: Any = value.get("subject", ())
    subject = (subject,) if isinstance(subject, str) else subject
    if not isinstance(subject, list | tuple) or not all(isinstance(s, str) and s for s in subject):
        raise ProxyConfigError(f"{where}.subject must be an argument name or a list of them")
    errors = value.get("tool_errors")
    if errors not in (None, "definite", "unknown"):
        raise ProxyConfigError(f'{where}.tool_errors must be "definite" or "unknown"')
    return Row(
        effect=effect,
        approver_role=_optional(where, value, "approver_role"),
        owner=_optional(where, value, "owner"),
        subject=tuple(subject),
        reversibility=reversibility,
        tool_errors=errors,
    )


def _target(where: str, server: Mapping[str, Any]) -> Stdio | Http:
    if ("command" in server) == ("url" in server):
        raise ProxyConfigError(f"{where} needs exactly one of command (stdio) or url (streamable HTTP)")
    if "url" in server:
        url = _text(f"{where}.url", server["url"])
        if not url.startswith(("http://", "https://")):
            raise ProxyConfigError(f"{where}.url must be an http:// or https:// URL")
        for key in ("env", "cwd"):
            if key in server:
                raise ProxyConfigError(f"{where}.{key} applies to a command, not a url")
        return Http(url=url)
    command = server["command"]
    if isinstance(command, str):
        command = [command]
    if not isinstance(command, list) or not command or not all(isinstance(c, str) and c for c in command):
        raise ProxyConfigError(f"{where}.command must be a list of strings: [program, arg, ...]")
    env = server.get("env", {})
    if not isinstance(env, Mapping) or not all(isinstance(v, str) for v in env.values()):
        raise ProxyConfigError(f"{where}.env must be a table of strings")
    return Stdio(
        command=command[0], args=tuple(command[1:]), env=dict(env), cwd=_optional(where, server, "cwd")
    )


def _server(name: str, server: Any) -> Upstream:
    where = f"[servers.{name}]"
    if not isinstance(server, Mapping):
        raise ProxyConfigError(f"{where} must be a table")
    _unknown(
        where,
        server,
        {"command", "url", "env", "cwd", "prefix", "tools", "default", "approver_role", "timeout"},
    )
    prefix = check_prefix(f"{where}.prefix", server.get("prefix", name))
    tools = server.get("tools", {})
    if not isinstance(tools, Mapping):
        raise ProxyConfigError(f"{where}.tools must be a table of [servers.{name}.tools.TOOL] rows")
    return Upstream(
        name=name,
        target=_target(where, server),
        prefix=prefix,
        tools={tool: _row(f"[servers.{name}.tools.{tool}]", row) for tool, row in tools.items()},
        default=_row(f"{where}.default", server["default"]) if "default" in server else None,
        approver_role=_optional(where, server, "approver_role"),
        timeout=check_timeout(f"{where}.timeout", server.get("timeout", DEFAULT_TIMEOUT)),
    )


def parse_config(data: Mapping[str, Any]) -> ProxyConfig:
    """The configuration in a parsed TOML document (see the module docstring)."""
    _unknown("the proxy configuration", data, {"identity", "servers"})
    identity = data.get("identity", {})
    if not isinstance(identity, Mapping):
        raise ProxyConfigError("[identity] must be a table")
    _unknown("[identity]", identity, {"agent", "user", "session"})
    servers = data.get("servers", {})
    if not isinstance(servers, Mapping):
        raise ProxyConfigError("[servers] must be a table of [servers.NAME] tables")
    return ProxyConfig(
        servers=tuple(_server(name, server) for name, server in servers.items()),
        agent=_optional("[identity]", identity, "agent"),
        user=_optional("[identity]", identity, "user"),
        session=_optional("[identity]", identity, "session"),
    )


def load_config(path: str | Path) -> ProxyConfig:
    """Read and check the proxy's TOML configuration file."""
    try:
        with Path(path).open("rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ProxyConfigError(f"cannot read the proxy configuration {path}: {exc.strerror or exc}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:  # TOML is UTF-8 text
        raise ProxyConfigError(f"the proxy configuration {path} is not valid TOML: {exc}") from exc
    return parse_config(data)


__all__ = [
    "DEFAULT_TIMEOUT",
    "ENV_CONFIG",
    "SEPARATOR",
    "Http",
    "ProxyConfig",
    "ProxyConfigError",
    "Row",
    "Stdio",
    "Upstream",
    "check_prefix",
    "check_timeout",
    "default_session",
    "load_config",
    "parse_config",
    "split_served",
]
