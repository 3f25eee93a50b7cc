"""Bad input, second round: each test failed before its fix. A non-text denial reason or a
non-bool `happened` is refused and changes nothing; `gate.note` keeps its keywords as detail; an
edited expiry (SQLite text) makes its row undecidable without stopping other calls; an edited
stored result is a clear error naming its record (never returned as the result); the CLI's JSON is
standard; the report reads past an edited amendment; a read row that needs a ToolContext is refused
when built; a row registered after the gate was built is checked against the gate's policy."""

from __future__ import annotations

import json
from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import (
    Effect,
    EffectTable,
    Executed,
    Grant,
    Pending,
    Policy,
    ToolContext,
    ToolSpec,
)
from effectgate.errors import ApprovalError, NeedsReconciliation, StoreError, TableError
from effectgate.examples.shop import context
from effectgate.stores import SQLStore

from ._bank import FINANCE, Tags
from .conftest import MakeGate, ShopGate

REFUND = {"order_id": "1042", "amount": 1200, "currency": "GBP"}


def _pending_refund(shop_gate: ShopGate, message: str = "m1") -> Pending:
    pending = shop_gate.gate.call("refund_order", REFUND, context(message))
    assert isinstance(pending, Pending), pending
    return pending


def _edit_result(store: SQLStore, key: object, text: str) -> None:
    """Overwrite a record's stored result, as someone with database access could."""
    with store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE eg_idempotency SET result_json = :v WHERE key = :k"), {"v": text, "k": key}
        )


# -- 1. deny / settle with values of the wrong type


def test_a_denial_reason_that_is_not_text_is_refused_and_changes_nothing(shop_gate: ShopGate) -> None:
    """`reason.strip()` on 123 raised a raw AttributeError; now a TypeError, the row still pending."""
    gate = shop_gate.gate
    pending = _pending_refund(shop_gate)
    with pytest.raises(TypeError, match="reason"):
        gate.deny(pending.approval_id, approver=FINANCE, reason=123)  # type: ignore[arg-type]
    assert gate.card(pending.approval_id).status == "pending"
    assert not gate.store.events(kind="denied")


def test_settle_refuses_a_happened_that_is_not_a_bool(store: SQLStore, make_gate: MakeGate) -> None:
    """happened="false" is truthy: the write whose outcome is unknown was settled as having
    happened (its record succeeded with no result). Now a TypeError, and nothing changes."""
    tags = Tags()
    gate = make_gate(tags.table())
    tags.lose_reply = 1
    with pytest.raises(NeedsReconciliation) as raised:
        gate.call("tag", {"ticket_id": "t-17", "tags": ["urgent"]}, context("m1"))
    key = raised.value.key
    with pytest.raises(TypeError, match="happened"):
        gate.settle(key, happened="false", by="ops")  # type: ignore[arg-type]
    record = store.get(key)
    assert record is not None
    assert record.status == "needs_reconciliation"
    assert [x.status for x in store.executions(tool="tag")] == ["needs_reconciliation"]
    assert not store.events(kind="reconciled")


# -- 2. gate.note keeps its keywords as detail


@pytest.mark.parametrize("field", ["tool", "row", "spec", "args_hash_"])
def test_note_keeps_every_keyword_as_detail(shop_gate: ShopGate, field: str) -> None:
    """`tool=`, `row=`, `spec=`, `args_hash_=` were taken by `Events.event` as the event's own
    fields (and `row="x"` crashed): an application's detail is detail."""
    gate = shop_gate.gate
    gate.note("app_event", **{field: "x"}, other=1)
    [event] = gate.store.events(kind="app_event")
    assert json.loads(event.detail_json or "{}") == {field: "x", "other": 1}
    assert event.tool is None
    assert event.args_hash is None


def test_note_still_takes_the_call_context(shop_gate: ShopGate) -> None:
    """The LangGraph adapter passes `ctx=` on purpose: the event carries the call's session."""
    gate = shop_gate.gate
    gate.note("app_event", ctx=context("m9"), shown=[1])
    [event] = gate.store.events(kind="app_event")
    assert event.session_id == "s-ada"
    assert event.origin_message_id == "m9"
    assert json.loads(event.detail_json or "{}") == {"shown": [1]}


