"""Round 4 review of the report and the sandbox replay: what a replay calls outside its sandbox,
what the report and the replay make of stored rows that do not verify or hold another type (a
report or replay that fails on one row reports nothing), how the page is written, and which days
the charts label. On SQLite and PostgreSQL."""

from __future__ import annotations

import errno
import json
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import Approver, Effect, EffectGate, EffectTable, Executed, Grant, Keyring, Pending, ToolSpec
from effectgate.canonical import hash_of_text
from effectgate.examples.shop import SHOP_POLICY, Shop, context
from effectgate.replay import replay
from effectgate.report import Figures, Metrics, figures, render_html
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

FINANCE = Approver("fiona", "finance")


def _run(gate: EffectGate, tool: str, args: dict[str, Any], message: str) -> str:
    out = gate.call(tool, args, context(message))
    assert isinstance(out, Pending), out
    grant = gate.approve(out.approval_id, version=out.version, approver=FINANCE)
    assert isinstance(grant, Grant)
    assert isinstance(gate.execute(grant.token), Executed)
    return out.approval_id


def test_replay_never_calls_the_real_snapshot(store: SQLStore, clock: FakeClock) -> None:
    """A row's `snapshot` reads the real system before and after the tool runs (the files tools
    read the real file). Replay promises that nothing real is called: the recorded payment
    replays `same` without the real tool or its snapshot being called once."""
    calls = {"pay": 0, "snapshot": 0}

    def pay(account: str, amount: int) -> dict[str, Any]:
        calls["pay"] += 1
        return {"paid": amount}

    def balance_of(args: Mapping[str, Any]) -> dict[str, Any]:
        calls["snapshot"] += 1
        return {"account": args["account"]}

    table = EffectTable(
        [ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance", snapshot=balance_of)]
    )
    table.allow(context("m").agent_id, ["pay"])
    with EffectGate(table, store, keyring=Keyring.generate(), clock=clock) as gate:
        _run(gate, "pay", {"account": "a1", "amount": 5}, "m1")
    assert calls == {"pay": 1, "snapshot": 2}
    report = replay(store, table)
    assert [r.verdict for r in report.results] == ["same"]
    assert calls == {"pay": 1, "snapshot": 2}  # nothing real ran in the sandbox


def test_a_forged_redaction_marker_is_refused_not_listed_as_erased(store: SQLStore, clock: FakeClock) -> None:
    """The append-only triggers let anyone with write access overwrite an approval's arguments
    with a redaction marker. A marker no sealed redaction entry backs hides nothing from replay:
    the approval is reported `refused` (tampered), not listed as erased in a clean report."""
    shop, keyring = Shop(), Keyring.generate()
    with EffectGate(shop.table(), store, policy=SHOP_POLICY, keyring=keyring, clock=clock) as gate:
        forged = _run(gate, "refund_order", {"order_id": "1042", "amount": 1200, "currency": "GBP"}, "m1")
        kept = _run(gate, "refund_order", {"order_id": "1043", "amount": 500, "currency": "GBP"}, "m2")
    with store.transaction() as conn:
        conn.execute(
            sa.text("UPDATE eg_approvals SET args_json = :m WHERE id = :i"),
            {"m": '{"$redacted": "r-nobody"}', "i": forged},
        )
    report = replay(store, shop.table(), SHOP_POLICY, keyring=keyring)
    assert report.redacted == ()
    found = {r.approval_id: (r.verdict, r.detail) for r in report.results}
    assert found[kept] == ("same", "")
    assert found[forged][0] == "refused"
    assert found[forged][1].startswith("tampered")
    assert not report.clean


def test_stored_arguments_that_are_not_json_are_refused_not_a_crash(
    store: SQLStore, clock: FakeClock
) -> None:
    """Without a keyring the args hash is a plain sha256 anyone with write access can recompute:
    arguments edited into text that is not JSON, with the hash recomputed over that text, are
    reported `refused` (tampered), and the other intent still replays; no JSONDecodeError."""
    shop = Shop()
    with EffectGate(shop.table(), store, policy=SHOP_POLICY, keyring=Keyring.generate(), clock=clock) as gate:
        edited = _run(gate, "refund_order", {"order_id": "1042", "amount": 1200, "currency": "GBP"}, "m1")
        kept = _run(gate, "refund_order", {"order_id": "1043", "amount": 500, "currency": "GBP"}, "m2")
    text = '{"order_id": "1042", "amount": 12'
    with store.transaction() as conn:
        conn.execute(
            sa.text("UPDATE eg_approvals SET args_json = :t, args_hash = :h WHERE id = :i"),
            {"t": text, "h": hash_of_text("refund_order", text), "i": edited},
        )
    found = {r.approval_id: (r.verdict, r.detail) for r in replay(store, shop.table(), SHOP_POLICY).results}
    assert found[kept] == ("same", "")
    assert found[edited][0] == "refused"
    assert found[edited][1].startswith("tampered")


@pytest.mark.parametrize("column", ["tool", "approver_role"])
def test_a_blob_edited_into_an_approval_is_reported_not_a_crash(
    store: SQLStore, clock: FakeClock, column: str
) -> None:
    """SQLite keeps what an UPDATE stores: a blob edited into one approval's tool or role (the
    owner of the file) made every report fail on comparing bytes with text. The report is drawn,
    the approval counted under mode "unverified" (its seal covers both columns), the others as
    they were."""
    if store.engine.dialect.name != "sqlite":
        pytest.skip("PostgreSQL refuses a value of another type")
    shop, keyring = Shop(), Keyring.generate()
    with EffectGate(shop.table(), store, policy=SHOP_POLICY, keyring=keyring, clock=clock) as gate:
        edited = _run(gate, "refund_order", {"order_id": "1042", "amount": 1200, "currency": "GBP"}, "m1")
        _run(gate, "refund_order", {"order_id": "1043", "amount": 500, "currency": "GBP"}, "m2")
    with store.transaction() as conn:
        conn.execute(sa.text(f"UPDATE eg_approvals SET {column} = X'41' WHERE id = :i"), {"i": edited})
    report = figures(store, keyring=keyring)
    assert report.unverified == 1
    assert {(r.key, r.mode, r.decided) for r in report.by_tool} == {
        ("refund_order", "live", 1),
        ("b'A'" if column == "tool" else "refund_order", "unverified", 1),
    }
    json.dumps(report.to_dict())
    page = render_html(report)
    assert page.count("<svg") == 5


@pytest.mark.parametrize(
    ("edit", "sealed", "verdict"),
    [
        ("args_json = X'41'", True, "refused"),  # not sealed: the hash check meets bytes
        ("created_at = 'abc'", True, "same"),  # not sealed, not replayed: only the order reads it
        ("tool = X'41'", False, "refused"),
        ("session_id = X'41'", False, "refused"),
    ],
)
def test_an_approval_edited_to_another_type_is_refused_not_a_crash(
    store: SQLStore, clock: FakeClock, edit: str, sealed: bool, verdict: str
) -> None:
    """SQLite keeps what an UPDATE stores: a blob or text edited into one approval's column made
    replay raise (TypeError, ValueError) instead of reporting it; every other intent still replays."""
    if store.engine.dialect.name != "sqlite":
        pytest.skip("PostgreSQL refuses a value of another type")
    shop, keyring = Shop(), Keyring.generate()
    with EffectGate(shop.table(), store, policy=SHOP_POLICY, keyring=keyring, clock=clock) as gate:
        edited = _run(gate, "refund_order", {"order_id": "1042", "amount": 1200, "currency": "GBP"}, "m1")
        kept = _run(gate, "refund_order", {"order_id": "1043", "amount": 500, "currency": "GBP"}, "m2")
    with store.transaction() as conn:
        conn.execute(sa.text(f"UPDATE eg_approvals SET {edit} WHERE id = :i"), {"i": edited})
    report = replay(store, shop.table(), SHOP_POLICY, keyring=keyring if sealed else None)
    found = {r.approval_id: (r.verdict, r.detail) for r in report.results}
    assert found[kept] == ("same", "")
    assert found[edited][0] == verdict
    assert verdict == "same" or found[edited][1].startswith("tampered")
    json.dumps(report.to_dict())


_FULL_DISK = """
import resource, signal, sys
from effectgate.report import _charts, write_html
from effectgate.report._figures import Figures, Metrics

metrics = Metrics(
    None, None, {}, {}, proposals=0, replays_absorbed=0, gated_by_day=[], needs_reconciliation=0
)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit a write fails (EFBIG), as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
try:
    write_html(Figures(None, None, [], [], metrics), sys.argv[1])
except OSError as exc:
    print(exc.errno)
"""


def test_a_report_that_cannot_be_written_whole_leaves_the_previous_one(tmp_path: Path) -> None:
    """`write_html` over last week's report, on a disk that fills up part way: the write fails
    (OSError, which the CLI reports), and last week's report is still there whole, not replaced by
    the first 4 KiB of the new page; no partial file is left beside it."""
    page = tmp_path / "report.html"
    page.write_text("<!doctype html><p>last week</p>\n", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-c", _FULL_DISK, str(page)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.stdout.strip() == str(errno.EFBIG), done.stderr
    assert page.read_text(encoding="utf-8") == "<!doctype html><p>last week</p>\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]


def test_a_decision_that_names_no_approver_is_not_one_and_replay_goes_on(
    store: SQLStore, clock: FakeClock
) -> None:
    """The decisions are append-only, not closed to an INSERT: a decision row appended with an
    empty approver id (which no Approver can hold) made replay raise ValueError before anything
    was replayed. Without the keyring it is no recorded approver; the intents replay `same`."""
    shop = Shop()
    with EffectGate(shop.table(), store, policy=SHOP_POLICY, keyring=Keyring.generate(), clock=clock) as gate:
        ids = [
            _run(gate, "refund_order", {"order_id": "1042", "amount": 1200, "currency": "GBP"}, "m1"),
            _run(gate, "refund_order", {"order_id": "1043", "amount": 500, "currency": "GBP"}, "m2"),
        ]
    with store.transaction() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO eg_decisions (approval_id, version, grant_round, approver_id, role, decision, "
                "at, seal) VALUES (:i, 1, 0, '', 'finance', 'approve', 0, '')"
            ),
            {"i": ids[0]},
        )
    report = replay(store, shop.table(), SHOP_POLICY)
    assert {r.approval_id: r.verdict for r in report.results} == dict.fromkeys(ids, "same")


def test_chart_days_are_utc_days_whatever_matplotlibs_timezone() -> None:
    """The per-day figures are UTC days. matplotlib formats dates in its `timezone` setting (a
    team's matplotlibrc may set one): in Auckland (UTC+13 in December), the backlog of 2026-12-05
    was drawn under the label 2026-12-06. The charts label the UTC day, as the tables do."""
    import matplotlib as mpl

    metrics = Metrics(
        None, None, {}, {}, proposals=0, replays_absorbed=0, gated_by_day=[], needs_reconciliation=2
    )
    metrics.backlog_by_day = [("2026-12-05", 2)]
    with mpl.rc_context({"timezone": "Pacific/Auckland"}):
        page = render_html(Figures(None, None, [], [], metrics, unverified=0))
    [chart] = re.findall(r'<figure data-chart="backlog">(.*?)</figure>', page, flags=re.DOTALL)
    assert re.findall(r">(\d{4}-\d\d-\d\d)</text>", chart) == ["2026-12-05"]


def test_an_appended_amendment_nested_past_the_parser_is_no_edit_not_a_crash(
    store: SQLStore, clock: FakeClock
) -> None:
    """The event log is append-only, not closed to an INSERT: an "amended" event whose detail is
    JSON nested deeper than Python's parser goes (RecursionError, not ValueError) made the report
    fail whenever a seal did not verify (the edits are read then). It is no reviewer's edit (the
    database's JSON functions read it as none either); the broken approval counts as unverified."""
    shop, keyring = Shop(), Keyring.generate()
    with EffectGate(shop.table(), store, policy=SHOP_POLICY, keyring=keyring, clock=clock) as gate:
        edited = _run(gate, "refund_order", {"order_id": "1042", "amount": 1200, "currency": "GBP"}, "m1")
        _run(gate, "refund_order", {"order_id": "1043", "amount": 500, "currency": "GBP"}, "m2")
    deep = "[" * 100_000 + "]" * 100_000
    with store.transaction() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO eg_events (at, kind, approval_id, detail_json) VALUES (0, 'amended', :i, :d)"
            ),
            {"i": edited, "d": deep},
        )
        conn.execute(sa.text("UPDATE eg_approvals SET subject_key = 'x' WHERE id = :i"), {"i": edited})
    report = figures(store, keyring=keyring)
    assert report.unverified == 1
    assert {(r.key, r.mode, r.decided, r.edited) for r in report.by_tool} == {
        ("refund_order", "live", 1, 0),
        ("refund_order", "unverified", 1, 0),
    }


def test_an_appended_rule_nested_past_the_parser_is_no_rule_not_a_crash(
    store: SQLStore, clock: FakeClock
) -> None:
    """The recorded rules are append-only, not closed to an INSERT: a rule row whose body is JSON
    nested deeper than Python's parser goes made every report and every replay fail with
    RecursionError. It is no rule (no body that hashes to its fingerprint): the figures and the
    replay go on as before."""
    shop, keyring = Shop(), Keyring.generate()
    with EffectGate(shop.table(), store, policy=SHOP_POLICY, keyring=keyring, clock=clock) as gate:
        ran = _run(gate, "refund_order", {"order_id": "1042", "amount": 1200, "currency": "GBP"}, "m1")
    with store.transaction() as conn:
        conn.execute(
            sa.text("INSERT INTO eg_rules (fingerprint, kind, body_json, at) VALUES ('deep', 'row', :d, 0)"),
            {"d": "[" * 100_000 + "]" * 100_000},
        )
    report = figures(store, keyring=keyring)
    assert {(r.key, r.mode, r.decided) for r in report.by_tool} == {("refund_order", "live", 1)}
    assert [(r.approval_id, r.verdict) for r in replay(store, shop.table(), SHOP_POLICY).results] == [
        (ran, "same")
    ]
