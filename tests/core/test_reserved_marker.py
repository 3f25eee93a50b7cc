"""Model-written text that would pass for an erasure, and model-written tool names, on SQLite and
PostgreSQL.

Arguments whose smallest key is "$redacted" start like an erasure marker: they are Invalid at call
time on every path that stores arguments (a call, a step, a reviewer's edit, a write, a read's fast
path), and nothing is stored. A tool result that looks like a marker is erased like any value. A
refused unknown tool's name is model-written: it is kept only where erasure reaches it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import Approver, EffectGate, EffectTable, Executed, Grant, Invalid, Pending, Refused, ToolSpec
from effectgate.audit import audit
from effectgate.chain import seal_chain, verify_chain
from effectgate.effects import Effect
from effectgate.errors import PolicyViolation
from effectgate.examples.shop import context
from effectgate.flow import drive
from effectgate.redact import redact, retain
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from .conftest import MakeGate, ShopGate

LEAD = Approver("sam", "support_lead")
ADA = "ada.lovelace@example.com"
OPEN = {"type": "object", "properties": {"to": {"type": "string"}}, "required": ["to"]}
#: closed, scalar properties: the plain-text fast path (`canonical.plain_checker`)
PLAIN = {
    "type": "object",
    "properties": {"$redacted": {"type": "string"}, "to": {"type": "string"}},
    "required": ["to"],
    "additionalProperties": False,
}
FORGED = {"$redacted": "r-0000", "to": ADA}


def everything(store: SQLStore) -> str:
    """Every value of every effectgate table, as one text (to search for personal values)."""
    with store.reading() as conn:
        names = [t for t in sa.inspect(conn).get_table_names() if t.startswith("eg_")]
        return "\n".join(
            repr(tuple(row)) for name in names for row in conn.exec_driver_sql(f"SELECT * FROM {name}")
        )


def echo(**args: Any) -> dict[str, Any]:
    return dict(args)


def mirror(to: str) -> dict[str, Any]:
    return {"$redacted": "r-0000", "to": to}  # a result that starts like a marker


def table() -> EffectTable:
    send, write = Effect.SEND, Effect.WRITE
    specs = [
        ToolSpec(name="send_note", effect=send, fn=echo, schema=OPEN, approver_role="support_lead"),
        ToolSpec(name="log_note", effect=write, fn=echo, schema=OPEN),
        ToolSpec(name="look_up", effect=Effect.READ, fn=echo, schema=PLAIN),
        ToolSpec(name="mirror_send", effect=send, fn=mirror, approver_role="support_lead"),
        ToolSpec(name="mirror_note", effect=write, fn=mirror),
    ]
    t = EffectTable(specs)
    t.allow("support", [s.name for s in specs])
    return t


@pytest.fixture
def gate(make_gate: MakeGate) -> EffectGate:
    return make_gate(table())


def stored_nothing(gate: EffectGate, store: SQLStore) -> None:
    gate.flush()
    assert store.approvals() == []
    assert store.executions() == []
    assert ADA not in everything(store)
    [event] = store.events(kind="invalid")
    assert json.loads(event.detail_json)["errors"][0]["pointer"] == "/$redacted"
    assert audit(store, gate.table, keyring=gate.keyring).clean


def reserved(out: object) -> None:
    assert isinstance(out, Invalid), out
    assert [e.pointer for e in out.errors] == ["/$redacted"]
    assert "reserved" in out.for_model()


@pytest.mark.parametrize("tool", ["send_note", "log_note", "look_up"])
def test_a_reserved_key_is_invalid_and_nothing_is_stored(
    gate: EffectGate, store: SQLStore, tool: str
) -> None:
    """A gated call, a write and a read (the fast path) with a "$redacted" key are Invalid at
    /$redacted, recorded as invalid without their values, and nothing else is stored."""
    reserved(gate.call(tool, FORGED, context("m1")))
    stored_nothing(gate, store)


def test_a_reserved_key_in_a_step_and_async_is_invalid(gate: EffectGate, store: SQLStore) -> None:
    """The step and the async call route the same way."""
    [out] = gate.call_step([("send_note", FORGED)], context("m1"))
    reserved(out)
    reserved(asyncio.run(gate.acall("log_note", FORGED, context("m2"))))
    gate.flush()
    assert store.approvals() == []
    assert store.executions() == []
    assert len(store.events(kind="invalid")) == 2


def test_a_smaller_key_than_the_marker_is_an_ordinary_argument(gate: EffectGate, store: SQLStore) -> None:
    """Only text that starts like a marker is refused: "$redacted" beside a smaller key is data."""
    args = {"!first": "x", **FORGED}
    out = gate.call("log_note", args, context("m1"))
    assert isinstance(out, Executed)
    assert out.result == args


def test_a_reviewers_edit_with_a_reserved_key_is_invalid(gate: EffectGate, store: SQLStore) -> None:
    """An edit (an adapter applying a reviewer's decision) is routed like a call: Invalid, and the
    waiting approval keeps its one version."""
    pending = gate.call("send_note", {"to": ADA}, context("m1"))
    assert isinstance(pending, Pending)
    reserved(drive(gate.flows.edit("send_note", FORGED, context("m1"), editor="sam")))
    [approval] = store.approvals()
    assert approval.version == 1
    assert not approval.args_json.startswith('{"$redacted"')
    assert [v.version for v in gate.versions(pending.approval_id)] == [1]


def test_a_result_that_looks_like_a_marker_is_erased(
    gate: EffectGate, store: SQLStore, clock: FakeClock
) -> None:
    """A tool echoing model text may return {"$redacted": ...}: no redaction wrote it, so `redact`
    erases it like any value (keeping none of its keys), the audit stays clean, and a second
    redaction finds it erased."""
    written = gate.call("mirror_note", {"to": ADA}, context("m1"))
    assert isinstance(written, Executed)
    assert written.result == FORGED
    pending = gate.call("mirror_send", {"to": ADA}, context("m2"))
    assert isinstance(pending, Pending)
    grant = gate.approve(pending.approval_id, version=1, approver=LEAD)
    assert isinstance(grant, Grant)
    assert isinstance(gate.execute(grant.token), Executed)
    gate.flush()
    assert ADA in everything(store)
    # stored with a leading space: only a redaction writes a value that starts like a marker
    assert {e.result_json[:2] for e in store.executions()} == {" {"}
    assert seal_chain(store, gate.keyring, now=clock.now() + 3600)
    done = redact(store, gate.keyring, user_id="u1", by="dpo", reason="request 1")
    assert done.values > 0
    assert ADA not in everything(store)
    assert audit(store, gate.table, keyring=gate.keyring).clean
    assert verify_chain(store, gate.keyring) == []  # the checkpointed result erased, the chain holds
    again = redact(store, gate.keyring, user_id="u1", by="dpo", reason="request 2")
    assert again.values == 0


def test_a_forged_argument_marker_stays_a_finding_after_a_redaction(
    gate: EffectGate, store: SQLStore
) -> None:
    """Arguments never start like a marker, so one no redaction wrote is tampering: `redact` leaves
    it (with no entry of its own) and the audit still reports it."""
    pending = gate.call("send_note", {"to": ADA}, context("m1"))
    assert isinstance(pending, Pending)
    assert isinstance(gate.deny(pending.approval_id, version=1, approver=LEAD, reason="no"), Refused)
    with store.transaction() as conn:
        conn.execute(
            sa.text("UPDATE eg_approvals SET args_json = :m WHERE id = :id"),
            {"m": '{"$redacted":"r-forged"}', "id": pending.approval_id},
        )
    redact(store, gate.keyring, user_id="u1", by="dpo", reason="request 1")
    [approval] = store.approvals()
    assert approval.args_json == '{"$redacted":"r-forged"}'
    findings = audit(store, gate.table, keyring=gate.keyring).findings
    assert [(f.kind, f.approval_id) for f in findings] == [("redaction_forged", pending.approval_id)]


def test_an_unknown_tools_name_is_kept_only_where_erasure_reaches(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock
) -> None:
    """A refused unknown tool's name is model-written: its event's tool column stays empty, the
    detail names it, and both `redact --user` and the `unclassified` retention erase it."""
    gate = shop_gate.gate
    name = f"email_{ADA}_about_her_case"
    for user in ("u1", "u2"):
        out = gate.call(name, {"note": "12 Baker St"}, context(f"m-{user}", user_id=user))
        assert isinstance(out, Refused)
        assert (out.code, out.tool) == ("unknown_tool", name)  # the model is told the name it wrote
    gate.flush()
    events = store.events(kind="refused")
    assert [e.tool for e in events] == [None, None]
    assert [json.loads(e.detail_json)["tool_name"] for e in events] == [name, name]
    redact(store, gate.keyring, user_id="u1", by="dpo", reason="request 1")
    assert [ADA in e.detail_json for e in store.events(kind="refused")] == [False, True]
    clock.advance(2 * 86400)
    done = retain(store, gate.keyring, {"unclassified": 1}, by="nightly", now=clock.now())
    assert done.values == 1
    assert ADA not in everything(store)
    assert audit(store, gate.table, keyring=gate.keyring).clean


def test_a_denial_reason_that_starts_like_a_marker_is_refused(gate: EffectGate, store: SQLStore) -> None:
    """A reviewer's reason is stored as written: one that starts like an erasure marker would be
    a forged marker to the audit, so the denial is refused and the approval stays pending."""
    pending = gate.call("send_note", {"to": ADA}, context("m1"))
    assert isinstance(pending, Pending)
    with pytest.raises(PolicyViolation, match="erasure marker"):
        gate.deny(pending.approval_id, approver=LEAD, reason='{"$redacted":"r-1"}')
    [approval] = store.approvals()
    assert approval.status == "pending"
    assert store.all_decisions() == []
    assert audit(store, gate.table, keyring=gate.keyring).clean
