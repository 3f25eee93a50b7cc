"""An `effectgate serve` process under test: a free port, and waiting until it answers."""

from __future__ import annotations

import socket
import subprocess
import threading

import httpx
import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def login_page(base: str, proc: subprocess.Popen[str], tries: int = 400) -> httpx.Response:
    """GET /login once the server listens; fails the test if the process exits or never listens."""
    waited = threading.Event()
    for _ in range(tries):
        try:
            return httpx.get(f"{base}/login")
        except httpx.ConnectError:
            if proc.poll() is not None:
                pytest.fail(f"the inbox exited: {proc.stdout.read() if proc.stdout else ''}")
            waited.wait(0.05)
    pytest.fail("the inbox did not start")
