"""What the `effectgate` command prints, and how it fails.

Model-provided arguments are hostile here: rich markup, emoji codes, terminal escapes,
bidirectional overrides and a 600-recipient bulk send, proposed through the shop's gate and then
read back by the command on SQLite and PostgreSQL. Failures that could end in a traceback (a
corrupt file, an unparseable URL, an unreachable server, another schema version) run the command
in its own process, where exactly one `effectgate: error:` line and the documented exit code are
all that may come out. COLUMNS is 80, what a pipe or a CI log gets.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import Keyring, Pending, open_store
from effectgate._display import when
from effectgate.cli import _short, main
from effectgate.errors import IdempotencyConflict, MissingDependency, StoreError, TokenError
from effectgate.examples.shop import app, context
from effectgate.gate import EffectGate
from effectgate.stores.records import SCHEMA_VERSION

from .test_cli import Run

CONCEAL = "[conceal]x@evil.example[/conceal]"
HOSTILE_TO = [CONCEAL, "[/bold]", "ok@example.com"]
HOSTILE_SUBJECT = "[bold red]URGENT[/] :warning: [link=https://evil.example]click[/link]"
HOSTILE_BODY = "\x1b[2J \x9b31m \u202eevil.example\u202c"
BULK_TO = [f"customer{i:03d}@example.com" for i in range(600)]
BULK_BODY = "Dear customer, " + "our prices change next month. " * 170


@pytest.fixture(autouse=True)
def _cli_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """One keyring in the environment, for SQLite and PostgreSQL alike; no other settings."""
    for name in ("EFFECTGATE_DB", "EFFECTGATE_APP", "EFFECTGATE_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("EFFECTGATE_KEYRING", Keyring.generate().dumps())
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., Run]:
    def run(*argv: str) -> Run:
        code = main(list(argv))
        out, err = capsys.readouterr()
        return Run(code, out, err)

    return run


@pytest.fixture
def db(store_url: str) -> str:
    with open_store(store_url) as store:
        store.setup()
    return store_url


def _propose(url: str, tool: str, args: dict[str, Any], message_id: str = "m1") -> Pending:
    """`tool(args)` called by the shop's support agent; it must wait for approval."""
    with open_store(url) as store:
        gate = app(store, keyring=Keyring.from_env())
        outcome = gate.call(tool, args, context(message_id))
        gate.close()
    assert isinstance(outcome, Pending), outcome
    return outcome


def _hostile(url: str) -> Pending:
    return _propose(url, "send_email", {"to": HOSTILE_TO, "subject": HOSTILE_SUBJECT, "body": HOSTILE_BODY})


