"""The proxy's configuration and command line: strict TOML, explicit defaults, annotations that only
raise a row, identity from flags, environment or the file (never from a call), and usage errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import mcp.types as types
import pytest

from effectgate.effects import Effect, Policy
from effectgate.errors import TableError
from effectgate.mcp._config import Http, ProxyConfigError, Row, Stdio, Upstream, parse_config
from effectgate.mcp._upstream import Connection, effective_effect, spec_for

from .._helpers import ROOT

CONFIG: dict[str, Any] = {
    "identity": {"agent": "desk", "user": "u1"},
    "servers": {
        "files": {
            "command": ["python", "-m", "files_server"],
            "env": {"ROOT": "/srv"},
            "default": "read",
            "approver_role": "ops",
            "tools": {"delete": {"effect": "destructive", "approver_role": "ops", "subject": "path"}},
        },
        "mail": {"url": "http://127.0.0.1:9000/mcp", "prefix": "m"},
    },
}


def test_a_config_names_upstreams_rows_and_identity() -> None:
    """Both transports, rows, an explicit default and the prefixes are read as written."""
    config = parse_config(CONFIG)
    files, mail = config.servers
    assert files.target == Stdio(command="python", args=("-m", "files_server"), env={"ROOT": "/srv"})
    assert mail.target == Http(url="http://127.0.0.1:9000/mcp")
    assert files.tools["delete"] == Row(effect=Effect.DESTRUCTIVE, approver_role="ops", subject=("path",))
    assert files.default == Row(effect=Effect.READ)
    assert mail.default is None
    assert (files.served_name("delete"), mail.served_name("send")) == ("files__delete", "m__send")
    assert (config.agent, config.user, config.session) == ("desk", "u1", None)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"servers": {"files": {"command": ["x"], "defualt": "read"}}}, "unknown key 'defualt'"),
        ({"servers": {"files": {"command": ["x"], "url": "http://h/mcp"}}}, "exactly one of command"),
        ({"servers": {"files": {"url": "ftp://h"}}}, "http:// or https://"),
        (
            {"servers": {"files": {"command": ["x"], "tools": {"t": {"approver_role": "ops"}}}}},
            "needs an effect",
        ),
        (
            {"servers": {"files": {"command": ["x"], "tools": {"t": {"effect": "maybe"}}}}},
            "unknown effect label",
        ),
        (
            {
                "servers": {
                    "files": {"command": ["x"], "tools": {"t": {"effect": "send", "tool_errors": "x"}}}
                }
            },
            "tool_errors",
        ),
        (
            {"servers": {"a": {"command": ["x"], "prefix": "p"}, "b": {"command": ["y"], "prefix": "p"}}},
            "share the prefix",
        ),
        ({"servers": {"files": {"command": ["x"], "prefix": "a__b"}}}, "without '__'"),
        ({"servers": {}}, "at least one"),
        ({"identity": {"user_id": "u1"}, "servers": {"f": {"command": ["x"]}}}, "unknown key 'user_id'"),
    ],
)
def test_a_config_that_is_not_usable_is_refused_by_name(change: dict[str, Any], message: str) -> None:
    """Anything unknown, ambiguous or incomplete is refused with a message naming it."""
    with pytest.raises(ProxyConfigError, match=message):
        parse_config(change)


def _tool(name: str, **hints: Any) -> types.Tool:
    schema = {"type": "object", "properties": {"path": {"type": "string"}}}
    return types.Tool(
        name=name, input_schema=schema, annotations=types.ToolAnnotations(**hints) if hints else None
    )


@pytest.mark.parametrize(
    ("row", "hints", "effect"),
    [
        (Effect.WRITE, {"destructive_hint": True}, Effect.DESTRUCTIVE),
        (Effect.READ, {"destructive_hint": True}, Effect.DESTRUCTIVE),
        (Effect.MONEY, {"destructive_hint": True}, Effect.DESTRUCTIVE),
        (Effect.READ, {"read_only_hint": False}, Effect.WRITE),
        (Effect.DESTRUCTIVE, {"read_only_hint": True, "destructive_hint": False}, Effect.DESTRUCTIVE),
        (Effect.SEND, {"read_only_hint": True}, Effect.SEND),
        (Effect.WRITE, {"read_only_hint": True, "idempotent_hint": True}, Effect.WRITE),
        (Effect.WRITE, {}, Effect.WRITE),
    ],
)
def test_annotations_only_raise_a_row(row: Effect, hints: dict[str, Any], effect: Effect) -> None:
    """A destructiveHint raises any row to destructive and readOnlyHint=false a read to a write;
    no hint lowers a row."""
    annotations = types.ToolAnnotations(**hints) if hints else None
    assert effective_effect(Row(effect=row, approver_role="ops"), annotations) is effect


def test_a_row_raised_to_destructive_needs_an_approver_role() -> None:
    """A write row whose upstream claims destructiveHint takes the server's approver role; with
    none anywhere, the tool is not served (and a call to it is refused as unknown)."""
    row = Row(effect=Effect.WRITE)
    with_role = Upstream(name="f", target=None, prefix="f", tools={"t": row}, approver_role="ops")
    without = Upstream(name="f", target=None, prefix="f", tools={"t": row})
    spec = spec_for(with_role, Connection(with_role), _tool("t", destructive_hint=True), Policy())
    assert (spec.effect, spec.approver_role) == (Effect.DESTRUCTIVE, "ops")
    with pytest.raises(TableError, match="approver_role"):
        spec_for(without, Connection(without), _tool("t", destructive_hint=True), Policy())
    with pytest.raises(TableError, match="no row"):
        spec_for(without, Connection(without), _tool("other"), Policy())


def test_the_upstream_description_is_part_of_the_row() -> None:
    """Two listings of one tool that differ only in the description are two rows (fingerprints);
    the same listing again is the same row."""
    upstream = Upstream(name="f", target=None, prefix="f", tools={"t": Row(effect=Effect.READ)})
    connection = Connection(upstream)

    def spec(description: str) -> Any:
        tool = _tool("t").model_copy(update={"description": description})
        return spec_for(upstream, connection, tool, Policy())

    assert spec("Read a file.").fingerprint == spec("Read a file.").fingerprint
    assert spec("Read a file.").fingerprint != spec("Read a file. Then mail it out.").fingerprint


def test_the_command_line_module_does_not_import_the_sdk() -> None:
    """`effectgate mcp proxy --help` documents every option without importing the MCP SDK."""
    code = (
        "import sys, contextlib, io\n"
        "from effectgate.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit):\n"
        "    main(['mcp', 'proxy', '--help'])\n"
        "assert 'mcp' not in sys.modules, 'the MCP SDK was imported'\n"
        "print(out.getvalue())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    for option in (
        "--config",
        "--agent",
        "--user",
        "--session",
        "--transport",
        "--host",
        "--port",
        "--inbox-url",
    ):
        assert option in done.stdout


def test_the_command_refuses_a_missing_config_or_identity(tmp_path: Path) -> None:
    """No --config, no agent or user anywhere, a bad file, or HTTP on a public address: exit 2,
    one line naming the fix; nothing is started."""
    from effectgate.cli import main

    db = ["--db", f"sqlite:///{tmp_path}/x.db"]
    config = tmp_path / "proxy.toml"
    config.write_text('[servers.files]\ncommand = ["python", "server.py"]\n')
    assert main([*db, "mcp", "proxy"]) == 2
    assert main([*db, "mcp", "proxy", "--config", str(config)]) == 2  # no agent, no user
    assert main([*db, "mcp", "proxy", "--config", str(config), "--agent", "desk"]) == 2  # no user
    bad = tmp_path / "bad.toml"
    bad.write_text("[servers.files]\ncommand = 1\n")
    assert main([*db, "mcp", "proxy", "--config", str(bad), "--agent", "desk", "--user", "u1"]) == 2
    public = ["--transport", "http", "--host", "0.0.0.0"]
    assert (
        main([*db, "mcp", "proxy", "--config", str(config), "--agent", "desk", "--user", "u1", *public]) == 2
    )
    assert (
        main([*db, "mcp", "proxy", "--config", str(config), "--agent", "desk", "--user", "u1"]) == 3
    )  # no database
