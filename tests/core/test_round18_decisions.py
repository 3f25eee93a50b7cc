"""Round 18 review of decisions (approve, grant again, deny, mint) and grant tokens: probes on
SQLite and PostgreSQL (the `store` fixture family)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import (
    Approver,
    Effect,
    EffectGate,
    EffectTable,
    Grant,
    Keyring,
    PartialApproval,
    Pending,
    ToolSpec,
)
from effectgate.errors import (
    AlreadyDecided,
    ApprovalExpired,
    EffectGateError,
    StaleApproval,
    TamperedRecord,
    TokenError,
    WrongApprover,
)
from effectgate.examples.shop import context
from effectgate.stores import SQLStore, _dialect
from effectgate.testing import EffectRecorder, FakeClock

from ._bank import FINANCE, Bank, pay_grant, status
from .conftest import MakeGate, ShopGate

PIA, PAT = Approver("pia", "privacy"), Approver("pat", "privacy")
_COLS = "approval_id, version, grant_round, approver_id, role, decision, reason, at, seal"


def _race(**calls: Any) -> dict[str, Any]:
    """Run each call on its own thread, released together by a Barrier; each one's result or
    EffectGateError, by name."""
    barrier = threading.Barrier(len(calls))
    got: dict[str, Any] = {}

    def run(name: str, call: Any) -> None:
        barrier.wait()
        try:
            got[name] = call()
        except EffectGateError as exc:
            got[name] = exc

    threads = [threading.Thread(target=run, args=item) for item in calls.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got


def _delete(gate: EffectGate, message: str = "m1") -> Pending:
    out = gate.call("delete_customer_data", {"customer_id": "u1"}, context(message))
    assert isinstance(out, Pending), out
    return out


def _sql(store: SQLStore, text: str, **params: Any) -> None:
    with store.engine.begin() as conn:
        conn.execute(sa.text(text), params)


def test_an_approver_of_the_first_round_counts_once_in_the_regrant_round(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock
) -> None:
    """A destructive grant lapsed unpresented; its fresh grant needs two distinct approvers of
    its own round: pia alone (twice) never grants it, the old token stays dead, the new one runs once."""
    shop, gate = shop_gate
    out = _delete(gate)
    assert isinstance(gate.approve(out.approval_id, version=1, approver=PIA), PartialApproval)
    old = gate.approve(out.approval_id, version=1, approver=PAT)
    assert isinstance(old, Grant)
    clock.advance(gate.policy.token_ttl + 1)
    assert isinstance(gate.approve(out.approval_id, version=1, approver=PIA), PartialApproval)
    with pytest.raises(WrongApprover):
        gate.approve(out.approval_id, version=1, approver=PIA)
    new = gate.approve(out.approval_id, version=1, approver=PAT)
    assert isinstance(new, Grant)
    with pytest.raises(TokenError):
        gate.execute(old.token)
    gate.execute(new.token)
    with pytest.raises(TokenError):
        gate.execute(new.token)
    with pytest.raises(TokenError):
        gate.execute(old.token)
    assert shop.receiver.count("delete") == 1


def test_a_lapsed_grant_token_is_dead_even_with_its_expiry_column_extended(
    store: SQLStore, make_gate: MakeGate, clock: FakeClock
) -> None:
    """After a regrant, the old token's expiry signed in it has passed: extending the stored
    expiry (unsealed) revives neither token beyond the one new grant."""
    bank = Bank()
    gate = make_gate(bank.table())
    old = pay_grant(gate)
    clock.advance(gate.policy.token_ttl + 1)
    new = gate.approve(old.approval_id, version=1, approver=Approver("fred", "finance"))
    assert isinstance(new, Grant)
    _sql(
        store,
        "UPDATE eg_approvals SET token_expires_at = :t WHERE id = :id",
        t=clock.now() + 9999,
        id=old.approval_id,
    )
    with pytest.raises(TokenError):
        gate.execute(old.token)
    gate.execute(new.token)
    assert bank.receiver.count("pay") == 1


def test_key_rotation_between_approve_and_execute(store: SQLStore, make_gate: MakeGate) -> None:
    """A grant minted under key A runs after rotation to B (A kept); with A retired it is refused
    as unknown_key and nothing runs; a new grant is needed."""
    bank = Bank()
    a = Keyring.generate("ka")
    gate = make_gate(bank.table(), keyring=a)
    grant = pay_grant(gate)
    b = Keyring.generate("kb")
    retired = make_gate(bank.table(), keyring=b)
    with pytest.raises(EffectGateError):
        retired.execute(grant.token)
    assert bank.receiver.count("pay") == 0
    rotated = make_gate(bank.table(), keyring=_rotated(a, b))
    rotated.execute(grant.token)
    with pytest.raises(TokenError):
        rotated.execute(grant.token)
    assert bank.receiver.count("pay") == 1


def _wipe_table(recorder: EffectRecorder) -> EffectTable:
    def wipe(account: str, scope: str) -> dict[str, str]:
        """Wipe an account's data."""
        recorder.record("wipe", account=account, scope=scope)
        return {"account": account}

    table = EffectTable(
        [
            ToolSpec(
                name="wipe", effect=Effect.DESTRUCTIVE, fn=wipe, approver_role="privacy", subject=("account",)
            )
        ]
    )
    table.allow_all("support")
    return table


