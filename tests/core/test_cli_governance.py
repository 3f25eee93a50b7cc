"""`effectgate redact`, `retain` and `hold` through the command line: what each changed in the
ledger (and an export file), its exit code, and that a refusal changes nothing."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from effectgate import Approver, Executed, Grant, Keyring, Pending, open_store
from effectgate.cli import keyring_for
from effectgate.examples.shop import app, context

from . import test_cli
from .test_cli import Run

cli = test_cli.cli  # its fixtures: the command run in-process, and a clean environment
_cli_env = test_cli._cli_env

REFUND = {"order_id": "1042", "amount": 5000, "currency": "GBP"}


@pytest.fixture
def executed(tmp_path: Path) -> str:
    """A database with u1's refund of order 1042 approved and executed; returns its URL."""
    url = f"sqlite:///{tmp_path / 'shop.db'}"
    with open_store(url) as store:
        store.setup()
        gate = app(store, keyring=keyring_for(url))
        pending = gate.call("refund_order", REFUND, context("m1"))
        assert isinstance(pending, Pending)
        grant = gate.approve(pending.approval_id, version=1, approver=Approver("fiona", "finance"))
        assert isinstance(grant, Grant)
        assert isinstance(gate.execute(grant.token), Executed)
        gate.close()
    return url


def test_redact_erases_the_users_values_in_the_ledger_and_an_export(
    executed: str, tmp_path: Path, cli: Callable[..., Run]
) -> None:
    export = tmp_path / "x.jsonl"
    assert cli("export", "--db", executed, "--out", str(export), "--settle", "0").code == 0
    run = cli(
        "redact", "--db", executed, "--user", "u1", "--by", "dpo", "--reason", "request 77",
        "--export", str(export), "--json",
    )  # fmt: skip
    assert run.code == 0, run.err
    done = json.loads(run.out)
    assert done["rows"] > 0
    assert done["exports"] == {str(export): 1}
    with open_store(executed) as store:
        [approval] = store.approvals()
        assert json.loads(approval.args_json) == {"$redacted": done["id"], "amount": 5000, "currency": "GBP"}
    [line] = [json.loads(text) for text in export.read_text().splitlines()]
    assert line["personal"] == {}  # the arguments' text is gone; the facts and the chain stay
    assert line["record"]["args"] == {"amount": 5000, "currency": "GBP"}
    assert cli("verify", "--db", executed, str(export)).code == 0
    assert cli("audit", "--db", executed).code == 0


def test_redact_of_one_subject_erases_only_that_subject_in_an_export(
    executed: str, tmp_path: Path, cli: Callable[..., Run]
) -> None:
    """The export loses exactly what the ledger lost: one subject's records, not all the user's."""
    with open_store(executed) as store:
        gate = app(store, keyring=keyring_for(executed))
        for message, order, user in (("m2", "1043", "u1"), ("m3", "2001", "u2")):
            args = {**REFUND, "order_id": order, "amount": 700}
            pending = gate.call("refund_order", args, context(message, user_id=user))
            assert isinstance(pending, Pending)
            grant = gate.approve(pending.approval_id, version=1, approver=Approver("fiona", "finance"))
            assert isinstance(grant, Grant)
            assert isinstance(gate.execute(grant.token), Executed)
        gate.close()
    one, whole = tmp_path / "one.jsonl", tmp_path / "whole.jsonl"
    for path in (one, whole):
        assert cli("export", "--db", executed, "--out", str(path), "--settle", "0").code == 0

    def lines(path: Path) -> list[dict[str, Any]]:
        return [json.loads(text) for text in path.read_text().splitlines()]

    before = lines(one)
    order = [json.loads(line["personal"]["args_json"])["order_id"] for line in before]
    assert order == ["1042", "1043", "2001"]
    run = cli(
        "redact", "--db", executed, "--user", "u1", "--subject", '{"order_id": "1042"}',
        "--by", "dpo", "--reason", "order", "--export", str(one), "--json",
    )  # fmt: skip
    assert run.code == 0, run.err
    assert json.loads(run.out)["exports"] == {str(one): 1}
    after = lines(one)
    assert after[0]["personal"] == {}  # the subject's arguments are gone; its facts and chain stay
    assert after[0]["record"] == before[0]["record"]
    assert after[1:] == before[1:]  # u1's other subject (1043) and u2's line are untouched
    assert cli("verify", "--db", executed, str(one)).code == 0
    # the whole user: every u1 line goes (1042, erased in the ledger earlier, too); u2's stays
    run = cli(
        "redact", "--db", executed, "--user", "u1", "--by", "dpo", "--reason", "all",
        "--export", str(one), "--export", str(whole), "--json",
    )  # fmt: skip
    assert run.code == 0, run.err
    assert json.loads(run.out)["exports"] == {str(one): 1, str(whole): 2}
    for path in (one, whole):
        assert [line["personal"] for line in lines(path)] == [{}, {}, before[2]["personal"]]
        assert cli("verify", "--db", executed, str(path)).code == 0
    assert cli("audit", "--db", executed).code == 0


