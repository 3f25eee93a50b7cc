"""Deferred mode: a model response's gated calls register together once the input guardrails
running for them have answered.

The SDK runs each call of a response in a task of its own: first the call's tool input
guardrails, then the tool. The first gated call invoked registers the response's gated calls
together (`GatedTools._register`). A sibling whose guardrail was still running then (an async
guardrail awaiting a moderation service) would be registered with them, amending another call's
waiting approval on its subject, before its guardrail refused it. So while a gated call's
guardrails run, its response (`Turn`) holds a future for it (`checking`), and a registration first
waits for those of its calls (`wait_checked`); a call they refuse is left out (`Turn.refused`). A
call whose task has not started yet (`max_function_tool_concurrency`) is not waited for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping
from typing import Any

from agents import ToolGuardrailFunctionOutput, ToolInputGuardrail, ToolInputGuardrailData

from ._arguments import parse
from ._context import STATE_KEY
from ._records import Turn, step_calls


def _turn(ctx: Any) -> Turn | None:
    """The model response recorded in this process that made the guarded call `ctx`, if any."""
    state = ctx.context.get(STATE_KEY) if isinstance(ctx.context, Mapping) else None
    latest = state.get("turn") if isinstance(state, Mapping) else None
    if not isinstance(latest, Turn):
        return None  # none recorded (gate_tools without gate_agent's hooks), or a restored one
    return step_calls(latest, ctx.tool_call_id, ctx.tool_name, parse(ctx.tool_arguments))[0]


def checking(guardrails: list[ToolInputGuardrail[Any]] | None) -> list[ToolInputGuardrail[Any]] | None:
    """`guardrails`, each marking its call on its response as being checked while it runs."""
    if not guardrails:
        return guardrails

    def marked(guardrail: ToolInputGuardrail[Any]) -> ToolInputGuardrail[Any]:
        async def run(data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
            turn, call_id = _turn(data.context), data.context.tool_call_id
            if turn is None:
                return await guardrail.run(data)
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            turn.checking = {**turn.checking, call_id: done}
            try:
                return await guardrail.run(data)
            finally:
                turn.checking = {k: f for k, f in turn.checking.items() if f is not done}
                done.set_result(None)

        return ToolInputGuardrail(guardrail_function=run, name=guardrail.get_name())

    return [marked(g) for g in guardrails]


async def wait_checked(turn: Turn | None, call_ids: Collection[str]) -> bool:
    """Wait until the guardrails running for any of `call_ids` (calls of `turn`) have answered;
    whether there were any (then what registers together may have changed)."""
    running = [f for cid, f in turn.checking.items() if cid in call_ids] if turn is not None else []
    if not running:
        return False
    await asyncio.wait(running)
    return True


__all__ = ["checking", "wait_checked"]