def test_an_approval_of_version_1_does_not_count_for_version_2(store: SQLStore, make_gate: MakeGate) -> None:
    """pia approves version 1 of a destructive call; a new message amends it to version 2 (wider
    scope). pat's approval of version 1 is stale, and pat alone never grants version 2."""
    recorder = EffectRecorder()
    gate = make_gate(_wipe_table(recorder))
    out = gate.call("wipe", {"account": "a1", "scope": "logs"}, context("m1"))
    assert isinstance(out, Pending)
    assert isinstance(gate.approve(out.approval_id, version=1, approver=PIA), PartialApproval)
    again = gate.call("wipe", {"account": "a1", "scope": "everything"}, context("m2"))
    assert isinstance(again, Pending)
    assert (again.approval_id, again.version) == (out.approval_id, 2)
    with pytest.raises(StaleApproval):
        gate.approve(out.approval_id, version=1, approver=PAT)
    assert isinstance(gate.approve(out.approval_id, version=2, approver=PAT), PartialApproval)
    grant = gate.approve(out.approval_id, version=2, approver=PIA)
    assert isinstance(grant, Grant)
    gate.execute(grant.token)
    assert recorder.count("wipe", account="a1", scope="everything") == recorder.count("wipe") == 1


def test_a_role_the_policy_does_not_grant_cannot_decide(shop_gate: ShopGate, store: SQLStore) -> None:
    """The table row decides the role: finance_lead may approve for finance (role_grants), but
    finance may not approve a call escalated to finance_lead, nor privacy a refund."""
    _, gate = shop_gate
    out = gate.call("refund_order", {"order_id": "1042", "amount": 500, "currency": "GBP"}, context("m1"))
    assert isinstance(out, Pending), out
    with pytest.raises(WrongApprover):
        gate.approve(out.approval_id, version=1, approver=Approver("pia", "privacy"))
    with pytest.raises(WrongApprover):
        gate.deny(out.approval_id, approver=Approver("pia", "privacy"), reason="no")
    assert isinstance(
        gate.approve(out.approval_id, version=1, approver=Approver("lea", "finance_lead")), Grant
    )


def test_an_edited_approver_role_column_is_refused(shop_gate: ShopGate, store: SQLStore) -> None:
    _, gate = shop_gate
    out = _delete(gate)
    _sql(
        store,
        "UPDATE eg_approvals SET approver_role = 'support', approvals_required = 1 WHERE id = :id",
        id=out.approval_id,
    )
    with pytest.raises(TamperedRecord):
        gate.approve(out.approval_id, version=1, approver=Approver("sam", "support"))
    assert status(store, out.approval_id) == "pending"