def test_a_hold_refuses_redaction_with_exit_4_until_released(executed: str, cli: Callable[..., Run]) -> None:
    placed = cli("hold", "--db", executed, "--user", "u1", "--by", "legal", "--reason", "case 14")
    assert placed.code == 0, placed.err
    hold_id = placed.out.split()[1]
    listed = cli("hold", "--db", executed, "--json")
    assert [h["id"] for h in json.loads(listed.out)] == [hold_id]
    refused = cli("redact", "--db", executed, "--user", "u1", "--by", "dpo", "--reason", "r")
    assert refused.code == 4
    assert "legal hold" in refused.err
    with open_store(executed) as store:
        assert '"1042"' in store.approvals()[0].args_json
    release = ("hold", "--db", executed, "--release", hold_id, "--by", "legal", "--reason", "case closed")
    assert cli(*release).code == 0
    assert cli(*release).code == 4
    assert cli("redact", "--db", executed, "--user", "u1", "--by", "dpo", "--reason", "r").code == 0


@pytest.mark.parametrize(
    "argv",
    [
        ["retain", "--rule", "read", "--by", "x"],
        ["retain", "--rule", "reads=3", "--by", "x"],
        ["redact", "--user", "u1", "--by", "x", "--reason", "r", "--subject", "[1]"],
        ["hold", "--user", "u1", "--by", "x"],
    ],
)
def test_bad_arguments_are_usage_errors_that_change_nothing(
    executed: str, cli: Callable[..., Run], argv: list[str]
) -> None:
    with open_store(executed) as store:
        before = store.approvals()[0].args_json
    run = cli(argv[0], "--db", executed, *argv[1:])
    assert run.code in (2, 4), run
    with open_store(executed) as store:
        assert store.approvals()[0].args_json == before


def test_retain_erases_by_age(executed: str, cli: Callable[..., Run]) -> None:
    run = cli("retain", "--db", executed, "--rule", "money=0", "--by", "nightly", "--json")
    assert run.code == 0, run.err
    assert json.loads(run.out)["rows"] > 0
    with open_store(executed) as store:
        assert store.approvals()[0].args_json.startswith('{"$redacted"')


def test_retain_takes_the_unclassified_kind(executed: str, cli: Callable[..., Run]) -> None:
    """`unclassified` (events that name no effect class) is a kind of its own: it reaches no
    approval, execution or effect-classed event."""
    run = cli("retain", "--db", executed, "--rule", "unclassified=0", "--by", "nightly", "--json")
    assert run.code == 0, run.err
    assert json.loads(run.out)["rows"] == 0
    with open_store(executed) as store:
        assert not store.approvals()[0].args_json.startswith('{"$redacted"')
        assert not any(e.detail_json.startswith('{"$redacted"') for e in store.events())


# -- bad input changes nothing: the ledger's files, and every table's rows


def _ledger_state(url: str) -> dict[str, Any]:
    """The database's and key file's bytes and times, which companions exist, and every table's
    rows (counted, and the events whole)."""
    db = Path(url.removeprefix("sqlite:///"))
    files = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in (db, Path(f"{db}.keys"))}
    with sqlite3.connect(db) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        rows = {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables}
        events = conn.execute("SELECT * FROM eg_events ORDER BY id").fetchall()
    conn.close()
    return {
        "files": files,
        "rows": rows,
        "events": events,
        "beside": sorted(p.name for p in db.parent.iterdir()),
    }


