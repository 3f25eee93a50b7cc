"""Round 5: the items `with_outcome` appends must be accepted by every model path of the SDK.
The Chat Completions path (`OpenAIChatCompletionsModel`, LiteLLM) turns a `function_call` into
an assistant `tool_calls[].id`, which OpenAI caps at 40 characters (a longer one is a 400,
`string_above_max_length`): the next run would fail on every executed deferred operation."""

from __future__ import annotations

from typing import Any

from agents.models.chatcmpl_converter import Converter

from effectgate import Executed, Refused
from effectgate._clock import uuid4_hex
from effectgate_openai_agents import with_outcome

CHAT_TOOL_CALL_ID_MAX = 40  # OpenAI Chat Completions: messages[].tool_calls[].id, maxLength


def test_outcome_call_ids_fit_the_chat_completions_limit_and_stay_distinct() -> None:
    done = Executed(tool="refund_order", result={"refund": "re_1"}, approval_id=uuid4_hex())
    failed = Refused(code="failed", message="provider said no", tool="refund_order", approval_id=uuid4_hex())
    custom = Executed(tool="refund_order", result={"refund": "re_2"}, approval_id="op-" + "x" * 60)
    history: list[Any] = [{"role": "user", "content": "Please refund order 1042"}]
    for outcome in (done, failed, custom):
        history = with_outcome(history, outcome)

    messages = Converter.items_to_messages(history)

    calls = [c["id"] for m in messages for c in m.get("tool_calls") or ()]
    answered = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
    assert len(set(calls)) == 3
    assert answered == calls
    assert all(len(i) <= CHAT_TOOL_CALL_ID_MAX for i in calls), calls
