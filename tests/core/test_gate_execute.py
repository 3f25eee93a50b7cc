"""Execution: grant tokens at execute time, exactly once, reconciliation, recovery, reclassification."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
from typing import Any

import pytest

from effectgate import (
    Approver,
    Effect,
    EffectGate,
    EffectTable,
    Executed,
    Grant,
    Keyring,
    Pending,
    Reconciled,
    ReconciliationNotice,
    ToolContext,
    ToolSpec,
)
from effectgate.audit import audit
from effectgate.canonical import args_hash, key_of
from effectgate.errors import (
    AlreadyDecided,
    NeedsReconciliation,
    PolicyViolation,
    TokenError,
    UnknownApproval,
)
from effectgate.examples.shop import SHOP_POLICY, Shop, context
from effectgate.stores import SQLStore
from effectgate.testing import EffectRecorder, FakeClock

from .conftest import MakeGate, ShopGate

REFUND = {"order_id": "1042", "amount": 12000, "currency": "GBP"}
FINANCE = Approver("fiona", "finance")


def propose(gate: EffectGate, args: dict[str, Any] = REFUND, message: str = "m3") -> Pending:
    out = gate.call("refund_order", args, context(message))
    assert isinstance(out, Pending), out
    return out


def granted(gate: EffectGate, args: dict[str, Any] = REFUND, message: str = "m3") -> Grant:
    pending = propose(gate, args, message)
    grant = gate.approve(pending.approval_id, version=pending.version, approver=FINANCE)
    assert isinstance(grant, Grant)
    return grant


def token_error(gate: EffectGate, token: str, args: dict[str, Any] | None = None) -> str:
    with pytest.raises(TokenError) as raised:
        gate.execute(token, args)
    return raised.value.reason


def status(store: SQLStore, approval_id: str) -> str:
    row = store.get_approval(approval_id)
    assert row is not None
    return row.status


def exec_key(grant: Grant) -> str:
    return f"eg_{grant.approval_id}_v{grant.version}"


def with_part(token: str, index: int, value: str) -> str:
    parts = token.split(".")
    parts[index] = value
    return ".".join(parts)


@pytest.fixture
def notices() -> list[ReconciliationNotice]:
    return []


@pytest.fixture
def paged(shop_gate: ShopGate, make_gate: MakeGate, notices: list[ReconciliationNotice]) -> EffectGate:
    """The shop's table behind a gate that pages the approver role into `notices`."""
    return make_gate(shop_gate.shop.table(), policy=SHOP_POLICY, on_needs_reconciliation=notices.append)


# -- tokens at execute time


def test_grant_executes_once(shop_gate: ShopGate, store: SQLStore) -> None:
    """A grant runs the refund; the approval is executed and the provider counts one refund."""
    shop, gate = shop_gate
    grant = granted(gate)
    done = gate.execute(grant.token)
    assert (done.approval_id, done.version, done.replay) == (grant.approval_id, 1, False)
    assert shop.receiver.count("refund", order_id="1042") == 1
    assert status(store, grant.approval_id) == "executed"
    assert [e.status for e in store.executions()] == ["succeeded"]


def test_reused_token_is_refused_used(shop_gate: ShopGate, store: SQLStore) -> None:
    """Presenting the grant a second time raises TokenError(used); still one refund, one execution."""
    shop, gate = shop_gate
    grant = granted(gate)
    gate.execute(grant.token)
    assert token_error(gate, grant.token) == "used"
    assert shop.receiver.count("refund") == 1
    assert len(store.executions()) == 1


