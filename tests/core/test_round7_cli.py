"""Review round 7 of the reviewer commands (`pending`, `show`, `approve`, `deny`, `audit`): rows
edited in the database into values of another type or shape, and the role a reviewer names.

State is proposed through the shop's gate on a SQLite file; the edits go straight into the file,
as someone with write access to the database would make them. The command runs in-process
(`main(argv)`), as in test_cli.py.
"""

from __future__ import annotations

import errno
import io
import json
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from effectgate import CallContext, Effect, EffectGate, EffectTable, Pending, ToolSpec, open_store
from effectgate.canonical import digest
from effectgate.cli import keyring_for, main
from effectgate.examples.shop import app, context

from . import test_cli
from .test_cli import Run

cli = test_cli.cli  # the command run in-process, and a clean environment
_cli_env = test_cli._cli_env

REFUND = {"order_id": "1042", "amount": 500, "currency": "GBP"}


@pytest.fixture
def proposed(tmp_path: Path) -> tuple[str, Path, str]:
    """A refund waiting for finance: (url, database file, approval id)."""
    db = tmp_path / "shop.db"
    url = f"sqlite:///{db}"
    with open_store(url) as store:
        store.setup()
        gate = app(store, keyring=keyring_for(url))
        pending = gate.call("refund_order", REFUND, context("m1"))
        gate.close()
    assert isinstance(pending, Pending)
    return url, db, pending.approval_id


def _edit(db: Path, sql: str, *params: Any) -> None:
    """An edit made outside effectgate (SQLite keeps a value of any type in any column)."""
    conn = sqlite3.connect(db)
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        conn.execute(f"DROP TRIGGER {name}")
    conn.execute(sql, params)
    conn.commit()
    conn.close()


def _status(db: Path, approval_id: str) -> str:
    conn = sqlite3.connect(db)
    [(status,)] = conn.execute("SELECT status FROM eg_approvals WHERE id = ?", (approval_id,)).fetchall()
    conn.close()
    return str(status)


# -- a card field edited into a BLOB: `--json` printed nothing and exited 70 ("a bug")


@pytest.mark.parametrize("column", ["tool", "args_hash", "reason", "expires_at"])
def test_show_json_of_a_field_edited_into_bytes_is_a_flagged_card(
    proposed: tuple[str, Path, str], cli: Callable[..., Run], column: str
) -> None:
    """`show ID --json` of an approval whose column was edited into a BLOB failed with
    "unexpected TypeError: Object of type bytes is not JSON serializable" (exit 70), where the
    text view prints the card with its does-not-verify warning: a script reading the card
    got no card and an exit code that says the command has a bug."""
    url, db, approval_id = proposed
    _edit(db, f"UPDATE eg_approvals SET {column} = ?", b"\x1b[31m")
    run = cli("show", approval_id, "--db", url, "--json")
    assert run.code == 0, run.err
    card = json.loads(run.out)
    assert card["approval_id"] == approval_id
    assert "\x1b" not in run.out
    listing = cli("pending", "--db", url, "--json")
    assert listing.code == 0, listing.err
    json.loads(listing.out)


# -- arguments edited into JSON nested deeper than Python parses


def test_audit_of_arguments_nested_too_deep_reports_the_record(
    proposed: tuple[str, Path, str], cli: Callable[..., Run]
) -> None:
    """`audit --app` of an approval whose arguments were edited into JSON nested 5,000 deep
    crashed on the escalation check (`RecursionError`, exit 70, "a bug") instead of reporting the
    edited record (exit 1); `show` of the same row prints the card with its warning."""
    url, db, approval_id = proposed
    _edit(db, "UPDATE eg_approvals SET args_json = ?", "[" * 5000 + "]" * 5000)
    shown = cli("show", approval_id, "--db", url)
    assert shown.code == 0, shown.err
    assert "does not verify" in shown.out
    for argv in (["audit"], ["audit", "--json"], ["--app", "effectgate.examples.shop:app", "audit"]):
        run = cli(*argv, "--db", url)
        assert run.code == 1, run.err
    report = json.loads(cli("audit", "--json", "--db", url).out)
    assert any(f["approval_id"] == approval_id for f in report["findings"])


