"""Round 29: notifications to approvers, on SQLite and PostgreSQL.

Fixed: `warn_expiring` paged the approver role ("Approval expiring: refund_order waits for
finance") about a pending call that nobody can approve any more: its tool was taken off its
agent's allowlist, or its table row changed, since it was proposed (approve refuses it:
`not_allowed`, `reclassified`). Such a call is not warned about, and no `expiry_warning` is
recorded for it (a scanner whose table still allows it warns as before).
Fixed: a run that lost its lease and came back after its call was settled and erased (`redact`
or a retention pass: `_late_erasure`) was announced with its error in clear ("could not post
<the erased text>"): the page sent the erased personal value to the notifier (a webhook) and the
log after the erasure. It is announced with a fixed reason that quotes nothing of the call."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from effectgate import EffectGate, EffectTable, Keyring
from effectgate.errors import PolicyViolation
from effectgate.examples.shop import SHOP_POLICY, SUPPORT_AGENT, Shop
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from .conftest import MakeGate
from .test_gate_notify import FINANCE, Hook, propose
from .test_round7_erasure import SECRET
from .test_round26_today import _late_write, eraser


def _not_allowed(table: EffectTable) -> EffectTable:
    """The shop's table with refund_order taken off the support agent's allowlist."""
    specs = [table.get(name) for name in sorted(table.allowlist(SUPPORT_AGENT))]
    out = EffectTable([s for s in specs if s is not None])
    out.allow(SUPPORT_AGENT, [s.name for s in specs if s is not None and s.name != "refund_order"])
    return out


def _reclassified(table: EffectTable) -> EffectTable:
    """The shop's table with refund_order's row changed (another approver role)."""
    spec = table.get("refund_order")
    assert spec is not None
    return table.replace(dataclasses.replace(spec, approver_role="cfo"))


@pytest.fixture
def gates(store: SQLStore, clock: FakeClock) -> Iterator[Callable[[EffectTable, Hook], EffectGate]]:
    """`gates(table, hook)`: a gate with `table` on `store`, notifying `hook`; all share one keyring."""
    made: list[EffectGate] = []
    keyring = Keyring.generate()

    def make(table: EffectTable, hook: Hook) -> EffectGate:
        gate = EffectGate(table, store, policy=SHOP_POLICY, keyring=keyring, clock=clock, notify=hook)
        made.append(gate)
        return gate

    yield make
    for gate in made:
        gate.close()


@pytest.mark.parametrize("change", [_not_allowed, _reclassified], ids=["off_allowlist", "reclassified"])
def test_an_approval_nobody_can_grant_any_more_is_not_warned_about(
    gates: Callable[[EffectTable, Hook], EffectGate],
    store: SQLStore,
    clock: FakeClock,
    change: Callable[[EffectTable], EffectTable],
) -> None:
    """A pending refund whose tool its agent may no longer call (or whose row changed) cannot be
    approved: the expiry scan pages no one about it and records no warning; a scanner under the
    table it was proposed under still warns, once."""
    table = Shop().table()
    first, later = Hook(), Hook()
    proposed = gates(table, first)
    out = propose(proposed)
    now = gates(change(table), later)
    clock.advance(SHOP_POLICY.pending_ttl - 60)
    with pytest.raises(PolicyViolation):
        now.approve(out.approval_id, version=1, approver=FINANCE)
    assert now.warn_expiring(within=300) == []
    assert later.seen == []
    assert store.events(kind="expiry_warning") == []
    [card] = proposed.warn_expiring(within=300)
    assert card.approval_id == out.approval_id
    assert [n.kind for n in first.seen] == ["pending", "expiring"]
    assert len(store.events(kind="expiry_warning")) == 1


@pytest.mark.parametrize("how", ["redact", "retain"])
def test_a_late_run_erased_with_its_call_is_paged_without_its_erased_values(
    store: SQLStore, make_gate: MakeGate, clock: FakeClock, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    """The late run's error quotes the text the user's erasure removed: the unknown outcome is
    still paged (once, to the worker's notifier), but nothing in the notice nor the log quotes it."""
    hook = Hook()
    made: list[EffectGate] = []

    def first_notifies(table: EffectTable, **options: Any) -> EffectGate:
        made.append(make_gate(table, **({"notify": hook} if not made else {}), **options))
        return made[-1]

    _late_write(first_notifies, clock, eraser(store, how), raises=True)
    [notice] = hook.seen
    assert (notice.kind, notice.tool) == ("needs_reconciliation", "post")
    assert SECRET not in repr(notice)
    assert SECRET not in caplog.text
    assert not any(SECRET in str(v) for _, row in store.every_row() for v in row.values())