def test_decisions_copied_into_the_regrant_round_do_not_count(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock
) -> None:
    """The first round's sealed decisions, inserted again as decisions of the regrant round (or
    under another approver id), do not verify: one approver of the new round grants nothing."""
    shop, gate = shop_gate
    out = _delete(gate)
    gate.approve(out.approval_id, version=1, approver=PIA)
    first = gate.approve(out.approval_id, version=1, approver=PAT)
    assert isinstance(first, Grant)
    clock.advance(gate.policy.token_ttl + 1)
    _sql(
        store,
        f"INSERT INTO eg_decisions ({_COLS}) "
        "SELECT approval_id, version, 1, approver_id, role, decision, reason, at, seal FROM eg_decisions "
        "WHERE approval_id = :id",
        id=out.approval_id,
    )
    _sql(
        store,
        f"INSERT INTO eg_decisions ({_COLS}) "
        "SELECT approval_id, version, grant_round, 'zed', role, decision, reason, at, seal FROM eg_decisions "
        "WHERE approval_id = :id AND approver_id = 'pia' AND grant_round = 0",
        id=out.approval_id,
    )
    assert isinstance(
        gate.approve(out.approval_id, version=1, approver=Approver("sam", "privacy")), PartialApproval
    )
    with pytest.raises(TokenError):
        gate.execute(first.token)
    assert shop.receiver.count("delete") == 0


def test_tokens_with_extra_or_missing_fields(store: SQLStore, make_gate: MakeGate) -> None:
    """A grant with a field added, dropped or emptied, a trailing newline or another case is
    refused as a TokenError and runs nothing; the genuine one then runs once."""
    bank = Bank()
    gate = make_gate(bank.table())
    token = pay_grant(gate).token
    head = token.rpartition(".")[0]
    for bad in (token + ".x", head, token.replace(".", "..", 1), "", token + "\n", token.upper(), head + "."):
        with pytest.raises(TokenError):
            gate.execute(bad)
    assert bank.receiver.count("pay") == 0
    gate.execute(token)
    assert bank.receiver.count("pay") == 1


def test_self_approval_refused(shop_gate: ShopGate, store: SQLStore) -> None:
    _, gate = shop_gate
    out = gate.call("refund_order", {"order_id": "1042", "amount": 500, "currency": "GBP"}, context("m1"))
    assert isinstance(out, Pending)
    with pytest.raises(WrongApprover):
        gate.approve(out.approval_id, version=1, approver=Approver("u1", "finance"))
    assert status(store, out.approval_id) == "pending"


def test_approve_racing_deny(store: SQLStore, make_gate: MakeGate) -> None:
    """Approve and deny at once (a Barrier): whichever wins, a denied call never runs, and a
    grant runs at most once."""
    bank = Bank()
    gate = make_gate(bank.table())
    for n in range(4):
        out = gate.call("pay", {"account": f"a{n}", "amount": 500}, context(f"m{n}"))
        assert isinstance(out, Pending)
        approval_id = out.approval_id
        got = _race(
            approve=lambda: gate.approve(approval_id, version=1, approver=FINANCE),  # noqa: B023
            deny=lambda: gate.deny(approval_id, approver=Approver("fay", "finance"), reason="no"),  # noqa: B023
        )
        grant = got["approve"]
        if isinstance(grant, Grant):
            with pytest.raises(TokenError):  # the denial came after the grant: it revoked it
                gate.execute(grant.token)
        else:
            assert isinstance(grant, AlreadyDecided), grant
        assert status(store, approval_id) == "denied"
    assert bank.receiver.count("pay") == 0


def test_approve_after_expiry(shop_gate: ShopGate, store: SQLStore, clock: FakeClock) -> None:
    _, gate = shop_gate
    out = _delete(gate)
    gate.approve(out.approval_id, version=1, approver=PIA)
    clock.advance(10**7)
    with pytest.raises(ApprovalExpired):
        gate.approve(out.approval_id, version=1, approver=PAT)
    with pytest.raises((ApprovalExpired, AlreadyDecided)):
        gate.deny(out.approval_id, approver=PAT, reason="late")


