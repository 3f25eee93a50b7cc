"""The audit checks every execution against the recorded table row it names, and never lets a
shadow call run. Each test runs on SQLite and PostgreSQL (`store`) but the CLI one (SQLite, with
the key file beside the database).

Rows are written behind the gate's back (`Store.append_execution`), as an attacker with database
access would: an execution with no approval is checked by the row it names, not by its own
`effect` column, and a call proposed in shadow mode is a finding whenever anything of it ran.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from effectgate import (
    Approver,
    EffectGate,
    Executed,
    Grant,
    Keyring,
    Pending,
    Recorded,
    Refused,
    open_store,
)
from effectgate.audit import audit
from effectgate.canonical import canonical_text, hash_of_text
from effectgate.cli import keyring_for, main
from effectgate.examples.shop import SHOP_POLICY, Shop, app, context
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from .conftest import ShopGate
from .test_redact import refund

FINANCE = Approver("fiona", "finance")
LARGE_REFUND = {"order_id": "2001", "amount": 50000, "currency": "GBP"}


def _execution(gate: EffectGate, tool: str, args: dict[str, Any], **values: Any) -> None:
    """Append a succeeded execution of `tool` with `args`, as SQL would; `values` override its
    columns (by default: no approval, the tool's current row and the gate's policy)."""
    text = canonical_text(args)
    row: dict[str, Any] = {
        "approval_id": None,
        "version": None,
        "tool": tool,
        "effect": "write",
        "args_hash": hash_of_text(tool, text),
        "args_json": text,
        # the key the gate runs an approval's version under (`exec_key`): a forger writes it too
        "idempotency_key": f"eg_{values.get('approval_id')}_v{values.get('version')}",
        "status": "succeeded",
        "session_id": "s-ada",
        "origin_message_id": "m-forged",
        "user_id": "u1",
        "agent_id": "support",
        "run_id": "run-1",
        "table_fingerprint": gate.table.fingerprint,
        "row_fingerprint": gate.table[tool].fingerprint,
        "policy_fingerprint": gate.policy.fingerprint,
        "result_json": '{"refund": "re_forged"}',
        **values,
    }
    with gate.store.transaction() as conn:
        gate.store.append_execution(conn, **row)


def _kinds(gate: EffectGate, *, table: bool = False) -> list[str]:
    report = audit(gate.store, gate.table if table else None, keyring=gate.keyring)
    return sorted(f.kind for f in report.findings)


def test_an_ungated_execution_naming_a_money_row_is_no_approval(shop_gate: ShopGate) -> None:
    """The review's repro: an execution of refund_order marked `write`, with no approval, naming
    the real money row, is `no_approval` (the row is gated) and `reclassified` (the row says
    money), with the table and without it (as `effectgate audit` and the export run it)."""
    gate = shop_gate.gate
    refund(gate, "m1", "1042", 1200)
    assert audit(gate.store, keyring=gate.keyring).clean
    _execution(gate, "refund_order", LARGE_REFUND)
    assert _kinds(gate) == ["no_approval", "reclassified"]
    assert _kinds(gate, table=True) == ["no_approval", "reclassified"]
    report = audit(gate.store, keyring=gate.keyring).to_dict()
    assert [f["kind"] for f in report["findings"]] == ["reclassified", "no_approval"]
    assert "says money" in report["findings"][0]["detail"]


def test_an_execution_naming_an_unrecorded_row_is_rule_missing(shop_gate: ShopGate) -> None:
    """An execution whose row fingerprint names no recorded rule cannot show it was allowed:
    `rule_missing`, and it is held to an approval it does not have (`no_approval`)."""
    gate = shop_gate.gate
    refund(gate, "m1", "1042", 1200)
    _execution(gate, "refund_order", LARGE_REFUND, row_fingerprint="0" * 64)
    assert _kinds(gate) == ["no_approval", "rule_missing"]


def test_an_execution_naming_another_tools_row_is_rule_missing(shop_gate: ShopGate) -> None:
    """A refund naming the recorded row of a write tool (update_ticket_tags) does not borrow
    that row's effect: the row is not refund_order's, so `rule_missing` and `no_approval`."""
    gate = shop_gate.gate
    tags = {"ticket_id": "t-17", "tags": ["refund"]}
    assert isinstance(gate.call("update_ticket_tags", tags, context("m1")), Executed)
    assert audit(gate.store, keyring=gate.keyring).clean
    _execution(
        gate, "refund_order", LARGE_REFUND, row_fingerprint=gate.table["update_ticket_tags"].fingerprint
    )
    report = audit(gate.store, keyring=gate.keyring)
    assert sorted(f.kind for f in report.findings) == ["no_approval", "rule_missing"]
    assert any("the row of update_ticket_tags" in f.detail for f in report.findings)


def test_a_gated_execution_recorded_under_another_effect_is_reclassified(shop_gate: ShopGate) -> None:
    """An approved refund whose execution row says `write` (the class retention rules read) is
    `reclassified`: its approval's row says money."""
    gate = shop_gate.gate
    args = {"order_id": "1042", "amount": 1200, "currency": "GBP"}
    pending = gate.call("refund_order", args, context("m1"))
    assert isinstance(pending, Pending)
    assert isinstance(gate.approve(pending.approval_id, version=1, approver=FINANCE), Grant)
    _execution(gate, "refund_order", args, approval_id=pending.approval_id, version=1, effect="write")
    assert _kinds(gate) == ["reclassified"]


