"""Round 9: EFFECTGATE_DEBUG shows tracebacks only when it says so (1, true, yes, on): `0`,
`false`, `no`, `off` or an empty value keep the one-line error and its exit code."""

from __future__ import annotations

import argparse

import pytest
from rich.console import Console

from effectgate import cli
from effectgate.cli import main


def _boom(args: argparse.Namespace, out: Console) -> int:
    raise RuntimeError("boom")


@pytest.mark.parametrize("value", ["0", "false", "no", "off", "", " 0 "])
def test_a_debug_value_that_says_no_keeps_the_one_line_error(
    value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(cli._COMMANDS, "setup", _boom)
    monkeypatch.setenv("EFFECTGATE_DEBUG", value)
    assert main(["--db", "sqlite://", "setup"]) == 70
    err = capsys.readouterr().err
    assert err.startswith("effectgate: error: unexpected RuntimeError: boom")
    assert "Traceback" not in err


@pytest.mark.parametrize("value", ["1", "true", "YES", "on"])
def test_a_debug_value_that_says_yes_raises(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(cli._COMMANDS, "setup", _boom)
    monkeypatch.setenv("EFFECTGATE_DEBUG", value)
    with pytest.raises(RuntimeError, match="boom"):
        main(["--db", "sqlite://", "setup"])