def test_deny_after_grant_then_execute(store: SQLStore, make_gate: MakeGate) -> None:
    bank = Bank()
    gate = make_gate(bank.table())
    grant = pay_grant(gate)
    gate.deny(grant.approval_id, approver=FINANCE, reason="changed my mind")
    _sql(store, "UPDATE eg_approvals SET status = 'approved' WHERE id = :id", id=grant.approval_id)
    with pytest.raises(TokenError):
        gate.execute(grant.token)
    with pytest.raises(AlreadyDecided):
        gate.approve(grant.approval_id, version=1, approver=Approver("fred", "finance"))
    assert bank.receiver.count("pay") == 0


def test_finance_cannot_approve_a_refund_escalated_to_finance_lead(
    shop_gate: ShopGate, store: SQLStore
) -> None:
    shop, gate = shop_gate
    shop.orders["1042"]["total"] = 10**7
    out = gate.call("refund_order", {"order_id": "1042", "amount": 200000, "currency": "GBP"}, context("m1"))
    assert isinstance(out, Pending), out
    with pytest.raises(WrongApprover):
        gate.approve(out.approval_id, version=1, approver=FINANCE)
    assert isinstance(
        gate.approve(out.approval_id, version=1, approver=Approver("lea", "finance_lead")), Grant
    )


def test_approve_at_the_deadline_is_expired(shop_gate: ShopGate, store: SQLStore, clock: FakeClock) -> None:
    """Approve exactly at the approval's deadline: expired, marked so, nothing granted."""
    _, gate = shop_gate
    out = _delete(gate)
    gate.approve(out.approval_id, version=1, approver=PIA)
    clock.advance(out.card.expires_at - clock.now())
    with pytest.raises(ApprovalExpired):
        gate.approve(out.approval_id, version=1, approver=PAT)
    assert status(store, out.approval_id) == "expired"


@pytest.mark.parametrize("rounds", [6])
def test_approve_racing_amend(store: SQLStore, make_gate: MakeGate, rounds: int) -> None:
    """pat approves version 1 (pia approved it before) while a new message amends the call to
    version 2: whatever wins, no grant runs arguments fewer than two people approved."""
    recorder = EffectRecorder()
    gate = make_gate(_wipe_table(recorder))
    for n in range(rounds):
        account = f"a{n}"
        out = gate.call("wipe", {"account": account, "scope": "logs"}, context(f"m{n}"))
        assert isinstance(out, Pending)
        gate.approve(out.approval_id, version=1, approver=PIA)
        got = _race(
            approve=lambda: gate.approve(out.approval_id, version=1, approver=PAT),  # noqa: B023
            amend=lambda: gate.call(
                "wipe",
                {"account": account, "scope": "everything"},  # noqa: B023
                context(f"x{n}"),  # noqa: B023
            ),
        )
        grant = got["approve"]
        if isinstance(grant, Grant):
            assert grant.version == 1
            gate.execute(grant.token)
        else:
            assert isinstance(grant, StaleApproval), grant
            amended = got["amend"]
            assert isinstance(amended, Pending)
            assert amended.version == 2
            assert isinstance(gate.approve(out.approval_id, version=2, approver=PAT), PartialApproval)
    wiped = [e.payload["scope"] for e in recorder.effects if e.kind == "wipe"]
    assert wiped == ["logs"] * len(wiped)


def _rotated(old: Keyring, new: Keyring, *, keep_old: bool = True) -> Keyring:
    keys = {**new._keys, **(old._keys if keep_old else {})}
    return Keyring(keys, current=new.current)


def test_destructive_rotated_between_the_two_approvals_then_old_key_retired(
    store: SQLStore, make_gate: MakeGate
) -> None:
    """pia approves under key A; the keyring rotates to B (A kept); pat approves: a grant under
    B. It runs under the rotated keyring; with A retired too early it is refused as
    keyring_mismatch (never tampered) and nothing runs."""
    recorder = EffectRecorder()
    a, b = Keyring.generate("ka"), Keyring.generate("kb")
    gate_a = make_gate(_wipe_table(recorder), keyring=a)
    out = gate_a.call("wipe", {"account": "a1", "scope": "logs"}, context("m1"))
    assert isinstance(out, Pending)
    gate_a.approve(out.approval_id, version=1, approver=PIA)
    gate_ab = make_gate(_wipe_table(recorder), keyring=_rotated(a, b))
    grant = gate_ab.approve(out.approval_id, version=1, approver=PAT)
    assert isinstance(grant, Grant)
    gate_b = make_gate(_wipe_table(recorder), keyring=b)
    with pytest.raises(TokenError) as info:
        gate_b.execute(grant.token)
    assert info.value.reason == "keyring_mismatch", info.value
    assert recorder.count("wipe") == 0
    gate_ab.execute(grant.token)
    assert recorder.count("wipe") == 1


