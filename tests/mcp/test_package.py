"""`effectgate.mcp`: its names resolve, and importing it does not import the MCP SDK."""

from __future__ import annotations

import subprocess
import sys

import pytest

import effectgate.mcp


def test_every_exported_name_resolves() -> None:
    for name in effectgate.mcp.__all__:
        assert getattr(effectgate.mcp, name) is not None, name
    with pytest.raises(AttributeError):
        _ = effectgate.mcp.no_such_name


def test_importing_the_package_and_the_cli_leaves_the_sdk_unimported() -> None:
    probe = "import sys, effectgate.mcp, effectgate.cli; print('mcp' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
