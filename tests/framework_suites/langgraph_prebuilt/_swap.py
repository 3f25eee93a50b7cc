"""The swap point: every `ToolNode(...)` the vendored tests build is a gated node instead.

`SwappedToolNode(tools, **options)` takes ToolNode's arguments and is `gated_node(tools,
{each tool: read()})`: the same tools, each an allowed read, on a SQLite store in the test's
tmp_path. Where a test gives no identity it is supplied; a value the test gives is kept:

- `thread_id` and `user_id` in `config["configurable"]`, as an application supplies them;
- the id of the user message the step answers. The adapter reads it only from a HumanMessage with
  an id in the state, and most of these tests invoke the node with an AIMessage alone, so
  `origin=True` replaces the adapter's lookup (`_identity.origin_message_id`) with one that
  answers "suite-message" where the state has none. That the adapter offers no other way to
  supply it is reported as a gap (`EFFECTGATE_SUITE_NO_ORIGIN=1` measures without it).

`install(monkeypatch, module, db, origin=...)` puts it under the name `ToolNode` in one vendored test module,
and in `langgraph.prebuilt.chat_agent_executor` (where `create_react_agent` builds its node).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

import pytest
from langchain_core.messages import AnyMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.prebuilt import chat_agent_executor
from langgraph.runtime import Runtime

from effectgate import EffectGate
from effectgate.adapter import MissingIdentity
from effectgate.rows import read
from effectgate_langgraph import GatedToolNode, _identity, gated_node
from effectgate_langgraph._native import as_tool  # how gated_node makes a function a tool

_real_origin = _identity.origin_message_id

THREAD_ID = "suite-thread"
ORIGIN_ID = "suite-message"
USER_ID = "suite-user"


class _Where:
    """The store the current test's nodes use, and the gates they built (closed after it)."""

    db: str | None = None
    gates: list[EffectGate] = []  # noqa: RUF012 (one list per test, reset by `install`)


def with_identity(config: RunnableConfig) -> RunnableConfig:
    """`config` with a thread id and a user id where it has none (a copy; the caller's is kept)."""
    conf = dict(config.get("configurable") or {})
    conf.setdefault("thread_id", THREAD_ID)
    conf.setdefault("user_id", USER_ID)
    return {**config, "configurable": conf}


class SwappedToolNode(GatedToolNode):
    """`ToolNode(tools, **options)` as a gated node: every tool an allowed read."""

    def __init__(self, tools: Sequence[BaseTool | Any], **options: Any) -> None:
        if _Where.db is None:
            raise RuntimeError("SwappedToolNode is built only inside the suite (see conftest.py)")
        offered = [as_tool(t) for t in tools]
        built = gated_node(offered, {t.name: read() for t in offered}, db=_Where.db)
        _Where.gates.append(built.gate)
        super().__init__(built.gate, offered, agent_id=built.agent_id, **options)

    def _func(self, input: Any, config: RunnableConfig, runtime: Runtime[Any]) -> Any:
        return super()._func(input, with_identity(config), runtime)

    async def _afunc(self, input: Any, config: RunnableConfig, runtime: Runtime[Any]) -> Any:
        return await super()._afunc(input, with_identity(config), runtime)


def _origin_or_fixed(messages: Sequence[AnyMessage]) -> str:
    try:
        return _real_origin(messages)
    except MissingIdentity:
        return ORIGIN_ID


def install(monkeypatch: pytest.MonkeyPatch, module: ModuleType, db: str, *, origin: bool) -> None:
    """Swap the gated node in for ToolNode in `module` and in create_react_agent, for one test.

    `origin=True` also supplies the user message id where the state has none (module docstring)."""
    if origin:
        monkeypatch.setattr(_identity, "origin_message_id", _origin_or_fixed)
    _Where.db = db
    _Where.gates = []
    if hasattr(module, "ToolNode"):
        monkeypatch.setattr(module, "ToolNode", SwappedToolNode)
    monkeypatch.setattr(chat_agent_executor, "ToolNode", SwappedToolNode)


def uninstall() -> None:
    for gate in _Where.gates:
        gate.close()
    _Where.db = None
    _Where.gates = []
