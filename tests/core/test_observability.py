"""Observability: decisions, refusals and reconciliations are logged through `logging` (one logger
per part under "effectgate", no handler installed, never a token or an argument value), and call,
approve and execute are OpenTelemetry spans (tested with the SDK's in-memory exporter). The ledger
stays the record: a span processor that raises changes no outcome.
"""

from __future__ import annotations

import ast
import asyncio
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from effectgate import (
    Approver,
    Effect,
    EffectGate,
    EffectTable,
    Executed,
    Grant,
    Invalid,
    PartialApproval,
    Pending,
    Refused,
    ToolSpec,
    flow,
)
from effectgate import _telemetry as telemetry
from effectgate.errors import NeedsReconciliation, TamperedRecord, TokenError
from effectgate.examples.shop import SHOP_POLICY, context
from effectgate.stores import SQLStore

from .conftest import MakeGate, ShopGate

REFUND = {"order_id": "1042", "amount": 12000, "currency": "GBP"}
FINANCE = Approver("fiona", "finance")
PIA = Approver("pia", "privacy")
CORE = Path(__file__).resolve().parents[2] / "core" / "src" / "effectgate"


# -- fixtures


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    """A tracer provider passed to the gate explicitly (the global one is never touched)."""
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield tracer_provider
    tracer_provider.shutdown()


@pytest.fixture
def traced(shop_gate: ShopGate, make_gate: MakeGate, provider: TracerProvider) -> EffectGate:
    """The shop's table behind a gate that traces to `provider`, on the parametrized store."""
    return make_gate(shop_gate.shop.table(), policy=SHOP_POLICY, tracer_provider=provider)


def spans(exporter: InMemorySpanExporter, name: str | None = None) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if name is None or s.name == name]


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def granted(gate: EffectGate) -> Grant:
    pending = gate.call("refund_order", REFUND, context("m3"))
    assert isinstance(pending, Pending), pending
    grant = gate.approve(pending.approval_id, version=pending.version, approver=FINANCE)
    assert isinstance(grant, Grant)
    return grant


def records(caplog: pytest.LogCaptureFixture, logger: str | None = None) -> list[logging.LogRecord]:
    return [
        r for r in caplog.records if r.name.startswith("effectgate") and (logger is None or r.name == logger)
    ]


# -- spans


def test_a_read_is_a_call_span(traced: EffectGate, exporter: InMemorySpanExporter) -> None:
    """A read is one "effectgate.call" span naming the tool, its effect and the outcome executed."""
    out = traced.call("get_order", {"order_id": "1042"}, context("m1"))
    assert isinstance(out, Executed)
    [span] = spans(exporter)
    assert span.name == "effectgate.call"
    assert attributes(span) == {
        "effectgate.tool": "get_order",
        "effectgate.effect": "read",
        "effectgate.outcome": "executed",
        "effectgate.replay": False,
    }
    assert span.status.status_code is StatusCode.UNSET