# -- `pending --role` without --app: the role grants of the policy recorded with the approval


def test_pending_for_a_granted_role_lists_what_it_may_decide_without_app(
    proposed: tuple[str, Path, str], cli: Callable[..., Run]
) -> None:
    """The shop's policy lets finance_lead decide what finance may (`role_grants`), and the
    approval records that policy. `pending --role finance_lead` without --app judged the role with
    an empty policy and printed "0 pending approval(s)": the lead's queue looked empty while a
    refund waited for them, and lapsed. With --app the same approval is listed."""
    url, _, approval_id = proposed
    with_app = cli(
        "--app", "effectgate.examples.shop:app", "pending", "--db", url, "--json", "--role", "finance_lead"
    )
    assert [c["approval_id"] for c in json.loads(with_app.out)] == [approval_id]
    run = cli("pending", "--db", url, "--json", "--role", "finance_lead")
    assert run.code == 0, run.err
    assert [c["approval_id"] for c in json.loads(run.out)] == [approval_id]
    other = cli("pending", "--db", url, "--json", "--role", "privacy")  # a role with no grant
    assert json.loads(other.out) == []


@pytest.mark.parametrize("column", ["args_json", "subject_json"])
def test_pending_and_show_of_arguments_edited_into_bytes_print_a_flagged_card(
    proposed: tuple[str, Path, str], cli: Callable[..., Run], column: str
) -> None:
    """`pending` and `show` of an approval whose arguments (or subject) were edited into a BLOB
    exit 70 ("unexpected TypeError ... a bug"): one edited row takes the whole `pending` list
    down, where text edited into them prints the card with its does-not-verify warning."""
    url, db, approval_id = proposed
    _edit(db, f"UPDATE eg_approvals SET {column} = ?", b'{"amount": 1}')
    listing = cli("pending", "--db", url)
    assert listing.code == 0, listing.err
    shown = cli("show", approval_id, "--db", url)
    assert shown.code == 0, shown.err
    # the store reads the BLOB as the text it holds (round 10): as text edited in, the arguments
    # no longer verify; an edited subject (unsealed, re-derived only with --app) is shown as stored
    assert ("does not verify" if column == "args_json" else '"amount": 1') in shown.out


# -- an --app whose module cannot be imported: a usage error (2), never "a bug" (70)


@pytest.mark.parametrize(
    ("source", "ref"),
    [
        ('raise RuntimeError("orders.toml is missing")\n', "eg_round7_app:factory"),  # its own set-up
        (None, ".eg_round7_app:factory"),  # a relative module name
    ],
)
def test_an_app_module_that_fails_to_import_is_a_usage_error(
    proposed: tuple[str, Path, str],
    cli: Callable[..., Run],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    source: str | None,
    ref: str,
) -> None:
    """A factory that raises is a usage error ("--app ... failed", exit 2), but an app module that
    raised while it was imported (a missing config file, a missing environment variable read as
    an attribute), or a relative module name (`.app:factory`, TypeError from importlib), exited
    70, "unexpected RuntimeError ... (a bug)": a bad --app is a usage error (the docstring's
    table). Nothing is decided either way."""
    url, db, approval_id = proposed
    if source is not None:
        (tmp_path / "eg_round7_app.py").write_text(source)
        monkeypatch.syspath_prepend(str(tmp_path))
    run = cli(
        "--app",
        ref,
        "approve",
        approval_id,
        "--version",
        "1",
        "--as",
        "finance",
        "--approver",
        "f",
        "--db",
        url,
    )
    assert run.code == 2, run.err
    assert "a bug" not in run.err
    assert _status(db, approval_id) == "pending"


# -- a run of variation selectors: hidden text that renders as nothing


