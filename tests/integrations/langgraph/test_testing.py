"""ScriptedChatModel: the core's Script as a LangChain chat model, strict and never cycling."""

from __future__ import annotations

import asyncio
import os

import langchain.chat_models
import pytest
from langchain_core.messages import AIMessage, HumanMessage

from effectgate.testing import Script, ScriptError, call, say, step
from effectgate_langgraph import table_tools
from effectgate_langgraph.testing import ScriptedChatModel
from tests.conformance.adapters import ShopGate


def test_a_step_becomes_an_ai_message_with_the_scripted_call_ids() -> None:
    """A step of two calls is one AIMessage whose tool calls carry the scripted names, args and ids."""
    model = ScriptedChatModel(
        script=Script(
            [step(call("get_order", id="c1", order_id="1042"), call("search_tickets", id="c2", query="x"))]
        )
    )
    message = model.invoke([HumanMessage("hi")])
    assert isinstance(message, AIMessage)
    assert [(c["name"], c["args"], c["id"]) for c in message.tool_calls] == [
        ("get_order", {"order_id": "1042"}, "c1"),
        ("search_tickets", {"query": "x"}, "c2"),
    ]


def test_a_say_becomes_a_plain_ai_message() -> None:
    """A scripted answer is an AIMessage with that text and no tool calls."""
    message = ScriptedChatModel(script=Script([say("It ships today.")])).invoke("where is it?")
    assert (message.content, message.tool_calls) == ("It ships today.", [])


def test_bind_tools_returns_the_model_itself(shop_gate: ShopGate) -> None:
    """Binding tools changes nothing: the script already says which tools are called."""
    model = ScriptedChatModel(script=Script([]))
    assert model.bind_tools(table_tools(shop_gate.gate.table)) is model


def test_one_call_too_many_raises() -> None:
    """Asking for a turn past the end of the script raises instead of cycling."""
    model = ScriptedChatModel(script=Script([say("only one")]))
    model.invoke("first")
    with pytest.raises(ScriptError):
        model.invoke("second")


def test_leftover_turns_fail_assert_complete() -> None:
    """assert_complete fails while a scripted turn is unused, and passes once it is used."""
    model = ScriptedChatModel(script=Script([say("a"), say("b")]))
    model.invoke("x")
    with pytest.raises(ScriptError):
        model.assert_complete()
    model.invoke("y")
    model.assert_complete()


def test_the_messages_shown_are_kept_and_async_works() -> None:
    """`ainvoke` takes the next turn too, and the script keeps what the model was shown."""
    model = ScriptedChatModel(script=Script([say("a")]))
    asyncio.run(model.ainvoke([HumanMessage("hello", id="m1")]))
    [[shown]] = model.script.seen
    assert (shown.content, shown.id) == ("hello", "m1")


def test_real_model_clients_cannot_be_built() -> None:
    """In this suite, asking langchain for a provider model fails, and no provider key is set."""
    with pytest.raises(AssertionError):
        langchain.chat_models.init_chat_model("openai:gpt-4o")
    assert "OPENAI_API_KEY" not in os.environ
    assert "ANTHROPIC_API_KEY" not in os.environ
