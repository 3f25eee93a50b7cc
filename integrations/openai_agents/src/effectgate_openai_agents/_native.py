"""The tools you already have: an SDK `FunctionTool` as the core's `NativeTool`.

    agent = gate_agent(
        Agent(name="support", tools=[get_order, refund_order]),
        effects={"get_order": read(), "refund_order": money("finance", subject="order_id")},
    )

`native_tool(tool)` reads the tool's name, description and `params_json_schema` (exactly what the
model is shown, so the arguments the gate validates and hashes are the ones the model was asked
for) and gives the gate a function that runs the tool itself. That function needs the SDK's
`ToolContext`, which only exists inside a call: the gated `on_invoke_tool` keeps the current call's
context in a context variable (`calling`) for as long as the gate works on that call, whether it
runs the tool at once (a read or a write) or, after approval, with the grant (`gate.aexecute`).

What the tool sees:

- its arguments are the ones the gate validated, froze and (for a gated row) bound to the
  approval, sent to the tool's own `on_invoke_tool` as JSON, so the SDK parses and validates them
  into the function's parameters as it always does;
- a first parameter typed `RunContextWrapper` (or `ToolContext`) receives the `ToolContext` of the
  SDK call that runs it: its `context` is the run context dict (with effectgate's reserved
  `"effectgate"` entry), its `tool_call_id` the SDK's call id. An approved call runs in the
  resumed run, so it sees that run's context (restored from the snapshot), not the first run's;
- a deferred operation the application executes after the run (`execute_deferred`) runs outside
  any SDK call: the parameter then sees a ToolContext made for it (`outside_run`), whose
  `context` is the one passed to `execute_deferred(..., context=...)` (default `{}`) and whose
  `tool_call_id` is the operation id;
- an exception reaches the gate, not the tool's `failure_error_function`: the gate records the
  failure (for a gated row, an unknown outcome unless the row names it in `definite_failures`)
  and the model is told `"<tool> failed: <error>"`, like every gated tool.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any

from agents import FunctionTool
from agents.tool import set_function_tool_failure_error_function
from agents.tool_context import ToolContext

from effectgate.errors import EffectGateError
from effectgate.rows import NativeTool

_CURRENT: ContextVar[ToolContext[Any] | None] = ContextVar("effectgate_openai_agents_call", default=None)


@contextlib.contextmanager
def calling(ctx: ToolContext[Any]) -> Iterator[None]:
    """Make `ctx` the current call's ToolContext (for native tools) while the gate works on it."""
    token = _CURRENT.set(ctx)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def outside_run(
    tool: str, call_id: str, arguments: Mapping[str, Any], context: Any = None
) -> ToolContext[Any]:
    """The ToolContext a native tool sees when it runs outside an SDK run (a deferred operation)."""
    return ToolContext(
        {} if context is None else context,
        tool_name=tool,
        tool_call_id=call_id,
        tool_arguments=json.dumps(dict(arguments), separators=(",", ":")),
    )


def native_tool(tool: FunctionTool) -> NativeTool:
    """The core's view of an SDK function tool: its name, description and the JSON schema the
    model is shown, and an async function (arguments as keywords) that runs the tool itself.

    The function runs only where the adapter provides the SDK's ToolContext (a gated call of the
    tool through `gate_agent`/`gate_tools`, or `execute_deferred`); elsewhere it raises
    `EffectGateError` and runs nothing."""
    if not isinstance(tool, FunctionTool):
        raise TypeError(
            f"native_tool takes an SDK FunctionTool (from @function_tool); got {type(tool).__name__}"
        )
    # A copy that raises instead of answering with its failure_error_function: the gate must see
    # a failure as a failure (a refund that raised is not a refund that returned an error text).
    raw = set_function_tool_failure_error_function(copy.copy(tool), None)
    name = tool.name

    async def run_tool(**kwargs: Any) -> Any:
        ctx = _CURRENT.get()
        if ctx is None:
            raise EffectGateError(
                f"{name} runs only inside its own gated call (gate_agent or gate_tools), where the "
                "SDK's ToolContext is known"
            )
        return await raw.on_invoke_tool(ctx, json.dumps(kwargs, separators=(",", ":")))

    run_tool.__name__ = run_tool.__qualname__ = name
    return NativeTool(
        name=name,
        description=tool.description or name,
        schema=copy.deepcopy(tool.params_json_schema),
        fn=run_tool,
    )


__all__ = ["calling", "native_tool", "outside_run"]