@pytest.mark.parametrize("own", ["shop.db", "shop.db.keys", "shop.db-wal", "shop.db-shm", "sub/../shop.db"])
@pytest.mark.parametrize(
    "argv",
    [
        ["export", "--settle", "0", "--out"],
        ["export", "--jsonl", "--out"],
        ["report", "--html"],
    ],
)
def test_an_output_over_the_ledger_is_refused_and_writes_nothing(
    executed: str, tmp_path: Path, cli: Callable[..., Run], argv: list[str], own: str
) -> None:
    (tmp_path / "sub").mkdir()  # `sub/../shop.db` is the database by another name
    before = _ledger_state(executed)
    run = cli(argv[0], "--db", executed, *argv[1:], str(tmp_path / own))
    assert run.code == 2, run
    assert run.err.startswith("effectgate: error: ")
    assert "nothing was written" in run.err
    assert _ledger_state(executed) == before
    assert cli("audit", "--db", executed).code == 0


def test_an_export_into_a_missing_directory_adds_no_checkpoint(
    executed: str, tmp_path: Path, cli: Callable[..., Run]
) -> None:
    before = _ledger_state(executed)
    run = cli("export", "--db", executed, "--settle", "0", "--out", str(tmp_path / "nodir" / "x.jsonl"))
    assert run.code == 2, run
    assert "no directory" in run.err
    assert _ledger_state(executed) == before


@pytest.mark.parametrize("which", ["missing", "not_an_export", "the_database"])
def test_redact_checks_every_export_file_before_erasing_anything(
    executed: str, tmp_path: Path, cli: Callable[..., Run], which: str
) -> None:
    good = tmp_path / "day1.jsonl"
    assert cli("export", "--db", executed, "--out", str(good), "--settle", "0").code == 0
    bad = {"missing": tmp_path / "day1.jsnol", "not_an_export": tmp_path / "notes.txt", "the_database": None}
    other = bad[which] or Path(executed.removeprefix("sqlite:///"))
    if which == "not_an_export":
        other.write_text("not json\n")
    texts = {p: p.read_bytes() for p in (good, other) if p.exists()}
    before = _ledger_state(executed)
    run = cli(
        "redact", "--db", executed, "--user", "u1", "--by", "dpo", "--reason", "r",
        "--export", str(good), "--export", str(other),
    )  # fmt: skip
    assert run.code == 2, run
    assert _ledger_state(executed) == before
    assert {p: p.read_bytes() for p in texts} == texts


@pytest.mark.parametrize(
    "argv",
    [
        ["report", "--target", "finance=inf"],
        ["report", "--target", "finance=nan", "--json"],
        ["report", "--since", "nan"],
        ["report", "--until=-inf"],
        ["export", "--settle", "nan", "--out", "x.jsonl"],
        ["export", "--settle", "-5", "--out", "x.jsonl"],
        ["retain", "--rule", "read=nan", "--by", "x"],
        ["retain", "--rule", "money=inf", "--by", "x", "--json"],
        ["retain", "--rule", "read=-1", "--by", "x"],
        ["retain", "--rule", "money=1e400", "--by", "x"],
        ["retain", "--rule", "bogus=30", "--by", "x"],
        ["retain", "--rule", "=30", "--by", "x"],
    ],
)
def test_a_number_that_is_not_finite_is_a_usage_error(
    executed: str, tmp_path: Path, cli: Callable[..., Run], argv: list[str]
) -> None:
    before = _ledger_state(executed)
    run = cli(argv[0], "--db", executed, *argv[1:])
    assert run.code == 2, run
    assert run.out == ""
    assert run.err.startswith("effectgate: error: argument "), run.err
    assert _ledger_state(executed) == before
    assert not (tmp_path / "x.jsonl").exists()


@pytest.mark.parametrize("user", ["", "  "])
def test_hold_on_an_empty_user_is_a_usage_error(executed: str, cli: Callable[..., Run], user: str) -> None:
    before = _ledger_state(executed)
    run = cli("hold", "--db", executed, "--user", user, "--by", "legal", "--reason", "r")
    assert run.code == 2, run
    assert _ledger_state(executed) == before


def test_hold_and_release_answer_in_json(executed: str, cli: Callable[..., Run]) -> None:
    placed = cli("hold", "--db", executed, "--user", "u9", "--by", "legal", "--reason", "case 14", "--json")
    assert placed.code == 0, placed.err
    hold = json.loads(placed.out)["placed"]
    assert (hold["user_id"], hold["placed_by"], hold["reason"]) == ("u9", "legal", "case 14")
    release = ("hold", "--db", executed, "--release", hold["id"], "--by", "legal", "--reason", "done")
    released = cli(*release, "--json")
    assert released.code == 0, released.err
    assert json.loads(released.out) == {"released": hold["id"], "by": "legal", "reason": "done"}
    assert json.loads(cli("hold", "--db", executed, "--json").out) == []


