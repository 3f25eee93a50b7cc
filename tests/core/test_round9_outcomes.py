"""What the model is told of a result: `Executed.for_model` for results json.dumps refuses."""

from __future__ import annotations

import datetime
import json
from typing import Any

import pytest

from effectgate import Effect, EffectTable, Executed, ToolSpec
from effectgate.examples.shop import context

from .conftest import MakeGate

DAY = datetime.date(2026, 12, 1)


def _circular() -> dict[str, Any]:
    loop: dict[str, Any] = {"name": "loop"}
    loop["self"] = loop
    return loop


@pytest.mark.parametrize(
    ("result", "shown"),
    [
        ({DAY: 120}, {"2026-12-01": 120}),  # totals keyed by day: json.dumps refuses date keys
        ({(1, 2): "pair"}, None),  # a tuple key
        (_circular(), None),  # a value holding itself
    ],
    ids=["date-keys", "tuple-key", "circular"],
)
def test_a_read_whose_result_json_refuses_is_told_to_the_model(
    make_gate: MakeGate, result: Any, shown: Any
) -> None:
    """A read returning totals keyed by date ran, and telling the model raised TypeError in every
    adapter that prints its result (`for_model`), failing the agent's run after the tool ran."""
    runs: list[int] = []

    def totals() -> Any:
        runs.append(1)
        return result

    gate = make_gate(EffectTable([ToolSpec(name="totals", effect=Effect.READ, fn=totals)]))
    gate.table.allow_all("support")
    out = gate.call("totals", {}, context("m1"))
    assert isinstance(out, Executed)
    text = out.for_model()
    assert isinstance(text, str)
    assert text
    if shown is not None:
        assert json.loads(text) == shown
    assert runs == [1]


def test_an_mcp_answer_of_a_result_holding_itself_is_its_repr_not_a_crash() -> None:
    """`mcp serve` writes out lone surrogates in every result before answering: walking a value
    that holds itself recursed without end."""
    pytest.importorskip("mcp")
    from effectgate.mcp._common import result_for

    answer = result_for(Executed(tool="totals", result=_circular()))
    assert answer.is_error is False
    assert answer.structured_content is None
    [block] = answer.content
    assert "loop" in getattr(block, "text", "")
