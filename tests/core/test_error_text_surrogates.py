"""A tool's exception whose text holds a lone surrogate (bytes decoded with surrogateescape, a
provider's error quoting them) must still settle the record it ran under: the text is stored
with the surrogate escaped, on both databases (neither can encode it as UTF-8)."""

from __future__ import annotations

import pytest

from effectgate import Effect, EffectTable, ToolContext, ToolSpec
from effectgate.errors import NeedsReconciliation, OutcomeUnknown
from effectgate.examples.shop import context
from effectgate.stores import SQLStore

from .conftest import MakeGate


@pytest.mark.parametrize(
    ("raised", "status"),
    [
        (RuntimeError("card \udcff declined"), "failed"),
        (OutcomeUnknown("provider said \udcff"), "needs_reconciliation"),
    ],
)
def test_a_write_whose_error_text_holds_a_lone_surrogate_settles(
    make_gate: MakeGate, store: SQLStore, raised: Exception, status: str
) -> None:
    runs: list[str] = []

    def tag(ticket: str) -> None:
        """Tag a ticket."""
        runs.append(ticket)
        raise raised

    table = EffectTable([ToolSpec(name="tag", effect=Effect.WRITE, fn=tag)])
    table.allow_all("support")
    gate = make_gate(table)
    expected = NeedsReconciliation if status == "needs_reconciliation" else type(raised)
    with pytest.raises(expected):
        gate.call("tag", {"ticket": "t1"}, context("m1"))
    assert runs == ["t1"]
    [record] = store.idempotency_records()
    assert record.status == status
    assert "\\udcff" in (record.error or "")
    [execution] = store.executions(tool="tag")
    assert execution.status == status


def test_an_unknown_outcome_whose_provider_ref_holds_a_lone_surrogate_settles(
    make_gate: MakeGate, store: SQLStore
) -> None:
    def tag(ticket: str) -> None:
        """Tag a ticket."""
        raise OutcomeUnknown("lost", provider_ref="ref-\udcff")

    table = EffectTable([ToolSpec(name="tag", effect=Effect.WRITE, fn=tag)])
    table.allow_all("support")
    gate = make_gate(table)
    with pytest.raises(NeedsReconciliation):
        gate.call("tag", {"ticket": "t1"}, context("m1"))
    [record] = store.idempotency_records()
    assert record.status == "needs_reconciliation"
    assert record.provider_ref == "ref-\\udcff"


def test_set_provider_ref_refuses_a_lone_surrogate_before_the_store(
    make_gate: MakeGate, store: SQLStore
) -> None:
    """A clear ValueError to the tool (which may go on), not the driver's encoding error."""
    refused: list[str] = []

    def tag(ticket: str, tool_context: ToolContext) -> str:
        """Tag a ticket."""
        try:
            tool_context.set_provider_ref("ref-\udcff")
        except ValueError as exc:
            refused.append(str(exc))
        return "tagged"

    table = EffectTable([ToolSpec(name="tag", effect=Effect.WRITE, fn=tag)])
    table.allow_all("support")
    gate = make_gate(table)
    gate.call("tag", {"ticket": "t1"}, context("m1"))
    assert len(refused) == 1
    [record] = store.idempotency_records()
    assert record.status == "succeeded"
    assert record.provider_ref is None
