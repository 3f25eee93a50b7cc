"""The CLI (round 14, reproduced first): `demo --app` was accepted and ignored."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from . import test_cli
from .test_cli import Run

cli = test_cli.cli
_cli_env = test_cli._cli_env


def test_demo_refuses_an_app_it_would_not_use(
    cli: Callable[..., Run], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The demo runs the shop's own effect table. `demo --app mine:make_gate` ran the shop and
    said nothing, so a user trying their own gate saw the shop's tools as if they were theirs."""
    ran: list[str] = []

    def run_demo(url: str, out: object) -> int:
        ran.append(url)
        return 0

    monkeypatch.setattr("effectgate._demo.run_demo", run_demo)
    run = cli("demo", "--app", "mine:make_gate")
    assert run.code == 2, run
    assert "--app" in run.err
    assert ran == []
    assert list(tmp_path.iterdir()) == []  # no database created
