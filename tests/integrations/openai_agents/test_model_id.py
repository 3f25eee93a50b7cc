"""The model identifier (issue 18) comes from the run context the application passes; anything but
a string there is ignored, and nothing the model writes is read for it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from effectgate import EffectGate, EffectTable, Keyring, open_store
from effectgate_openai_agents._context import TamperedState, call_context

IDENTITY = {"session_id": "s1", "origin_message_id": "m1", "user_id": "u1"}


@pytest.mark.parametrize(("given", "recorded"), [("gpt-4.1", "gpt-4.1"), (None, ""), (42, "")])
def test_the_model_id_comes_from_the_run_context(given: Any, recorded: str) -> None:
    context = {**IDENTITY, "model_id": given} if given is not None else dict(IDENTITY)
    assert call_context(context, agent_id="support").model_id == recorded


def test_a_run_resumed_on_another_model_is_the_same_caller(tmp_path: Path) -> None:
    """The signed identity leaves the model out: resuming with another model_id verifies, while a
    changed user is still refused."""
    store = open_store(f"sqlite:///{tmp_path / 'g.db'}")
    store.setup()
    with EffectGate(EffectTable([]), store, keyring=Keyring.generate()) as gate:
        context: dict[str, Any] = {**IDENTITY, "model_id": "gpt-a"}
        call_context(context, agent_id="support", gate=gate)  # a new run: its identity is signed
        context["model_id"] = "gpt-b"
        assert call_context(context, agent_id="support", gate=gate, resumed=True).model_id == "gpt-b"
        context["user_id"] = "u2"
        with pytest.raises(TamperedState):
            call_context(context, agent_id="support", gate=gate, resumed=True)
    store.close()
