"""Round 12 review of the effect table and its inputs: each test's docstring tells the defect it
was written against (it failed before its fix), on SQLite and PostgreSQL where a store is
involved."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import (
    Approver,
    Confirmation,
    Effect,
    EffectTable,
    Escalate,
    Grant,
    Invalid,
    Pending,
    Policy,
    Refused,
    ToolSpec,
)
from effectgate.audit import audit
from effectgate.canonical import canonical_json, digest
from effectgate.errors import TableError
from effectgate.examples.shop import context
from effectgate.stores import SQLStore
from effectgate.testing import EffectRecorder

from .conftest import MakeGate, ShopGate

FINANCE = Approver("fiona", "finance")
REFUND = {"order_id": "1042", "amount": 12000, "currency": "GBP"}


def test_a_subject_argument_left_out_names_the_subject_its_default_names(
    store: SQLStore, make_gate: MakeGate
) -> None:
    """A payment's subject is the account it pays from, an argument with a default ("ops"). A
    model that left the account out named no subject at all (`subject_of` read only what was
    given, while the tool ran with the default): the call was keyed by its arguments, its
    `confirm` check saw none of the account's payments, and one payment per account became two
    from the same account. The subject is what the tool runs with, as `role_for`'s rules are."""
    receiver = EffectRecorder()

    def pay(amount: int, account: str = "ops") -> str:
        receiver.record("pay", account=account)
        return "paid"

    def once(args: Any, seen: Confirmation) -> str | None:
        return "already paid from this account" if any(e.in_effect for e in seen.history) else None

    spec = ToolSpec(
        name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance", subject=("account",), confirm=once
    )
    table = EffectTable([spec])
    table.allow_all("support")
    gate = make_gate(table)
    first = gate.call("pay", {"amount": 5, "account": "ops"}, context("m1"))
    assert isinstance(first, Pending)
    grant = gate.approve(first.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    gate.execute(grant.token)
    again = gate.call("pay", {"amount": 7}, context("m2"))  # the same account, by its default
    if isinstance(again, Pending):
        second = gate.approve(again.approval_id, version=1, approver=FINANCE)
        if isinstance(second, Grant):
            gate.execute(second.token)
    assert receiver.count("pay") == 1
    assert isinstance(again, Refused)


def test_an_amount_in_text_just_above_a_decimal_limit_escalates() -> None:
    """`Escalate.above("amount", 999.99)` on an amount given as text (pydantic's Decimal, a
    token with 18 decimals): "999.990000000000001" is above the limit as written, but was
    compared with the float's binary value (999.990000000000009094...), so it kept the lower
    role. The limit is the number its text says, as `multipleOf` reads it."""

    def pay(amount: Decimal) -> str:
        return "paid"

    spec = ToolSpec(
        name="pay",
        effect=Effect.MONEY,
        fn=pay,
        approver_role="finance",
        escalate=(Escalate.above("amount", 999.99, role="cfo"),),
    )
    assert spec.role_for({"amount": "999.990000000000001"})[0] == "cfo"
    assert spec.role_for({"amount": "999.99"})[0] == "finance"


def test_a_policy_refuses_self_approval_given_as_text(store: SQLStore, make_gate: MakeGate) -> None:
    """`Policy(self_approval="false")` (a setting read from the environment or a config file as
    text) was taken as true: the user who made a payment could approve it, and it ran. A row's
    flags are refused unless they are booleans; so is the policy's."""
    receiver = EffectRecorder()

    def pay(account: str, amount: int) -> str:
        receiver.record("pay", account=account)
        return "paid"

    table = EffectTable([ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance")])
    table.allow_all("support")

    def self_approved(setting: Any) -> None:
        gate = make_gate(table, policy=Policy(self_approval=setting))
        out = gate.call("pay", {"account": "a1", "amount": 5}, context("m1", user_id="fiona"))
        assert isinstance(out, Pending)
        grant = gate.approve(out.approval_id, version=1, approver=FINANCE)  # fiona approves her own
        assert isinstance(grant, Grant)
        gate.execute(grant.token)

    with pytest.raises(ValueError, match="self_approval"):
        self_approved("false")
    assert receiver.count("pay") == 0


@pytest.mark.xfail(
    strict=True,
    reason="the fast validator (fastjsonschema) checks multipleOf inexactly at these extremes (a whole "
    "step divides binary floats, a fractional one rounds to 28 digits); sending every multipleOf "
    "schema to the full validator fixed it but cost +32 us per call of such a row (15 -> 47 us for a "
    "shop-like refund schema, measured), the common money amount: an exact check beside the fast "
    "validator is the fix to make",
)
@pytest.mark.parametrize(("step", "quantity"), [(3, 1e17), (3, 5e-324), (0.03, 1e30)])
def test_a_number_that_is_no_multiple_of_the_step_is_invalid(
    make_gate: MakeGate, store: SQLStore, step: float, quantity: float
) -> None:
    """`multipleOf` on a number: the fast validator divides binary floats when the step is a
    whole number (1e17 / 3 rounds to a whole float, 5e-324 / 3 to 0.0) and rounds its Decimal
    quotient to 28 digits for a fractional one (1e30 / 0.03), so it passed them, which the full
    validator refuses (1e17 is no multiple of 3, as its JSON says): the README promises
    `multipleOf` exact under either validator, and the tool ran with them."""
    receiver = EffectRecorder()

    def order(quantity: float) -> str:
        receiver.record("order", quantity=quantity)
        return "ordered"

    schema = {
        "type": "object",
        "properties": {"quantity": {"type": "number", "multipleOf": step}},
        "required": ["quantity"],
        "additionalProperties": False,
    }
    table = EffectTable([ToolSpec(name="order", effect=Effect.WRITE, fn=order, schema=schema)])
    table.allow_all("support")
    gate = make_gate(table)
    out = gate.call("order", {"quantity": quantity}, context("m1"))
    assert receiver.count("order") == 0
    assert isinstance(out, Invalid)
    assert gate.call("order", {"quantity": step * 1000}, context("m2")) is not None
    assert receiver.count("order") == 1


@pytest.mark.parametrize("nested", ["[" * 3000 + "]" * 3000, "{a=" * 3000 + "1" + "}" * 3000])
def test_a_toml_table_nested_without_end_is_a_table_error(nested: str) -> None:
    """A TOML file whose value nests thousands of arrays or inline tables deep crashed
    `EffectTable.from_toml` with a bare RecursionError (tomllib recurses into each), where every
    other file that is not a table is a `TableError` naming the TOML."""

    def f(x: int = 0) -> int:
        return x

    with pytest.raises(TableError, match="nests too deeply"):
        EffectTable.from_toml(f'[tools.f]\neffect = "read"\nschema = {nested}\n', {"f": f})


def test_an_inserted_table_row_with_a_limit_that_is_no_number_does_not_crash_the_audit(
    shop_gate: ShopGate, store: SQLStore
) -> None:
    """Someone with write access to the database inserts a table row (content-addressed: its
    fingerprint is its digest) whose escalation limit is text ("above": "12000"), and points a
    refund's approval at it. The audit checked a recorded row's rules with no arguments (no
    comparison ran), took it for a table row, then compared the refund's amount with the text:
    a TypeError out of the audit, so the ledger of an attacker's edits could not be audited at
    all. A rule the gate never writes makes the row not a table row (`rule_missing`)."""
    _, gate = shop_gate
    out = gate.call("refund_order", REFUND, context("m1"))
    assert isinstance(out, Pending)
    body = gate.table["refund_order"].canonical()
    body["escalate"] = [{**rule, "above": str(rule["above"])} for rule in body["escalate"]]
    forged = digest(body)
    with store.engine.begin() as conn:
        conn.execute(
            sa.text("INSERT INTO eg_rules (fingerprint, kind, body_json, at) VALUES (:f, 'row', :b, 0)"),
            {"f": forged, "b": canonical_json(body).decode()},
        )
        conn.execute(sa.text("UPDATE eg_approvals SET row_fingerprint = :f"), {"f": forged})
    findings = audit(store, keyring=gate.keyring).findings
    assert findings
    assert "rule_missing" in {f.kind for f in findings}
