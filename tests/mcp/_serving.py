"""What the `mcp serve` tests share: the shop's refund, and reading an MCP result."""

from __future__ import annotations

import asyncio
import socket
import subprocess
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import mcp.types as types
import pytest

from effectgate import Approver
from effectgate.mcp._common import META_KEY

T = TypeVar("T")
FINANCE = Approver("fiona", "finance")
REFUND = {"order_id": "1042", "amount": 12000, "currency": "GBP"}


def run(scenario: Callable[[], Awaitable[T]]) -> T:
    """Run an async scenario to completion (the suite drives async code with asyncio.run)."""

    async def main() -> T:
        return await scenario()

    return asyncio.run(main())


def outcome(result: types.CallToolResult) -> dict[str, Any]:
    """What the gate did, as the result's `_meta` says it."""
    meta = result.meta or {}
    return dict(meta[META_KEY])


def text(result: types.CallToolResult) -> str:
    """The text the model reads."""
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening(proc: subprocess.Popen[bytes], port: int, tries: int = 400) -> None:
    """Return once the child accepts connections on `port`; fail if it exits or never does."""
    for _ in range(tries):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            try:
                proc.wait(timeout=0.05)  # waits on the child: an early exit ends the wait
            except subprocess.TimeoutExpired:
                continue
            pytest.fail(f"the child process exited with {proc.returncode}")
    pytest.fail("the child process never listened")
