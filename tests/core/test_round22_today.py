"""Round 22, an adversarial review of today's core changes (round 21).

- Every store opened on a database file or a server registered an `os.register_at_fork` hook of
  its own (`stores/_fork.py`), which Python never removes: a process opening stores over its life
  (a test suite, a worker per tenant) kept one hook per store ever opened, and each fork ran them
  all. One hook now serves every live engine (a weak set).
- Each notifier gets its own copy of the card (round 21), made with `copy.deepcopy`: 17 us per
  hook on every propose of the money cycle. It is copied as the parsed JSON it is now (5-8 us);
  the test below keeps the promise (nested values included) that the cheaper copy must keep.
- `IdempotencyStore.run` (round 21, `stores/_run.py`) reads a lost claim or completion back, but
  a function's definite failure or unknown outcome whose write lost the connection still raised
  the driver's error in place of the function's (or `NeedsReconciliation`), and left the record
  in flight: a retry was `InProgress`, then, after the lease, "needs reconciliation" for a
  failure that was known. Both are written once more on a fresh connection now while the
  record, read back, is still in flight under the run's lease (the first write did not land).
- The report's window bounds (round 21: None or a finite number, else ValueError) let an integer
  too large for a float through its check, and `float()` of it crashed with a raw OverflowError.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import Effect, EffectTable, Pending, ToolSpec, open_store
from effectgate.errors import NeedsReconciliation, OutcomeUnknown
from effectgate.examples.shop import context
from effectgate.notify import Notification
from effectgate.report import disagreement, figures
from effectgate.stores import SQLStore, _fork
from effectgate.testing import EffectRecorder

from .conftest import MakeGate


@pytest.mark.skipif(not hasattr(os, "register_at_fork"), reason="needs os.register_at_fork")
def test_opening_stores_registers_no_fork_hook_per_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hooks: list[Any] = []
    monkeypatch.setattr(os, "register_at_fork", lambda **kw: hooks.append(kw))
    for i in range(3):
        open_store(f"sqlite:///{tmp_path / f'{i}.db'}").close()
    assert hooks == []
    live = open_store(f"sqlite:///{tmp_path / 'live.db'}")
    try:
        assert live.engine in _fork._ENGINES  # the one hook's: a pool of its own in a forked child
    finally:
        live.close()


@pytest.mark.parametrize("bound", [10**400, -(10**400)])
def test_a_report_window_bound_no_float_holds_is_a_value_error(store: SQLStore, bound: int) -> None:
    with pytest.raises(ValueError, match="not a finite number"):
        figures(store, since=bound)
    with pytest.raises(ValueError, match="not a finite number"):
        disagreement(store, until=bound)


def test_a_hook_editing_a_nested_value_of_its_card_reaches_no_other_card(make_gate: MakeGate) -> None:
    args = {"account": "acct-1", "lines": [{"amount": 5, "tags": ["a"]}]}
    seen: list[Any] = []

    def editing(n: Notification) -> None:
        assert n.card is not None
        n.card.args["lines"][0]["amount"] = 0
        n.card.args["lines"][0]["tags"].append("edited")
        n.card.subject["account"] = "****"  # type: ignore[index]

    def second(n: Notification) -> None:
        assert n.card is not None
        seen.append((n.card.args, n.card.subject))

    def pay(account: str, lines: list[dict[str, Any]]) -> int:
        return 1

    spec = ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance", subject=("account",))
    table = EffectTable([spec])
    table.allow("support", ["pay"])
    gate = make_gate(table, notify=[editing, second])
    out = gate.call("pay", args, context("m1"))
    assert isinstance(out, Pending)
    assert out.card.args == args
    assert seen == [(args, {"account": "acct-1"})]
    assert out.card == gate.card(out.approval_id)


def _lose_the_settling_write(store: SQLStore, monkeypatch: pytest.MonkeyPatch, *, landed: bool) -> None:
    """The store's first write of a run's outcome (after its claim) loses its connection: before
    the statement ran, or after it committed (its reply lost, as in a failover)."""
    x = store._x
    armed = [True]

    def lose(conn: Any, sql: str, params: Any) -> Any:
        if armed and sql.startswith("UPDATE eg_idempotency"):
            armed.clear()
            if landed:
                x(conn, sql, params)
            lost = ConnectionError("server closed the connection unexpectedly")
            raise sa.exc.OperationalError(sql, None, lost, connection_invalidated=True)
        return x(conn, sql, params)

    monkeypatch.setattr(store, "_x", lose)


@pytest.mark.parametrize("landed", [False, True])
def test_store_run_keeps_a_definite_failure_whose_write_lost_the_connection(
    store: SQLStore, monkeypatch: pytest.MonkeyPatch, landed: bool
) -> None:
    receiver = EffectRecorder()

    def declined() -> None:
        receiver.record("charge")
        raise ValueError("card declined")

    _lose_the_settling_write(store, monkeypatch, landed=landed)
    with pytest.raises(ValueError, match="card declined"):
        store.run("k", "h" * 64, declined)
    record = store.get("k")
    assert record is not None
    assert (record.status, record.error) == ("failed", "ValueError: card declined")
    with pytest.raises(ValueError, match="card declined"):  # a definite failure may run again
        store.run("k", "h" * 64, declined)
    assert receiver.count("charge") == 2


@pytest.mark.parametrize("landed", [False, True])
def test_store_run_keeps_an_unknown_outcome_whose_write_lost_the_connection(
    store: SQLStore, monkeypatch: pytest.MonkeyPatch, landed: bool
) -> None:
    receiver = EffectRecorder()

    def timed_out() -> None:
        receiver.record("charge")
        raise OutcomeUnknown("the provider timed out", provider_ref="ch_1")

    _lose_the_settling_write(store, monkeypatch, landed=landed)
    with pytest.raises(NeedsReconciliation):
        store.run("k", "h" * 64, timed_out)
    record = store.get("k")
    assert record is not None
    assert (record.status, record.provider_ref) == ("needs_reconciliation", "ch_1")
    with pytest.raises(NeedsReconciliation):  # never run again
        store.run("k", "h" * 64, timed_out)
    assert receiver.count("charge") == 1
