"""Round 17: the audit over legitimate flows (amendments, regrants after a lapse, reconciliations,
settlements, erasures, retention, two-approver destructive calls, replayed writes) must stay
clean, in one scan and in the split scan of a large ledger. Each test runs on SQLite and
PostgreSQL (`shop_gate`, `make_gate`); the clock is injected.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest

import effectgate.audit as audit_module
from effectgate import (
    Approver,
    Effect,
    EffectGate,
    Executed,
    Grant,
    Keyring,
    PartialApproval,
    Pending,
    Policy,
)
from effectgate.audit import audit
from effectgate.errors import NeedsReconciliation
from effectgate.examples.shop import SHOP_POLICY, Shop, context
from effectgate.redact import redact, retain
from effectgate.testing import FakeClock

from .conftest import MakeGate, ShopGate
from .test_round12_audit import FINANCE, REFUND

PRIVACY = (Approver("pia", "privacy"), Approver("paul", "privacy"))
AGAIN = (Approver("pat", "privacy"), Approver("pim", "privacy"))


def proposed(gate: EffectGate, tool: str, args: dict[str, Any], message: str, **ctx: str) -> Pending:
    pending = gate.call(tool, args, context(message, **ctx))
    assert isinstance(pending, Pending), pending
    return pending


def granted(gate: EffectGate, pending: Pending, approvers: Sequence[Approver] = (FINANCE,)) -> Grant:
    grant = None
    for who in approvers:
        grant = gate.approve(pending.approval_id, version=pending.version, approver=who)
    assert isinstance(grant, Grant), grant
    return grant


def unknown_outcome(shop: Shop, gate: EffectGate, order: str, message: str, **ctx: str) -> str:
    """A refund approved whose provider timed out after refunding: its outcome is unknown."""
    shop.provider.timeouts_to_inject = 1
    pending = proposed(gate, "refund_order", {**REFUND, "order_id": order, "amount": 10}, message, **ctx)
    with pytest.raises(NeedsReconciliation):
        gate.execute(granted(gate, pending).token)
    return pending.approval_id


def clean(gate: EffectGate) -> None:
    gate.flush()
    assert audit(gate.store, gate.table, keyring=gate.keyring, chain=True).findings == []


def split_clean(gate: EffectGate, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same ledger audited in two processes (the split scan of a large ledger)."""
    gate.close()  # no background thread: the scan may fork
    monkeypatch.setattr(audit_module, "PARALLEL_FROM", 2)
    assert audit(gate.store, gate.table, keyring=gate.keyring, chain=True).findings == []


