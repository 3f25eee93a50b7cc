"""Small helpers the suites share: run a module in a child process; keep tests off the network."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
LOOPBACK = ("127.0.0.1", "::1", "localhost")


def run_checked(args: list[str], env: dict[str, str] | None = None, timeout: int = 300) -> str:
    """Run a command from the repository root with no stdin; fail with its stderr unless it exits 0."""
    done = subprocess.run(
        args,
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def run_module(module: str, *args: str, env: dict[str, str] | None = None, timeout: int = 300) -> str:
    """`python -m module args...` in a child process; its stdout."""
    return run_checked([sys.executable, "-m", module, *args], env, timeout)


def last_json_line(stdout: str) -> Any:
    return json.loads(stdout.strip().splitlines()[-1])


def refuse_remote_sockets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any connect() to a host other than loopback (or a Unix socket) fails the test."""
    real_connect = socket.socket.connect

    def connect(self: socket.socket, address: Any) -> Any:
        host = address[0] if isinstance(address, tuple) else address
        if self.family == socket.AF_UNIX or str(host) in LOOPBACK:
            return real_connect(self, address)
        raise AssertionError(f"a test tried to reach {address!r}")

    monkeypatch.setattr(socket.socket, "connect", connect)