def test_grant_under_a_retired_key_is_a_keyring_mismatch(store: SQLStore, make_gate: MakeGate) -> None:
    bank = Bank()
    a, b = Keyring.generate("ka"), Keyring.generate("kb")
    grant = pay_grant(make_gate(bank.table(), keyring=a))
    with pytest.raises(TokenError) as info:
        make_gate(bank.table(), keyring=b).execute(grant.token)
    assert info.value.reason == "keyring_mismatch"
    with pytest.raises(TokenError) as info:
        make_gate(bank.table(), keyring=_rotated(b, Keyring.generate("kc"))).execute(grant.token)
    assert info.value.reason == "keyring_mismatch"
    assert bank.receiver.count("pay") == 0


def test_approve_racing_expiry(shop_gate: ShopGate, store: SQLStore, clock: FakeClock) -> None:
    """The clock passes the deadline while pat approves: either the grant was minted in time
    (then expiry marks nothing and the grant runs once) or the approval expired with no grant."""
    shop, gate = shop_gate
    out = _delete(gate)
    gate.approve(out.approval_id, version=1, approver=PIA)
    clock.advance(out.card.expires_at - clock.now() - 0.001)
    started = threading.Event()
    got: dict[str, Any] = {}

    def approve() -> None:
        started.set()
        try:
            got["approve"] = gate.approve(out.approval_id, version=1, approver=PAT)
        except EffectGateError as exc:
            got["approve"] = exc

    thread = threading.Thread(target=approve)
    thread.start()
    started.wait()
    clock.advance(1)
    thread.join()
    gate.expire()
    grant = got["approve"]
    if isinstance(grant, Grant):
        assert status(store, out.approval_id) == "approved"
        gate.execute(grant.token)
        assert shop.receiver.count("delete") == 1
    else:
        assert isinstance(grant, ApprovalExpired), grant
        assert status(store, out.approval_id) == "expired"
        assert shop.receiver.count("delete") == 0


class _LostReply:
    """The next COMMIT lands and its reply is lost (a failover), while armed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.armed = False
        end = _dialect.driver_end

        def landed_then_lost(conn: Any, driver: Any, *, commit: bool) -> None:
            end(conn, driver, commit=commit)
            if self.armed and commit:
                self.armed = False
                lost = ConnectionError("server closed the connection unexpectedly")
                raise sa.exc.OperationalError("COMMIT", None, lost, connection_invalidated=True)

        monkeypatch.setattr(_dialect, "driver_end", landed_then_lost)


def test_lost_reply_of_the_regrant_and_of_the_second_approver_yields_the_grant(
    store: SQLStore, make_gate: MakeGate, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second destructive approver's COMMIT lands and its reply is lost: the grant is
    returned; the same for the regrant round after it lapsed; the lapsed token stays dead and
    the returned one runs once."""
    recorder = EffectRecorder()
    gate = make_gate(_wipe_table(recorder))
    lost = _LostReply(monkeypatch)
    out = gate.call("wipe", {"account": "a1", "scope": "logs"}, context("m1"))
    assert isinstance(out, Pending)
    gate.approve(out.approval_id, version=1, approver=PIA)
    lost.armed = True
    first = gate.approve(out.approval_id, version=1, approver=PAT)
    assert isinstance(first, Grant)
    clock.advance(gate.policy.token_ttl + 1)
    gate.approve(out.approval_id, version=1, approver=PAT)
    lost.armed = True
    second = gate.approve(out.approval_id, version=1, approver=PIA)
    assert isinstance(second, Grant)
    with pytest.raises(TokenError):
        gate.execute(first.token)
    gate.execute(second.token)
    assert recorder.count("wipe") == 1
