"""Round 14 review of the export, the ledger's chain and the sandbox replay.

- Replay picked the intents to replay by the approval's status column, which no seal covers: an
  executed refund whose status was edited to `expired`, `denied` or `pending` was left out, and a
  replay against a table that would now route it elsewhere came back clean. What ran is read from
  the append-only executions.
- A tool reclassified from money to send (same role, same number of approvers) replayed `same`:
  the report now says its effect changed.
- `export_chain` (and `seal_chain`) took a settle window of NaN and wrote a signed, empty export
  that skipped every new record (infinity the same; minus infinity a raw canonical-JSON error):
  a settle window or a time that is not a finite number (>= 0) is a ValueError, nothing written."""

from __future__ import annotations

import dataclasses
import logging
import math
from pathlib import Path
from typing import Any

import pytest

from effectgate import Effect, EffectGate
from effectgate.chain import seal_chain
from effectgate.examples.shop import SHOP_POLICY, Shop
from effectgate.export import Manifest, export_chain, manifest_path, verify_export
from effectgate.replay import replay
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from .test_chain import sql
from .test_export import ledger as export_ledger  # noqa: F401 - the fixture
from .test_export import lines, refund
from .test_replay import ledger  # noqa: F401 - the fixture


@pytest.mark.parametrize("status", ["expired", "denied", "pending", "superseded"])
def test_an_executed_intent_whose_status_was_edited_is_still_replayed(
    ledger: tuple[Shop, list[str]],  # noqa: F811
    store: SQLStore,
    status: str,
) -> None:
    shop, ids = ledger
    sql(store, "UPDATE eg_approvals SET status = :s WHERE id = :i", s=status, i=ids[0])
    table = shop.table()
    # the refund now needs another role: every refund that ran must be reported
    moved = table.replace(dataclasses.replace(table["refund_order"], approver_role="treasury"))
    report = replay(store, moved, SHOP_POLICY)
    verdicts = {r.approval_id: r.verdict for r in report.results}
    assert verdicts.get(ids[0]) == "rerouted"
    assert verdicts[ids[1]] == "rerouted"
    assert not report.clean
    # and against the table it ran under, it replays the same
    same = {r.approval_id: r.verdict for r in replay(store, table, SHOP_POLICY).results}
    assert same[ids[0]] == "same"


def test_a_tool_reclassified_from_money_to_send_is_rerouted(
    ledger: tuple[Shop, list[str]],  # noqa: F811
    store: SQLStore,
) -> None:
    shop, ids = ledger
    table = shop.table()
    sent = table.replace(dataclasses.replace(table["refund_order"], effect=Effect.SEND))
    report = replay(store, sent, SHOP_POLICY)
    verdicts = {r.approval_id: (r.verdict, r.detail) for r in report.results}
    assert verdicts[ids[0]][0] == verdicts[ids[1]][0] == "rerouted"
    assert "send" in verdicts[ids[0]][1]
    assert "money" in verdicts[ids[0]][1]
    assert {verdicts[i][0] for i in ids[2:]} == {"same"}
    assert not report.clean


@pytest.mark.parametrize(
    ("option", "value"),
    [("settle", math.nan), ("settle", math.inf), ("settle", -math.inf), ("settle", -5.0), ("now", math.nan)],
)
def test_an_export_with_a_settle_window_or_time_that_is_no_number_is_refused(
    export_ledger: tuple[EffectGate, Path],  # noqa: F811
    clock: FakeClock,
    tmp_path: Path,
    option: str,
    value: float,
) -> None:
    gate, first = export_ledger
    before = Manifest.load(manifest_path(first))
    refund(gate, "m9", 77)
    with gate.store.reading() as conn:
        points = len(gate.store.checkpoints(conn))
    target = tmp_path / "two.jsonl"
    options: dict[str, Any] = {"now": clock.now() + 61, option: value}
    with pytest.raises(ValueError, match=option):
        export_chain(gate.store, gate.keyring, target, after=before, **options)
    # nothing written: no file, no manifest, no checkpoint (NaN exported nothing, and said so)
    assert not target.exists()
    assert not manifest_path(target).exists()
    with gate.store.reading() as conn:
        assert len(gate.store.checkpoints(conn)) == points
    with pytest.raises(ValueError, match=option):
        seal_chain(gate.store, gate.keyring, **options)
    # the same export with a settle window that is a number holds the new refund
    done = export_chain(gate.store, gate.keyring, target, after=before, now=clock.now() + 61)
    assert [line["record"]["args"]["amount"] for line in lines(target)] == [77]
    assert done.count == 1
    assert verify_export(target, gate.keyring, after=before).ok


def test_replay_sends_no_spans_to_the_applications_tracer(
    ledger: tuple[Shop, list[str]],  # noqa: F811
    store: SQLStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sandbox's proposals, approvals and executions are not the application's: a tracer set
    globally (auto-instrumentation) must not receive an "effectgate.execute" of a refund."""
    otel = pytest.importorskip("opentelemetry.trace")
    sdk = pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    shop, _ = ledger
    exporter = InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(otel, "_TRACER_PROVIDER", provider)  # as set_tracer_provider would
    try:
        assert {r.verdict for r in replay(store, shop.table(), SHOP_POLICY).results} == {"same"}
        assert [s.name for s in exporter.get_finished_spans()] == []
    finally:
        provider.shutdown()


def test_replay_logs_no_execution_as_the_applications(
    ledger: tuple[Shop, list[str]],  # noqa: F811
    store: SQLStore,
    caplog: pytest.LogCaptureFixture,
) -> None:
    shop, _ = ledger
    with caplog.at_level(logging.INFO, logger="effectgate"):
        assert replay(store, shop.table(), SHOP_POLICY).clean
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("executed:")] == []
