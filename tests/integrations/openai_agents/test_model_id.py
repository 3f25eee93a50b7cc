"""The model identifier (issue 18) comes from the run context the application passes; anything but
a string there is ignored, and nothing the model writes is read for it."""

from __future__ import annotations

from typing import Any

import pytest

from effectgate_openai_agents._context import call_context

IDENTITY = {"session_id": "s1", "origin_message_id": "m1", "user_id": "u1"}


@pytest.mark.parametrize(("given", "recorded"), [("gpt-4.1", "gpt-4.1"), (None, ""), (42, "")])
def test_the_model_id_comes_from_the_run_context(given: Any, recorded: str) -> None:
    context = {**IDENTITY, "model_id": given} if given is not None else dict(IDENTITY)
    assert call_context(context, agent_id="support").model_id == recorded
