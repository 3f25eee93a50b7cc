"""The `effectgate` command, driven through `main(argv)` and once as a real process.

State is set up with the shop from the running example on a file SQLite store (and PostgreSQL
where a test takes `store_url`); the CLI is then run against that database exactly as an approver
would run it. COLUMNS is pinned to 80 (what a pipe or a CI log may carry), so the tests see that
output off a terminal is not wrapped at it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import sqlalchemy as sa

from effectgate import Approver, Grant, Keyring, Pending, open_store
from effectgate.canonical import args_hash, canonical_text
from effectgate.cli import keyring_for, main
from effectgate.errors import TokenError
from effectgate.examples.shop import Shop, app, context
from effectgate.testing import FakeClock

APP = "effectgate.examples.shop:app"
REFUND_V1 = {"order_id": "1042", "amount": 5000, "currency": "GBP"}
REFUND_V2 = {"order_id": "1042", "amount": 6000, "currency": "GBP"}


class Setup(NamedTuple):
    url: str
    db: Path
    approval_id: str
    version: int


class Run(NamedTuple):
    code: int
    out: str
    err: str


@pytest.fixture(autouse=True)
def _cli_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("EFFECTGATE_DB", "EFFECTGATE_APP", "EFFECTGATE_KEYRING"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.chdir(tmp_path)  # the default sqlite:///effectgate.db must never be the repo's


@pytest.fixture
def refund(tmp_path: Path) -> Setup:
    """A refund of order 1042 proposed, then amended in place: pending at version 2."""
    db = tmp_path / "shop.db"
    url = f"sqlite:///{db}"
    with open_store(url) as store:
        store.setup()
        gate = app(store, keyring=keyring_for(url))
        gate.call("refund_order", REFUND_V1, context("m1"))
        amended = gate.call("refund_order", REFUND_V2, context("m2"))
        gate.close()
    assert isinstance(amended, Pending)
    assert amended.version == 2
    return Setup(url, db, amended.approval_id, amended.version)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., Run]:
    def run(*argv: str) -> Run:
        code = main(list(argv))
        out, err = capsys.readouterr()
        return Run(code, out, err)

    return run


def _snapshot(url: str) -> dict[str, Any]:
    """Everything an approve could change: approval rows, decisions, executions, events, keys."""
    with open_store(url) as store:
        return {
            "approvals": [
                (a.id, a.status, a.version, a.args_hash, a.token_hash, a.token_used_at)
                for a in store.approvals()
            ],
            "decisions": [d.model_dump() for d in store.all_decisions()],
            "executions": [e.model_dump() for e in store.executions()],
            "events": len(store.events()),
            "idempotency": [r.key for r in store.idempotency_records()],
        }


def _flat(text: str) -> str:
    """The text with whitespace and box-drawing borders removed, so folded values read whole."""
    return "".join(ch for ch in text if not ch.isspace() and ch not in "│")


def _one_line(text: str) -> str:
    return " ".join(text.split())


# -- pending


def test_pending_lists_the_waiting_approval(refund: Setup, cli: Callable[..., Run]) -> None:
    """`pending` exits 0 and lists the one waiting approval."""
    run = cli("pending", "--db", refund.url)
    assert run.code == 0, run.err
    assert "1 pending approval(s)" in run.out
    assert refund.approval_id[:8] in run.out


def test_pending_table_shows_the_whole_id(refund: Setup, cli: Callable[..., Run]) -> None:
    """The human listing shows the full approval id, the one `approve ID` needs."""
    run = cli("pending", "--db", refund.url)
    assert refund.approval_id in run.out


def test_pending_json_parses_and_filters_by_role(refund: Setup, cli: Callable[..., Run]) -> None:
    """`pending --json` is a JSON list of cards, and `--role` narrows it to that approver role."""
    run = cli("pending", "--db", refund.url, "--json")
    assert run.code == 0, run.err
    [card] = json.loads(run.out)
    assert card["approval_id"] == refund.approval_id
    assert card["version"] == 2
    assert card["tool"] == "refund_order"
    assert card["approver_role"] == "finance"

    finance = cli("pending", "--db", refund.url, "--json", "--role", "finance")
    assert [c["approval_id"] for c in json.loads(finance.out)] == [refund.approval_id]
    privacy = cli("pending", "--db", refund.url, "--json", "--role", "privacy")
    assert privacy.code == 0
    assert json.loads(privacy.out) == []


def test_db_before_the_subcommand_is_used(refund: Setup, cli: Callable[..., Run]) -> None:
    """`effectgate --db URL pending` reads URL, like `effectgate pending --db URL`."""
    run = cli("--db", refund.url, "pending", "--json")
    assert run.code == 0, run.err
    assert [c["approval_id"] for c in json.loads(run.out)] == [refund.approval_id]


# -- show


def test_show_prints_the_stored_arguments_and_hash(refund: Setup, cli: Callable[..., Run]) -> None:
    """`show ID` prints the frozen arguments of the current version and their sha256."""
    with open_store(refund.url) as store:
        row = store.get_approval(refund.approval_id)
    assert row is not None
    run = cli("show", refund.approval_id, "--db", refund.url)
    assert run.code == 0, run.err
    flat = _flat(run.out)
    assert row.args_hash in flat
    assert '"amount":6000' in flat
    assert '"order_id":"1042"' in flat
    assert "version2" in flat


def test_show_json_carries_the_stored_arguments_and_hash(refund: Setup, cli: Callable[..., Run]) -> None:
    """`show ID --json` is the card: stored arguments, args hash, version and status."""
    with open_store(refund.url) as store:
        row = store.get_approval(refund.approval_id)
    assert row is not None
    run = cli("show", refund.approval_id, "--db", refund.url, "--json")
    assert run.code == 0, run.err
    card = json.loads(run.out)
    assert card["approval_id"] == refund.approval_id
    assert card["args"] == REFUND_V2
    assert card["args_hash"] == row.args_hash
    assert (card["version"], card["status"]) == (2, "pending")


# -- approve


def _token(out: str) -> str:
    token = out.strip().splitlines()[-1].strip()
    assert token.startswith("eg1."), out
    return token


def test_approve_prints_a_token_that_executes_exactly_once(refund: Setup, cli: Callable[..., Run]) -> None:
    """The token `approve` prints runs the approved refund once through a gate with the same keyring."""
    run = cli(
        "approve",
        refund.approval_id,
        "--db",
        refund.url,
        "--version",
        "2",
        "--as",
        "finance",
        "--approver",
        "fiona",
        "--app",
        APP,
    )
    assert run.code == 0, run.err
    assert run.err == ""
    token = _token(run.out)

    shop = Shop()
    with open_store(refund.url) as store:
        gate = app(store, keyring=keyring_for(refund.url), shop=shop)
        done = gate.execute(token)
        assert done.approval_id == refund.approval_id
        assert done.result["amount"] == 6000
        with pytest.raises(TokenError):
            gate.execute(token)
        gate.close()  # its lease thread ends: a later test's audit forks only with one thread
        [decision] = store.all_decisions()
        row = store.get_approval(refund.approval_id)
    assert shop.receiver.count("refund") == 1
    assert shop.receiver.count("refund", order_id="1042", amount=6000) == 1
    assert (decision.approver_id, decision.role, decision.decision) == ("fiona", "finance", "approve")
    assert row is not None
    assert row.status == "executed"


def _approve(
    setup: Setup,
    *,
    approval_id: str | None = None,
    db: str | None = None,
    version: str = "2",
    role: str = "finance",
    app_ref: str | None = APP,
) -> list[str]:
    """The argv of `effectgate approve` for the pending refund, with one part changed."""
    argv = ["approve", approval_id or setup.approval_id, "--db", db or setup.url]
    argv += ["--version", version, "--as", role, "--approver", "fiona"]
    return [*argv, "--app", app_ref] if app_ref is not None else argv


def _not_a_gate(tmp: Path) -> str:
    (tmp / "eg_not_a_gate.py").write_text("def factory(store, *, keyring=None):\n    return object()\n")
    return "eg_not_a_gate:factory"


# (argv builder, a fragment the error must name, the exit code)
BAD_INPUT: dict[str, tuple[Callable[[Setup, Path], list[str]], str, int]] = {
    "stale_version": (lambda s, _: _approve(s, version="1"), "version 1 is stale", 4),
    "future_version": (lambda s, _: _approve(s, version="3"), "version 3 does not exist yet", 4),
    "wrong_role": (lambda s, _: _approve(s, role="support_lead"), "needs role finance", 4),
    "unknown_id": (lambda s, _: _approve(s, approval_id="nope"), "no approval 'nope'", 3),
    "missing_app": (lambda s, _: _approve(s, app_ref=None), "--app", 2),
    "app_without_colon": (lambda s, _: _approve(s, app_ref="effectgate.examples.shop"), "module:factory", 2),
    "app_unknown_module": (lambda s, _: _approve(s, app_ref="eg_no_such_module:app"), "cannot load", 2),
    "app_unknown_attr": (lambda s, _: _approve(s, app_ref="effectgate.examples.shop:nope"), "cannot load", 2),
    "app_not_callable": (
        lambda s, _: _approve(s, app_ref="effectgate.examples.shop:SHOP_POLICY"),
        "not callable",
        2,
    ),
    "app_not_a_gate": (lambda s, tmp: _approve(s, app_ref=_not_a_gate(tmp)), "not an EffectGate", 2),
    "app_wrong_signature": (
        lambda s, _: _approve(s, app_ref="effectgate.examples.shop:context"),
        "--app",
        2,
    ),
    "no_database": (lambda s, _: _approve(s, db="sqlite:///missing.db"), "no database at missing.db", 3),
    "version_not_a_number": (lambda s, _: _approve(s, version="two"), "invalid int value", 2),
}


def _cases() -> list[Any]:
    return [pytest.param(name, id=name) for name in BAD_INPUT]


@pytest.mark.parametrize("case", _cases())
def test_approve_bad_input_exits_with_its_code_and_changes_nothing(
    case: str, refund: Setup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli: Callable[..., Run]
) -> None:
    """Bad approve input exits with its documented code and an `effectgate: error:` line, and the
    store is untouched."""
    monkeypatch.syspath_prepend(str(tmp_path))
    build, fragment, code = BAD_INPUT[case]
    before = _snapshot(refund.url)
    run = cli(*build(refund, tmp_path))
    assert run.code == code, run.err
    assert run.out == ""
    assert run.err.startswith("effectgate: error:")
    assert fragment in _one_line(run.err)
    assert "Traceback" not in run.err
    assert _snapshot(refund.url) == before
    [row] = before["approvals"]
    assert (row[1], row[2]) == ("pending", 2)
    assert before["decisions"] == []
    assert not (tmp_path / "missing.db").exists()
    assert not (tmp_path / "missing.db.keys").exists()


@pytest.mark.parametrize("case", _cases())
def test_approve_bad_input_is_one_line_on_stderr(
    case: str, refund: Setup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli: Callable[..., Run]
) -> None:
    """The error for bad approve input is one line on stderr when the console is wide enough."""
    monkeypatch.setenv("COLUMNS", "1000")
    monkeypatch.syspath_prepend(str(tmp_path))
    build, _, code = BAD_INPUT[case]
    run = cli(*build(refund, tmp_path))
    assert run.code == code
    assert len(run.err.splitlines()) == 1, run.err


def test_a_long_error_stays_one_line_at_80_columns(refund: Setup, cli: Callable[..., Run]) -> None:
    """An error longer than the console (a stale version names a 32-character id) is still one line."""
    run = cli(*_approve(refund, version="1"))
    assert run.code == 4
    assert len(run.err.splitlines()) == 1, run.err


# -- refusals: the gate refused the decision (exit 4), nothing was decided


def _expired(s: Setup, tmp: Path, cli: Callable[..., Run]) -> list[str]:
    """A refund of order 1043 proposed three days ago (a clock in the past): long expired."""
    with open_store(s.url) as store:
        gate = app(store, keyring=keyring_for(s.url), clock=FakeClock(time.time() - 3 * 86400))
        old = gate.call(
            "refund_order", {"order_id": "1043", "amount": 1000, "currency": "GBP"}, context("m5")
        )
        gate.close()
    assert isinstance(old, Pending)
    return _approve(s, approval_id=old.approval_id, version="1")


def _denied(s: Setup, tmp: Path, cli: Callable[..., Run]) -> list[str]:
    denied = cli("deny", s.approval_id, "--db", s.url, "--reason", "no", "--as", "finance", "--approver", "x")
    assert denied.code == 0, denied.err
    return _approve(s)


def _over_balance(s: Setup, tmp: Path, cli: Callable[..., Run]) -> list[str]:
    """An app whose shop has refunded most of order 1042 since: 6000 no longer fits."""
    (tmp / "eg_small_shop.py").write_text(
        "from effectgate.examples.shop import Shop, app\n"
        "def factory(store, *, keyring=None):\n"
        "    shop = Shop()\n"
        "    shop.orders['1042']['total'] = 1000\n"
        "    return app(store, keyring=keyring, shop=shop)\n"
    )
    return _approve(s, app_ref="eg_small_shop:factory")


def _tampered(s: Setup, tmp: Path, cli: Callable[..., Run]) -> list[str]:
    """The stored arguments edited outside effectgate (the amount raised)."""
    _tamper(s.url)
    return _approve(s)


def _blank_reason(s: Setup, tmp: Path, cli: Callable[..., Run]) -> list[str]:
    return ["deny", s.approval_id, "--db", s.url, "--reason", "  ", "--as", "finance", "--approver", "x"]


def _tamper(url: str) -> None:
    with open_store(url) as store, store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE eg_approvals SET args_json = :a"),
            {"a": json.dumps({**REFUND_V2, "amount": 9999})},
        )


# (argv builder, a fragment the error must name)
REFUSALS: dict[str, tuple[Callable[[Setup, Path, Callable[..., Run]], list[str]], str]] = {
    "expired": (_expired, "has expired"),
    "already_decided": (_denied, "is denied, not pending"),
    "confirm_failed": (_over_balance, "confirm check failed: only 1000 is left"),
    "tampered_record": (_tampered, "changed outside effectgate"),
    "policy_violation": (_blank_reason, "a denial needs a reason"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_refused_decision_exits_4_and_records_no_decision(
    case: str, refund: Setup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli: Callable[..., Run]
) -> None:
    """When the gate refuses a decision the command exits 4 with one error line naming why (after
    the gate's own warning, when it logs one), and no new decision or grant is recorded."""
    monkeypatch.syspath_prepend(str(tmp_path))
    build, fragment = REFUSALS[case]
    argv = build(refund, tmp_path, cli)
    before = _snapshot(refund.url)
    run = cli(*argv)
    assert run.code == 4, run.err
    assert run.out == ""
    *logged, error = run.err.splitlines()
    assert error.startswith("effectgate: error:")
    assert all(line.startswith("effectgate._") and ": warning: " in line for line in logged), run.err
    assert fragment in error
    after = _snapshot(refund.url)
    assert after["decisions"] == before["decisions"]
    assert [a[4] for a in after["approvals"]] == [a[4] for a in before["approvals"]]  # no grant


# -- deny


def test_deny_closes_the_approval_with_its_reason(refund: Setup, cli: Callable[..., Run]) -> None:
    """`deny ID --reason ...` denies the approval, records the decision, and empties `pending`."""
    run = cli(
        "deny",
        refund.approval_id,
        "--db",
        refund.url,
        "--reason",
        "duplicate of a refund already made",
        "--as",
        "finance",
        "--approver",
        "xavier",
    )
    assert run.code == 0, run.err
    assert f"denied {refund.approval_id}" in _one_line(run.out)
    with open_store(refund.url) as store:
        row = store.get_approval(refund.approval_id)
        [decision] = store.all_decisions()
    assert row is not None
    assert row.status == "denied"
    assert (decision.approver_id, decision.decision) == ("xavier", "deny")
    assert decision.reason == "duplicate of a refund already made"
    assert json.loads(cli("pending", "--db", refund.url, "--json").out) == []


def test_approve_json_is_the_grant(refund: Setup, cli: Callable[..., Run]) -> None:
    """`approve --json` prints the grant as JSON: kind, approval, version, token and expiry."""
    run = cli(*_approve(refund), "--json")
    assert run.code == 0, run.err
    grant = json.loads(run.out)
    assert (grant["kind"], grant["approval_id"], grant["version"]) == ("grant", refund.approval_id, 2)
    assert grant["token"].startswith("eg1.")
    assert grant["expires_at"] > time.time()


def test_approve_json_reports_a_partial_approval_then_the_grant(
    refund: Setup, cli: Callable[..., Run]
) -> None:
    """A destructive call's first `approve --json` is a partial approval (1 of 2); a second,
    distinct approver's is the grant."""
    with open_store(refund.url) as store:
        gate = app(store, keyring=keyring_for(refund.url))
        erase = gate.call("delete_customer_data", {"customer_id": "u1"}, context("m7"))
        gate.close()
    assert isinstance(erase, Pending)
    argv = ["approve", erase.approval_id, "--db", refund.url, "--version", "1", "--as", "privacy"]
    first = cli(*argv, "--approver", "pia", "--app", APP, "--json")
    assert first.code == 0, first.err
    partial = json.loads(first.out)
    assert partial["kind"] == "partial_approval"
    assert (partial["approval_id"], partial["approvals"], partial["required"]) == (erase.approval_id, 1, 2)
    assert "second, distinct approver" in partial["message"]
    second = cli(*argv, "--approver", "pete", "--app", APP, "--json")
    assert second.code == 0, second.err
    assert json.loads(second.out)["kind"] == "grant"


def test_deny_json_is_the_refusal(refund: Setup, cli: Callable[..., Run]) -> None:
    """`deny --json` prints the refusal the model will be told, as JSON."""
    run = cli(
        "deny",
        refund.approval_id,
        "--db",
        refund.url,
        "--reason",
        "duplicate",
        "--as",
        "finance",
        "--approver",
        "xavier",
        "--json",
    )
    assert run.code == 0, run.err
    refused = json.loads(run.out)
    assert (refused["kind"], refused["code"], refused["tool"]) == ("refused", "denied", "refund_order")
    assert refused["approval_id"] == refund.approval_id
    assert "duplicate" in refused["message"]


# -- audit


def _diverge(url: str) -> None:
    """A money execution with no approval behind it, written straight into the ledger."""
    with open_store(url) as store, store.transaction() as conn:
        store.append_execution(
            conn,
            approval_id=None,
            version=None,
            tool="refund_order",
            effect="money",
            args_hash=args_hash("refund_order", REFUND_V2),
            args_json=canonical_text(REFUND_V2),
            idempotency_key="rogue-1",
            status="succeeded",
            session_id="s-ada",
            origin_message_id="m9",
            user_id="u1",
            agent_id="support",
            table_fingerprint="f",
            row_fingerprint=Shop().table()["refund_order"].fingerprint,  # the money row, recorded
            result_json="{}",
        )


def test_audit_exits_0_when_clean(refund: Setup, cli: Callable[..., Run]) -> None:
    """`audit` on a ledger with nothing ungated exits 0 and says clean."""
    run = cli("audit", "--db", refund.url)
    assert run.code == 0, run.err
    assert _one_line(run.out).startswith("clean: 0 finding(s)")


def test_audit_exits_1_on_a_divergence(refund: Setup, cli: Callable[..., Run]) -> None:
    """A money execution with no approval makes `audit` exit 1 and name the finding."""
    _diverge(refund.url)
    run = cli("audit", "--db", refund.url)
    assert run.code == 1
    text = _one_line(run.out)
    assert "no_approval refund_order" in text
    assert "DIVERGED: 1 finding(s)" in text


@pytest.mark.parametrize("flags", [[], ["--json"]])
def test_audit_findings_exit_1_when_the_reader_stops_early(refund: Setup, flags: list[str]) -> None:
    """`effectgate audit | head -1` (the pipe closed before anything is read) keeps the verdict:
    exit 1 on findings, never 0, and no traceback."""
    _diverge(refund.url)
    proc = subprocess.Popen(
        [sys.executable, "-m", "effectgate.cli", "audit", "--db", refund.url, *flags],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert (proc.returncode, err) == (1, "")


def test_audit_json_reports_clean_and_findings(refund: Setup, cli: Callable[..., Run]) -> None:
    """`audit --json` parses, says clean, and after a divergence lists it with exit 1."""
    clean = cli("audit", "--db", refund.url, "--json")
    assert clean.code == 0, clean.err
    report = json.loads(clean.out)
    assert (report["clean"], report["findings"]) == (True, [])
    assert report["metrics"]["gated_proposals"] == 1

    _diverge(refund.url)
    dirty = cli("audit", "--db", refund.url, "--json")
    assert dirty.code == 1
    report = json.loads(dirty.out)
    assert report["clean"] is False
    assert [(f["kind"], f["tool"]) for f in report["findings"]] == [("no_approval", "refund_order")]


def test_audit_verifies_seals_with_the_database_keyring(refund: Setup, cli: Callable[..., Run]) -> None:
    """`audit` checks every seal with the database's keyring: under another key the approval's
    seal is reported broken (exit 1, the finding's kind first on its line)."""
    keys = Path(f"{refund.db}.keys")
    original = keys.read_text()
    keys.unlink()
    Keyring.load_or_create(keys)  # another key, with the file's proper permissions
    run = cli("audit", "--db", refund.url)
    assert run.code == 1
    assert any(line.startswith("seal_broken refund_order") for line in run.out.splitlines()), run.out
    keys.write_text(original)
    assert cli("audit", "--db", refund.url).code == 0


def test_audit_without_a_keyring_exits_2_and_makes_none(refund: Setup, cli: Callable[..., Run]) -> None:
    """Without $EFFECTGATE_KEYRING or the key file beside the database, `audit` exits 2 naming the
    fix, and does not create a key file (a new key would verify nothing)."""
    keys = Path(f"{refund.db}.keys")
    keys.unlink()
    run = cli("audit", "--db", refund.url)
    assert run.code == 2
    assert "EFFECTGATE_KEYRING" in run.err
    assert len(run.err.splitlines()) == 1
    assert not keys.exists()


def test_audit_reports_tampered_arguments_on_both_backends(
    store_url: str, monkeypatch: pytest.MonkeyPatch, cli: Callable[..., Run]
) -> None:
    """On SQLite and PostgreSQL, `audit` says the seals were verified and exits 0 while the
    ledger is intact, then exits 1 and prints the `args_tampered` kind once a stored argument is
    edited; the JSON report lists the same kinds."""
    monkeypatch.setenv("EFFECTGATE_KEYRING", Keyring.generate().dumps())
    with open_store(store_url) as store:
        store.setup()
        gate = app(store, keyring=keyring_for(store_url))
        assert isinstance(gate.call("refund_order", REFUND_V2, context("m1")), Pending)
        gate.close()
    clean = cli("audit", "--db", store_url)
    assert clean.code == 0, clean.err
    assert "seals verified" in clean.out
    _tamper(store_url)
    dirty = cli("audit", "--db", store_url)
    assert dirty.code == 1, dirty.err
    printed = [line.split()[0] for line in dirty.out.splitlines()[:-1]]
    assert printed == ["args_tampered"]
    report = cli("audit", "--db", store_url, "--json")
    assert report.code == 1
    assert [f["kind"] for f in json.loads(report.out)["findings"]] == printed


# -- export


def test_export_jsonl_writes_one_tagged_object_per_line(
    refund: Setup, tmp_path: Path, cli: Callable[..., Run]
) -> None:
    """`export --jsonl --out FILE` writes every row of every table as one JSON object a line,
    tagged by table (`eg_` dropped)."""
    target = tmp_path / "export.jsonl"
    run = cli("export", "--db", refund.url, "--jsonl", "--out", str(target))
    assert run.code == 0, run.err
    lines = target.read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert all(isinstance(r, dict) and "table" in r for r in records)
    assert {"approvals", "events", "rules", "schema_version"} <= {r["table"] for r in records}
    [approval] = [r for r in records if r["table"] == "approvals"]
    assert (approval["id"], approval["version"]) == (refund.approval_id, 2)
    assert f"wrote {len(lines)} records" in _one_line(run.out)


def test_export_writes_a_signed_chain_that_verify_checks(
    refund: Setup, tmp_path: Path, cli: Callable[..., Run]
) -> None:
    """`export --out FILE` writes the executed refund as a chained record with a signed manifest;
    `verify` says ok, names the line of a changed amount (exit 1), and an export continuing the
    first with `--after` verifies against it."""
    with open_store(refund.url) as store:
        gate = app(store, keyring=keyring_for(refund.url))
        grant = gate.approve(
            refund.approval_id, version=refund.version, approver=Approver("fiona", "finance")
        )
        assert isinstance(grant, Grant)
        gate.execute(grant.token)
        gate.close()
    target = tmp_path / "d1.jsonl"
    assert cli("export", "--db", refund.url).code == 2  # no --out
    run = cli("export", "--db", refund.url, "--out", str(target), "--settle", "0")
    assert run.code == 0, run.err
    assert "wrote 1 decision records" in _one_line(run.out)
    [line] = [json.loads(text) for text in target.read_text().splitlines()]
    assert (line["record"]["args"]["amount"], line["record"]["approvers"][0]["id"]) == (6000, "fiona")
    manifest = f"{target}.manifest.json"
    ok = cli("verify", "--db", refund.url, str(target))
    assert (ok.code, _one_line(ok.out)) == (0, "ok: 1 records, chain and signed manifest verified")
    later = tmp_path / "d2.jsonl"
    assert (
        cli("export", "--db", refund.url, "--out", str(later), "--after", manifest, "--settle", "0").code == 0
    )
    assert cli("verify", "--db", refund.url, str(later), "--after", manifest).code == 0
    target.write_text(target.read_text().replace('"amount": 6000', '"amount": 6100'))
    broken = cli("verify", "--db", refund.url, str(target), "--json")
    assert broken.code == 1
    assert (json.loads(broken.out)["ok"], json.loads(broken.out)["line"]) == (False, 1)
    assert "line 1" in cli("verify", "--db", refund.url, str(target)).out


def test_verify_of_a_missing_file_is_not_found(
    refund: Setup, tmp_path: Path, cli: Callable[..., Run]
) -> None:
    """A missing export file (or --after manifest) is exit 3 with one line, not a broken export."""
    missing = tmp_path / "nosuch.jsonl"
    run = cli("verify", "--db", refund.url, str(missing))
    assert (run.code, run.out) == (3, "")
    assert _one_line(run.err).endswith(f"verify {missing}: no such file")
    present = tmp_path / "present.jsonl"
    present.write_text("")
    run = cli("verify", "--db", refund.url, str(present), "--after", str(tmp_path / "no.manifest.json"))
    assert run.code == 3
    assert "no such file" in _one_line(run.err)


def test_report_counts_a_denied_refund_as_disagreement(refund: Setup, cli: Callable[..., Run]) -> None:
    """`report --json`: the amended refund, denied, is one decided call with a disagreement of
    1.0 under tool refund_order and role finance, mode live; a bad --since is a usage error."""
    assert (
        cli(
            "deny",
            "--db",
            refund.url,
            refund.approval_id,
            "--reason",
            "no",
            "--as",
            "finance",
            "--approver",
            "fiona",
        ).code
        == 0
    )
    run = cli("report", "--db", refund.url, "--json")
    assert run.code == 0, run.err
    data = json.loads(run.out)
    [by_tool], [by_role] = data["by_tool"], data["by_role"]
    assert (by_tool["key"], by_tool["mode"], by_tool["decided"], by_tool["denied"]) == (
        "refund_order",
        "live",
        1,
        1,
    )
    assert by_tool["disagreement"] == 1.0
    assert (by_role["key"], by_role["decided"]) == ("finance", 1)
    assert (
        json.loads(cli("report", "--db", refund.url, "--json", "--since", "2999-01-01").out)["by_tool"] == []
    )
    assert cli("report", "--db", refund.url, "--since", "last tuesday").code == 2
    assert "refund_order" in cli("report", "--db", refund.url).out


def test_replay_says_every_approved_intent_replays_the_same(refund: Setup, cli: Callable[..., Run]) -> None:
    """`replay --app`: the executed refund replays the same against stubs (exit 0, nothing real
    runs); without --app it is a usage error."""
    with open_store(refund.url) as store:
        gate = app(store, keyring=keyring_for(refund.url))
        fiona = Approver("fiona", "finance")
        grant = gate.approve(refund.approval_id, version=refund.version, approver=fiona)
        assert isinstance(grant, Grant)
        gate.execute(grant.token)
        gate.close()
    run = cli("replay", "--db", refund.url, "--app", APP, "--json")
    assert run.code == 0, run.err
    [result] = json.loads(run.out)["results"]
    assert (result["approval_id"], result["verdict"]) == (refund.approval_id, "same")
    assert "1 of 1 approved intents replay the same" in _one_line(
        cli("replay", "--db", refund.url, "--app", APP).out
    )
    assert cli("replay", "--db", refund.url).code == 2


# -- demo


def test_demo_runs_and_reruns_on_its_own_database(tmp_path: Path, cli: Callable[..., Run]) -> None:
    """`demo --db URL` exits 0, and again on the database it made (it starts that one afresh)."""
    url = f"sqlite:///{tmp_path}/demo.db"
    first = cli("demo", "--db", url)
    assert first.code == 0, first.out[-2000:]
    second = cli("demo", "--db", url)
    assert second.code == 0, second.out[-2000:]
    assert "demo failed" not in second.out
    with open_store(url) as store:
        assert len(store.events(kind="demo_started")) == 1  # recreated, not appended to


def test_demo_refuses_a_database_it_did_not_make(refund: Setup, cli: Callable[..., Run]) -> None:
    """`demo` exits 1 rather than delete an existing database it did not create, and leaves it as it was."""
    before = _snapshot(refund.url)
    run = cli("demo", "--db", refund.url)
    assert run.code == 1
    assert "was not made by the demo" in _one_line(run.out)
    assert refund.db.exists()
    assert _snapshot(refund.url) == before


def test_demo_refuses_a_foreign_sqlite_file(tmp_path: Path, cli: Callable[..., Run]) -> None:
    """`demo` exits 1 on a SQLite file that is not an effectgate database, and keeps its bytes."""
    import sqlite3

    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
        conn.execute("INSERT INTO notes VALUES ('keep me')")
    conn.close()
    data = path.read_bytes()
    run = cli("demo", "--db", f"sqlite:///{path}")
    assert run.code == 1
    assert path.read_bytes() == data


# -- the real command


def _subprocess_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EFFECTGATE_")}
    env["COLUMNS"] = "80"
    return env


def test_the_installed_command_approves_and_reports_errors(refund: Setup, tmp_path: Path) -> None:
    """The `effectgate` console script approves in its own process, and exits 4 on a stale version."""
    command = Path(sys.executable).with_name("effectgate")
    argv = [str(command) if command.exists() else sys.executable]
    if not command.exists():
        argv += ["-m", "effectgate.cli"]

    def run(args: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv + args,
            cwd=tmp_path,
            env=_subprocess_env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    stale = run(_approve(refund, version="1"))
    assert stale.returncode == 4
    assert stale.stdout == ""
    assert stale.stderr.startswith("effectgate: error:")
    assert "Traceback" not in stale.stderr

    ok = run(_approve(refund))
    assert ok.returncode == 0, ok.stderr
    shop = Shop()
    with open_store(refund.url) as store, app(store, keyring=keyring_for(refund.url), shop=shop) as gate:
        done = gate.execute(_token(ok.stdout))
    assert done.approval_id == refund.approval_id
    assert shop.receiver.count("refund", order_id="1042") == 1


def test_approve_execute_runs_the_call_once_and_spends_the_token(
    refund: Setup, cli: Callable[..., Run]
) -> None:
    """`approve --execute` runs the grant at once (one execution recorded, the result printed, no
    token); the approval is then executed, and a gate re-running it gets the stored result."""
    run = cli(*_approve(refund), "--execute", "--json")
    assert run.code == 0, run.err
    answer = json.loads(run.out)
    assert "token" not in answer
    assert answer["executed"]["result"]["amount"] == 6000
    assert answer["executed"]["replay"] is False
    with open_store(refund.url) as store:
        [execution] = store.executions(approval_id=refund.approval_id)
        row = store.get_approval(refund.approval_id)
        assert row is not None
        assert row.status == "executed"
        assert execution.version == 2
    again = cli(*_approve(refund), "--execute")
    assert again.code == 4, again.out
    with open_store(refund.url) as store:
        assert len(store.executions(approval_id=refund.approval_id)) == 1


def test_a_keyring_mismatch_is_not_reported_as_tampering(
    refund: Setup, cli: Callable[..., Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record sealed under a key this keyring lacks is a keyring mismatch naming the key, in
    show, pending and approve; not an edit to audit and propose again."""
    kid = keyring_for(refund.url).current
    monkeypatch.setenv("EFFECTGATE_KEYRING", Keyring.generate().dumps())
    show = cli("show", "--db", refund.url, refund.approval_id).out
    [pending] = json.loads(cli("pending", "--db", refund.url, "--json").out)
    for text in (_one_line(show), " ".join(pending["warnings"])):
        assert f"keyring mismatch: the record is sealed with key {kid!r}" in text
        assert "edited outside effectgate" not in text
    run = cli(*_approve(refund, version=str(refund.version)))
    assert run.code == 4
    err = _one_line(run.err)
    assert f"keyring mismatch: the record is sealed with key {kid!r}" in err
    assert "ledger's keyring" in err
    assert "changed outside effectgate" not in err
    assert "propose the call again" not in err
