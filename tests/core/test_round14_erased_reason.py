"""A replayed message after erasure (round 14, reproduced first, SQLite and PostgreSQL): the
refusal the model reads names the erasure, never the redaction marker's JSON."""

from __future__ import annotations

from effectgate import Approver, Pending, Refused
from effectgate.examples.shop import context
from effectgate.redact import redact
from effectgate.testing import FakeClock

from .conftest import ShopGate
from .test_redact import ADA_EMAIL

EMAIL = {"to": [ADA_EMAIL], "subject": "Your refund", "body": "Dear Ada, it is on its way."}
LEAD = Approver("sam", "support_lead")


def test_a_denial_replayed_after_erasure_says_its_reason_was_erased(
    shop_gate: ShopGate, clock: FakeClock
) -> None:
    """The reviewer's reason is personal data erased with the user's records. The same message
    again answered `send_email was denied: {"$redacted":"r-..."}`: the marker's JSON as the reason."""
    gate = shop_gate.gate
    pending = gate.call("send_email", EMAIL, context("m1"))
    assert isinstance(pending, Pending)
    gate.deny(pending.approval_id, approver=LEAD, reason="Ada asked us not to write", version=1)
    gate.flush()
    redact(gate.store, gate.keyring, user_id="u1", by="dpo", reason="request 77", now=clock.now())
    [row] = gate.store.approvals()
    assert row.status == "denied"
    again = gate.call("send_email", EMAIL, context("m1"))
    assert isinstance(again, Refused)
    assert again.code == "denied"
    assert "$redacted" not in again.message
    assert "Ada asked" not in again.message
    assert again.message == "send_email was denied (its reason was erased)"
    assert shop_gate.shop.receiver.count("email") == 0  # nothing was ever sent
