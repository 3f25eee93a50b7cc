"""Round 12: execution edges and keys (each reproduced first, on the current code)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from effectgate import EffectGate, Keyring, open_store
from effectgate.chain import seal_chain
from effectgate.errors import NeedsReconciliation, TokenError
from effectgate.examples.shop import Shop, app, context
from effectgate.export import ExportError, export_chain
from effectgate.stores import SQLStore
from effectgate.stores._memory import sqlite_file
from effectgate.testing import FakeClock
from effectgate.tokens import keyring_for
from effectgate.web import ApproverRegistry

from ..web.test_round9_web import Served, entries
from ._bank import Bank, exec_key, pay_grant


@pytest.fixture
def sqlite_store(sqlite_url: str, clock: FakeClock) -> Iterator[SQLStore]:
    store = open_store(sqlite_url, clock=clock)
    store.setup()
    yield store
    store.close()


def test_an_in_flight_lease_edited_into_text_is_no_raw_type_error(
    sqlite_store: SQLStore, clock: FakeClock
) -> None:
    """SQLite keeps text written into the REAL lease column of an in-flight record (a worker
    that died mid-payment). Presenting the grant again crashed with a raw TypeError (the text
    compared with the clock), and so did `recover()`, before it reached the other records: a
    genuinely expired payment was never parked for reconciliation. Neither runs the payment."""
    bank = Bank()
    gate = EffectGate(bank.table(reconcile=False), sqlite_store, keyring=Keyring.generate(), clock=clock)
    try:
        edited, other = pay_grant(gate, "a1", "m1"), pay_grant(gate, "a2", "m2")
        for grant in (edited, other):
            row = sqlite_store.get_approval(grant.approval_id)
            assert row is not None
            sqlite_store.claim(exec_key(grant), row.args_hash, lease_seconds=60)
            clock.advance(1)
        with sqlite_store.engine.begin() as conn:
            conn.execute(
                sa.text("UPDATE eg_idempotency SET lease_expires_at = 'x' WHERE key = :k"),
                {"k": exec_key(edited)},
            )
        clock.advance(120)
        with pytest.raises((TokenError, NeedsReconciliation)):
            gate.execute(edited.token)
        touched = gate.recover()
        assert exec_key(other) in touched
        record = sqlite_store.get(exec_key(other))
        assert record is not None
        assert record.status == "needs_reconciliation"
        assert bank.runs == 0
    finally:
        gate.close()


def test_a_keyring_file_that_is_a_fifo_is_refused_not_waited_on(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`DB.keys` replaced by a named pipe (mode 0600) made every command that resolves the
    keyring (the gate, the CLI, the inbox) hang forever, waiting for a writer. It is refused at
    once with a clear error, as a file with a loose mode is."""
    monkeypatch.delenv("EFFECTGATE_KEYRING", raising=False)
    keys = Path(f"{sqlite_file(sa.engine.make_url(sqlite_url))}.keys")
    os.mkfifo(keys, 0o600)
    outcome: list[BaseException | Keyring] = []

    def resolve() -> None:
        try:
            outcome.append(keyring_for(sqlite_url))
        except BaseException as exc:  # handed to the test thread
            outcome.append(exc)

    worker = threading.Thread(target=resolve, daemon=True)
    worker.start()
    worker.join(10)
    if worker.is_alive():  # it waits for a writer: be one, so that the thread ends
        os.close(os.open(keys, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(10)
        pytest.fail("resolving the keyring blocked on a FIFO")
    assert len(outcome) == 1
    assert isinstance(outcome[0], ValueError), outcome
    assert "not a regular file" in str(outcome[0])


def test_a_keyring_path_that_is_a_directory_is_a_clear_error(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory at `DB.keys` (mode 0700) was a raw IsADirectoryError from every command."""
    monkeypatch.delenv("EFFECTGATE_KEYRING", raising=False)
    keys = Path(f"{sqlite_file(sa.engine.make_url(sqlite_url))}.keys")
    keys.mkdir(mode=0o700)
    with pytest.raises(ValueError, match="not a regular file"):
        keyring_for(sqlite_url)


@pytest.mark.parametrize("meanwhile", ["", entries(frank="finance")[:40]], ids=["empty", "half-written"])
def test_an_approvers_file_caught_mid_rewrite_does_not_end_live_sessions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, meanwhile: str
) -> None:
    """approvers.toml rewritten in place (an editor, `cat > approvers.toml`): a request that
    reads it while it is empty or half-written is refused (no one decides on a list that does not
    load), but it ended every live session for good, so when the same file was back, frank had to
    sign in again. His session is refused meanwhile, and decides again once the file loads."""
    served = Served(tmp_path, monkeypatch)
    p = served.propose()
    frank = served.client()
    assert served.sign_in(frank, "frank") == 303
    good = served.file.read_text()
    served.file.write_text(meanwhile)
    served.approve(frank, p)
    assert served.decided(p) == [("status", "pending")]
    assert served.sign_in(served.client(), "fiona") == 503  # no new sign-in on a file that does not load
    served.file.write_text(good)
    served.approve(frank, p)
    assert served.decided(p) == [("status", "approved"), ("frank", "finance")]


def test_an_approvers_file_replaced_by_a_fifo_refuses_everyone_without_blocking(tmp_path: Path) -> None:
    """The inbox reads approvers.toml again on every request, on the server's event loop: a
    named pipe put in its place blocked that read, so the whole inbox hung (every page, every
    client) until something wrote to the pipe. It refuses everyone at once, as a file that does
    not load does."""
    path = tmp_path / "approvers.toml"
    path.write_text(entries(frank="finance"))
    registry = ApproverRegistry.from_toml(path)
    assert registry.get("frank") is not None
    path.unlink()
    os.mkfifo(path, 0o600)
    outcome: list[object] = []
    worker = threading.Thread(target=lambda: outcome.append(registry.get("frank")), daemon=True)
    worker.start()
    worker.join(10)
    if worker.is_alive():  # it waits for a writer: be one, so that the thread ends
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(30)
        pytest.fail("reading the approvers file blocked on a FIFO")
    assert outcome == [None]
    assert registry.problem is not None
    assert "regular file" in registry.problem


def test_an_older_checkpoint_edited_into_text_is_an_export_finding_not_a_crash(
    sqlite_store: SQLStore, clock: FakeClock, tmp_path: Path
) -> None:
    """SQLite keeps text in the id column of a checkpoint. With the newest one intact (a seal
    checks only it), the export read every checkpoint's id as a number to pin its heads and
    raised a raw ValueError: it is refused as a ledger with audit findings, nothing written."""
    gate = app(sqlite_store, keyring=Keyring.generate(), clock=clock, shop=Shop())
    try:
        for order in ("1042", "1043"):
            gate.call("refund_order", {"order_id": order, "amount": 100, "currency": "GBP"}, context(order))
            gate.flush()
            assert seal_chain(sqlite_store, gate.keyring, now=clock.now() + 61)
            clock.advance(100)
        with sqlite_store.engine.begin() as conn:
            conn.exec_driver_sql("DROP TRIGGER IF EXISTS eg_chain_no_update")
            first = "SELECT MIN(id) FROM eg_chain WHERE table_name = 'eg_events'"
            conn.execute(sa.text(f"UPDATE eg_chain SET last_id = 'x' WHERE id = ({first})"))
        out = tmp_path / "decisions.jsonl"
        with pytest.raises(ExportError, match="audit finding"):
            export_chain(sqlite_store, gate.keyring, out, now=clock.now() + 200)
        assert not out.exists()
    finally:
        gate.close()


@pytest.mark.parametrize("text", ["approver = 5\n", "approver = [1, 2]\n"])
def test_an_approvers_file_whose_approver_is_not_a_table_is_a_clear_error(tmp_path: Path, text: str) -> None:
    """`approver = 5` (or a list of numbers) raised a raw TypeError: `effectgate serve` showed a
    traceback, and a file rewritten so while the inbox ran made every request fail with one
    (500), rather than refusing everyone with the reason. A ValueError naming the file."""
    path = tmp_path / "approvers.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=r"approvers\.toml"):
        ApproverRegistry.from_toml(path)
    path.write_text(entries(frank="finance"))
    registry = ApproverRegistry.from_toml(path)
    path.write_text(text)
    assert registry.get("frank") is None
    assert registry.problem is not None