def test_a_grant_presented_while_its_first_run_settles_is_refused_used(
    shop_gate: ShopGate, store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first run stores its result and marks the approval executed in one commit, but under
    READ COMMITTED that commit can land after a second presentation has read the approval as
    approved and before it reads the run's record: the second reads the status again and is
    refused `used`, not answered with the first run's result."""
    if store.engine.dialect.name == "sqlite":
        pytest.skip("SQLite runs the two transactions one after the other (BEGIN IMMEDIATE)")
    shop, gate = shop_gate
    grant = granted(gate)
    first = gate.flows.execute(grant.token)
    request = next(first)  # claimed and committed: the refund is about to run
    load = store.load
    settled: list[Executed] = []

    def first_settles_then_load(conn: Any, key: str) -> Any:
        if key == exec_key(grant) and not settled:
            with pytest.raises(StopIteration) as done:
                first.send(request.fn(**request.kwargs()))  # its own transaction commits
            settled.append(done.value.value)
        return load(conn, key)

    monkeypatch.setattr(store, "load", first_settles_then_load)
    assert token_error(gate, grant.token) == "used"
    assert [s.replay for s in settled] == [False]
    assert shop.receiver.count("refund") == 1
    assert status(store, grant.approval_id) == "executed"


def test_expired_token_is_refused_expired(shop_gate: ShopGate, store: SQLStore, clock: FakeClock) -> None:
    """Past Policy.token_ttl the grant raises TokenError(expired) and nothing runs."""
    shop, gate = shop_gate
    grant = granted(gate)
    clock.advance(gate.policy.token_ttl + 1)
    assert token_error(gate, grant.token) == "expired"
    assert shop.receiver.count("refund") == 0
    assert status(store, grant.approval_id) == "approved"
    assert store.executions() == []


def test_token_expires_exactly_at_its_deadline(shop_gate: ShopGate, clock: FakeClock) -> None:
    """At exactly grant.expires_at the token is already expired."""
    shop, gate = shop_gate
    grant = granted(gate)
    clock.advance(grant.expires_at - clock.now())
    assert token_error(gate, grant.token) == "expired"
    assert shop.receiver.count("refund") == 0


def test_token_just_before_its_deadline_executes(shop_gate: ShopGate, clock: FakeClock) -> None:
    """One second before the deadline the grant still runs."""
    shop, gate = shop_gate
    grant = granted(gate)
    clock.advance(gate.policy.token_ttl - 1)
    gate.execute(grant.token)
    assert shop.receiver.count("refund") == 1


def test_tampered_mac_is_refused_forged(shop_gate: ShopGate) -> None:
    """Changing one character of the MAC raises TokenError(forged); nothing runs."""
    shop, gate = shop_gate
    grant = granted(gate)
    mac = grant.token.split(".")[-1]
    tampered = with_part(grant.token, 6, ("A" if mac[0] != "A" else "B") + mac[1:])
    assert token_error(gate, tampered) == "forged"
    assert shop.receiver.count("refund") == 0


def test_tampered_expiry_is_refused_forged(shop_gate: ShopGate, clock: FakeClock) -> None:
    """Extending the expiry written in the token breaks its MAC: TokenError(forged)."""
    shop, gate = shop_gate
    grant = granted(gate)
    later = str(int(grant.token.split(".")[4]) + 3_600_000)
    assert token_error(gate, with_part(grant.token, 4, later)) == "forged"
    assert shop.receiver.count("refund") == 0


def test_token_moved_to_another_approval_is_refused(shop_gate: ShopGate) -> None:
    """A grant for 1042 rewritten to name the approval of 1043 does not run either."""
    shop, gate = shop_gate
    grant = granted(gate)
    other = propose(gate, {"order_id": "1043", "amount": 3500, "currency": "GBP"}, "m4")
    gate.approve(other.approval_id, version=1, approver=FINANCE)
    assert token_error(gate, with_part(grant.token, 2, other.approval_id)) == "forged"
    assert shop.receiver.count("refund") == 0


def test_token_signed_with_another_keyring_is_refused_forged(shop_gate: ShopGate, store: SQLStore) -> None:
    """A token minted with another secret under the same key id raises TokenError(forged)."""
    shop, gate = shop_gate
    grant = granted(gate)
    row = store.get_approval(grant.approval_id)
    assert row is not None
    forged = Keyring.generate(gate.keyring.current).mint(
        approval_id=row.id, version=1, args_hash=row.args_hash, expires_at=grant.expires_at
    )
    assert token_error(gate, forged) == "forged"
    assert shop.receiver.count("refund") == 0


def test_token_signed_under_an_unknown_key_id_is_refused(shop_gate: ShopGate, store: SQLStore) -> None:
    """A token naming a key id the keyring does not hold raises TokenError(unknown_key)."""
    shop, gate = shop_gate
    grant = granted(gate)
    row = store.get_approval(grant.approval_id)
    assert row is not None
    forged = Keyring.generate("k-attacker").mint(
        approval_id=row.id, version=1, args_hash=row.args_hash, expires_at=grant.expires_at
    )
    assert token_error(gate, forged) == "keyring_mismatch"
    assert shop.receiver.count("refund") == 0


def test_malformed_token_is_refused(shop_gate: ShopGate) -> None:
    """Something that is not a grant token raises TokenError(malformed)."""
    _, gate = shop_gate
    assert token_error(gate, "not-a-token") == "malformed"


def test_arguments_that_hash_differently_are_refused_mismatch(shop_gate: ShopGate, store: SQLStore) -> None:
    """Re-sent arguments with another amount raise TokenError(mismatch); nothing runs."""
    shop, gate = shop_gate
    grant = granted(gate)
    assert token_error(gate, grant.token, {**REFUND, "amount": 11999}) == "mismatch"
    assert shop.receiver.count("refund") == 0
    assert status(store, grant.approval_id) == "approved"


def test_mismatched_arguments_do_not_consume_the_grant(shop_gate: ShopGate) -> None:
    """After a refused mismatch, the same grant with the frozen arguments still runs once."""
    shop, gate = shop_gate
    grant = granted(gate)
    token_error(gate, grant.token, {**REFUND, "amount": 1})
    gate.execute(grant.token)
    assert shop.receiver.count("refund", amount=12000) == 1


def test_mismatched_arguments_are_recorded(shop_gate: ShopGate, store: SQLStore) -> None:
    """A refused mismatch leaves a token_refused event with the reason and the approval it claimed."""
    _, gate = shop_gate
    grant = granted(gate)
    token_error(gate, grant.token, {**REFUND, "amount": 1})
    [event] = store.events(kind="token_refused")
    assert json.loads(event.detail_json) == {"reason": "mismatch"}
    assert event.approval_id == grant.approval_id


def test_reused_token_is_recorded(shop_gate: ShopGate, store: SQLStore) -> None:
    """A refused second presentation leaves a token_refused event with reason used."""
    _, gate = shop_gate
    grant = granted(gate)
    gate.execute(grant.token)
    token_error(gate, grant.token)
    [event] = store.events(kind="token_refused")
    assert json.loads(event.detail_json)["reason"] == "used"


def test_resent_arguments_in_another_key_order_are_accepted(shop_gate: ShopGate) -> None:
    """The check is on the canonical hash: the same arguments in another order run."""
    shop, gate = shop_gate
    grant = granted(gate)
    gate.execute(grant.token, {"currency": "GBP", "amount": 12000, "order_id": "1042"})
    assert shop.receiver.count("refund") == 1


def test_grant_denied_after_approval_is_refused_revoked(shop_gate: ShopGate, store: SQLStore) -> None:
    """Denied after approval and before execution, the grant raises TokenError(revoked)."""
    shop, gate = shop_gate
    grant = granted(gate)
    gate.deny(grant.approval_id, approver=FINANCE, reason="customer withdrew the request")
    assert token_error(gate, grant.token) == "revoked"
    assert shop.receiver.count("refund") == 0
    assert status(store, grant.approval_id) == "denied"


def test_rotated_keyring_still_executes_an_older_grant(shop_gate: ShopGate, make_gate: MakeGate) -> None:
    """A grant minted under k1 runs on a gate whose keyring now signs with k2 and keeps k1."""
    shop, gate = shop_gate
    grant = granted(gate)
    rotated = Keyring.parse(f"k2:{hashlib.sha256(b'ab').hexdigest()},{gate.keyring.dumps()}")
    assert rotated.current == "k2"
    other = make_gate(gate.table, policy=SHOP_POLICY, keyring=rotated)
    other.execute(grant.token)
    assert shop.receiver.count("refund") == 1


# -- the idempotency key reaches the provider


def test_provider_receives_the_approval_idempotency_key(shop_gate: ShopGate) -> None:
    """The refund reaches the provider with ToolContext.idempotency_key = eg_<approval>_v<version>."""
    shop, gate = shop_gate
    grant = granted(gate)
    done = gate.execute(grant.token)
    [effect] = shop.receiver.effects
    assert effect.idempotency_key == f"eg_{grant.approval_id}_v1"
    assert done.idempotency_key == effect.idempotency_key


def test_amended_version_reaches_the_provider_under_its_version_key(shop_gate: ShopGate) -> None:
    """An approval executed at version 2 passes the key ending _v2."""
    shop, gate = shop_gate
    propose(gate, REFUND, "m3")
    grant = granted(gate, {**REFUND, "amount": 6000}, "m5")
    assert grant.version == 2
    gate.execute(grant.token)
    [effect] = shop.receiver.effects
    assert effect.idempotency_key == f"eg_{grant.approval_id}_v2"


def test_tool_receives_the_tool_context(make_gate: MakeGate) -> None:
    """A tool declaring a ToolContext parameter gets the approval id, version, key and caller."""
    seen: list[ToolContext] = []

    def pay(account: str, amount: int, ctx: ToolContext) -> str:
        seen.append(ctx)
        return "ok"

    table = EffectTable([ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance")])
    table.allow_all("support")
    gate = make_gate(table)
    out = gate.call("pay", {"account": "a1", "amount": 5}, context("m1"))
    assert isinstance(out, Pending)
    grant = gate.approve(out.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    gate.execute(grant.token)
    [tc] = seen
    assert (tc.idempotency_key, tc.approval_id, tc.version, tc.attempt) == (
        f"eg_{out.approval_id}_v1",
        out.approval_id,
        1,
        1,
    )
    assert (tc.call.session_id, tc.call.origin_message_id, tc.call.user_id) == ("s-ada", "m1", "u1")


def test_result_returns_the_stored_result(shop_gate: ShopGate) -> None:
    """gate.result(approval_id) returns the stored result as a replay; None before it ran."""
    _, gate = shop_gate
    grant = granted(gate)
    assert gate.result(grant.approval_id) is None
    done = gate.execute(grant.token)
    stored = gate.result(grant.approval_id)
    assert isinstance(stored, Executed)
    assert stored.replay
    assert stored.result == done.result
    assert stored.idempotency_key == exec_key(grant)


def test_result_of_an_unknown_approval_is_an_error(shop_gate: ShopGate) -> None:
    """gate.result of an id that does not exist raises UnknownApproval."""
    _, gate = shop_gate
    with pytest.raises(UnknownApproval):
        gate.result("nope")


def test_concurrent_executions_of_one_grant_refund_once(shop_gate: ShopGate, store: SQLStore) -> None:
    """Two threads presenting the same grant at once: one runs; the other is refused "used" or, when it
    arrives after the result was stored but before the approval was marked, gets that stored result
    as a replay (the crash-recovery path). Either way the provider sees one refund."""
    shop, gate = shop_gate
    grant = granted(gate)
    barrier = threading.Barrier(2)
    outcomes: list[object] = []
    lock = threading.Lock()

    def present() -> None:
        barrier.wait()
        try:
            result: object = gate.execute(grant.token)
        except TokenError as exc:
            result = exc.reason
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=present) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    ran = [o for o in outcomes if isinstance(o, Executed) and not o.replay]
    other = [o for o in outcomes if o not in ran]
    assert len(ran) == 1
    assert len(other) == 1
    assert other[0] == "used" or (isinstance(other[0], Executed) and other[0].replay)
    assert shop.receiver.count("refund") == 1
    assert len(store.executions()) == 1


# -- an unknown outcome: needs_reconciliation, never a blind retry (conversation 8)


def test_provider_timeout_needs_reconciliation(
    shop_gate: ShopGate, store: SQLStore, paged: EffectGate
) -> None:
    """A timed-out refund raises NeedsReconciliation; the record is needs_reconciliation, not failed."""
    shop = shop_gate.shop
    grant = granted(paged)
    shop.provider.timeouts_to_inject = 1
    with pytest.raises(NeedsReconciliation) as raised:
        paged.execute(grant.token)
    assert raised.value.key == exec_key(grant)
    assert raised.value.provider_ref == "re_1"
    record = store.get(exec_key(grant))
    assert record is not None
    assert record.status == "needs_reconciliation"
    assert status(store, grant.approval_id) == "approved"
    assert [e.status for e in store.executions()] == ["needs_reconciliation"]
    assert shop.receiver.count("refund") == 1


def test_timeout_notifies_the_approver_role(
    shop_gate: ShopGate, paged: EffectGate, notices: list[ReconciliationNotice], store: SQLStore
) -> None:
    """The on_needs_reconciliation hook is called once with role finance and the operation's key."""
    shop = shop_gate.shop
    grant = granted(paged)
    shop.provider.timeouts_to_inject = 1
    with pytest.raises(NeedsReconciliation):
        paged.execute(grant.token)
    [notice] = notices
    assert notice.approver_role == "finance"
    assert (notice.key, notice.tool, notice.approval_id) == (
        exec_key(grant),
        "refund_order",
        grant.approval_id,
    )
    assert notice.provider_ref == "re_1"
    assert [e.approval_id for e in store.events(kind="notified")] == [grant.approval_id]


def test_failing_hook_does_not_break_the_gate(
    shop_gate: ShopGate, store: SQLStore, make_gate: MakeGate
) -> None:
    """A hook that raises is recorded as notify_failed; the caller still gets NeedsReconciliation."""
    shop = shop_gate.shop

    def broken(notice: ReconciliationNotice) -> None:
        raise RuntimeError("pager is down")

    gate = make_gate(shop.table(), policy=SHOP_POLICY, on_needs_reconciliation=broken)
    grant = granted(gate)
    shop.provider.timeouts_to_inject = 1
    with pytest.raises(NeedsReconciliation):
        gate.execute(grant.token)
    [event] = store.events(kind="notify_failed")
    assert event.approval_id == grant.approval_id
    assert "pager is down" in event.detail_json
    record = store.get(exec_key(grant))
    assert record is not None
    assert record.status == "needs_reconciliation"


def test_grant_after_a_timeout_is_not_retried_blindly(shop_gate: ShopGate, paged: EffectGate) -> None:
    """Presenting the grant again after a timeout raises NeedsReconciliation and refunds nothing more."""
    shop = shop_gate.shop
    grant = granted(paged)
    shop.provider.timeouts_to_inject = 1
    with pytest.raises(NeedsReconciliation):
        paged.execute(grant.token)
    with pytest.raises(NeedsReconciliation):
        paged.execute(grant.token)
    assert shop.receiver.count("refund") == 1
    assert len(shop.provider.refunds) == 1


def test_grant_presented_cannot_be_denied_mid_execution(
    shop_gate: ShopGate, store: SQLStore, paged: EffectGate
) -> None:
    """Once the grant was presented (here: it timed out), a denial raises AlreadyDecided."""
    shop = shop_gate.shop
    grant = granted(paged)
    shop.provider.timeouts_to_inject = 1
    with pytest.raises(NeedsReconciliation):
        paged.execute(grant.token)
    with pytest.raises(AlreadyDecided):
        paged.deny(grant.approval_id, approver=FINANCE, reason="too late")
    assert status(store, grant.approval_id) == "approved"


def test_reconcile_settles_with_exactly_one_refund(
    shop_gate: ShopGate, store: SQLStore, paged: EffectGate
) -> None:
    """reconcile finds the refund at the provider by key: executed, one refund, the provider's result."""
    shop = shop_gate.shop
    grant = granted(paged)
    shop.provider.timeouts_to_inject = 1
    with pytest.raises(NeedsReconciliation):
        paged.execute(grant.token)
    settled = paged.reconcile(grant.approval_id)
    assert isinstance(settled, Executed)
    assert settled.result["refund_id"] == "re_1"
    assert shop.receiver.count("refund", order_id="1042") == 1
    assert status(store, grant.approval_id) == "executed"
    record = store.get(exec_key(grant))
    assert record is not None
    assert (record.status, record.provider_ref) == ("succeeded", "re_1")
    assert [e.status for e in store.executions()] == ["needs_reconciliation", "succeeded"]
    stored = paged.result(grant.approval_id)
    assert stored is not None
    assert stored.result == settled.result
    assert paged.audit().clean


def test_reconciled_grant_cannot_run_again(shop_gate: ShopGate, paged: EffectGate) -> None:
    """After reconciliation the grant is used."""
    shop = shop_gate.shop
    grant = granted(paged)
    shop.provider.timeouts_to_inject = 1
    with pytest.raises(NeedsReconciliation):
        paged.execute(grant.token)
    paged.reconcile(grant.approval_id)
    assert token_error(paged, grant.token) == "used"
    assert shop.receiver.count("refund") == 1


def test_reconcile_of_a_settled_approval_is_refused(shop_gate: ShopGate) -> None:
    """An approval that is not awaiting reconciliation cannot be reconciled."""
    _, gate = shop_gate
    grant = granted(gate)
    gate.execute(grant.token)
    with pytest.raises(PolicyViolation) as raised:
        gate.reconcile(grant.approval_id)
    assert raised.value.code == "not_reconcilable"


class Bank:
    """A provider whose request can be lost before it arrives (the effect did not happen)."""

    def __init__(self) -> None:
        self.receiver = EffectRecorder()
        self.applied: dict[str, dict[str, Any]] = {}
        self.drop_next = 0
        self.cannot_tell = False
        self.attempts: list[int] = []

    def pay(self, account: str, amount: int, tool_context: ToolContext) -> dict[str, Any]:
        """Pay an account."""
        self.attempts.append(tool_context.attempt)
        if self.drop_next:
            self.drop_next -= 1
            raise TimeoutError("connection reset before the request was sent")
        key = tool_context.idempotency_key
        if key not in self.applied:
            self.applied[key] = {"account": account, "amount": amount, "ref": f"p{len(self.applied) + 1}"}
            self.receiver.record("pay", idempotency_key=key, account=account)
        return self.applied[key]

    def lookup(self, key: str) -> Reconciled | None:
        if self.cannot_tell:
            return None
        if key in self.applied:
            return Reconciled(found=True, result=self.applied[key], provider_ref=self.applied[key]["ref"])
        return Reconciled(found=False)

    def table(self, *, reconcile: bool = True) -> EffectTable:
        table = EffectTable(
            [
                ToolSpec(
                    name="pay",
                    effect=Effect.MONEY,
                    fn=self.pay,
                    approver_role="finance",
                    subject=("account",),
                    reconcile=self.lookup if reconcile else None,
                )
            ]
        )
        table.allow_all("support")
        return table


def bank_grant(gate: EffectGate, message: str = "m1") -> Grant:
    out = gate.call("pay", {"account": "a1", "amount": 500}, context(message))
    assert isinstance(out, Pending)
    grant = gate.approve(out.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    return grant


def test_reconcile_not_found_runs_again_with_the_same_key(store: SQLStore, make_gate: MakeGate) -> None:
    """When the provider never saw the key, reconcile runs the call again under the same key, once."""
    bank = Bank()
    gate = make_gate(bank.table())
    grant = bank_grant(gate)
    bank.drop_next = 1
    with pytest.raises(NeedsReconciliation):
        gate.execute(grant.token)
    done = gate.reconcile(grant.approval_id)
    assert isinstance(done, Executed)
    assert bank.receiver.count("pay") == 1
    assert [e.idempotency_key for e in bank.receiver.effects] == [exec_key(grant)]
    assert bank.attempts == [1, 2]
    assert status(store, grant.approval_id) == "executed"


def test_reconcile_that_cannot_tell_leaves_the_record(store: SQLStore, make_gate: MakeGate) -> None:
    """A reconcile hook answering None settles nothing: still needs_reconciliation, nothing ran."""
    bank = Bank()
    gate = make_gate(bank.table())
    grant = bank_grant(gate)
    bank.drop_next = 1
    with pytest.raises(NeedsReconciliation):
        gate.execute(grant.token)
    bank.cannot_tell = True
    assert gate.reconcile(grant.approval_id) is None
    record = store.get(exec_key(grant))
    assert record is not None
    assert record.status == "needs_reconciliation"
    assert bank.receiver.count("pay") == 0


def test_settled_as_not_happened_ends_the_approval_failed(store: SQLStore, make_gate: MakeGate) -> None:
    """A person settling 'did not happen' is a definite failure: the approval ends `failed`, the
    spent grant never runs it again, and a new message proposes afresh (the subject is free)."""
    bank = Bank()
    gate = make_gate(bank.table(reconcile=False))
    grant = bank_grant(gate)
    bank.drop_next = 1
    with pytest.raises(NeedsReconciliation):
        gate.execute(grant.token)
    assert gate.settle(grant.approval_id, happened=False, by="fiona") is None
    assert status(store, grant.approval_id) == "failed"
    assert token_error(gate, grant.token) == "used"
    assert bank.receiver.count("pay") == 0
    again = bank_grant(gate, message="m-again")
    assert again.approval_id != grant.approval_id
    gate.execute(again.token)
    assert bank.receiver.count("pay") == 1


def test_settled_as_happened_completes_without_running(store: SQLStore, make_gate: MakeGate) -> None:
    """A person settling 'it happened' records the result; the tool is not called again."""
    bank = Bank()
    gate = make_gate(bank.table(reconcile=False))
    grant = bank_grant(gate)
    bank.drop_next = 1
    with pytest.raises(NeedsReconciliation):
        gate.execute(grant.token)
    done = gate.settle(grant.approval_id, happened=True, result={"ref": "manual"}, by="fiona")
    assert isinstance(done, Executed)
    assert done.result == {"ref": "manual"}
    assert bank.attempts == [1]
    assert status(store, grant.approval_id) == "executed"
    assert token_error(gate, grant.token) == "used"


class Vault:
    """A money tool whose before-snapshot fails the first time."""

    def __init__(self) -> None:
        self.receiver = EffectRecorder()
        self.snapshot_failures = 1

    def withdraw(self, account: str, amount: int) -> dict[str, Any]:
        """Withdraw from an account."""
        self.receiver.record("withdraw", account=account, amount=amount)
        return {"account": account, "amount": amount}

    def balance(self, args: Any) -> int:
        if self.snapshot_failures:
            self.snapshot_failures -= 1
            raise ConnectionError("ledger unavailable")
        return 1000


def test_failed_snapshot_before_execution_ends_the_approval_failed(
    store: SQLStore, make_gate: MakeGate
) -> None:
    """A snapshot error before the tool runs is a definite failure: nothing ran, the approval ends
    `failed` with the reason on its card, the grant is spent, and a new proposal runs once."""
    vault = Vault()
    spec = ToolSpec(
        name="withdraw",
        effect=Effect.MONEY,
        fn=vault.withdraw,
        approver_role="finance",
        snapshot=vault.balance,
    )
    table = EffectTable([spec])
    table.allow_all("support")
    gate = make_gate(table)
    out = gate.call("withdraw", {"account": "a1", "amount": 5}, context("m1"))
    assert isinstance(out, Pending)
    grant = gate.approve(out.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    with pytest.raises(ConnectionError):
        gate.execute(grant.token)
    record = store.get(exec_key(grant))
    assert record is not None
    assert record.status == "failed"
    assert status(store, grant.approval_id) == "failed"
    assert "ledger unavailable" in (gate.card(grant.approval_id).reason or "")
    assert token_error(gate, grant.token) == "used"
    assert vault.receiver.count("withdraw") == 0
    again = gate.call("withdraw", {"account": "a1", "amount": 5}, context("m2"))
    assert isinstance(again, Pending)
    assert again.approval_id != out.approval_id
    second = gate.approve(again.approval_id, version=1, approver=FINANCE)
    assert isinstance(second, Grant)
    gate.execute(second.token)
    assert vault.receiver.count("withdraw") == 1


# -- recovery after a crash


def crash_after_claim(gate: EffectGate, store: SQLStore, clock: FakeClock, grant: Grant) -> str:
    """A worker claimed the key and died: its lease runs out."""
    row = store.get_approval(grant.approval_id)
    assert row is not None
    key = exec_key(grant)
    store.claim(key, row.args_hash, lease_seconds=gate.policy.lease_seconds)
    clock.advance(gate.policy.lease_seconds + 1)
    return key


def test_recover_reconciles_a_crashed_execution(
    shop_gate: ShopGate,
    store: SQLStore,
    clock: FakeClock,
    paged: EffectGate,
    notices: list[ReconciliationNotice],
) -> None:
    """recover() marks the expired in-flight record needs_reconciliation, pages finance and reconciles it."""
    shop = shop_gate.shop
    grant = granted(paged)
    key = crash_after_claim(paged, store, clock, grant)
    assert paged.recover() == [key]
    assert [e.approval_id for e in store.events(kind="needs_reconciliation")] == [grant.approval_id]
    [notice] = notices
    assert (notice.key, notice.approver_role) == (key, "finance")
    assert shop.receiver.count("refund", order_id="1042") == 1
    record = store.get(key)
    assert record is not None
    assert record.status == "succeeded"
    assert status(store, grant.approval_id) == "executed"


def test_recover_finds_an_effect_that_happened_before_the_crash(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock, paged: EffectGate
) -> None:
    """If the provider applied the refund before the worker died, recover settles it without a second."""
    shop = shop_gate.shop
    grant = granted(paged)
    key = crash_after_claim(paged, store, clock, grant)
    shop.provider.refund(key=key, order_id="1042", amount=12000, currency="GBP")
    paged.recover()
    assert shop.receiver.count("refund", order_id="1042") == 1
    stored = paged.result(grant.approval_id)
    assert stored is not None
    assert stored.result["refund_id"] == "re_1"


def test_recover_leaves_live_leases_alone(shop_gate: ShopGate, store: SQLStore, clock: FakeClock) -> None:
    """A record whose lease has not expired is not touched."""
    _, gate = shop_gate
    grant = granted(gate)
    row = store.get_approval(grant.approval_id)
    assert row is not None
    store.claim(exec_key(grant), row.args_hash, lease_seconds=gate.policy.lease_seconds)
    clock.advance(gate.policy.lease_seconds - 1)
    assert gate.recover() == []
    record = store.get(exec_key(grant))
    assert record is not None
    assert record.status == "in_progress"


def test_recover_without_a_reconcile_hook_waits_for_a_person(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock
) -> None:
    """A crashed email (no reconcile hook) stays needs_reconciliation after recover; nothing is sent."""
    shop, gate = shop_gate
    out = gate.call("send_email", {"to": ["ada@example.com"], "subject": "Hi", "body": "x"}, context("m1"))
    assert isinstance(out, Pending)
    grant = gate.approve(out.approval_id, version=1, approver=Approver("sam", "support_lead"))
    assert isinstance(grant, Grant)
    key = crash_after_claim(gate, store, clock, grant)
    assert gate.recover() == [key]
    record = store.get(key)
    assert record is not None
    assert record.status == "needs_reconciliation"
    assert shop.receiver.count("email") == 0
    assert status(store, out.approval_id) == "approved"


def test_recover_names_the_tool_of_a_crashed_write(
    shop_gate: ShopGate,
    store: SQLStore,
    clock: FakeClock,
    paged: EffectGate,
    notices: list[ReconciliationNotice],
) -> None:
    """The notice for a crashed write says which tool the operation belongs to."""
    args = {"ticket_id": "t-17", "tags": ["urgent"]}
    call = context("m2")
    key = "w_update_ticket_tags_" + key_of(
        "write",
        call.session_id,
        "update_ticket_tags",
        call.origin_message_id,
        args_hash("update_ticket_tags", args),
    )
    store.claim(key, args_hash("update_ticket_tags", args), lease_seconds=paged.policy.lease_seconds)
    clock.advance(paged.policy.lease_seconds + 1)
    assert paged.recover() == [key]
    [notice] = notices
    assert notice.tool == "update_ticket_tags"


def test_execute_after_a_crash_is_not_rerun_blindly(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock
) -> None:
    """Presenting the grant after the crashed worker's lease expired raises NeedsReconciliation."""
    shop, gate = shop_gate
    grant = granted(gate)
    crash_after_claim(gate, store, clock, grant)
    with pytest.raises(NeedsReconciliation):
        gate.execute(grant.token)
    assert shop.receiver.count("refund") == 0


# -- reclassification between approval and execution, and the audit (conversation 10)


def reclassified_gate(gate: EffectGate, make_gate: MakeGate, **changes: Any) -> EffectGate:
    """A second gate on the same store whose refund_order row was changed."""
    spec = gate.table["refund_order"]
    table = gate.table.replace(dataclasses.replace(spec, **changes))
    return make_gate(table, policy=SHOP_POLICY, keyring=gate.keyring)


def test_execute_after_reclassification_is_refused(
    shop_gate: ShopGate, store: SQLStore, make_gate: MakeGate
) -> None:
    """A grant issued under the old row is refused with PolicyViolation(reclassified); nothing runs."""
    shop, gate = shop_gate
    grant = granted(gate)
    changed = reclassified_gate(gate, make_gate, approver_role="finance_lead")
    with pytest.raises(PolicyViolation) as raised:
        changed.execute(grant.token)
    assert raised.value.code == "reclassified"
    assert shop.receiver.count("refund") == 0
    assert status(store, grant.approval_id) == "approved"
    assert store.executions() == []


def test_approval_after_reclassification_is_refused(
    shop_gate: ShopGate, store: SQLStore, make_gate: MakeGate
) -> None:
    """An approval proposed under the old row cannot be approved under the new one."""
    _, gate = shop_gate
    pending = propose(gate)
    changed = reclassified_gate(gate, make_gate, owner="treasury")
    with pytest.raises(PolicyViolation) as raised:
        changed.approve(pending.approval_id, version=1, approver=FINANCE)
    assert raised.value.code == "reclassified"
    assert status(store, pending.approval_id) == "pending"


def test_audit_is_clean_after_the_flow(shop_gate: ShopGate) -> None:
    """After reads, writes and approved gated calls, the audit finds nothing."""
    _, gate = shop_gate
    gate.call("get_order", {"order_id": "1042"}, context("m1"))
    gate.call("update_ticket_tags", {"ticket_id": "t-17", "tags": ["urgent"]}, context("m2"))
    gate.execute(granted(gate).token)
    report = gate.audit()
    assert report.clean
    assert report.metrics is not None
    assert report.metrics.executions == 2


def test_audit_against_a_reclassified_table_reports_it(shop_gate: ShopGate) -> None:
    """With refund_order reclassified as a write, the audit reports a reclassified finding for it."""
    _, gate = shop_gate
    gate.execute(granted(gate).token)
    spec = gate.table["refund_order"]
    table = gate.table.replace(dataclasses.replace(spec, effect=Effect.WRITE, approver_role=None))
    findings = gate.audit(table=table).findings
    assert [(f.kind, f.tool) for f in findings] == [("reclassified", "refund_order")]
    assert gate.audit().clean


def test_audit_reports_an_approved_call_whose_tool_changed_since(
    shop_gate: ShopGate, store: SQLStore, make_gate: MakeGate
) -> None:
    """A granted refund that has not run, whose row changed afterwards, is reported: against the
    changed table, and from the records alone once a call under the new row recorded it."""
    _, gate = shop_gate
    grant = granted(gate)
    changed = reclassified_gate(gate, make_gate, approver_role="finance_lead")
    findings = gate.audit(table=changed.table).findings
    assert [(f.kind, f.approval_id) for f in findings] == [("reclassified", grant.approval_id)]
    assert gate.audit().clean  # nothing recorded says the tool changed yet
    changed.call("refund_order", {**REFUND, "order_id": "2001"}, context("m9"))  # records the new row
    findings = audit(store, keyring=gate.keyring).findings
    assert [(f.kind, f.approval_id) for f in findings] == [("reclassified", grant.approval_id)]


def test_audit_reports_a_write_that_is_now_gated(shop_gate: ShopGate) -> None:
    """A tag update that ran ungated is reported once the table says it needs a person."""
    _, gate = shop_gate
    gate.call("update_ticket_tags", {"ticket_id": "t-17", "tags": ["urgent"]}, context("m2"))
    spec = gate.table["update_ticket_tags"]
    table = gate.table.replace(dataclasses.replace(spec, effect=Effect.MONEY, approver_role="finance"))
    findings = gate.audit(table=table).findings
    assert [(f.kind, f.tool) for f in findings] == [("reclassified", "update_ticket_tags")]


def test_fresh_shop_table_is_not_a_reclassification(shop_gate: ShopGate, make_gate: MakeGate) -> None:
    """A gate rebuilt from a new Shop (a restart) executes grants of the old one: same fingerprints."""
    shop, gate = shop_gate
    grant = granted(gate)
    fresh = Shop()
    restarted = make_gate(fresh.table(), policy=SHOP_POLICY, keyring=gate.keyring)
    restarted.execute(grant.token)
    assert fresh.receiver.count("refund") == 1
    assert shop.receiver.count("refund") == 0
    assert restarted.audit(table=Shop().table()).clean
