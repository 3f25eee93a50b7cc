"""Review round 4 of the inbox: a reconciliation whose provider or run again raises, records edited
or inserted in the database (a status edited back to pending, arguments, results), and model text
beside the card (another call in flight, an argument's name)."""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from starlette.testclient import TestClient

from effectgate import (
    Approver,
    Effect,
    EffectGate,
    EffectTable,
    Grant,
    Keyring,
    Pending,
    Reconciled,
    ToolSpec,
)
from effectgate.errors import OutcomeUnknown
from effectgate.examples.shop import context
from effectgate.outcomes import TAMPERED_WARNING
from effectgate.redact import redact
from effectgate.stores.records import ExecutionRow
from effectgate.web import create_app

from .conftest import REFUND, Inbox, form, login, propose, registry, snapshot


class Declined(Exception):
    """The provider's definite "no"."""


def _flaky_pay_gate(inbox: Inbox, runs: list[str], lookup: Any, then: type[Exception]) -> EffectGate:
    """A money tool whose first run's reply is lost (an unknown outcome) and whose next run
    raises `then` (`Declined`: a definite failure); `lookup(key)` is its reconcile hook."""

    def pay(payee: str) -> dict[str, Any]:
        """Pay someone."""
        runs.append(payee)
        if len(runs) == 1:
            raise OutcomeUnknown("the provider timed out")
        raise then(f"no reply for {payee}")

    spec = ToolSpec(
        name="pay",
        effect=Effect.MONEY,
        fn=pay,
        approver_role="finance",
        definite_failures=(Declined,),
        reconcile=lookup,
    )
    table = EffectTable([spec])
    table.allow_all("support")
    return EffectGate(table, inbox.store, keyring=Keyring.generate(), clock=inbox.clock)


def _reconcile(inbox: Inbox, lookup: Any, then: type[Exception] = Declined) -> tuple[int, str, list[str]]:
    """Approve a payment whose reply is lost, then press Reconcile: (status, approval id, runs)."""
    runs: list[str] = []
    gate = _flaky_pay_gate(inbox, runs, lookup, then)
    try:
        p = gate.call("pay", {"payee": "acme"}, context("m1"))
        assert isinstance(p, Pending), p
        app = create_app(gate, registry(), secret_key="k", on_grant=lambda grant: gate.execute(grant.token))
        c = TestClient(
            app, base_url="http://127.0.0.1", follow_redirects=False, raise_server_exceptions=False
        )
        csrf = login(c, "fiona")
        assert c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf)).status_code == 200
        assert [r.status for r in inbox.store.idempotency_records()] == ["needs_reconciliation"]
        r = c.post(f"/reconciliation/{p.approval_id}", data={"csrf": csrf})
    finally:
        gate.close()
    return r.status_code, p.approval_id, runs


def test_a_provider_lookup_that_raises_is_a_clear_refusal(inbox: Inbox) -> None:
    """The reconcile hook cannot reach the provider (it raises): the reviewer gets a page saying
    so (502), not a bare 500; the record stays in the queue and nothing ran again."""

    def lookup(key: str) -> Reconciled | None:
        raise ConnectionError("provider unreachable")

    status, _, runs = _reconcile(inbox, lookup)
    assert status == 502
    assert [r.status for r in inbox.store.idempotency_records()] == ["needs_reconciliation"]
    assert runs == ["acme"]


def test_a_run_again_that_fails_is_shown_not_a_bare_500(inbox: Inbox) -> None:
    """The provider never saw the key, so reconciling runs the payment again, and the provider
    declines it (a definite failure): the record ends failed, and the reviewer gets a page
    saying what happened instead of a bare 500."""
    status, approval_id, runs = _reconcile(inbox, lambda key: Reconciled(found=False))
    assert runs == ["acme", "acme"]
    assert [r.status for r in inbox.store.idempotency_records()] == ["failed"]
    assert inbox.store.get_approval(approval_id).status == "failed"  # type: ignore[union-attr]
    assert status == 502


def test_a_run_again_whose_outcome_is_unknown_again_is_not_called_unchanged(inbox: Inbox) -> None:
    """The provider never saw the key, so reconciling runs the payment again, and its reply is
    lost again: the record needs reconciliation again (the payment may have happened). The page
    must not say the request was refused with nothing changed (409): it ran (502, saying so)."""
    status, _, runs = _reconcile(inbox, lambda key: Reconciled(found=False), then=OutcomeUnknown)
    assert runs == ["acme", "acme"]
    assert [r.status for r in inbox.store.idempotency_records()] == ["needs_reconciliation"]
    assert len([e for e in inbox.store.executions() if e.status == "needs_reconciliation"]) == 2
    assert status == 502