# -- 3. an expiry edited to text (SQLite stores what it is given)


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_an_expiry_edited_to_text_decides_nothing_and_stops_no_other_call(
    shop_gate: ShopGate, store: SQLStore
) -> None:
    """Text edited into the deadline column once made the row undecidable (it read as lapsed).
    Since round 29 the deadline is derived from the version's proposal event and the policy
    (`_deadline`): the column decides nothing, the refund is granted and runs once, and other
    calls of the session still route."""
    gate = shop_gate.gate
    pending = _pending_refund(shop_gate)
    with store.engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE eg_approvals SET expires_at = 'tomorrow' WHERE id = ?", (pending.approval_id,)
        )
    grant = gate.approve(pending.approval_id, version=pending.version, approver=FINANCE)
    assert isinstance(grant, Grant), grant
    assert isinstance(gate.execute(grant.token), Executed)
    [row] = [r for r in store.approvals() if r.id == pending.approval_id]
    assert row.status == "executed"
    assert shop_gate.shop.receiver.count("refund") == 1
    other = gate.call("refund_order", {**REFUND, "amount": 900}, context("m2"))
    assert isinstance(other, Pending), other
    tags = gate.call("update_ticket_tags", {"ticket_id": "t-17", "tags": ["x"]}, context("m3"))
    assert isinstance(tags, Executed), tags


# -- 4. a stored result edited to text that is not JSON


def test_an_edited_result_is_a_clear_error_naming_its_record(shop_gate: ShopGate, store: SQLStore) -> None:
    """`gate.result` and a replay raised a raw JSON error; now a StoreError naming the record. A
    replay never returns the edited text as the result, and never runs the tool again."""
    gate = shop_gate.gate
    args = {"ticket_id": "t-17", "tags": ["billing"]}
    done = gate.call("update_ticket_tags", args, context("m1"))
    assert isinstance(done, Executed)
    key = done.idempotency_key
    ran = shop_gate.shop.receiver.count()
    _edit_result(store, key, "forged, not JSON")
    with pytest.raises(StoreError, match=str(key)):
        gate.call("update_ticket_tags", args, context("m1"))
    assert shop_gate.shop.receiver.count() == ran
    with pytest.raises(StoreError, match=str(key)):
        store.get(str(key))


def test_result_of_an_approval_whose_result_was_edited_names_the_record(
    shop_gate: ShopGate, store: SQLStore
) -> None:
    gate = shop_gate.gate
    pending = _pending_refund(shop_gate)
    grant = gate.approve(pending.approval_id, version=pending.version, approver=FINANCE)
    done = gate.execute(grant.token)  # type: ignore[union-attr]
    _edit_result(store, done.idempotency_key, "{nope")
    with pytest.raises(StoreError, match=str(done.idempotency_key)):
        gate.result(pending.approval_id)


# -- 5. the CLI's --json output is standard JSON


def test_write_json_prints_standard_json_for_an_infinite_expiry(capsys: pytest.CaptureFixture[str]) -> None:
    from effectgate.cli._render import _write_json

    _write_json({"expires_at": float("inf"), "low": float("-inf"), "nan": float("nan")})
    out = capsys.readouterr().out
    json.loads(out, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))


# -- 6. the report past an edited amendment


@pytest.mark.parametrize("detail", ["{not json", "[1]", "7"])
def test_the_report_reads_past_an_edited_amendment(shop_gate: ShopGate, store: SQLStore, detail: str) -> None:
    from effectgate.report import edited_approvals

    pending = _pending_refund(shop_gate)
    with store.transaction() as conn:  # an amendment whose detail was written by hand
        store.append_events(
            conn, [{"at": 1.0, "kind": "amended", "approval_id": pending.approval_id, "detail_json": detail}]
        )
    assert edited_approvals(store) == set()
    with store.reading() as conn:
        rows = store.report_rows(conn, "decisions")
    assert sum(r[-1] for r in rows) == 1
    assert all(r[4] == 0 for r in rows)


# -- 8. a read row that needs a ToolContext


def test_a_read_row_that_requires_a_tool_context_is_refused_when_built() -> None:
    """Reads get no ToolContext (no idempotency key): every call failed with a raw TypeError."""

    def lookup(order_id: str, tool_context: ToolContext) -> str:
        return order_id

    with pytest.raises(TableError, match="ToolContext"):
        ToolSpec(name="lookup", effect=Effect.READ, fn=lookup)


