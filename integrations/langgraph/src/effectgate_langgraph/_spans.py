"""The tool callbacks the node fires itself, where no langchain tool's `invoke` fires them.

- `row_span(gate, tools, call, config)` fires `on_tool_start` (`tool_span`) for a read or write a
  table row's function answers (its function is not a langchain tool, so nothing else would):
  `answered` closes it with the ToolMessage, the node's `_failed` with the error.
- `answered(answer, outcome, call, config, tools, span)`: a call whose arguments the gate refused
  (`Invalid`) never reaches `tool.invoke`, where a plain ToolNode's tool fires `on_tool_start`
  then `on_tool_error` with the validation error. The node fires the same pair, once (the start
  only when no span was started), the error a `ToolException` carrying the gate's message. The
  answer the model gets is the gate's, unchanged. A started span ends with `on_tool_end`, or with
  `on_tool_error` for a run that raised (the settled outcome is its error).
- `settled_answer(...)`: `_grants.answer_settled` (a gated call its step settled, or its grant
  spent where it runs) with those callbacks, `on_tool_error` too when ToolNode's
  `handle_tool_errors` raises the error again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langchain_core.callbacks import CallbackManager, CallbackManagerForToolRun
from langchain_core.messages import ToolCall, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, ToolException
from langgraph.types import Command

from effectgate import EffectGate, Executed, Invalid

from ._fidelity import is_native
from ._grants import Settled, answer_settled


def tool_span(tool: BaseTool, call: ToolCall, config: RunnableConfig) -> CallbackManagerForToolRun:
    """`on_tool_start` for `call`, as `BaseTool.run` fires it for a langchain tool (the config's
    callbacks, tags and metadata, the tool's own)."""
    manager = CallbackManager.configure(
        config.get("callbacks"),
        tool.callbacks,
        bool(tool.verbose),
        config.get("tags"),
        tool.tags,
        config.get("metadata"),
        tool.metadata,
    )
    args = dict(call["args"])
    return manager.on_tool_start(
        {"name": tool.name, "description": tool.description},
        str(args),
        name=config.get("run_name"),
        inputs=args,
        tool_call_id=call.get("id"),
    )


def row_span(
    gate: EffectGate, tools: Mapping[str, BaseTool], call: ToolCall, config: RunnableConfig
) -> CallbackManagerForToolRun | None:
    """The span of a read or write a table row's function answers; None for a langchain tool
    given to `gated_node` (it fires its own when it runs) or a tool the node does not offer."""
    spec = gate.table.get(call["name"])
    tool = tools.get(call["name"])
    if spec is None or tool is None or is_native(spec.fn):
        return None
    return tool_span(tool, call, config)


def answered(
    answer: ToolMessage,
    outcome: object,
    call: ToolCall,
    config: RunnableConfig | None,
    tools: Mapping[str, BaseTool],
    span: CallbackManagerForToolRun | None = None,
) -> ToolMessage:
    """`answer`, after its callbacks: `on_tool_end` with it for a started span; for a call whose
    arguments the gate refused (`Invalid`), `on_tool_start` (unless `span` started the call) and
    `on_tool_error`, once. A call of a tool the node does not offer (not in `tools`) fires none."""
    if not isinstance(outcome, Invalid):
        if span is not None and isinstance(outcome, BaseException):  # its run raised
            span.on_tool_error(outcome, tool_call_id=call.get("id"))
        elif span is not None:
            span.on_tool_end(answer, name=answer.name)
        return answer
    if span is None and (tool := tools.get(call["name"])) is not None:
        span = tool_span(tool, call, config or {})
    if span is not None:
        span.on_tool_error(ToolException(outcome.for_model()), tool_call_id=call.get("id"))
    return answer


def ran_now(settled: Settled) -> bool:
    """Whether the step ran this gated call (not a replay of its stored result, not a pause or a
    refusal): a table row's function fires no callback of its own, so the node fires its start
    and end (or error) as it answers it (`row_span`, `settled_answer`)."""
    outcome = settled.outcome
    return isinstance(outcome, BaseException) or (isinstance(outcome, Executed) and not outcome.replay)


def settled_answer(
    settled: Settled,
    call: ToolCall,
    ran: ToolMessage | None,
    flag: Any,
    config: RunnableConfig | None,
    tools: Mapping[str, BaseTool],
    span: CallbackManagerForToolRun | None = None,
) -> ToolMessage | Command[Any]:
    """`answer_settled` (`flag`: ToolNode's `handle_tool_errors`), after its callbacks (`answered`)."""
    try:
        answer = answer_settled(settled, call, ran, flag)
    except Exception as exc:  # the run's error, raised again by `flag`
        if span is not None:
            span.on_tool_error(exc, tool_call_id=call.get("id"))
        raise
    if isinstance(answer, ToolMessage):
        return answered(answer, settled.outcome, call, config, tools, span)
    if span is not None:
        span.on_tool_end(answer)
    return answer