def _edit(inbox: Inbox, approval_id: str, column: str, value: str) -> None:
    """One column of an approval edited in the database, behind effectgate's back."""
    with inbox.store.engine.begin() as conn:
        conn.execute(
            sa.text(f"UPDATE eg_approvals SET {column} = :v WHERE id = :i"), {"v": value, "i": approval_id}
        )


def _offered(inbox: Inbox, c: TestClient, approval_id: str) -> bool:
    """Whether the card page offers the approve form without saying the record does not verify."""
    page = c.get(f"/approvals/{approval_id}").text
    return f'action="/approvals/{approval_id}/approve"' in page and 'id="does-not-verify"' not in page


def test_a_granted_call_edited_back_to_pending_is_flagged_not_offered(inbox: Inbox) -> None:
    """A refund approved and run, whose status is edited back to 'pending': the gate refuses any
    decision on it as tampered (its sealed count of grants says it was granted), so the card says
    it does not verify and offers no approve form; a forged approve changes nothing."""
    p = propose(inbox)
    c = inbox.client()
    csrf = login(c, "fiona")
    assert c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf)).status_code == 200
    _edit(inbox, p.approval_id, "status", "pending")
    before = snapshot(inbox)
    assert not _offered(inbox, c, p.approval_id)
    assert c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf)).status_code == 409
    assert snapshot(inbox) == before
    assert inbox.shop.receiver.count("refund") == 1


def test_a_denied_call_edited_back_to_pending_is_flagged_not_offered(inbox: Inbox) -> None:
    """A denied refund whose status is edited back to 'pending': its sealed denial is final (the
    gate refuses an approval), so the card says it does not verify and offers no approve form."""
    p = propose(inbox)
    c = inbox.client()
    csrf = login(c, "fiona")
    assert c.post(f"/approvals/{p.approval_id}/deny", data=form(p, csrf, reason="no")).status_code == 200
    _edit(inbox, p.approval_id, "status", "pending")
    before = snapshot(inbox)
    assert not _offered(inbox, c, p.approval_id)
    assert c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf)).status_code == 409
    assert snapshot(inbox) == before
    assert inbox.shop.receiver.count("refund") == 0


def test_history_flags_a_decided_record_that_does_not_verify(inbox: Inbox) -> None:
    """A denied refund whose stored arguments were edited in the database (120.00 made 1.00,
    its seal and hash no longer verify): the History page marks that row as not verifying, as its
    card does, instead of listing it as an ordinary record; the untouched denial is not marked."""
    edited, clean = propose(inbox), propose(inbox, {**REFUND, "order_id": "1043", "amount": 3500}, "m4")
    c = inbox.client()
    csrf = login(c, "fiona")
    for p in (edited, clean):
        assert c.post(f"/approvals/{p.approval_id}/deny", data=form(p, csrf, reason="no")).status_code == 200
    _edit(inbox, edited.approval_id, "args_json", json.dumps({**REFUND, "amount": 100}))
    page = c.get("/history").text
    assert f'data-unverified="{edited.approval_id}"' in page
    assert f'data-unverified="{clean.approval_id}"' not in page


def test_reconciliation_offers_no_form_for_a_record_that_does_not_verify(inbox: Inbox) -> None:
    """A refund whose reply was lost (it needs reconciliation) and whose stored arguments were then
    edited in the database: the queue marks it as not verifying and offers no Reconcile form (the
    gate refuses it anyway); a forged reconcile changes nothing and runs nothing again."""
    p = propose(inbox)
    inbox.shop.provider.timeouts_to_inject = 1
    c = inbox.client()
    csrf = login(c, "fiona")
    assert c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf)).status_code == 200
    _edit(inbox, p.approval_id, "args_json", json.dumps({**REFUND, "amount": 100}))
    queue = c.get("/reconciliation").text
    assert f'action="/reconciliation/{p.approval_id}"' not in queue
    assert f'data-unverified="{p.approval_id}"' in queue
    before = (snapshot(inbox), inbox.store.idempotency_records())
    assert c.post(f"/reconciliation/{p.approval_id}", data={"csrf": csrf}).status_code == 409
    assert (snapshot(inbox), inbox.store.idempotency_records()) == before
    assert inbox.shop.receiver.count("refund") == 1


def test_another_call_in_flight_on_the_subject_has_its_hidden_characters_written_out(inbox: Inbox) -> None:
    """An email approved (its grant not yet used) and a second one to the same recipient waiting:
    the second card lists the first as in flight on the subject, its model-written body holding
    a right-to-left override. It is written out there (`<U+202E>`), as in the subject history
    beside it: only the card's own stored arguments are shown as stored, beside a revealed copy."""
    to = {"to": ["ada@example.test"], "subject": "s"}
    first = inbox.gate.call("send_email", {**to, "body": "pay acme\u202eevil"}, context("m1"))
    assert isinstance(first, Pending), first
    grant = inbox.gate.approve(
        first.approval_id, version=first.version, approver=Approver("sam", "support_lead")
    )
    assert isinstance(grant, Grant)
    second = inbox.gate.call("send_email", {**to, "body": "hello"}, context("m2"))
    assert isinstance(second, Pending), second
    c = inbox.client()
    login(c, "sam")
    page = c.get(f"/approvals/{second.approval_id}").text
    assert f'href="/approvals/{first.approval_id}"' in page  # listed as in flight
    assert "\u202e" not in page