def _pay_pending(tmp_path: Path, memo: str) -> tuple[str, str]:
    url = f"sqlite:///{tmp_path / 'pay.db'}"

    def pay(ref: str, memo: str) -> dict[str, bool]:
        """Pay a reference."""
        return {"ok": True}

    with open_store(url) as store:
        store.setup()
        table = EffectTable([ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance")])
        table.allow("a", ["pay"])
        gate = EffectGate(table, store, keyring=keyring_for(url))
        ctx = CallContext(session_id="s", origin_message_id="m", user_id="u", agent_id="a")
        pending = gate.call("pay", {"ref": "r1", "memo": memo}, ctx)
        gate.close()
    assert isinstance(pending, Pending)
    return url, pending.approval_id


def test_a_run_of_variation_selectors_is_escaped_where_the_card_warns(
    tmp_path: Path, cli: Callable[..., Run]
) -> None:
    """Text hidden in a run of variation selectors (one byte each, U+E0100 + byte: "ASCII
    smuggling") renders as nothing. The card warns about it, as the inbox and the webhook show it
    (`reveal`), but `show` and `pending` printed the selectors raw, so the reviewer told to read
    the warning saw "invoice 7" and no trace of what it carries, against the CLI's promise that
    every character that renders as nothing is written as an escape. One selector after a
    character (an emoji's presentation) is that character's glyph and stays."""
    smuggled = "".join(chr(0xE0100 + b) for b in b"IBAN DE00")
    url, approval_id = _pay_pending(tmp_path, "invoice 7" + smuggled + " \u2764\ufe0f")
    shown = cli("show", approval_id, "--db", url)
    listing = cli("pending", "--db", url)
    for run in (shown, listing):
        assert run.code == 0, run.err
        # the first selector varies the "7" before it (as `reveal` has it); the rest are escapes
        assert sum(0xE0100 <= ord(ch) <= 0xE01EF for ch in run.out) <= 1
        assert "\\U000e0141\\U000e014e\\U000e0120" in run.out  # "AN "
    assert "\u2764\ufe0f" in shown.out


# -- the output cannot be written after the decision is recorded


class _Full(io.RawIOBase):
    """A standard output on a full disk (`> /dev/full`, or a token redirected into a file)."""

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.xfail(
    strict=True,
    reason="design decision: the exit-code table has no code for 'decided and recorded, then the "
    "answer (the grant token) could not be written'; an OSError from stdout is mapped to 2 (usage "
    "error, which the table reads as nothing changed), a closed stdout to 70",
)
def test_approve_whose_token_cannot_be_written_is_not_a_usage_error(
    proposed: tuple[str, Path, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`effectgate approve ... > token.txt` on a full disk records the approval, then fails to
    write the single-use token (only its hash is stored: it is lost) and exits 2, "usage error",
    which a script reads as bad arguments that changed nothing."""
    url, db, approval_id = proposed
    app_ref = "effectgate.examples.shop:app"
    with capsys.disabled():
        monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.BufferedWriter(_Full())))
        code = main(
            [
                "--app",
                app_ref,
                "approve",
                approval_id,
                "--version",
                "1",
                "--as",
                "finance",
                "--approver",
                "f",
                "--db",
                url,
            ]
        )
    assert _status(db, approval_id) == "approved"  # recorded; the token is gone
    assert code != 2


# -- text that is not UTF-8 in a column: the driver's own error when the row is read


def test_show_of_a_row_that_is_not_utf8_exits_as_pending_does(
    proposed: tuple[str, Path, str], cli: Callable[..., Run]
) -> None:
    """A column edited into bytes that are not UTF-8 (`CAST(X'FF41' AS TEXT)`) makes sqlite3 fail
    when the row is fetched. `pending` reports it as the database's error (exit 5, the file is
    corrupt); `show` of the same row raised the driver's unwrapped `sqlite3.OperationalError`
    and exited 70, "unexpected OperationalError ... (a bug)"."""
    url, db, approval_id = proposed
    _edit(db, "UPDATE eg_approvals SET reason = CAST(X'FF41' AS TEXT)")
    listing = cli("pending", "--db", url)
    shown = cli("show", approval_id, "--db", url)
    assert (listing.code, shown.code) == (5, 5), shown.err
    assert "a bug" not in shown.err
    assert len(shown.err.splitlines()) == 1


# -- `approve --execute` exit 6 says "`show ID` says which": failed, or outcome unknown

TIMING_OUT_APP = """
from effectgate.examples.shop import Shop, app

SHOPS = []


def factory(store, *, keyring=None):
    shop = Shop()
    shop.provider.timeouts_to_inject = 1  # the refund happens, its reply is lost
    SHOPS.append(shop)
    return app(store, keyring=keyring, shop=shop)
"""


def test_show_says_the_outcome_of_an_approved_run_is_unknown(
    proposed: tuple[str, Path, str], cli: Callable[..., Run], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`approve --execute` whose run timed out at the provider exits 6, documented as "approved,
    then the run failed or its outcome is unknown (`effectgate show ID` says which)". `show ID`
    printed "status approved, version 1" and nothing else: the same card as a grant not yet run,
    though the refund happened and waits for reconciliation (the token is spent)."""
    url, _, approval_id = proposed
    (tmp_path / "eg_round7_timeout.py").write_text(TIMING_OUT_APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    approve = ["--app", "eg_round7_timeout:factory", "approve", approval_id, "--version", "1"]
    run = cli(*approve, "--as", "finance", "--approver", "fiona", "--db", url, "--execute")
    assert run.code == 6, run.err
    import eg_round7_timeout  # type: ignore[import-not-found]

    [shop] = eg_round7_timeout.SHOPS
    assert shop.receiver.count("refund") == 1  # it ran, once
    shown = cli("show", approval_id, "--db", url)
    assert shown.code == 0, shown.err
    assert "needs_reconciliation" in shown.out
    card = json.loads(cli("show", approval_id, "--db", url, "--json").out)
    assert card["run"]["status"] == "needs_reconciliation"


def test_pending_for_a_role_survives_a_recorded_policy_edited_in(
    proposed: tuple[str, Path, str], cli: Callable[..., Run]
) -> None:
    """A policy row inserted under its own fingerprint (`{}`, no policy the gate writes) and named
    by the approval: the role's listing still lists it (the card warns), never fails on it."""
    url, db, approval_id = proposed
    fingerprint = digest({})
    _edit(
        db,
        "INSERT INTO eg_rules (fingerprint, kind, body_json, at) VALUES (?, 'policy', '{}', 0)",
        fingerprint,
    )
    _edit(db, "UPDATE eg_approvals SET policy_fingerprint = ?", fingerprint)
    run = cli("pending", "--db", url, "--json", "--role", "finance")
    assert run.code == 0, run.err
    assert [c["approval_id"] for c in json.loads(run.out)] == [approval_id]


def test_audit_reports_a_recorded_policy_edited_in(
    proposed: tuple[str, Path, str], cli: Callable[..., Run]
) -> None:
    """The same edit as above: `audit` exits 2, "effectgate: error: autonomous", not 1 with findings."""
    url, db, _ = proposed
    fingerprint = digest({})
    _edit(
        db,
        "INSERT INTO eg_rules (fingerprint, kind, body_json, at) VALUES (?, 'policy', '{}', 0)",
        fingerprint,
    )
    _edit(db, "UPDATE eg_approvals SET policy_fingerprint = ?", fingerprint)
    assert cli("audit", "--db", url).code == 1


def test_a_creation_time_edited_into_text_is_printed_escaped(
    proposed: tuple[str, Path, str], cli: Callable[..., Run]
) -> None:
    """`show` prints a creation time that is no date as its repr, which escapes controls but not a
    printable character that renders as nothing (U+3164 HANGUL FILLER) or a run of variation
    selectors: every other field of the card writes those as escapes."""
    url, db, approval_id = proposed
    _edit(db, "UPDATE eg_approvals SET created_at = ?", "2026\u3164\ufe0f\ufe0f")
    shown = cli("show", approval_id, "--db", url)
    assert shown.code == 0, shown.err
    assert "\u3164" not in shown.out
    assert "\ufe0f\ufe0f" not in shown.out
    assert "\\u3164" in shown.out
