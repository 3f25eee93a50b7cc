"""What an erasure refuses before it writes anything, on SQLite and PostgreSQL: arguments edited in
the database (erasing them would seal the edited facts under the true hash and clear the audit's
`args_tampered`), and a subject that matches no record (a typo must not read as an erasure done).
And a legal hold serialises with a running erasure (PostgreSQL: `hold` takes the erasure lock)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import Approver, EffectGate, Keyring, Pending, open_store
from effectgate.audit import audit
from effectgate.examples.shop import app, context
from effectgate.redact import RedactionError, SubjectNotFound, hold, holds, is_redacted, redact, retain
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from . import test_redact
from .conftest import ShopGate
from .test_chain import unguard

ledger = test_redact.ledger  # Ada (u1): a read, a write, a refund of 1042, an email; Grace (u2)
everything = test_redact.everything


def _edit(store: SQLStore, table: str, tool: str, old: str, new: str) -> None:
    """Change text in u1's stored arguments of `tool`, leaving the args hash alone."""
    with store.transaction() as conn:
        conn.execute(
            sa.text(
                f"UPDATE {table} SET args_json = REPLACE(args_json, :old, :new) "
                "WHERE user_id = 'u1' AND tool = :tool"
            ),
            {"old": old, "new": new, "tool": tool},
        )


def _kinds(gate: EffectGate) -> set[str]:
    return {f.kind for f in audit(gate.store, gate.table, keyring=gate.keyring).findings}


@pytest.mark.parametrize("table", ["eg_approvals", "eg_executions"])
def test_edited_arguments_refuse_the_whole_redaction(ledger: EffectGate, table: str) -> None:
    """A refund whose stored amount was edited (hash left alone) is named in the refusal; nothing
    is erased (Ada's other records neither), no redaction is recorded, and the audit still
    reports the edit."""
    store = ledger.store
    assert isinstance(store, SQLStore)
    if table == "eg_executions":
        unguard(store, table)
    _edit(store, table, "refund_order", "1200", "99999")
    assert "args_tampered" in _kinds(ledger)
    snapshot = everything(store)
    with pytest.raises(RedactionError, match=f"{table} row .*do not hash to its recorded args hash"):
        redact(store, ledger.keyring, user_id="u1", by="dpo", reason="request 77")
    assert everything(store) == snapshot
    assert store.events(kind="redacted") == []
    assert "args_tampered" in _kinds(ledger)


@pytest.mark.parametrize("table", ["eg_approvals", "eg_executions"])
def test_edited_arguments_refuse_the_whole_retention_pass(
    ledger: EffectGate, clock: FakeClock, table: str
) -> None:
    """Retention is refused the same way, and whole: the edited row is an email's (the `send`
    rule), and the rules applied before it in the same pass (`money`, `read`) erase nothing."""
    store = ledger.store
    assert isinstance(store, SQLStore)
    if table == "eg_executions":
        unguard(store, table)
    _edit(store, table, "send_email", "Your refund", "Your bonus")
    assert "args_tampered" in _kinds(ledger)
    snapshot = everything(store)
    rules = {"read": 0, "write": 0, "send": 0, "money": 0}
    with pytest.raises(RedactionError, match="do not hash to its recorded args hash"):
        retain(store, ledger.keyring, rules, by="nightly", now=clock.now() + 86400)
    assert everything(store) == snapshot
    assert store.events(kind="redacted") == []
    assert "args_tampered" in _kinds(ledger)


def test_intact_arguments_are_erased_as_before(ledger: EffectGate) -> None:
    """Control: the check passes an honest ledger, which is erased with a clean audit after."""
    done = redact(ledger.store, ledger.keyring, user_id="u1", by="dpo", reason="request 77")
    assert done.values > 0
    assert audit(ledger.store, ledger.table, keyring=ledger.keyring).clean


def test_a_subject_matching_no_record_is_not_found_and_records_nothing(ledger: EffectGate) -> None:
    """`{"order_id": 1042}` (an integer; the ledger holds "1042") matches nothing: SubjectNotFound
    (a RedactionError and a LookupError), every value stays, no `redacted` event."""
    store = ledger.store
    assert isinstance(store, SQLStore)
    snapshot = everything(store)
    with pytest.raises(
        SubjectNotFound, match=r"no record of user 'u1' matches subject \{\"order_id\":1042\}"
    ):
        redact(store, ledger.keyring, user_id="u1", subject={"order_id": 1042}, by="dpo", reason="r")
    assert everything(store) == snapshot
    assert store.events(kind="redacted") == []
    # the same subject written as stored is found, and erased
    done = redact(store, ledger.keyring, user_id="u1", subject={"order_id": "1042"}, by="dpo", reason="r")
    assert done.values > 0


# -- a legal hold and a running erasure (PostgreSQL: SQLite's BEGIN IMMEDIATE serialises them)


@pytest.fixture
def pg_gate(pg_url: str) -> Iterator[EffectGate]:
    """A PostgreSQL ledger with one write of u1's (ticket tags)."""
    store = open_store(pg_url)
    store.setup()
    gate = app(store, keyring=Keyring.generate())
    gate.call("update_ticket_tags", {"ticket_id": "t-17", "tags": ["u1-secret"]}, context("m1"))
    gate.flush()
    yield gate
    gate.close()
    store.close()