def test_a_read_row_with_an_optional_tool_context_still_works(make_gate: MakeGate) -> None:
    seen: list[Any] = []

    def lookup(order_id: str, tool_context: ToolContext = None) -> str:  # type: ignore[assignment]
        seen.append(tool_context)
        return order_id

    table = EffectTable([ToolSpec(name="lookup", effect=Effect.READ, fn=lookup)])
    table.allow_all("agent")
    gate = make_gate(table)
    out = gate.call("lookup", {"order_id": "1"}, context("m1", agent_id="agent"))
    assert isinstance(out, Executed)
    assert out.result == "1"
    assert seen == [None]


# -- 9. a row registered after the gate was built


def test_a_row_registered_later_is_checked_against_the_gates_policy(make_gate: MakeGate) -> None:
    """Under a policy that gates writes, a write row without approver_role was accepted by
    `register` (only the default policy is checked) and its call hit `assert role is not None`."""

    def read(x: str) -> str:
        return x

    def write(x: str) -> str:
        return x

    table = EffectTable([ToolSpec(name="read", effect=Effect.READ, fn=read)])
    make_gate(table, policy=Policy(autonomous=frozenset({Effect.READ})))
    with pytest.raises(TableError, match="approver_role"):
        table.register(ToolSpec(name="write", effect=Effect.WRITE, fn=write))
    assert table.get("write") is None


def test_the_report_still_counts_a_reviewers_edit(shop_gate: ShopGate, store: SQLStore) -> None:
    """The guard around the amendment's JSON keeps a real edit (an editor with non-ASCII text too)."""
    from effectgate.flow import drive
    from effectgate.report import edited_approvals

    gate = shop_gate.gate
    pending = _pending_refund(shop_gate)
    edited = drive(
        gate.flows.edit("refund_order", {**REFUND, "amount": 1100}, context("m1"), editor="zoë 😀")
    )
    assert isinstance(edited, Pending), edited
    assert edited.version == 2
    assert edited_approvals(store) == {pending.approval_id}
    with store.reading() as conn:
        rows = store.report_rows(conn, "decisions")
    assert [r[4] for r in rows] == [1]


def test_the_card_of_an_approval_whose_result_was_edited_still_shows(
    shop_gate: ShopGate, store: SQLStore
) -> None:
    """The inbox's card page (`card_view`) crashed on the edited result; it now shows the card,
    no result, and a warning naming the record."""
    from effectgate._display import card_view

    gate = shop_gate.gate
    pending = _pending_refund(shop_gate)
    grant = gate.approve(pending.approval_id, version=pending.version, approver=FINANCE)
    done = gate.execute(grant.token)  # type: ignore[union-attr]
    _edit_result(store, done.idempotency_key, "{nope")
    view = card_view(gate, pending.approval_id)
    assert view["result"] is None
    assert any(str(done.idempotency_key) in w for w in view["card"].warnings)


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_an_approved_row_whose_expiry_was_edited_to_text_lapses_at_its_derived_deadline(
    shop_gate: ShopGate, store: SQLStore, clock: Any
) -> None:
    """An approved row's grant lapsed unused, its deadline column edited to text (which once
    raised TypeError, then read as lapsed). The column decides nothing (round 29): within the
    deadline derived from its proposal the replay answers the approval as it stands and it can be
    granted again; past that deadline the replay is told it expired, it cannot be granted, and
    nothing runs."""
    gate = shop_gate.gate
    pending = _pending_refund(shop_gate)
    gate.approve(pending.approval_id, version=pending.version, approver=FINANCE)
    with store.engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE eg_approvals SET expires_at = 'tomorrow' WHERE id = ?", (pending.approval_id,)
        )
    clock.advance(gate.policy.token_ttl + 1)
    again = gate.call("refund_order", REFUND, context("m1"))
    assert isinstance(again, Pending), again
    assert again.status == "approved"
    clock.advance(gate.policy.pending_ttl)
    again = gate.call("refund_order", REFUND, context("m1"))
    assert getattr(again, "code", None) == "expired", again
    with pytest.raises(ApprovalError):
        gate.approve(pending.approval_id, version=pending.version, approver=FINANCE)
    assert shop_gate.shop.receiver.count() == 0
