"""Review round 22 of the smolagents adapter: today's plain copy of a managed agent's memory.
Each test reproduced a defect before its fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from smolagents import CodeAgent
from smolagents.monitoring import LogLevel

from effectgate import Keyring
from effectgate.rows import gate_for
from effectgate_smolagents import Finished, GatedAgent, _plain
from effectgate_smolagents.testing import ScriptedCodeModel

from .test_managed import IDENTITY

#: a member's code ends on a list holding itself twice: smolagents prints it at once ("[[...], [...]]")
SELF_HOLDING = "x = [0, 0]\nx[0] = x\nx[1] = x\nfinal_answer(x)"
_LIMIT = 20_000


def test_a_member_answering_with_a_list_holding_itself_does_not_hang_the_manager(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plain copy of a member's memory (made around every call the manager's code makes)
    followed each reference afresh down to its depth cut: a list holding itself twice (or any
    shared part) was copied 2**64 times over, and the manager's run never ended. Each object is
    now copied once (a cycle cut where it closes): the copy takes a few dozen steps."""
    calls = [0]
    original = _plain.plain

    def counting(value: Any, *args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] > _LIMIT:
            raise RecursionError("the plain copy does not end")
        return original(value, *args, **kwargs)

    monkeypatch.setattr(_plain, "plain", counting)
    member = CodeAgent(
        tools=[],
        model=ScriptedCodeModel([SELF_HOLDING]),
        name="orders",
        description="Orders.",
        verbosity_level=LogLevel.OFF,
    )
    gate = gate_for(
        [], {}, agent_id="support", db=f"sqlite:///{tmp_path / 'e.db'}", keyring=Keyring.generate()
    )
    GatedAgent(member, gate, agent_id="support")
    manager = CodeAgent(
        tools=[],
        model=ScriptedCodeModel(
            [
                'orders(task="Where is 1042?")\nout = orders.memory.steps[-1].action_output',
                'final_answer("done")',
            ]
        ),
        managed_agents=[member],
        verbosity_level=LogLevel.OFF,
        max_steps=3,
    )
    with gate:
        out = GatedAgent(manager, gate, agent_id="support").run("Look at order 1042", **IDENTITY)
    assert isinstance(out, Finished)
    assert calls[0] < _LIMIT
    copied = manager.python_executor.state["out"]
    assert copied == ["...", "..."]  # the cycle cut where it closes: never unrolled