def _waits_for_lock(url: str, done: threading.Event) -> bool:
    """Whether some session waits for an advisory lock (polled until one does, or `done` is set
    first: then it never waited; 30 s is a hang, not a timing assumption)."""
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    q = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
    try:
        deadline = time.monotonic() + 30
        with engine.connect() as conn:
            while time.monotonic() < deadline and not done.is_set():
                if conn.exec_driver_sql(q).scalar():
                    return True
                done.wait(0.01)
        return False
    finally:
        engine.dispose()


def _in_thread(work: Callable[[], Any]) -> tuple[threading.Thread, threading.Event, dict[str, Any]]:
    done, out = threading.Event(), {}

    def run() -> None:
        try:
            out["value"] = work()
        except Exception as exc:
            out["error"] = exc
        finally:
            done.set()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, done, out


@pytest.mark.postgres
def test_a_hold_waits_for_a_running_redaction(pg_gate: EffectGate, pg_url: str) -> None:
    """While a redaction of u1 is inside its transaction (it has read the holds), `hold` on u1
    waits for it instead of committing under it; it commits after, and holds from then on."""
    store = pg_gate.store
    assert isinstance(store, SQLStore)
    original = store.redaction_targets
    seen: dict[str, Any] = {}

    def targets(conn: Any, **where: Any) -> Any:  # inside the redaction's transaction
        other = open_store(pg_url)
        thread, done, out = _in_thread(lambda: hold(other, user_id="u1", by="legal", reason="case 14"))
        seen["waited"] = _waits_for_lock(pg_url, done)
        seen["held_meanwhile"] = done.is_set()
        seen["run"] = (thread, out, other)
        return original(conn, **where)

    store.redaction_targets = targets  # type: ignore[method-assign]
    try:
        done_redaction = redact(store, pg_gate.keyring, user_id="u1", by="dpo", reason="request 77")
    finally:
        del store.redaction_targets
    thread, out, other = seen.pop("run")
    thread.join()
    other.close()
    assert seen == {"waited": True, "held_meanwhile": False}
    assert "error" not in out, out
    assert done_redaction.values > 0  # it started first: it ran
    assert [h.user_id for h in holds(store)] == ["u1"]
    with pytest.raises(RedactionError, match="legal hold"):
        redact(store, pg_gate.keyring, user_id="u1", by="dpo", reason="again")


@pytest.mark.postgres
def test_a_redaction_waits_for_a_hold_being_placed_and_is_refused(pg_gate: EffectGate, pg_url: str) -> None:
    """A redaction that starts while a hold is being placed waits for it, then sees it: refused,
    nothing erased."""
    store = pg_gate.store
    assert isinstance(store, SQLStore)
    seen: dict[str, Any] = {}
    original = store.add_hold

    def add_hold(conn: Any, placed: Any) -> None:  # inside the hold's transaction
        other = open_store(pg_url)
        thread, done, out = _in_thread(
            lambda: redact(other, pg_gate.keyring, user_id="u1", by="dpo", reason="request 77")
        )
        seen["waited"] = _waits_for_lock(pg_url, done)
        seen["redacted_meanwhile"] = done.is_set()
        seen["run"] = (thread, out, other)
        original(conn, placed)

    store.add_hold = add_hold  # type: ignore[method-assign]
    try:
        hold(store, user_id="u1", by="legal", reason="case 14")
    finally:
        del store.add_hold
    thread, out, other = seen.pop("run")
    thread.join()
    other.close()
    assert seen == {"waited": True, "redacted_meanwhile": False}
    assert isinstance(out.get("error"), RedactionError), out
    assert "legal hold" in str(out["error"])
    assert "u1-secret" in everything(store)
    assert store.events(kind="redacted") == []


def test_retention_keeps_a_note_naming_an_open_approval_in_its_detail(
    shop_gate: ShopGate, clock: FakeClock
) -> None:
    """An application note that names no approval in its column but lists approvals in its
    detail (`approval_ids`, as the LangGraph adapter's interrupt record does) is part of those
    calls for retention: kept while one is pending, erased once it is decided."""
    gate = shop_gate.gate
    store = gate.store
    assert isinstance(store, SQLStore)
    ctx = context("m1")
    pending = gate.call("refund_order", {"order_id": "1042", "amount": 1200, "currency": "GBP"}, ctx)
    assert isinstance(pending, Pending)
    gate.note("interrupt_shown", ctx=ctx, interrupt_id="i-1", approval_ids=[pending.approval_id])
    gate.flush()
    retain(store, gate.keyring, {"unclassified": 0}, by="nightly", now=clock.now() + 1)
    [note] = store.events(kind="interrupt_shown")
    assert not is_redacted(note.detail_json)
    gate.deny(pending.approval_id, approver=Approver("fiona", "finance"), reason="duplicate")
    clock.advance(60)
    retain(store, gate.keyring, {"unclassified": 0}, by="nightly", now=clock.now())
    [note] = store.events(kind="interrupt_shown")
    assert is_redacted(note.detail_json)