def test_a_model_written_argument_name_has_its_hidden_characters_written_out(inbox: Inbox) -> None:
    """A tool whose schema admits any argument names (an upstream MCP server's, or `**fields`)
    gets a top-level name holding a right-to-left override: the card labels that argument with it
    written out (`<U+202E>`), as the notebook card does, so it cannot reorder the label; the
    stored value is shown as stored."""

    def post(**fields: Any) -> dict[str, Any]:
        """Post a form."""
        return {"posted": len(fields)}

    spec = ToolSpec(
        name="post", effect=Effect.SEND, fn=post, approver_role="finance", schema={"type": "object"}
    )
    table = EffectTable([spec])
    table.allow_all("support")
    gate = EffectGate(table, inbox.store, keyring=Keyring.generate(), clock=inbox.clock)
    try:
        p = gate.call("post", {"to\u202eliam": "acme"}, context("m1"))
        assert isinstance(p, Pending), p
        c = TestClient(
            create_app(gate, registry(), secret_key="k"), base_url="http://127.0.0.1", follow_redirects=False
        )
        login(c, "fiona")
        page = c.get(f"/approvals/{p.approval_id}").text
    finally:
        gate.close()
    assert "to&lt;U+202E&gt;liam" in page
    assert "\u202e" not in page


def test_an_inserted_result_that_is_not_json_leaves_the_history_working(inbox: Inbox) -> None:
    """A refund approved and run, and an execution row inserted in the database (the table is
    append-only, not closed to inserts) for it with a result that is not JSON: the History page
    still lists the decided approvals, the inserted text shown as text, instead of a bare 500."""
    p = propose(inbox)
    c = inbox.client(raise_server_exceptions=False)
    csrf = login(c, "fiona")
    assert c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf)).status_code == 200
    with inbox.store.engine.begin() as conn:
        columns = ", ".join(c for c in ExecutionRow.model_fields if c not in ("id", "result_json"))
        conn.execute(
            sa.text(
                f"INSERT INTO eg_executions ({columns}, result_json) "
                f"SELECT {columns}, :r FROM eg_executions WHERE approval_id = :i"
            ),
            {"r": "<b>not json", "i": p.approval_id},
        )
    before = snapshot(inbox)
    r = c.get("/history")
    assert r.status_code == 200
    assert f'href="/approvals/{p.approval_id}"' in r.text
    assert "<b>not json" not in r.text
    assert c.get(f"/approvals/{p.approval_id}").status_code == 200
    assert snapshot(inbox) == before


def test_a_queued_record_whose_result_is_not_json_is_named_not_a_bare_500(inbox: Inbox) -> None:
    """A refund whose reply was lost (it needs reconciliation), whose idempotency record's result
    is then edited in the database into text that is not JSON: the reconciliation page names the
    record (the store's error) with a 4xx instead of a bare 500, and nothing changes."""
    p = propose(inbox)
    inbox.shop.provider.timeouts_to_inject = 1
    c = inbox.client(raise_server_exceptions=False)
    csrf = login(c, "fiona")
    assert c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf)).status_code == 200
    with inbox.store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE eg_idempotency SET result_json = :r"), {"r": "<b>not json"})
    before = snapshot(inbox)
    r = c.get("/reconciliation")
    assert r.status_code == 409
    assert f"eg_{p.approval_id}_v1" in r.text
    assert snapshot(inbox) == before
    with inbox.store.engine.connect() as conn:
        statuses = [s for (s,) in conn.execute(sa.text("SELECT status FROM eg_idempotency"))]
    assert statuses == ["needs_reconciliation"]


def test_history_does_not_flag_a_record_erased_by_a_redaction(inbox: Inbox) -> None:
    """A refund run and then erased by `redact` (its arguments replaced by a marker that cannot
    be hashed again): it still verifies, as its card says, so the History page does not flag it."""
    p = propose(inbox)
    c = inbox.client()
    csrf = login(c, "fiona")
    assert c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf)).status_code == 200
    row = inbox.store.get_approval(p.approval_id)
    assert row is not None
    redact(inbox.store, inbox.gate.keyring, user_id=row.user_id, by="dpo", reason="erasure")
    assert inbox.store.get_approval(p.approval_id).args_json.startswith('{"$redacted":')  # type: ignore[union-attr]
    assert TAMPERED_WARNING not in inbox.gate.card(p.approval_id).warnings
    page = c.get("/history").text
    assert f'href="/approvals/{p.approval_id}"' in page
    assert "data-unverified=" not in page