def _command(*argv: str) -> subprocess.CompletedProcess[str]:
    """`python -m effectgate.cli ARGV` in its own process, output to pipes."""
    return subprocess.run(
        [sys.executable, "-m", "effectgate.cli", *argv],
        env={**os.environ, "COLUMNS": "80"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _assert_one_error(code: int, out: str, err: str, expected: int, fragment: str) -> None:
    assert code == expected, err
    assert out == ""
    assert err.startswith("effectgate: error: "), err
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    assert fragment in err, err


# -- model text is text


def test_pending_prints_markup_in_arguments_literally(db: str, cli: Callable[..., Run]) -> None:
    """Markup, closing tags and emoji codes in a model's arguments are listed as the literal text
    by `pending`: nothing is concealed, styled or replaced, and `[/bold]` does not crash it."""
    pending = _hostile(db)
    run = cli("pending", "--db", db)
    assert run.code == 0, run.err
    assert pending.approval_id in run.out
    assert CONCEAL in run.out
    assert '"[/bold]"' in run.out
    assert "[bold red]URGENT[/] :warning:" in run.out
    assert "⚠" not in run.out


def test_show_prints_markup_in_arguments_literally(db: str, cli: Callable[..., Run]) -> None:
    """`show` prints every hostile argument as the literal text, `[/bold]` and `[conceal]` included."""
    pending = _hostile(db)
    run = cli("show", pending.approval_id, "--db", db)
    assert run.code == 0, run.err
    assert f'"{CONCEAL}"' in run.out
    assert '"[/bold]"' in run.out
    assert "[link=https://evil.example]click[/link]" in run.out
    assert "⚠" not in run.out


@pytest.mark.parametrize("command", ["pending", "show"])
def test_terminal_controls_in_arguments_are_escaped(db: str, command: str, cli: Callable[..., Run]) -> None:
    """Escape sequences (C0 and C1) and bidirectional overrides never reach the terminal: they are
    printed as \\u escapes, so the line shows what is stored."""
    pending = _hostile(db)
    argv = ["show", pending.approval_id] if command == "show" else ["pending"]
    run = cli(*argv, "--db", db)
    assert run.code == 0, run.err
    for raw in ("\x1b", "\x9b", "\u202e", "\u202c"):
        assert raw not in run.out
    assert "\\u001b[2J" in run.out
    assert "\\u009b31m" in run.out
    assert "\\u202eevil.example\\u202c" in run.out


def test_hostile_arguments_in_a_real_process(db: str) -> None:
    """In its own process `pending` and `show` exit 0 on hostile arguments, print them literally,
    and write no traceback."""
    pending = _hostile(db)
    for argv in (["pending"], ["show", pending.approval_id]):
        done = _command(*argv, "--db", db)
        assert done.returncode == 0, done.stderr
        assert done.stderr == ""
        assert CONCEAL in done.stdout
        assert "[/bold]" in done.stdout
        assert "\x1b" not in done.stdout


def test_json_output_is_ascii_and_round_trips(db: str, cli: Callable[..., Run]) -> None:
    """`pending --json` and `show --json` are plain-ASCII JSON (no raw control or bidirectional
    character reaches the terminal) that parses back to exactly the stored arguments."""
    pending = _hostile(db)
    listing = cli("pending", "--db", db, "--json")
    shown = cli("show", pending.approval_id, "--db", db, "--json")
    for run in (listing, shown):
        assert run.code == 0, run.err
        assert run.out.isascii()
    [card] = json.loads(listing.out)
    expected = {"to": HOSTILE_TO, "subject": HOSTILE_SUBJECT, "body": HOSTILE_BODY}
    assert card["args"] == json.loads(shown.out)["args"] == expected


def test_a_reader_that_stops_early_gets_no_error(db: str) -> None:
    """`effectgate show ID | head` with the pipe closed before anything is written exits 0 and
    writes nothing on stderr (no BrokenPipeError, no traceback)."""
    pending = _bulk(db)
    proc = subprocess.Popen(
        [sys.executable, "-m", "effectgate.cli", "show", pending.approval_id, "--db", db],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    proc.stdout.close()  # before the command has even imported effectgate
    _, err = proc.communicate(timeout=120)
    assert (proc.returncode, err) == (0, "")


# -- pending lists short, show prints whole


def _bulk(url: str) -> Pending:
    return _propose(url, "send_email", {"to": BULK_TO, "subject": "Price change", "body": BULK_BODY})


def test_pending_shortens_a_bulk_send(db: str, cli: Callable[..., Run]) -> None:
    """A 600-recipient send is listed in a few lines: each argument cut to a fixed width with a
    note of what is hidden, and no line folded at 80 columns."""
    _bulk(db)
    run = cli("pending", "--db", db)
    assert run.code == 0, run.err
    lines = run.out.splitlines()
    assert len(lines) < 10, run.out
    [to_line] = [line for line in lines if line.lstrip().startswith("to: [")]
    listed = re.fullmatch(r"\s+to: \[(.*), … \(\+(\d+) more items\)\]", to_line)
    assert listed, to_line
    shown, hidden = listed.groups()
    assert shown.count("@example.com") + int(hidden) == 600
    assert hidden == "598"  # two recipients fit in an argument's 60 characters
    [body_line] = [line for line in lines if "body: " in line]
    assert re.search(r"… \(\+\d+ chars\)", body_line)
    assert max(len(line) for line in lines) > 80  # wide content is not folded into the width


def test_show_prints_every_argument_whole(db: str, cli: Callable[..., Run]) -> None:
    """`show` hides nothing: all 600 recipients, and the whole body on one line."""
    pending = _bulk(db)
    run = cli("show", pending.approval_id, "--db", db)
    assert run.code == 0, run.err
    for address in BULK_TO:
        assert f'"{address}"' in run.out
    assert json.dumps(BULK_BODY) in run.out
    assert "more items" not in run.out
    assert "chars)" not in run.out


def test_a_long_object_shows_the_keys_that_fit() -> None:
    """A long object argument keeps the keys that fit and counts the rest; a value too long for
    any item to fit is cut with the number of characters hidden."""
    value = {f"k{i:02d}": i for i in range(40)}
    text = _short(value, 40)
    assert text.startswith('{"k00": 0, "k01": 1')
    shown = text.count('"k')
    assert text.endswith(f"… (+{40 - shown} more keys)}}")
    assert _short(["x" * 100], 40) == '["' + "x" * 38 + "… (+64 chars)"
    assert _short(list(range(12)), 40) == "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]"
    assert _short(list(range(13)), 40) == "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, … (+1 more item)]"


# -- show: expiry, warnings, reason


def test_show_prints_the_expiry_as_utc_time_and_countdown(db: str, cli: Callable[..., Run]) -> None:
    """`show` gives the expiry as a UTC date and time with a countdown, not epoch seconds."""
    pending = _propose(db, "refund_order", {"order_id": "1042", "amount": 5000, "currency": "GBP"})
    run = cli("show", pending.approval_id, "--db", db)
    assert run.code == 0, run.err
    [expires] = [line for line in run.out.splitlines() if "expires" in line]
    assert when(pending.card.expires_at) in expires
    assert re.search(r"\(in (23h 59m \d+s|1d 0h 0m)\)", expires), expires


def test_warnings_are_shown_and_marked(db: str, cli: Callable[..., Run]) -> None:
    """A card with warnings (a bidirectional override) has them printed by `show`, and is marked
    in `pending` with a line saying to read them; a clean card is not marked."""
    clean = _propose(db, "refund_order", {"order_id": "1042", "amount": 5000, "currency": "GBP"})
    flagged = _hostile(db)
    assert flagged.card.warnings
    listing = cli("pending", "--db", db)
    assert listing.code == 0, listing.err
    [flagged_row] = [line for line in listing.out.splitlines() if flagged.approval_id in line]
    [clean_row] = [line for line in listing.out.splitlines() if clean.approval_id in line]
    assert f"! {len(flagged.card.warnings)} warning(s): see show" in flagged_row
    assert "see show" not in clean_row
    assert "! 1 approval(s) carry warnings" in listing.out
    shown = cli("show", flagged.approval_id, "--db", db)
    assert shown.out.count("WARNING") == len(flagged.card.warnings)
    assert "/args/body: bidirectional control" in shown.out
    assert "U+202E RIGHT-TO-LEFT OVERRIDE" in shown.out


def test_show_prints_the_reason_of_a_denial(db: str, cli: Callable[..., Run]) -> None:
    """After a denial, `show` prints its status and the reason given."""
    pending = _propose(db, "refund_order", {"order_id": "1042", "amount": 5000, "currency": "GBP"})
    argv = ["--db", db, "--as", "finance", "--approver", "fiona"]
    denied = cli("deny", pending.approval_id, *argv, "--reason", "[bold]already refunded[/bold]")
    assert denied.code == 0, denied.err
    assert "[bold]already refunded[/bold]" in denied.out
    run = cli("show", pending.approval_id, "--db", db)
    [reason] = [line for line in run.out.splitlines() if "reason" in line]
    assert "[bold]already refunded[/bold]" in reason
    assert "denied, version 1" in run.out


def test_a_tampered_record_is_flagged_in_pending_and_show(db: str, cli: Callable[..., Run]) -> None:
    """An approval edited outside effectgate carries the does-not-verify warning in both views."""
    pending = _propose(db, "refund_order", {"order_id": "1042", "amount": 5000, "currency": "GBP"})
    with open_store(db) as store, store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE eg_approvals SET args_json = :a"), {"a": '{"amount": 1}'})
    listing = cli("pending", "--db", db)
    assert "! 1 warning(s): see show" in listing.out
    shown = cli("show", pending.approval_id, "--db", db)
    assert "does not verify" in _flat(shown.out)


def _flat(text: str) -> str:
    return " ".join(text.replace("│", " ").split())


# -- failures: one line, the documented code, never a traceback


def test_a_corrupt_sqlite_file_exits_5(tmp_path: Path) -> None:
    """A SQLite file of random bytes is reported as unreadable (exit 5), in one line."""
    bad = tmp_path / "corrupt.db"
    bad.write_bytes(b"not a database at all" + os.urandom(8192))
    done = _command("pending", "--db", f"sqlite:///{bad}")
    _assert_one_error(done.returncode, done.stdout, done.stderr, 5, "cannot read the SQLite database")
    assert "not a database" in done.stderr


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("nota://", "unsupported database URL"),
        ("postgresql+psycopg://[bad", "is not a host name or address"),
        ("not a url", "cannot parse the database URL"),
        ("postgresql+psycopg://eg:hunter2@db.example:notaport/x", "cannot parse the database URL"),
        ("mysql://eg:hunter2@db.example/x", "unsupported database URL"),
    ],
)
def test_an_unparseable_url_exits_5_without_its_password(url: str, fragment: str) -> None:
    """A database URL that cannot be parsed or used exits 5 naming it, with any password hidden."""
    done = _command("pending", "--db", url)
    _assert_one_error(done.returncode, done.stdout, done.stderr, 5, fragment)
    assert "hunter2" not in done.stderr


def test_an_unreachable_postgresql_server_exits_5() -> None:
    """A refused connection says the server is unreachable (not that the schema is missing)."""
    pytest.importorskip("psycopg")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the socket is: nothing listens there
    done = _command("audit", "--db", f"postgresql+psycopg://eg:hunter2@127.0.0.1:{port}/effectgate")
    _assert_one_error(done.returncode, done.stdout, done.stderr, 5, "is unreachable")
    assert "refused" in done.stderr.lower()
    assert "schema" not in done.stderr
    assert "hunter2" not in done.stderr


def test_a_database_of_another_schema_version_exits_5(db: str) -> None:
    """A database at schema version 99 is refused with exit 5 naming the version."""
    with open_store(db) as store, store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE eg_schema_version SET version = 99"))
    for argv in (["pending"], ["setup"]):
        done = _command(*argv, "--db", db)
        _assert_one_error(done.returncode, done.stdout, done.stderr, 5, "schema version 99")


def test_a_database_without_the_schema_exits_5(store_url: str, tmp_path: Path) -> None:
    """A database with no effectgate tables exits 5, and `setup` then makes it usable."""
    if store_url.startswith("sqlite"):
        with open_store(store_url) as store, store.engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE notes (body TEXT)"))
    done = _command("pending", "--db", store_url)
    _assert_one_error(done.returncode, done.stdout, done.stderr, 5, "no effectgate schema")
    made = _command("setup", "--db", store_url)
    assert made.returncode == 0, made.stderr
    assert f"effectgate schema {SCHEMA_VERSION} ready" in made.stdout
    assert _command("pending", "--db", store_url).returncode == 0


def test_a_missing_database_file_exits_3(tmp_path: Path) -> None:
    """A SQLite path with no file exits 3 (not found) and creates neither the file nor a key file."""
    done = _command("show", "abc", "--db", "sqlite:///nowhere.db")
    _assert_one_error(done.returncode, done.stdout, done.stderr, 3, "no database at nowhere.db")
    assert not list(tmp_path.iterdir())


def test_an_unknown_approval_exits_3(db: str, cli: Callable[..., Run]) -> None:
    """`show` and `deny` of an approval id that does not exist exit 3."""
    shown = cli("show", "nope", "--db", db)
    _assert_one_error(shown.code, shown.out, shown.err, 3, "no approval 'nope'")
    denied = cli("deny", "nope", "--db", db, "--reason", "r", "--as", "finance", "--approver", "f")
    _assert_one_error(denied.code, denied.out, denied.err, 3, "no approval 'nope'")


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["approve", "abc"], "the following arguments are required"),
        (["frobnicate"], "invalid choice"),
        (["pending", "--role"], "expected one argument"),
        (["deny", "abc", "--reason", "r", "--as", "x", "--approver", "y", "--version", "v2"], "invalid int"),
    ],
)
def test_a_bad_command_line_is_one_line_exit_2(
    argv: list[str], fragment: str, cli: Callable[..., Run]
) -> None:
    """argparse's errors are one `effectgate: error:` line (with where to find help), exit 2."""
    run = cli(*argv)
    _assert_one_error(run.code, run.out, run.err, 2, fragment)
    assert "--help" in run.err


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (TokenError("used", "the grant was already presented"), 4),
        (IdempotencyConflict("k-1"), 4),
        (StoreError("the database went away"), 5),
        (sa.exc.OperationalError("SELECT 1", {}, Exception("server closed the connection\nmore")), 5),
        (MissingDependency("psycopg", "postgres"), 5),
        (RuntimeError("boom\nsecond line"), 70),
    ],
    ids=["token", "idempotency", "store", "operational", "driver", "internal"],
)
def test_every_error_class_has_its_exit_code(
    error: Exception, code: int, db: str, monkeypatch: pytest.MonkeyPatch, cli: Callable[..., Run]
) -> None:
    """Whatever the gate raises during a command becomes its documented exit code and one line
    (an unexpected exception is an internal error, 70, with how to see the traceback)."""
    pending = _propose(db, "refund_order", {"order_id": "1042", "amount": 5000, "currency": "GBP"})

    def deny(*args: Any, **kwargs: Any) -> Any:
        raise error

    monkeypatch.setattr(EffectGate, "deny", deny)
    run = cli("deny", pending.approval_id, "--db", db, "--reason", "r", "--as", "finance", "--approver", "f")
    _assert_one_error(run.code, run.out, run.err, code, "")
    if code == 70:
        assert "EFFECTGATE_DEBUG=1" in run.err
    monkeypatch.setenv("EFFECTGATE_DEBUG", "1")
    with pytest.raises(type(error)):
        main(["deny", pending.approval_id, "--db", db, "--reason", "r", "--as", "finance", "--approver", "f"])


