"""Round 11, the inbox: each test reproduces one defect found in this round (SQLite and
PostgreSQL through the `inbox` fixture)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from effectgate.outcomes import TAMPERED_WARNING
from effectgate.web import create_app

from .conftest import Inbox, login, propose, registry, snapshot


def test_a_broken_erasure_marker_on_one_call_does_not_take_down_its_subject(inbox: Inbox) -> None:
    """An erased call's arguments are a marker the seal cannot cover (`redact` wrote them). A
    marker edited in the database into text that is not JSON made every other call on the same
    subject crash with a raw JSONDecodeError: its card (500), its approval (500) and a new
    proposal. The edited row does not verify (as any other edit): it is flagged on its own card
    and is no history, and the other calls go on."""
    client = inbox.client(raise_server_exceptions=False)
    csrf = login(client, "fiona")
    first = propose(inbox, {"order_id": "1042", "amount": 100, "currency": "GBP"}, "m1")
    denied = {"csrf": csrf, "version": 1, "args_hash": first.card.args_hash, "reason": "no"}
    assert client.post(f"/approvals/{first.approval_id}/deny", data=denied).status_code == 200
    second = propose(inbox, {"order_id": "1042", "amount": 200, "currency": "GBP"}, "m2")
    with inbox.store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE eg_approvals SET args_json = :a WHERE id = :i"),
            {"a": '{"$redacted": not json', "i": first.approval_id},
        )

    assert client.get(f"/approvals/{second.approval_id}").status_code == 200
    approve = {"csrf": csrf, "version": 1, "args_hash": second.card.args_hash}
    assert client.post(f"/approvals/{second.approval_id}/approve", data=approve).status_code == 200
    assert inbox.gate.card(second.approval_id).status == "executed"
    assert len(inbox.shop.receiver.effects) == 1
    assert TAMPERED_WARNING in inbox.gate.card(first.approval_id).warnings
    propose(inbox, {"order_id": "1042", "amount": 300, "currency": "GBP"}, "m3")


def test_a_grant_deadline_edited_into_text_on_one_call_does_not_take_down_its_subject(
    inbox: Inbox,
) -> None:
    """SQLite keeps text written into a REAL column. An approved call's unsealed grant deadline
    edited into text made every other call on its subject crash with a raw TypeError (its
    subject history compared the text with the clock): the other call's card (500) and its
    approval (500). Such a grant still counts as in effect (it may be live: the token carries
    its own deadline), so the balance stays the safe one, and the other call is decided."""
    if inbox.store.engine.dialect.name != "sqlite":
        pytest.skip("PostgreSQL's double precision column cannot hold text")
    client = inbox.client(raise_server_exceptions=False)
    csrf = login(client, "fiona")
    first = propose(inbox, {"order_id": "1042", "amount": 100, "currency": "GBP"}, "m1")
    denied = {"csrf": csrf, "version": 1, "args_hash": first.card.args_hash, "reason": "no"}
    assert client.post(f"/approvals/{first.approval_id}/deny", data=denied).status_code == 200
    second = propose(inbox, {"order_id": "1042", "amount": 200, "currency": "GBP"}, "m2")
    with inbox.store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE eg_approvals SET status = 'approved', token_expires_at = 'x' WHERE id = :i"),
            {"i": first.approval_id},
        )

    assert client.get(f"/approvals/{second.approval_id}").status_code == 200
    [entry] = inbox.gate.subject_view(second.approval_id).history
    # round 18: its version's denial is sealed and its sealed count of grants is 0, so no grant of
    # it can be live whatever its columns say (tests/core/test_round18_history.py)
    assert not entry.in_effect
    approve = {"csrf": csrf, "version": 1, "args_hash": second.card.args_hash}
    assert client.post(f"/approvals/{second.approval_id}/approve", data=approve).status_code == 200
    assert inbox.gate.card(second.approval_id).status == "executed"
    assert len(inbox.shop.receiver.effects) == 1


def test_approving_a_call_whose_grant_deadline_was_edited_into_text_is_refused_cleanly(
    inbox: Inbox,
) -> None:
    """An approved call (its grant unpresented) whose grant deadline was edited into text: an
    approve posted for it (a grant again) crashed with a raw TypeError (500) comparing the text
    with the clock. It is refused as already approved (the grant may be live: nothing tells),
    with nothing changed."""
    if inbox.store.engine.dialect.name != "sqlite":
        pytest.skip("PostgreSQL's double precision column cannot hold text")
    inbox.app = create_app(inbox.gate, registry(), secret_key="test-secret")  # grants not run
    client = inbox.client(raise_server_exceptions=False)
    csrf = login(client, "fiona")
    pending = propose(inbox)
    approve = {"csrf": csrf, "version": 1, "args_hash": pending.card.args_hash}
    assert client.post(f"/approvals/{pending.approval_id}/approve", data=approve).status_code == 200
    with inbox.store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE eg_approvals SET token_expires_at = 'x' WHERE id = :i"),
            {"i": pending.approval_id},
        )
    before = snapshot(inbox)
    other = inbox.client(raise_server_exceptions=False)
    csrf = login(other, "frank")
    assert (
        other.post(f"/approvals/{pending.approval_id}/approve", data={**approve, "csrf": csrf}).status_code
        == 409
    )
    assert snapshot(inbox) == before
