"""A restored `RunState` whose arguments were edited after approval runs nothing (a read-back boundary).

Each test runs on SQLite and PostgreSQL (`store_url`); effects are counted at the receiver.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from agents import Runner, RunState

from effectgate.testing import say
from effectgate_openai_agents import approve_as, pending_approvals

from ._harness import context, tool_results
from .test_native_approvals import FINANCE, REFUND, Shop


@pytest.fixture
def shop(store_url: str) -> Iterator[Callable[..., Shop]]:
    made: list[Shop] = []

    def make(script: list[Any], **options: Any) -> Shop:
        made.append(Shop(store_url, script, **options))
        return made[-1]

    yield make
    for s in made:
        s.gate.close()


def _replace_everywhere(snapshot: str, old: str, new: str) -> str:
    """Every string in the snapshot's JSON with `old` replaced: the model response, the
    generated items, the interruption, the processed response and effectgate's turn record."""

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        if isinstance(node, str):
            return node.replace(old, new)
        return node

    data = walk(json.loads(snapshot))
    # the SDK's own fingerprints of its calls (0.24) would refuse the edit before effectgate
    # sees it; a holder of the snapshot can drop them too
    data["context"].pop("tool_invocations", None)
    return json.dumps(data)


def _restore(s: Shop, snapshot: str) -> RunState[Any, Any]:
    return asyncio.run(RunState.from_string(s.agent, snapshot))


def test_arguments_edited_after_approval_do_not_run(shop: Callable[..., Shop]) -> None:
    """The refund of 500 is approved (`approve_as` attaches the grant), then the stored snapshot
    is edited so that every copy of the call's arguments says 99999 (same order, same call id,
    grant and SDK approval kept). Resumed (twice), the edited refund never runs, nor does the
    approved one with the edited amount; the store's approval keeps its approved arguments."""
    s = shop([REFUND, say("Done."), say("Done again.")])
    paused = Runner.run_sync(s.agent, "Refund order 1042", context=context("m1"))
    state = paused.to_state()
    [item] = pending_approvals(state)
    approve_as(s.gate, state, item, FINANCE)
    stored = _replace_everywhere(state.to_string(), '"amount":500', '"amount":99999')
    assert '"amount":500' not in stored
    for _ in range(2):
        result = s.resume(_restore(s, stored))
        assert [i.call_id for i in result.interruptions] == ["c1"]  # paused again, not run
        assert [o for o in tool_results(result) if o.call_id == "c1"] == []
    assert s.receiver.count("refund", order_id="1042", amount=99999) == 0
    assert s.receiver.count("refund", order_id="1042", amount=500) == 0
