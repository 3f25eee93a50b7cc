"""An unknown outcome stored (`_settle.Settlement.run_claimed`): the record needs_reconciliation,
with its execution row and event, in one commit. As a result or a definite failure is, it is
stored once more on a fresh connection when the connection was lost (a failover, a dropped
socket), unless the record says that commit landed: before, the driver's error was raised in
place of `NeedsReconciliation`, the record was left in flight and nobody was notified until a
`recover` pass found its lease run out."""

from __future__ import annotations

from typing import Any

from ._deps import Events, connection_lost
from .errors import LeaseLost
from .stores import _statements as S
from .stores.protocol import Store


def store_unknown(store: Store, events: Events, unknown: tuple[Any, ...], tool_error: Exception) -> None:
    """Mark the record needs_reconciliation with its execution row and event (one commit); once
    more after a lost connection whose commit did not land. LeaseLost when the lease is gone."""
    try:
        _store(store, events, unknown)
    except Exception as lost:  # not the tool's own error (a lost connection of its own: `tool_error`)
        if isinstance(lost, LeaseLost) or not connection_lost(store, lost, tool_error):
            raise
        key, owner, reason = unknown[4], unknown[5], unknown[7]
        record = store.get(key)
        if not (
            record is not None
            and record.status == "needs_reconciliation"
            and record.lease_owner == owner
            and record.error == S.no_nul(reason)
        ):
            _store(store, events, unknown)


def _store(store: Store, events: Events, unknown: tuple[Any, ...]) -> None:
    spec, ctx, row, frozen, key, owner, execution, reason, ref = unknown
    with store.transaction() as conn:
        store.mark_needs_reconciliation(key, owner, reason, provider_ref=ref, conn=conn)
        store.append_execution(conn, status="needs_reconciliation", error=reason, **execution)
        event = events.event(
            "needs_reconciliation", spec=spec, ctx=ctx, row=row, args_hash_=frozen, key=key, reason=reason
        )
        store.append_events(conn, [event])
