"""A newcomer's first hour, followed literally from the README (round 15).

The README's blocks copied into one directory of one's own and run again there, and the
closing lines of `effectgate demo`, which name the commands to run next: each must reach the
records the demo wrote, and none may print the database's password.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from effectgate import Keyring
from effectgate.cli import main

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def _said(capsys: pytest.CaptureFixture[str]) -> str:
    """What the command printed, its lines joined (the demo wraps at the console's width)."""
    captured = capsys.readouterr()
    return " ".join((captured.out + captured.err).split())


@pytest.fixture
def wide(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A newcomer's directory, a console wide enough that no URL is folded, no keyring set."""
    for name in ("EFFECTGATE_DB", "EFFECTGATE_APP", "EFFECTGATE_KEYRING"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COLUMNS", "1000")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:"])
def test_the_demo_on_an_in_memory_database_sends_no_one_to_look_in_it(
    url: str, wide: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`effectgate demo --db sqlite://` ended: "Look at them with: uv run effectgate --db
    sqlite:// audit" and "decide it ... `uv run effectgate --db sqlite:// pending`": each opens a
    new, empty in-memory database (exit 5, "run `effectgate setup`"). The demo says its records
    ended with it, and names no command over that URL."""
    assert main(["demo", "--db", url]) == 0
    said = _said(capsys)
    assert "effectgate --db" not in said
    assert "make serve" not in said
    assert "in memory" in said
    assert main(["--db", url, "pending"]) == 5  # why: there is nothing to look at
    assert list(wide.iterdir()) == []


def test_the_demo_on_its_own_database_points_the_inbox_at_that_database(
    wide: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`effectgate demo --db sqlite:///mine.db` ended: "decide it in the inbox: `make serve`",
    and `make serve` opens sqlite:///effectgate-demo.db, where the refund is not. It names an
    inbox over the database the demo wrote."""
    url = f"sqlite:///{wide / 'mine.db'}"
    assert main(["demo", "--db", url]) == 0
    said = _said(capsys)
    assert "make serve" not in said
    assert f"effectgate serve --db {url} --app effectgate.examples.shop:app" in said
    assert f"effectgate --db {url} pending" in said
    assert main(["--db", url, "pending", "--json"]) == 0  # the refund it names is there
    assert "refund_order" in capsys.readouterr().out


def test_the_default_demo_still_suggests_make_serve(wide: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`make demo` then `make serve` (the README's inbox walkthrough): the same database."""
    assert main(["demo"]) == 0
    said = _said(capsys)
    assert "`make serve`" in said
    assert "uv run effectgate --db sqlite:///effectgate-demo.db audit" in said


@pytest.mark.postgres
@pytest.mark.parametrize("framework", ["core", "langgraph"])
def test_the_demo_never_prints_the_database_password(
    framework: str, pg_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`effectgate demo --framework langgraph --db postgresql+psycopg://app:PASSWORD@...` ended
    with "The records are in <the URL, password and all>" (the core demo hides it): a
    terminal's scrollback or a CI log kept the database password."""
    pytest.importorskip("effectgate_langgraph")
    monkeypatch.setenv("EFFECTGATE_KEYRING", Keyring.generate().dumps())
    monkeypatch.setenv("COLUMNS", "1000")
    secret = "hunter2-not-for-logs"
    url = sa.engine.make_url(pg_url).set(password=secret).render_as_string(hide_password=False)
    assert main(["demo", "--framework", framework, "--db", url]) == 0
    said = _said(capsys)
    assert secret not in said
    assert "The records are in postgresql+psycopg://" in said


def test_the_quickstart_notebook_runs_without_ipywidgets(tmp_path: Path) -> None:
    """Notebook 01 says "Without ipywidgets the card is plain text and `card.approve()` does the
    same", but its cell pressed `card.approve_button.click()`, an attribute only a widget card
    has: without ipywidgets (plain `pip install effectgate`, a Jupyter without the extra) the cell
    raised AttributeError and the refund was never approved. Its code cells, run in order with
    ipywidgets unimportable, reach the end: the notebook's own asserts count one refund at the
    provider and a clean audit."""
    cells = json.loads((NOTEBOOKS / "01_quickstart.ipynb").read_text())["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    script = tmp_path / "nb01.py"
    script.write_text(f"import sys\nsys.modules['ipywidgets'] = None  # not installed\n{code}\n")
    done = subprocess.run(
        [sys.executable, script.name], cwd=tmp_path, capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "refunds at the provider: 1" in done.stdout


def test_the_demo_given_a_path_names_the_url_to_give(wide: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`effectgate demo --db mydemo.db` (a file name, as the README names the demo's file) said
    only "Could not parse SQLAlchemy URL" where every other command says "give
    sqlite:///mydemo.db" (round 6). Nothing is created."""
    assert main(["demo", "--db", "mydemo.db"]) == 5
    assert "give sqlite:///mydemo.db" in _said(capsys)
    assert list(wide.iterdir()) == []


def test_the_demo_never_prints_part_of_a_password_with_an_at_sign(
    wide: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A password holding `@` unescaped: every other command says "escape @ in a password as
    %40"; the demo went on to connect and printed "failed to resolve host 'w0rd-tail@127.0.0.1'",
    the rest of the password, into the terminal."""
    url = "postgresql+psycopg://app:pass@w0rd-tail@127.0.0.1:1/shop"
    assert main(["demo", "--db", url]) == 5
    said = _said(capsys)
    assert "w0rd-tail" not in said
    assert "escape @ in a password as %40" in said
