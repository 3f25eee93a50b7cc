"""The audit's check of an approval's pending deadline, as the gate derives it (`_deadline`): when
the granted version was proposed or amended (its first such event by id, streamed with the approval)
plus the `pending_ttl` that event records (the gate's policy then: `Policy.fingerprint` leaves the
timeouts out, so the recorded policy does not say it; an event without one, written by an earlier
release or erased, is not judged). An approval of that version
recorded after it (a decision's `at`) is `approved_late`: the gate refuses it, so a ledger that
holds one was written by a gate that read the deadline from its column (an earlier release, with
the column edited forward) or the decision was inserted. A version without a proposal event, or
a time that is not one, is not judged here (the chain finds an event deleted or edited)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ._audit_rows import (
    A_ID,
    A_PROPOSED,
    A_PROPOSED_DETAIL,
    A_TOOL,
    A_VERSION,
    D_AT,
    D_DECISION,
    D_SEAL,
    D_VERSION,
    Finding,
)
from ._deadline import _time, _ttl


def approved_late(
    a: tuple[Any, ...],
    decisions: Sequence[tuple[Any, ...]],
    sealed: Callable[[Sequence[Any], Any], bool] | None,
) -> list[Finding]:
    """The finding of an approval (`a`, a granted one: its proposal time is streamed) whose
    version holds an approve decision (sealed, when `sealed` checks seals) recorded after its
    deadline (its proposal plus the `pending_ttl` its proposing event records)."""
    proposed, ttl = a[A_PROPOSED], _ttl(a[A_PROPOSED_DETAIL])
    if ttl is None or not _time(proposed):
        return []
    deadline = proposed + ttl
    late = [
        d[D_AT]
        for d in decisions
        if d[D_DECISION] == "approve"
        and d[D_VERSION] == a[A_VERSION]
        and _time(d[D_AT])
        and d[D_AT] > deadline
        and (sealed is None or sealed(d[:D_SEAL], d[D_SEAL]))
    ]
    if not late:
        return []
    detail = (
        f"version {a[A_VERSION]} was approved {max(late) - deadline:.0f}s after its deadline (its "
        f"proposal plus the gate's pending_ttl then, {ttl:g}s): no grant of it could be made"
    )
    return [Finding("approved_late", a[A_TOOL], detail, a[A_ID])]
