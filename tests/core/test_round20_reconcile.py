"""Round 20: reconciliation and stored results (each reproduced first); on SQLite and PostgreSQL.

- `gate.result(approval_id)` answered from an approval whose seal no longer verifies: with its
  arguments edited in the database (and the idempotency record's payload hash edited to match),
  the stored result was returned as the replay of the edited arguments, where every other reader
  (reconcile, settle, the agent's replay) refuses the row as tampered. Now a StoreError, as a
  result recorded for other arguments is (a card still shows, flagged, without the result).
- `gate.reconcile(key, approver=...)` with an approver that is not an `Approver` (a name typed in
  a script) crashed with a raw AttributeError (after the provider was asked, for a write). Now a
  TypeError before anything is read, and nothing changes.
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import Executed
from effectgate._display import card_view
from effectgate._seal import stored_args_hash
from effectgate.errors import NeedsReconciliation, StoreError
from effectgate.examples.shop import context
from effectgate.stores import Claimed, SQLStore

from ._bank import FINANCE, Bank, Tags, exec_key, pay_grant, status
from .conftest import MakeGate


def test_the_result_of_an_approval_whose_arguments_were_edited_is_refused(
    store: SQLStore, make_gate: MakeGate
) -> None:
    bank = Bank()
    gate = make_gate(bank.table())
    grant = pay_grant(gate)
    assert isinstance(gate.execute(grant.token), Executed)
    assert gate.result(grant.approval_id) is not None
    edited = '{"account":"a2","amount":9000}'
    hashed = stored_args_hash("pay", edited)
    with store.engine.begin() as conn:  # the arguments and the record's hash edited together
        conn.execute(
            sa.text("UPDATE eg_approvals SET args_json = :a, args_hash = :h WHERE id = :i"),
            {"a": edited, "h": hashed, "i": grant.approval_id},
        )
        conn.execute(sa.text("UPDATE eg_idempotency SET payload_hash = :h"), {"h": hashed})
    with pytest.raises(StoreError, match="does not verify"):
        gate.result(grant.approval_id)
    view = card_view(gate, grant.approval_id)  # the card still shows, flagged, without the result
    assert view["result"] is None
    assert any("does not verify" in w for w in view["card"].warnings)
    assert bank.runs == 1


def test_the_result_of_an_erased_approval_is_still_read(store: SQLStore, make_gate: MakeGate) -> None:
    """`redact` erases an ended call's arguments (its seal still verifies): not a tampered row."""
    from effectgate.redact import redact

    bank = Bank()
    gate = make_gate(bank.table())
    grant = pay_grant(gate)
    assert isinstance(gate.execute(grant.token), Executed)
    redact(store, gate.keyring, user_id="u1", by="dpo", reason="erasure request")
    gate.result(grant.approval_id)  # no TamperedRecord (what it holds after erasure is redact's)


def lost_write(make_gate: MakeGate) -> tuple[Any, Tags, str]:
    tags = Tags()
    gate = make_gate(tags.table())
    tags.lose_reply = 1
    with pytest.raises(NeedsReconciliation) as raised:
        gate.call("tag", {"ticket_id": "t-17", "tags": ["urgent"]}, context("m1"))
    return gate, tags, raised.value.key


@pytest.mark.parametrize("bad", ["fiona", 3, {"id": "fiona", "role": "finance"}])
def test_reconcile_with_an_approver_that_is_no_approver_is_a_type_error(
    store: SQLStore, make_gate: MakeGate, bad: Any
) -> None:
    gate, _tags, key = lost_write(make_gate)
    with pytest.raises(TypeError, match="approver"):
        gate.reconcile(key, approver=bad)
    record = store.get(key)
    assert record is not None
    assert record.status == "needs_reconciliation"
    assert not store.events(kind="reconciled")

    bank = Bank()
    pay_gate = make_gate(bank.table())
    grant = pay_grant(pay_gate, account="a9", message="m9")
    bank.lose_reply = 1
    with pytest.raises(NeedsReconciliation):
        pay_gate.execute(grant.token)
    with pytest.raises(TypeError, match="approver"):
        pay_gate.reconcile(grant.approval_id, approver=bad)
    assert status(store, grant.approval_id) == "approved"
    settled = store.get(exec_key(grant))
    assert settled is not None
    assert settled.status == "needs_reconciliation"
    assert isinstance(pay_gate.reconcile(grant.approval_id, approver=FINANCE), Executed)


# -- the store on its own: a lease that can never run out (or is over before it starts)


@pytest.mark.parametrize("seconds", [float("nan"), float("inf"), 0, -5.0, "60", None])
def test_a_claim_with_a_lease_that_is_no_duration_is_refused_before_anything(
    store: SQLStore, seconds: Any
) -> None:
    """`IdempotencyStore.claim(lease_seconds=nan)` stored a lease that never runs out (SQLite reads
    NaN back as NULL, which `recover` skips and a claim never expires): a worker that died holding
    it was never recovered, and every later call was `InProgress` forever. A negative or zero lease
    was over at once (the next claim took a live run for a dead one). Now a ValueError, and nothing
    is claimed or run."""
    ran: list[int] = []
    with pytest.raises(ValueError, match="lease_seconds"):
        store.run("k1", "h", lambda: ran.append(1), lease_seconds=seconds)
    with pytest.raises(ValueError, match="lease_seconds"):
        store.claim("k2", "h", lease_seconds=seconds)
    assert store.get("k1") is None
    assert store.get("k2") is None
    assert not ran
    claimed = store.claim("k3", "h", lease_seconds=30)
    assert isinstance(claimed, Claimed)
    with pytest.raises(ValueError, match="lease_seconds"):
        store.renew_lease("k3", claimed.owner, lease_seconds=seconds)
    record = store.get("k3")
    assert record is not None
    assert record.lease_expires_at == store.clock.now() + 30
