"""A write whose run outlived its lease: `recover()` reconciled it (the provider had not applied
it yet: released), then the run applied it and returned. Its record goes back to
needs_reconciliation (`store.reopen`), so the same write made again is not run a second time and
the late outcome can be reconciled (SQLite and PostgreSQL)."""

from __future__ import annotations

from typing import Any

import pytest

from effectgate import Executed, Refused, ToolContext
from effectgate.errors import LeaseLost
from effectgate.examples.shop import context
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from ._bank import Tags
from .conftest import MakeGate

TAGS = {"ticket_id": "t-17", "tags": ["billing", "urgent"]}


class SlowTags(Tags):
    """A write whose first run is slow: while it runs, its lease expires and `recover()` runs
    (the provider has not applied the key yet, so the lookup says not found)."""

    def __init__(self) -> None:
        super().__init__()
        self.during_first_run: Any = None

    def tag(self, ticket_id: str, tags: list[str], tool_context: ToolContext) -> dict[str, Any]:
        """Tag a ticket."""
        if self.during_first_run is not None:
            hook, self.during_first_run = self.during_first_run, None
            hook()
        return super().tag(ticket_id, tags, tool_context)


def test_a_write_that_returns_after_recover_released_it_is_not_run_again(
    store: SQLStore, make_gate: MakeGate, clock: FakeClock
) -> None:
    """recover() now reconciles writes: a slow write's lease expires, the lookup (not yet applied)
    says not found, and the record is released ('failed'). The run then applies and returns: its
    lease is lost, its result is only an execution row needing reconciliation. The record says
    released, so (a) that unknown outcome cannot be reconciled (not_reconcilable) and (b) the
    next call of the same write runs it a second time."""
    tags = SlowTags()
    gate = make_gate(tags.table())
    args = {"ticket_id": "t1", "tags": ["vip"]}

    def expire_and_recover() -> None:
        clock.advance(gate.policy.lease_seconds + 1)
        assert len(gate.recover()) == 1

    tags.during_first_run = expire_and_recover
    with pytest.raises(LeaseLost):
        gate.call("tag", args, context("m1"))
    [record] = store.idempotency_records()
    assert record.status == "needs_reconciliation"
    refused = gate.call("tag", args, context("m1"))  # the same write, made again: not run
    assert isinstance(refused, Refused)
    assert refused.code == "needs_reconciliation"
    assert tags.receiver.count("tag") == 1
    settled = gate.reconcile(record.key)  # the late run is found at the provider
    assert isinstance(settled, Executed)
    assert settled.result == {"tags": ["vip"]}
    again = gate.call("tag", args, context("m1"))
    assert isinstance(again, Executed)
    assert again.replay
    assert tags.receiver.count("tag") == 1
