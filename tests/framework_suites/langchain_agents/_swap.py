"""The swap point: every agent the vendored tests build with tools gets effectgate's middleware.

`create_agent(model, tools, middleware=[...], **options)` is, here, what a user does who adds
the gate to an agent they already have: the same call, with `gated_middleware(tools, {each tool:
read()})` appended as the last middleware and the tools given to it instead of `tools=`:

- The gate's middleware goes last, innermost, where the tool runs: the tests' own
  `wrap_tool_call` middleware (retries, limits, HITL, error handling) wrap it as they wrap the
  tool, and their `handler` is the gate. Put first, it would answer every call before them.
- The gate offers every client-side tool the agent runs: the `tools=` the test gives and the
  tools its middleware register (`middleware.tools`, e.g. the todo list's `write_todos`), each
  an allowed `read()` row, on a SQLite store in the test's tmp_path (one gate per agent, closed
  after the test). create_agent keeps one tool per name, in its usual order (the middleware's
  tools first, then the rest), so the model is bound to the same tools as before. Provider
  tools (dicts) stay in `tools=`: they run at the provider, not in the agent.
- An agent without client-side tools is built as the test builds it: there is nothing to gate,
  and the middleware's `wrap_tool_call` would make create_agent add a tool node it has none of.

Identity where a test gives none, as an application supplies it: `thread_id` and `user_id` in
`config["configurable"]`, as defaults of the compiled agent (`agent.with_config(...)`, which
create_agent itself uses for its own defaults), so a value the test passes wins. The user message
id is the id LangGraph gives the HumanMessage the test sends; `origin_message_id` in the defaults
would cover a state without one (no vendored test needs it: the count is the same without it).

`install(monkeypatch, module, db)` puts `create_agent` under that name in one vendored test
module and in `langchain.agents` / `langchain.agents.factory`, for one test.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

import langchain.agents
import pytest
from langchain.agents import factory
from langchain_core.tools import BaseTool

from effectgate import EffectGate
from effectgate.rows import read
from effectgate_langgraph import gated_middleware
from effectgate_langgraph._native import as_tool  # how gated_middleware makes a function a tool

_real_create_agent = factory.create_agent

THREAD_ID = "suite-thread"
USER_ID = "suite-user"
ORIGIN_ID = "suite-message"


class _Where:
    """The store the current test's gates use, the gates it built (closed after it), and how
    many calls they answered."""

    db: str | None = None
    gates: list[EffectGate] = []  # noqa: RUF012 (one list per test, reset by `install`)
    calls: int = 0


def _counted(gate: EffectGate) -> None:
    """Count the calls `gate` answers (every row is a read: `call` / `acall`, never `call_step`)."""
    call, acall = gate.call, gate.acall

    def counted_call(*args: Any, **kwargs: Any) -> Any:
        _Where.calls += 1
        return call(*args, **kwargs)

    async def counted_acall(*args: Any, **kwargs: Any) -> Any:
        _Where.calls += 1
        return await acall(*args, **kwargs)

    gate.call = counted_call  # type: ignore[method-assign]
    gate.acall = counted_acall  # type: ignore[method-assign]


def offered_tools(tools: Sequence[Any], middleware: Sequence[Any]) -> list[BaseTool]:
    """The client-side tools the agent runs (middleware's first, as create_agent orders them),
    one per name: the last given wins, as in create_agent's tool node."""
    given = [*(t for m in middleware for t in getattr(m, "tools", [])), *tools]
    by_name: dict[str, BaseTool] = {}
    for tool in given:
        if isinstance(tool, dict):  # a provider tool: runs at the provider
            continue
        made = as_tool(tool)
        by_name[made.name] = made
    return list(by_name.values())


def create_agent(model: Any, tools: Sequence[Any] | None = None, **options: Any) -> Any:
    """`create_agent(model, tools, **options)` with effectgate's middleware (module docstring)."""
    if _Where.db is None:
        raise RuntimeError("the swapped create_agent runs only inside the suite (see conftest.py)")
    middleware = list(options.pop("middleware", ()) or ())
    offered = offered_tools(list(tools or []), middleware)
    if not offered:
        return _real_create_agent(model, tools, middleware=middleware, **options)
    gated = gated_middleware(offered, {t.name: read() for t in offered}, db=_Where.db)
    _Where.gates.append(gated.gate)
    _counted(gated.gate)
    provider = [t for t in tools or [] if isinstance(t, dict)]
    agent = _real_create_agent(
        model, provider if tools is not None else None, middleware=[*middleware, gated], **options
    )
    identity = {"thread_id": THREAD_ID, "user_id": USER_ID, "origin_message_id": ORIGIN_ID}
    return agent.with_config({"configurable": identity})


def install(monkeypatch: pytest.MonkeyPatch, module: ModuleType, db: str) -> None:
    """Swap the gated `create_agent` in for one test (module docstring)."""
    _Where.db = db
    _Where.gates = []
    _Where.calls = 0
    if hasattr(module, "create_agent"):
        monkeypatch.setattr(module, "create_agent", create_agent)
    monkeypatch.setattr(langchain.agents, "create_agent", create_agent)
    monkeypatch.setattr(factory, "create_agent", create_agent)


def built() -> tuple[int, int]:
    """How many gated agents the current test built, and how many calls their gates answered."""
    return len(_Where.gates), _Where.calls


def uninstall() -> None:
    for gate in _Where.gates:
        gate.close()
    _Where.db = None
    _Where.gates = []