def test_every_option_has_help_and_version_prints_the_release(capsys: pytest.CaptureFixture[str]) -> None:
    """Each option and argument of every command carries help text, and --version prints the release."""
    import argparse

    import effectgate
    from effectgate.cli import _parser

    missing: list[str] = []

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{path} {name}")
            elif action.help is None:
                missing.append(f"{path}: {action.option_strings or action.dest}")

    walk(_parser(), "effectgate")
    assert missing == []
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"effectgate {effectgate.__version__}"


def test_setup_and_hash_secret_answer_in_json(
    store_url: str, cli: Callable[..., Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`setup --json` names the schema version and the database (password hidden); `hash-secret
    --json` gives a hash the approvers file accepts."""
    from io import StringIO

    from effectgate.web._auth import verify_secret

    made = cli("setup", "--db", store_url, "--json")
    assert made.code == 0, made.err
    assert json.loads(made.out)["schema_version"] == SCHEMA_VERSION
    assert json.loads(made.out)["db"] == sa.make_url(store_url).render_as_string(hide_password=True)
    monkeypatch.setattr(sys, "stdin", StringIO("a long secret\n"))
    hashed = cli("hash-secret", "--json")
    assert hashed.code == 0, hashed.err
    assert verify_secret("a long secret", json.loads(hashed.out)["hash"])


def test_every_command_that_answers_has_json() -> None:
    """Every command but those that run until stopped (serve, demo, mcp) takes --json."""
    from effectgate.cli import _parser

    parser = _parser()
    [sub] = [a for a in parser._actions if a.dest == "command"]
    for name, command in sub.choices.items():  # type: ignore[union-attr]
        if name in ("serve", "demo", "mcp"):
            continue
        flags = {flag for action in command._actions for flag in action.option_strings}
        assert "--json" in flags or "--jsonl" in flags, name


def test_help_describes_every_command_in_one_whole_sentence(capsys: pytest.CaptureFixture[str]) -> None:
    """`effectgate --help` opens with the module's whole first sentence, not its first line."""
    assert main(["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert (
        "The `effectgate` command: setup, pending, show, approve, deny, audit, export, verify, report,"
        in text
    )
    assert "replay, redact, retain, hold, seal-rules, demo, serve." in text