def _shadow_gate(store: SQLStore, clock: FakeClock, shop: Shop, keyring: Keyring | None = None) -> EffectGate:
    table = shop.table().shadowed(["refund_order"])
    return EffectGate(table, store, policy=SHOP_POLICY, clock=clock, keyring=keyring or Keyring.generate())


def test_an_execution_of_an_approved_shadow_call_is_shadow_executed(
    store: SQLStore, clock: FakeClock
) -> None:
    """A shadow call never runs: an execution attached to its approval (approved, as reviewers
    decide shadow calls) is `shadow_executed`, with the shadow table and without a table."""
    shop = Shop()
    with _shadow_gate(store, clock, shop) as gate:
        out = gate.call(
            "refund_order", {"order_id": "1042", "amount": 1200, "currency": "GBP"}, context("m1")
        )
        assert isinstance(out, Refused)
        assert out.approval_id is not None
        assert isinstance(gate.approve(out.approval_id, version=1, approver=FINANCE), Recorded)
        assert audit(store, gate.table, keyring=gate.keyring).clean
        args = {"order_id": "1042", "amount": 1200, "currency": "GBP"}
        _execution(gate, "refund_order", args, approval_id=out.approval_id, version=1, effect="money")
        assert _kinds(gate) == ["shadow_executed"]
        assert _kinds(gate, table=True) == ["shadow_executed"]


def test_an_ungated_execution_naming_a_shadow_row_is_shadow_executed(
    store: SQLStore, clock: FakeClock
) -> None:
    """An execution with no approval that names a shadow row ran what may never run:
    `shadow_executed`, and `no_approval` (a shadow row is a gated row)."""
    shop = Shop()
    with _shadow_gate(store, clock, shop) as gate:
        out = gate.call(
            "refund_order", {"order_id": "1042", "amount": 1200, "currency": "GBP"}, context("m1")
        )
        assert isinstance(out, Refused)
        _execution(gate, "refund_order", LARGE_REFUND, effect="money")
        assert _kinds(gate) == ["no_approval", "shadow_executed"]


def test_a_ledger_from_normal_use_stays_clean(store: SQLStore, clock: FakeClock) -> None:
    """Reads, writes, approved refunds and a shadow call decided, switched to live and run:
    every execution names its recorded row, of its effect, and the audit stays clean."""
    shop, keyring = Shop(), Keyring.generate()
    with app(store, clock=clock, shop=shop, keyring=keyring) as gate:
        assert isinstance(gate.call("get_order", {"order_id": "1042"}, context("m0")), Executed)
        tags = {"ticket_id": "t-17", "tags": ["refund"]}
        assert isinstance(gate.call("update_ticket_tags", tags, context("m1")), Executed)
        refund(gate, "m2", "1042", 1200)
    with _shadow_gate(store, clock, shop, keyring) as shadow:
        out = shadow.call(
            "refund_order", {"order_id": "1042", "amount": 300, "currency": "GBP"}, context("m3")
        )
        assert isinstance(out, Refused)
        assert out.approval_id is not None
        assert isinstance(shadow.approve(out.approval_id, version=1, approver=FINANCE), Recorded)
    with app(store, clock=clock, shop=shop, keyring=keyring) as gate:
        refund(gate, "m4", "1042", 300)
        gate.flush()
        assert audit(store, keyring=gate.keyring, chain=True).clean
        assert audit(store, gate.table, keyring=gate.keyring).clean


def test_the_cli_reports_the_new_kinds_as_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`effectgate audit --json` lists `no_approval` and `reclassified` for the forged ungated
    refund, and `shadow_executed` for a run shadow call, and exits 1."""
    url = f"sqlite:///{tmp_path}/shop.db"
    with open_store(url) as store:
        store.setup()
        shop = Shop()
        keyring = keyring_for(url)
        with app(store, keyring=keyring, shop=shop) as gate:
            refund(gate, "m1", "1042", 1200)
            _execution(gate, "refund_order", LARGE_REFUND)
        table = shop.table().shadowed(["refund_order"])
        with EffectGate(table, store, policy=SHOP_POLICY, keyring=keyring) as shadow:
            args = {"order_id": "1042", "amount": 300, "currency": "GBP"}
            out = shadow.call("refund_order", args, context("m2"))
            assert isinstance(out, Refused)
            assert out.approval_id is not None
            assert isinstance(shadow.approve(out.approval_id, version=1, approver=FINANCE), Recorded)
            _execution(shadow, "refund_order", args, approval_id=out.approval_id, version=1, effect="money")
    capsys.readouterr()
    assert main(["audit", "--db", url, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["clean"] is False
    assert sorted(f["kind"] for f in report["findings"]) == ["no_approval", "reclassified", "shadow_executed"]
