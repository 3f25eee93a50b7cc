"""Command-line leftovers of the fourth review: a report window that ends before it starts, an
--html path naming a directory, and an --app factory that raises."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from . import test_cli
from .test_cli import Run

cli = test_cli.cli
_cli_env = test_cli._cli_env


@pytest.fixture
def url(tmp_path: Path, cli: Callable[..., Run]) -> str:
    url = f"sqlite:///{tmp_path / 'shop.db'}"
    assert cli("setup", "--db", url).code == 0  # the schema and its key file
    return url


def test_a_report_window_that_ends_before_it_starts_is_a_usage_error(
    cli: Callable[..., Run], url: str
) -> None:
    """--since after --until selects nothing: an empty report would read as 'no calls at all'."""
    run = cli("report", "--db", url, "--since", "2026-12-05", "--until", "2026-12-01")
    assert run.code == 2
    assert "--since" in run.err
    assert run.out == ""


def test_an_html_path_naming_a_directory_writes_nothing(
    cli: Callable[..., Run], url: str, tmp_path: Path
) -> None:
    """`--html newdir/` (a trailing slash: a directory) wrote a file named `newdir`."""
    run = cli("report", "--db", url, "--html", f"{tmp_path / 'newdir'}/")
    assert run.code == 2
    assert not (tmp_path / "newdir").exists()


@pytest.fixture
def raising_app() -> Iterator[str]:
    module = types.ModuleType("eg_raising_app")

    def app(store: object, *, keyring: object) -> object:
        raise RuntimeError("the table could not be loaded: orders.toml is missing")

    module.app = app  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    try:
        yield f"{module.__name__}:app"
    finally:
        del sys.modules[module.__name__]


def test_an_app_factory_that_raises_is_a_usage_error_not_a_bug(
    cli: Callable[..., Run], url: str, raising_app: str
) -> None:
    run = cli("audit", "--db", url, "--app", raising_app)
    assert run.code == 2, run.err
    assert "orders.toml is missing" in run.err
    assert "a bug" not in run.err