def test_a_tools_own_span_nests_under_the_call_span(
    make_gate: MakeGate, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    """A span the tool starts while it runs is a child of the gate's "effectgate.call" span."""
    tracer = provider.get_tracer("the tool")

    def lookup(key: str) -> str:
        """Look a key up."""
        with tracer.start_as_current_span("tool.lookup"):
            return key.upper()

    table = EffectTable([ToolSpec(name="lookup", effect=Effect.READ, fn=lookup)])
    table.allow("agent", ["lookup"])
    gate = make_gate(table, tracer_provider=provider)
    ctx = context("m1", agent_id="agent")
    assert gate.call("lookup", {"key": "k"}, ctx) == Executed(tool="lookup", result="K")
    inner, outer = spans(exporter)
    assert (inner.name, outer.name) == ("tool.lookup", "effectgate.call")
    assert inner.parent is not None
    assert outer.context is not None
    assert inner.parent.span_id == outer.context.span_id


def test_a_paused_call_is_a_call_span_with_its_approval(
    traced: EffectGate, exporter: InMemorySpanExporter
) -> None:
    """A gated call's span says pending and carries the approval id and version, not the arguments."""
    out = traced.call("refund_order", REFUND, context("m3"))
    assert isinstance(out, Pending)
    [span] = spans(exporter)
    assert attributes(span) == {
        "effectgate.tool": "refund_order",
        "effectgate.effect": "money",
        "effectgate.outcome": "pending",
        "effectgate.replay": False,
        "effectgate.approval_id": out.approval_id,
        "effectgate.version": 1,
    }


def test_an_approval_is_a_span(traced: EffectGate, exporter: InMemorySpanExporter) -> None:
    """`approve` is an "effectgate.approve" span: approval id, version and outcome grant."""
    grant = granted(traced)
    [span] = spans(exporter, "effectgate.approve")
    assert attributes(span) == {
        "effectgate.approval_id": grant.approval_id,
        "effectgate.version": 1,
        "effectgate.outcome": "grant",
    }


def test_a_partial_approval_is_a_span(traced: EffectGate, exporter: InMemorySpanExporter) -> None:
    """The first of two approvals a destructive call needs is an approve span with outcome partial."""
    pending = traced.call("delete_customer_data", {"customer_id": "u1"}, context("m-del"))
    assert isinstance(pending, Pending)
    assert isinstance(traced.approve(pending.approval_id, version=1, approver=PIA), PartialApproval)
    [span] = spans(exporter, "effectgate.approve")
    assert attributes(span)["effectgate.outcome"] == "partial"


def test_an_execution_is_a_span(
    traced: EffectGate, shop_gate: ShopGate, exporter: InMemorySpanExporter
) -> None:
    """`execute` is an "effectgate.execute" span with the approval id, version and outcome executed."""
    grant = granted(traced)
    out = traced.execute(grant.token)
    assert isinstance(out, Executed)
    assert shop_gate.shop.receiver.count("refund") == 1
    [span] = spans(exporter, "effectgate.execute")
    assert attributes(span) == {
        "effectgate.approval_id": grant.approval_id,
        "effectgate.version": 1,
        "effectgate.outcome": "executed",
        "effectgate.replay": False,
    }
    assert span.status.status_code is StatusCode.UNSET


def test_a_refused_token_is_an_error_span_without_the_token(
    traced: EffectGate, exporter: InMemorySpanExporter
) -> None:
    """A spent grant's execute span ends in error with the exception recorded; the token appears nowhere."""
    grant = granted(traced)
    traced.execute(grant.token)
    with pytest.raises(TokenError):
        traced.execute(grant.token)
    span = spans(exporter, "effectgate.execute")[-1]
    assert span.status.status_code is StatusCode.ERROR
    assert attributes(span)["error.type"] == "TokenError"
    assert attributes(span)["effectgate.token_refusal"] == "used"
    assert [e.name for e in span.events] == ["exception"]
    assert grant.token not in repr([s.to_json() for s in spans(exporter)])


def test_an_unknown_outcome_is_an_error_span(
    traced: EffectGate, shop_gate: ShopGate, exporter: InMemorySpanExporter
) -> None:
    """A provider timeout ends the execute span in error with error.type NeedsReconciliation."""
    grant = granted(traced)
    shop_gate.shop.provider.timeouts_to_inject = 1
    with pytest.raises(NeedsReconciliation):
        traced.execute(grant.token)
    [span] = spans(exporter, "effectgate.execute")
    assert attributes(span)["error.type"] == "NeedsReconciliation"
    assert span.status.status_code is StatusCode.ERROR


@pytest.mark.parametrize(
    ("name", "args", "agent", "code"),
    [
        ("wire_money", {}, "support", "unknown_tool"),
        ("refund_order", REFUND, "queue_summarizer", "not_allowed"),
        ("get_order", {"order_id": "2001"}, "support", "out_of_scope"),
    ],
)
def test_a_refusal_is_a_call_span_with_its_code(
    traced: EffectGate, exporter: InMemorySpanExporter, name: str, args: dict[str, Any], agent: str, code: str
) -> None:
    """A refused call's span says refused and names the refusal code; a refusal is not an error."""
    out = traced.call(name, args, context("m1", agent_id=agent))
    assert isinstance(out, Refused)
    assert out.code == code
    [span] = spans(exporter)
    assert attributes(span)["effectgate.outcome"] == "refused"
    assert attributes(span)["effectgate.refusal_code"] == code
    assert span.status.status_code is StatusCode.UNSET


def test_async_call_and_execute_are_spans(traced: EffectGate, exporter: InMemorySpanExporter) -> None:
    """`acall` and `aexecute` make the same spans as their sync forms."""

    async def run() -> None:
        pending = await traced.acall("refund_order", REFUND, context("m3"))
        assert isinstance(pending, Pending)
        grant = await traced.aapprove(pending.approval_id, version=1, approver=FINANCE)
        assert isinstance(grant, Grant)
        assert isinstance(await traced.aexecute(grant.token), Executed)

    asyncio.run(run())
    assert [s.name for s in spans(exporter)] == [
        "effectgate.call",
        "effectgate.approve",
        "effectgate.execute",
    ]


def test_flows_and_steps_are_call_spans(traced: EffectGate, exporter: InMemorySpanExporter) -> None:
    """An adapter's flows are spans too, and each call of a step is its own call span (parallel
    calls of one gated tool included)."""
    out = flow.drive(traced.flows.call("get_order", {"order_id": "1042"}, context("m1")))
    assert isinstance(out, Executed)
    step = [("refund_order", REFUND, "c1"), ("refund_order", {**REFUND, "amount": 100}, "c2")]
    outcomes = traced.call_step([*step, ("get_order", {"order_id": "1043"}, "c3")], context("m2"))
    assert [type(o).__name__ for o in outcomes] == ["Refused", "Refused", "Executed"]
    assert [
        (attributes(s)["effectgate.tool"], attributes(s)["effectgate.outcome"]) for s in spans(exporter)
    ] == [
        ("get_order", "executed"),
        ("refund_order", "refused"),
        ("refund_order", "refused"),
        ("get_order", "executed"),
    ]


class Raising(SpanProcessor):
    """A span processor that raises where it is told to."""

    def __init__(self, where: str) -> None:
        self.where = where

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        if self.where == "start":
            raise RuntimeError("span processor broke on start")

    def on_end(self, span: ReadableSpan) -> None:
        if self.where == "end":
            raise RuntimeError("span processor broke on end")


@pytest.mark.parametrize("where", ["start", "end"])
def test_a_raising_span_processor_changes_no_outcome(
    shop_gate: ShopGate, make_gate: MakeGate, store: SQLStore, where: str
) -> None:
    """With a processor that raises, every call, approval, execution and refusal returns (or raises)
    exactly what it would without telemetry, and the ledger records it all."""
    broken = TracerProvider()
    broken.add_span_processor(Raising(where))
    gate = make_gate(shop_gate.shop.table(), policy=SHOP_POLICY, tracer_provider=broken)
    read = gate.call("get_order", {"order_id": "1042"}, context("m1"))
    assert isinstance(read, Executed)
    assert read.result["status"] == "shipped"
    assert gate.call("wire_money", {}, context("m1")) == Refused(
        code="unknown_tool", message="'wire_money' is not a tool in the effect table", tool="wire_money"
    )
    assert isinstance(gate.call("get_order", {"order_id": 1042}, context("m1")), Invalid)
    grant = granted(gate)
    executed = gate.execute(grant.token)
    assert executed.result["refund_id"] == "re_1"
    with pytest.raises(TokenError) as raised:
        gate.execute(grant.token)
    assert raised.value.reason == "used"
    out = flow.drive(gate.flows.call("get_order", {"order_id": "1043"}, context("m2")))
    assert isinstance(out, Executed)
    assert shop_gate.shop.receiver.count("refund") == 1
    gate.flush()
    assert [e.kind for e in store.events(kind="executed")] == ["executed"]
    assert [e.detail_json for e in store.events(kind="token_refused")] == ['{"reason": "used"}']


def test_without_opentelemetry_spans_are_no_ops(
    make_gate: MakeGate, shop_gate: ShopGate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With `opentelemetry` not importable, the gate runs as before and a flow is not even wrapped."""
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    monkeypatch.setattr(telemetry, "_otel", telemetry._UNSET)
    assert telemetry._api() is None
    gate = make_gate(shop_gate.shop.table(), policy=SHOP_POLICY)
    assert gate._spans.tracer is None
    inner = gate._calls.call_flow("get_order", {"order_id": "1042"}, context("m1"))
    assert gate._spans.call_flow("get_order", inner) is inner
    assert isinstance(gate.call("get_order", {"order_id": "1042"}, context("m1")), Executed)
    assert isinstance(gate.execute(granted(gate).token), Executed)


def test_opentelemetry_is_imported_in_one_place() -> None:
    """Only `_telemetry.py` imports opentelemetry, and only inside a function."""
    importers = sorted(
        str(path.relative_to(CORE))
        for path in CORE.rglob("*.py")
        if "import opentelemetry" in path.read_text() or "from opentelemetry" in path.read_text()
    )
    assert importers == ["_telemetry.py"]
    text = (CORE / "_telemetry.py").read_text()
    assert text.count("from opentelemetry import") == 1
    assert "\nfrom opentelemetry" not in text
    assert "\nimport opentelemetry" not in text


# -- logs


def test_a_denial_is_logged_with_its_reason(shop_gate: ShopGate, caplog: pytest.LogCaptureFixture) -> None:
    """A denial is one INFO record on effectgate._decisions with the approval, approver, role and reason."""
    _, gate = shop_gate
    pending = gate.call("refund_order", REFUND, context("m3"))
    assert isinstance(pending, Pending)
    with caplog.at_level(logging.INFO, logger="effectgate"):
        gate.deny(pending.approval_id, approver=FINANCE, reason="the order was never shipped")
    [record] = records(caplog)
    assert (record.name, record.levelno) == ("effectgate._decisions", logging.INFO)
    message = record.getMessage()
    assert message.startswith("approval denied:")
    for part in (pending.approval_id, "version=1", "'fiona'", "role=finance", "the order was never shipped"):
        assert part in message


def test_proposals_and_approvals_are_logged(shop_gate: ShopGate, caplog: pytest.LogCaptureFixture) -> None:
    """Proposed, amended, replayed, partial and granted are INFO records naming approval, version and role."""
    _, gate = shop_gate
    with caplog.at_level(logging.INFO, logger="effectgate"):
        first = gate.call("refund_order", REFUND, context("m3"))
        gate.call("refund_order", REFUND, context("m3"))
        amended = gate.call("refund_order", {**REFUND, "amount": 6000}, context("m4"))
        deletion = gate.call("delete_customer_data", {"customer_id": "u1"}, context("m-del"))
        assert isinstance(first, Pending)
        assert isinstance(amended, Pending)
        assert isinstance(deletion, Pending)
        gate.approve(first.approval_id, version=2, approver=FINANCE)
        gate.approve(deletion.approval_id, version=1, approver=PIA)
    messages = [(r.name, r.levelno, r.getMessage()) for r in records(caplog)]
    assert [m[2].split(":")[0] for m in messages] == [
        "gated call proposed",
        "gated call replayed",
        "gated call amended",
        "gated call proposed",
        "approval granted",
        "approval partial (1 of 2)",
    ]
    assert {(name, level) for name, level, _ in messages} == {
        ("effectgate._proposals", logging.INFO),
        ("effectgate._decisions", logging.INFO),
    }
    assert f"approval={first.approval_id} version=2 tool=refund_order role=finance" in messages[2][2]
    assert f"approval={deletion.approval_id} version=1 approver='pia' role=privacy" in messages[5][2]


def test_an_unknown_outcome_is_a_warning_and_its_reconciliation_is_logged(
    shop_gate: ShopGate, caplog: pytest.LogCaptureFixture
) -> None:
    """A provider timeout is a WARNING with the idempotency key and reason; reconciling it is INFO."""
    shop, gate = shop_gate
    grant = granted(gate)
    key = f"eg_{grant.approval_id}_v1"
    shop.provider.timeouts_to_inject = 1
    with caplog.at_level(logging.INFO, logger="effectgate"), pytest.raises(NeedsReconciliation):
        gate.execute(grant.token)
    [warning] = [r for r in records(caplog) if r.levelno == logging.WARNING]
    assert warning.name == "effectgate._execution"
    assert "needs_reconciliation" in warning.getMessage()
    assert f"key={key}" in warning.getMessage()
    assert "OutcomeUnknown: payment provider timed out" in warning.getMessage()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="effectgate"):
        assert isinstance(gate.reconcile(grant.approval_id), Executed)
    [info] = records(caplog, "effectgate._reconcile")
    assert info.levelno == logging.INFO
    assert info.getMessage().startswith(f"reconciled (it happened): approval={grant.approval_id} version=1")


def test_a_definite_failure_is_a_warning(make_gate: MakeGate, caplog: pytest.LogCaptureFixture) -> None:
    """A write whose tool raises an ordinary exception fails definitely: one WARNING with the key."""

    def tag(ticket: str) -> None:
        """Tag a ticket."""
        raise ValueError("no such ticket")

    table = EffectTable([ToolSpec(name="tag", effect=Effect.WRITE, fn=tag)])
    table.allow("agent", ["tag"])
    gate = make_gate(table)
    with caplog.at_level(logging.INFO, logger="effectgate"), pytest.raises(ValueError, match="no such"):
        gate.call("tag", {"ticket": "t-1"}, context("m1", agent_id="agent"))
    [record] = records(caplog)
    assert (record.name, record.levelno) == ("effectgate._execution", logging.WARNING)
    assert record.getMessage().startswith("write failed (definite")
    assert "key=w_tag_" in record.getMessage()


def test_refusals_are_logged_with_their_code_and_never_an_argument_value(
    shop_gate: ShopGate, caplog: pytest.LogCaptureFixture
) -> None:
    """Unknown tool, not allowed, out of scope and invalid are INFO records with their code; an invalid
    argument's value is not logged (only its JSON pointer)."""
    _, gate = shop_gate
    with caplog.at_level(logging.DEBUG, logger="effectgate"):
        gate.call("wire_money", {"iban": "GB-SECRET-IBAN"}, context("m1"))
        gate.call("refund_order", REFUND, context("m1", agent_id="queue_summarizer"))
        gate.call("get_order", {"order_id": "2001"}, context("m1"))
        gate.call("get_order", {"order_id": ["VALUE-NOT-FOR-LOGS"]}, context("m1"))
    messages = [(r.name, r.levelno, r.getMessage()) for r in records(caplog)]
    assert [m[2].split(":")[0] for m in messages] == [
        "call refused (unknown_tool)",
        "call refused (not_allowed)",
        "call refused (out_of_scope)",
        "call refused (invalid)",
    ]
    assert {level for _, level, _ in messages} == {logging.INFO}
    assert "pointers=['/order_id']" in messages[3][2]
    text = "\n".join(m[2] for m in messages)
    assert "GB-SECRET-IBAN" not in text
    assert "VALUE-NOT-FOR-LOGS" not in text


def test_a_tampered_record_is_a_warning(
    shop_gate: ShopGate, store: SQLStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Approving a row edited outside effectgate is refused and logged at WARNING."""
    _, gate = shop_gate
    pending = gate.call("refund_order", REFUND, context("m3"))
    assert isinstance(pending, Pending)
    with store.transaction() as conn:
        conn.execute(
            sa.text("UPDATE eg_approvals SET approver_role = 'support' WHERE id = :i"),
            {"i": pending.approval_id},
        )
    with caplog.at_level(logging.INFO, logger="effectgate"), pytest.raises(TamperedRecord):
        gate.approve(pending.approval_id, version=1, approver=FINANCE)
    [record] = records(caplog)
    assert (record.name, record.levelno) == ("effectgate._decisions", logging.WARNING)
    assert pending.approval_id in record.getMessage()


def test_no_token_text_in_any_log_record(shop_gate: ShopGate, caplog: pytest.LogCaptureFixture) -> None:
    """Through a grant, an execution, a spent, a forged and a malformed token, no log record (message
    or arguments, at DEBUG) holds the token or its secret parts."""
    _, gate = shop_gate
    with caplog.at_level(logging.DEBUG, logger="effectgate"):
        grant = granted(gate)
        gate.execute(grant.token)
        forged = grant.token[:-4] + ("AAAA" if not grant.token.endswith("AAAA") else "BBBB")
        for token in (grant.token, forged, "not-a-token"):
            with pytest.raises(TokenError):
                gate.execute(token)
    assert [r.getMessage().split(":")[0] for r in records(caplog, "effectgate._execution")] == [
        "executed",
        "grant refused (used)",
        "grant refused (forged)",
        "grant refused (malformed)",
    ]
    nonce, mac = grant.token.split(".")[-2:]
    logged = "\n".join(f"{r.getMessage()} {r.args!r} {r.exc_text or ''}" for r in records(caplog))
    for secret in (grant.token, forged, nonce, mac):
        assert secret not in logged


def test_a_read_is_not_logged(shop_gate: ShopGate, caplog: pytest.LogCaptureFixture) -> None:
    """The read hot path writes no log record, even at DEBUG."""
    _, gate = shop_gate
    with caplog.at_level(logging.DEBUG, logger="effectgate"):
        for _ in range(3):
            assert isinstance(gate.call("get_order", {"order_id": "1042"}, context("m1")), Executed)
        gate.flush()
    assert records(caplog) == []


def test_no_handler_is_installed_by_importing_effectgate() -> None:
    """Importing every effectgate module leaves the root logger and every effectgate logger without
    handlers (the library never calls basicConfig or adds one); the parts log under "effectgate"."""
    script = """
import importlib, logging, pkgutil, effectgate
for m in pkgutil.walk_packages(effectgate.__path__, "effectgate."):
    if not m.name.endswith("__main__"):
        importlib.import_module(m.name)
loggers = {
    name: logger.handlers
    for name, logger in logging.root.manager.loggerDict.items()
    if name.startswith("effectgate") and isinstance(logger, logging.Logger)
}
assert logging.getLogger().handlers == [], logging.getLogger().handlers
assert logging.getLogger("effectgate").handlers == []
assert all(handlers == [] for handlers in loggers.values()), loggers
print(sorted(loggers))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    names = set(ast.literal_eval(done.stdout))
    parts = {"_calls", "_decisions", "_deps", "_execution", "_proposals", "_reconcile", "_telemetry"}
    assert {f"effectgate.{p}" for p in parts} <= names
