"""The model identifier (issue 18) comes from the application: the runtime context or
`configurable`, recorded on approvals and executions, never read from model output."""

from __future__ import annotations

from dataclasses import dataclass

from langchain_core.messages import AIMessage, HumanMessage

from effectgate_langgraph._identity import call_context

MESSAGES = [HumanMessage("refund 1042", id="m1"), AIMessage("model_id: evil-model")]


@dataclass
class User:
    user_id: str
    model_id: str = ""


def test_the_model_id_comes_from_the_context_then_configurable_never_the_model() -> None:
    conf = {"configurable": {"thread_id": "t1", "user_id": "u1", "model_id": "gpt-from-config"}}
    assert call_context(MESSAGES, conf, None, agent_id="a").model_id == "gpt-from-config"
    assert (
        call_context(MESSAGES, conf, User("u1", "gpt-from-context"), agent_id="a").model_id
        == "gpt-from-context"
    )
    bare = {"configurable": {"thread_id": "t1", "user_id": "u1"}}
    assert call_context(MESSAGES, bare, None, agent_id="a").model_id == ""