# -- setup makes the key file the next command needs


def test_setup_creates_the_key_file_that_pending_and_audit_use(
    tmp_path: Path, cli: Callable[..., Run]
) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    made = cli("setup", "--db", url)
    assert made.code == 0, made.err
    keys = tmp_path / "fresh.db.keys"
    assert "created the development key file" in made.out
    assert keys.stat().st_mode & 0o777 == 0o600
    assert cli("pending", "--db", url).code == 0
    assert cli("audit", "--db", url).code == 0
    secret = keys.read_bytes()
    again = cli("setup", "--db", url, "--json")
    assert json.loads(again.out)["key_file"] == str(keys)
    assert keys.read_bytes() == secret


def test_setup_makes_no_key_file_with_a_keyring_in_the_environment_or_for_a_used_ledger(
    executed: str, tmp_path: Path, cli: Callable[..., Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    Path(executed.removeprefix("sqlite:///") + ".keys").unlink()
    used = cli("setup", "--db", executed, "--json")
    assert used.code == 0, used.err
    assert json.loads(used.out)["key_file"] is None
    assert not Path(executed.removeprefix("sqlite:///") + ".keys").exists()
    monkeypatch.setenv("EFFECTGATE_KEYRING", Keyring.generate().dumps())
    fresh = cli("setup", "--db", f"sqlite:///{tmp_path / 'env.db'}")
    assert fresh.code == 0, fresh.err
    assert not (tmp_path / "env.db.keys").exists()


def _written(line: dict[str, Any]) -> str:
    return json.dumps(line) + "\n"


@pytest.mark.parametrize(
    "edit",
    [
        lambda line: _written({**line, "personal": "corrupted"}),
        lambda line: _written({**line, "personal": {"args_json": 1042}}),
        lambda line: _written({**line, "record": {**line["record"], "personal": ["args_json"]}}),
        lambda line: _written(line)[:-2] + ', "seq": 1}\n',  # a key named twice
        lambda line: _written(line)[:-1],  # cut short: no final newline
    ],
    ids=[
        "personal_not_an_object",
        "personal_value_not_text",
        "record_personal_not_an_object",
        "repeated_key",
        "no_final_newline",
    ],
)
def test_redact_refuses_a_malformed_export_line_before_erasing_anything(
    executed: str, tmp_path: Path, cli: Callable[..., Run], edit: Callable[[dict[str, Any]], str]
) -> None:
    """An export line that `redact_export` could not rewrite (personal values or the record's
    commitments of another shape, a key named twice, a last line cut short) is a usage error
    (exit 2), raised before the ledger is erased: the ledger and the file are as they were (it
    used to erase the ledger, then crash with exit 70)."""
    export = tmp_path / "x.jsonl"
    assert cli("export", "--db", executed, "--out", str(export), "--settle", "0").code == 0
    [line] = [json.loads(text) for text in export.read_text().splitlines()]
    export.write_text(edit(line))
    text, before = export.read_bytes(), _ledger_state(executed)
    run = cli(
        "redact", "--db", executed, "--user", "u1", "--by", "dpo", "--reason", "r", "--export", str(export)
    )
    assert run.code == 2, run
    assert "nothing was erased" in run.err
    assert _ledger_state(executed) == before
    assert export.read_bytes() == text


def test_retain_refuses_a_kind_given_twice(executed: str, cli: Callable[..., Run]) -> None:
    """`--rule read=3650 --rule read=0`: which was meant? A usage error (exit 2), nothing erased
    (the last one used to win silently)."""
    before = _ledger_state(executed)
    run = cli("retain", "--db", executed, "--rule", "money=3650", "--rule", "money=0", "--by", "nightly")
    assert run.code == 2, run
    assert "--rule money= is given twice" in run.err
    assert _ledger_state(executed) == before


def test_redact_of_a_subject_matching_nothing_exits_3_and_records_nothing(
    executed: str, cli: Callable[..., Run]
) -> None:
    """`--subject '{"order_id": 1042}'` (the ledger holds "1042"): exit 3 naming the subject, no
    value erased and no `redacted` event (it used to exit 0 having erased nothing)."""
    before = _ledger_state(executed)
    run = cli(
        "redact", "--db", executed, "--user", "u1", "--subject", '{"order_id": 1042}', "--by", "dpo",
        "--reason", "r",
    )  # fmt: skip
    assert run.code == 3, run
    assert 'matches subject {"order_id":1042}' in run.err
    assert _ledger_state(executed) == before