def test_amendments_reconciliations_erasure_and_retention_audit_clean(
    shop_gate: ShopGate, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    shop, gate = shop_gate
    gate.execute(granted(gate, proposed(gate, "refund_order", REFUND, "m1")).token)
    first = proposed(gate, "refund_order", {**REFUND, "order_id": "1043", "amount": 100}, "m2")
    second = proposed(gate, "refund_order", {**REFUND, "order_id": "1043", "amount": 200}, "m3")
    assert second.version == first.version + 1  # amended in place
    gate.execute(granted(gate, second).token)
    gate.execute(
        granted(gate, proposed(gate, "delete_customer_data", {"customer_id": "u1"}, "m4"), PRIVACY).token
    )
    for _ in range(2):  # a write, replayed
        gate.call("update_ticket_tags", {"ticket_id": "t-17", "tags": ["vip"]}, context("m5"))
    reconciled = unknown_outcome(shop, gate, "2001", "m6", user_id="u2", session_id="s-g")
    assert isinstance(gate.reconcile(reconciled), Executed)
    assert shop.receiver.count("refund") == 3
    clean(gate)
    redact(gate.store, gate.keyring, user_id="u1", by="dpo", reason="erasure")
    clean(gate)
    clock.advance(400 * 86400)
    retain(gate.store, gate.keyring, {str(e): 30 for e in Effect}, by="ops")
    clean(gate)
    split_clean(gate, monkeypatch)


def test_regrants_and_settlements_audit_clean(
    shop_gate: ShopGate, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    shop, gate = shop_gate
    # a destructive call whose grant lapsed unused, granted again by a new round of two
    deletion = proposed(gate, "delete_customer_data", {"customer_id": "u1"}, "d1")
    granted(gate, deletion, PRIVACY)
    clock.advance(gate.policy.token_ttl + 1)
    gate.execute(granted(gate, deletion, AGAIN).token)
    # a refund granted again by another person
    refund = proposed(gate, "refund_order", REFUND, "r1")
    granted(gate, refund)
    clock.advance(gate.policy.token_ttl + 1)
    gate.execute(granted(gate, refund, (Approver("frank", "finance"),)).token)
    # unknown outcomes settled by a person: it happened; it did not (then proposed again, run once)
    gate.settle(unknown_outcome(shop, gate, "1043", "s1"), happened=True, result={"ok": 1}, by="ops")
    gate.settle(unknown_outcome(shop, gate, "1043", "s2"), happened=False, by="ops")
    gate.execute(granted(gate, proposed(gate, "refund_order", {**REFUND, "order_id": "1043"}, "s3")).token)
    assert shop.receiver.count("delete") == 1
    clean(gate)
    split_clean(gate, monkeypatch)


@pytest.mark.parametrize(("first", "then"), [(500, 200000), (200000, 500)])
def test_a_partial_approval_of_an_earlier_version_is_no_wrong_role(
    make_gate: MakeGate, monkeypatch: pytest.MonkeyPatch, first: int, then: int
) -> None:
    """Money needs two approvers here. Version 1 got one approval from its role; a new message
    amended the call in place with an amount that escalates (or de-escalates) the role, and
    version 2 was approved by two people of its role and ran once. The earlier version's decision
    was right for its own role (which the approval row no longer holds) and counts for no run of
    version 2: the audit must stay clean, not report it as `wrong_role`."""
    shop = Shop()
    shop.orders["1042"]["total"] = 10**7
    policy = Policy(double_confirmation=frozenset({Effect.MONEY, Effect.DESTRUCTIVE}))
    gate = make_gate(shop.table(), policy=policy)
    people = {
        "finance": (Approver("fiona", "finance"), Approver("frank", "finance")),
        "finance_lead": (Approver("lena", "finance_lead"), Approver("leo", "finance_lead")),
    }
    p = proposed(gate, "refund_order", {**REFUND, "amount": first}, "m1")
    partial = gate.approve(p.approval_id, version=1, approver=people[p.card.approver_role][0])
    assert isinstance(partial, PartialApproval)
    q = proposed(gate, "refund_order", {**REFUND, "amount": then}, "m2")
    assert (q.approval_id, q.version) == (p.approval_id, 2)
    assert q.card.approver_role != p.card.approver_role
    gate.execute(granted(gate, q, people[q.card.approver_role]).token)
    assert shop.receiver.count("refund") == 1
    clean(gate)
    split_clean(gate, monkeypatch)


def test_a_lapsed_approval_is_no_reclassification_after_a_later_deploy(
    shop_gate: ShopGate, make_gate: MakeGate, clock: FakeClock
) -> None:
    """A refund was approved and never run: its grant lapsed, and the approval expired (no grant
    can be made for it again). Days later a deploy changes the tool's row (a call under it records
    it). Nothing was approved under the old row that could still run, so the audit stays clean;
    a grant still usable when the row changed is reported (`test_gate_execute`)."""
    shop, gate = shop_gate
    granted(gate, proposed(gate, "refund_order", REFUND, "m1"))
    clock.advance(gate.policy.pending_ttl + gate.policy.token_ttl + 1)
    gate.expire()
    spec = gate.table["refund_order"]
    deployed = gate.table.replace(dataclasses.replace(spec, description="refunds (v2)", pin_description=True))
    changed = make_gate(deployed, policy=SHOP_POLICY, keyring=gate.keyring)
    later = changed.call("refund_order", {**REFUND, "order_id": "1043", "amount": 100}, context("m2"))
    assert isinstance(later, Pending)
    assert shop.receiver.count("refund") == 0
    clean(gate)
    assert audit(gate.store, deployed, keyring=gate.keyring).findings == []


def test_an_earlier_versions_approver_who_amended_the_call_is_not_self_approved(
    make_gate: MakeGate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sends need two approvers here, in a session two people share. Ada proposed an email; Bea
    (a support lead) approved that version; then Bea amended the call in the session (version 2,
    proposed by her, so she may not approve it), and two other leads approved it: it ran once.
    Bea approved a version she did not propose, and her decision counts for no run of version 2:
    the audit must not report it as `self_approved`."""
    shop = Shop()
    policy = Policy(double_confirmation=frozenset({Effect.SEND, Effect.DESTRUCTIVE}))
    gate = make_gate(shop.table(), policy=policy)
    email = {"to": ["grace@example.com"], "subject": "your refund", "body": "on its way"}
    p = proposed(gate, "send_email", email, "m1", user_id="ada", session_id="s-team")
    partial = gate.approve(p.approval_id, version=1, approver=Approver("bea", "support_lead"))
    assert isinstance(partial, PartialApproval)
    q = proposed(
        gate, "send_email", {**email, "body": "sent today"}, "m2", user_id="bea", session_id="s-team"
    )
    assert (q.approval_id, q.version) == (p.approval_id, 2)
    leads = (Approver("cy", "support_lead"), Approver("dee", "support_lead"))
    gate.execute(granted(gate, q, leads).token)
    assert shop.receiver.count("email") == 1
    clean(gate)


def test_a_rotated_keyring_audits_the_records_of_both_keys_clean(
    shop_gate: ShopGate, make_gate: MakeGate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records sealed under the first key, the keyring rotated (a new current key, the old one
    kept), more records under the new key, and an erasure: every seal verifies."""
    shop, gate = shop_gate
    gate.execute(granted(gate, proposed(gate, "refund_order", REFUND, "m1")).token)
    waiting = proposed(gate, "refund_order", {**REFUND, "order_id": "1043", "amount": 100}, "m2")
    old = gate.keyring
    fresh = Keyring.generate()
    rotated = Keyring.parse(f"{fresh.dumps()},{old.dumps()}")  # the new key current, the old kept
    gate.close()
    later = make_gate(shop.table(), policy=SHOP_POLICY, keyring=rotated)
    later.execute(granted(later, waiting).token)
    later.execute(
        granted(later, proposed(later, "delete_customer_data", {"customer_id": "u1"}, "m3"), PRIVACY).token
    )
    assert shop.receiver.count("refund") == 2
    clean(later)
    redact(later.store, rotated, user_id="u1", by="dpo", reason="erasure")
    clean(later)
    split_clean(later, monkeypatch)
