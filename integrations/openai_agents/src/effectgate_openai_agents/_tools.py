"""Gated FunctionTools: the effect table decides `needs_approval`, and every call runs through the gate.

`gate_tools(tools, gate, agent_id=...)` returns one FunctionTool per tool, with the same name,
description and JSON schema (what the model sees), and two things replaced:

- `needs_approval`: `False` for read and write rows (they never pause, so the SDK never forces an
  approval on them), and for gated rows a callable that registers the call with the gate and asks
  the SDK to pause only when the core answers `Pending`. A replayed message whose call already ran
  (`Executed`), a bad argument (`Invalid`) or a refusal does not pause: the model is told at once;
  nor does a call its message's decided approval answers for other arguments (`mismatch`).
- `on_invoke_tool`: the call goes through the core with the raw arguments the model sent, so the
  arguments validated, frozen and hashed are the ones that run. What runs is the effect table's
  function for that row (for a table built from the tools, `gate_agent(..., effects=...)`, the
  tool itself: `_native`); the SDK's approval alone never runs a gated call. A gated call runs only
  with a grant token the application attached (`approve()`), checked against effectgate's record,
  version and args hash; a call the SDK approved without one is refused, unless the SDK's own
  approval is settled into a grant through `native_approver` (`_native_decisions`).

`is_enabled` keeps the tool's own answer, and first settles the SDK's native decisions
(`state.approve` / `state.reject`): the SDK evaluates it with the run's context at the start of
every turn, before it selects which paused calls of a resumed run may run.

Parallel calls: with `gate_agent` (its hooks record each model response's calls in the run context,
`_records.Turn`), one turn's gated calls register together (`gate.call_step`: two calls of one
gated tool in a turn register neither); otherwise, and from a restored snapshot, call by call.

Deferred mode (`mode="deferred"`): gated calls never pause; the tool answers
`{"status": "deferred", "operation_id": <approval id>, ...}`, recorded in the run context as this
run's own, and the run ends with that payload (as a JSON string) as its final output; another
tool's output that only reads like one is not deferred (see `_deferred`). A call its input guardrail
refuses registers nothing, and a turn registers its calls once their running guardrails answered
(`_guarding`), so a refused call never amends (nor its refusal closes) another call's approval.

A paused call's record in the run context is sealed (`_records`); every decision through it is
verified first. Each gated tool's `on_invoke_tool` carries its gate (`_reach.mark`).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import inspect
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any, Literal

from agents import FunctionTool, RunContextWrapper
from agents.tool_context import ToolContext

from effectgate import Approver, CallContext, EffectGate, Executed, Invalid, Outcome, Pending
from effectgate.adapter import Paused, Unknown, bind_token, check_wrappable, is_gated
from effectgate.errors import EffectGateError, NeedsReconciliation, TokenError

from ._arguments import call_of, parse
from ._context import STATE_KEY, MissingIdentity, TamperedState, adapter_state, call_context, resumed
from ._deferred import deferred_payload, is_deferred, remember_deferred
from ._guarding import checking, wait_checked
from ._native import awaited, calling, check_own_approval, failed, invalid_error, model_output, own_policy
from ._native_decisions import NativeApprover, NativeDecisions, execute_grant, not_granted, unknown_outcome
from ._reach import mark
from ._records import Turn, check_asked_again, for_other_arguments, invocation_of, paused_record, step_calls
from ._restored import gated as mark_gated
from ._restored import observe
from ._table import as_function_tool, spec_tool, table_tools

Mode = Literal["approval", "deferred"]

_CACHE_LIMIT = 4096
_Step = dict[str, Outcome]
_StepKey = tuple[str, str, tuple[str, ...]]
_Found = tuple[Turn | None, list[tuple[str, Any, str]], _StepKey]
_Entry = tuple[Any, asyncio.Future[_Step]]
_INVOKE_ANNOTATIONS: dict[str, Any] = {"ctx": ToolContext[Any], "arguments": str, "return": Any}


def _run(ctx: RunContextWrapper[Any]) -> object:
    """One SDK run (one leg: a resumed state is a copy): its approval table, shared by its calls."""
    return getattr(ctx, "_approvals", ctx)


class GatedTools:
    """The shared state of one `gate_tools` call: step registrations and per-call outcomes."""

    def __init__(
        self, gate: EffectGate, *, agent_id: str, mode: Mode, native_approver: NativeApprover | None = None
    ) -> None:
        if mode not in ("approval", "deferred"):
            raise ValueError(f"mode must be 'approval' or 'deferred', not {mode!r}")
        if not agent_id:
            raise ValueError("gate_tools needs the agent_id the effect table's allowlist names")
        if not isinstance(native_approver, Approver | None) and not callable(native_approver):
            raise TypeError(
                f"native_approver must be an Approver or a function of the run context: {native_approver!r}"
            )
        self.gate = gate
        self.agent_id = agent_id
        self.mode: Mode = mode
        self.names: dict[str, str] = {}  # each tool's name -> the SDK's (qualified) name
        self.tools: dict[str, FunctionTool] = {}  # each tool as given: its failure policy
        self.native = NativeDecisions(gate, agent_id=agent_id, approver=native_approver, tools=self.names)
        # outcomes decided before the call runs (needs_approval), taken once by on_invoke of the same
        # run, call id, tool and arguments (the SDK may skip a call: a later turn, or another run on
        # the same context, may reuse its id); kept with the run (`_run`): its id is not reused
        self._decided: OrderedDict[tuple[int, str, str], tuple[object, Outcome]] = OrderedDict()
        # one registration per model response: (session, origin, call ids) -> (its calls as
        # `on_llm_end` recorded them, the task); never served to a response reusing the ids
        self._steps: OrderedDict[_StepKey, _Entry] = OrderedDict()

    # -- wrapping

    def wrap(self, tool: FunctionTool, unknown: Unknown) -> FunctionTool:
        check_wrappable(self.gate, agent_id=self.agent_id, name=tool.name, unknown=unknown)
        gated = is_gated(self.gate, tool.name)
        check_own_approval(self.gate, tool, gated=gated)
        if gated:
            mark_gated(tool.name)  # its SDK approvals in a restored snapshot are dropped (`_restored`)
        self.names[tool.name] = tool.qualified_name  # the SDK keys decisions by it
        self.tools[tool.name] = tool
        name = tool.name

        async def on_invoke(ctx: ToolContext[Any], arguments: str) -> Any:
            return await self.invoke(name, ctx, arguments, gated=gated)

        # Resolved, not strings: the SDK reads the first parameter's type on every call (a
        # `RunContextWrapper` one gets a reduced context), and evaluating string annotations
        # compiles them each time.
        on_invoke.__annotations__ = dict(_INVOKE_ANNOTATIONS)
        mark(on_invoke, self.gate, self.mode)  # what `gate_agent` checks an agent's tools by (`_reach`)

        needs: bool | Callable[[RunContextWrapper[Any], dict[str, Any], str], Awaitable[bool]] = False
        if gated and self.mode == "approval":

            async def needs_approval(
                ctx: RunContextWrapper[Any], params: dict[str, Any], call_id: str
            ) -> bool:
                return await self.needs_approval(name, ctx, params, call_id)

            needs = needs_approval
        # A shallow copy, as the SDK copies tools (a FunctionTool subclass with an __init__ of its
        # own cannot be rebuilt field by field); the original is never changed.
        gated_tool = copy.copy(tool)
        gated_tool.on_invoke_tool = on_invoke
        gated_tool.needs_approval = needs
        gated_tool.is_enabled = self._enabled(tool.is_enabled)
        deferred = self._registered if self.mode == "deferred" else None  # refusals close
        guards = self.native.guarded(tool, gated=gated, deferred=deferred)
        gated_tool.tool_input_guardrails = checking(guards) if gated and deferred else guards
        return gated_tool

    def _enabled(self, own: Any) -> Callable[[RunContextWrapper[Any], Any], bool | Awaitable[bool]]:
        """The tool's own `is_enabled`, after settling the SDK's native decisions: the SDK evaluates
        it with the run's context at the start of every turn, before it selects which paused calls
        run (`_native_decisions`). A run without decisions and a tool whose own answer is a bool
        are answered at once (the SDK awaits only what is awaitable)."""

        async def settled(ctx: RunContextWrapper[Any], agent: Any) -> bool:
            await self.native.settle(ctx)
            if isinstance(own, bool):
                return own
            answer = own(ctx, agent)
            return bool(await answer if inspect.isawaitable(answer) else answer)

        def is_enabled(ctx: RunContextWrapper[Any], agent: Any) -> bool | Awaitable[bool]:
            if isinstance(own, bool) and not getattr(ctx, "_approvals", None):
                observe(ctx)  # a run effectgate has seen: its later decisions are made here
                return own  # nothing to settle (`NativeDecisions.settle` needs SDK decisions)
            return settled(ctx, agent)

        return is_enabled

    # -- the core, off the event loop

    def _sync(self, name: str) -> bool:
        spec = self.gate.table.get(name)
        return spec is None or not awaited(spec.fn)

    async def _call(self, name: str, args: Any, cctx: CallContext) -> Outcome:
        """One call through the core. A sync table function runs the whole call in one worker
        thread (one hop, as the SDK does for a plain sync function tool); an async tool, and an SDK
        tool of `effects=` (`_native.awaited`), uses the core's async driver. Either way the loop
        never waits on the database."""
        if self._sync(name):
            return await asyncio.to_thread(self.gate.call, name, args, cctx)
        return await self.gate.acall(name, args, cctx)

    # -- registration

    def _remember(self, run: object, key: tuple[int, str, str], outcome: Outcome) -> None:
        self._decided[key] = (run, outcome)
        while len(self._decided) > _CACHE_LIMIT:
            self._decided.popitem(last=False)

    def _step(self, name: str, context: Any, args: Any, call_id: str, cctx: CallContext) -> _Found:
        """The model response that made call `call_id`, its gated calls to register together (less
        those their input guardrail refused, `Turn.refused`), and their registration's key."""
        turn, step = step_calls(adapter_state(context).get("turn"), call_id, name, args)
        refused = turn.refused if turn is not None else frozenset()
        calls = [
            (tname, parse(targs), cid)
            for cid, tname, targs in step
            if tname in self.names and is_gated(self.gate, tname) and cid not in refused
        ]
        return turn, calls, (cctx.session_id, cctx.origin_message_id, tuple(cid for _, _, cid in calls))

    async def _register(self, name: str, context: Any, args: Any, call_id: str, cctx: CallContext) -> Outcome:
        """Register one gated call, together with its turn's other gated calls when known."""
        turn, calls, key = self._step(name, context, args, call_id, cctx)
        if not any(cid == call_id for _, _, cid in calls):
            return await self._call(name, args, cctx)
        entry = self._steps.get(key)
        if entry is None or entry[0] is not turn:  # another model response: registered afresh
            if await wait_checked(turn, [cid for _, _, cid in calls if cid != call_id]):  # `_guarding`
                return await self._register(name, context, args, call_id, cctx)  # without the refused
            entry = (turn, asyncio.ensure_future(self._register_step(calls, cctx)))
            self._steps[key] = entry
            while len(self._steps) > _CACHE_LIMIT:
                self._steps.popitem(last=False)
        outcome = await self._take(key, entry, call_id)
        return outcome if outcome is not None else await self._call(name, args, cctx)

    async def _take(self, key: _StepKey, entry: _Entry, call_id: str) -> Outcome | None:
        try:  # shielded: one call cancelled (its SDK timeout) must not cancel its siblings' answers
            outcomes = await asyncio.shield(entry[1])
        except BaseException:  # the store failed (or the run was cancelled): not kept for a retry
            if self._steps.get(key) is entry:
                del self._steps[key]
            raise
        # each outcome is taken once, and only by a call of the response that registered it
        outcome = outcomes.pop(call_id, None)
        if not outcomes:
            self._steps.pop(key, None)
        return outcome

    async def _register_step(
        self, calls: list[tuple[str, Any, str]], cctx: CallContext
    ) -> dict[str, Outcome]:
        outcomes = await asyncio.to_thread(
            self.gate.call_step, calls, dataclasses.replace(cctx, tool_call_id=None)
        )
        return {cid: o for (_, _, cid), o in zip(calls, outcomes, strict=True)}

    async def _registered(self, ctx: ToolContext[Any]) -> Outcome | None:
        """Deferred mode: what a call its input guardrail refused (never invoked) registered with
        its turn's other gated calls, when that is an approval of its own (new: not another call's
        that it amended or found again); else None. A refused call registers nothing itself, and
        its turn's calls not registered yet register without it."""
        call_id, args = ctx.tool_call_id, parse(ctx.tool_arguments)
        turn, calls, key = self._step(ctx.tool_name, ctx.context, args, call_id, self._cctx(ctx, call_id))
        entry = self._steps.get(key)
        if turn is not None:
            turn.refused = turn.refused | {call_id}
        if entry is None or entry[0] is not turn or not any(cid == call_id for _, _, cid in calls):
            return None
        done = await self._take(key, entry, call_id)
        return done if isinstance(done, Pending) and done.version == 1 and not done.replay else None

    async def needs_approval(
        self, name: str, ctx: RunContextWrapper[Any], params: dict[str, Any], call_id: str
    ) -> bool:
        cctx = self._cctx(ctx, call_id)
        check_asked_again(self.gate, ctx, cctx, call_id, name, params)  # a paused call, edited
        registered = await self._register(name, ctx.context, params, call_id, cctx)
        outcome = for_other_arguments(self.gate, name, params, registered)  # not this call's to pause on
        run = _run(ctx)
        key = (id(run), call_id, call_of(name, params))
        if isinstance(outcome, Pending):
            record = paused_record(self.gate, cctx, call_id, outcome, invocation_of(ctx, call_id))
            adapter_state(ctx.context)["approvals"][call_id] = record
            # the run pauses: decisions on this state (or its `result.to_state()` copy) are made here
            observe(ctx)
            self._decided.pop(key, None)
            return True
        self._remember(run, key, outcome)
        return False

    # -- execution

    def _cctx(self, ctx: RunContextWrapper[Any], call_id: str) -> CallContext:
        return call_context(
            ctx.context, agent_id=self.agent_id, tool_call_id=call_id, gate=self.gate, resumed=resumed(ctx)
        )

    async def invoke(self, name: str, ctx: ToolContext[Any], arguments: str, *, gated: bool) -> Any:
        cctx = self._cctx(ctx, ctx.tool_call_id)
        args = parse(arguments)
        decided = None
        if gated and self._decided:  # only a gated call's needs_approval decides before it runs
            run = _run(ctx)
            kept = self._decided.pop((id(run), ctx.tool_call_id, call_of(name, args)), None)
            decided = kept[1] if kept is not None and kept[0] is run else None
        with calling(ctx):  # a native tool's function runs the SDK tool with this call's context
            return await self._invoke(name, ctx, cctx, args, decided, gated=gated)

    async def _invoke(
        self,
        name: str,
        ctx: ToolContext[Any],
        cctx: CallContext,
        args: Any,
        decided: Outcome | None,
        *,
        gated: bool,
    ) -> Any:
        try:
            if decided is not None:
                outcome: Outcome = decided
            elif not gated:
                outcome = await self._call(name, args, cctx)
            elif self.mode == "deferred":
                outcome = await self._register(name, ctx.context, args, ctx.tool_call_id, cctx)
            else:
                outcome = for_other_arguments(self.gate, name, args, await self._call(name, args, cctx))
            deferred = gated and self.mode == "deferred" and isinstance(outcome, Pending | Executed)
            if deferred and outcome.approval_id is not None:  # type: ignore[union-attr]
                # the run's own record of what it deferred: the only source of deferred results
                payload = deferred_payload(outcome)  # type: ignore[arg-type]
                return remember_deferred(ctx.context, ctx.tool_call_id, payload)
            if isinstance(outcome, Pending):
                return await self._run_granted(ctx, cctx, outcome, args)
            tool = self.tools.get(name)
            if not isinstance(outcome, Invalid) or tool is None or not own_policy(tool, ctx):
                return model_output(outcome)
        except (MissingIdentity, TamperedState):
            raise
        except TokenError as exc:
            return f"Refused (token_{exc.reason}): {exc}"
        except NeedsReconciliation as exc:  # it may have happened: not a refusal
            return unknown_outcome(name, exc)
        except EffectGateError as exc:
            return f"Refused: {exc}"
        except Exception as exc:  # the tool's own failure: recorded by the gate, then its policy
            return await failed(self.tools.get(name), name, ctx, exc)
        # Arguments the gate refused, for a tool with a failure policy of its own: the SDK's error
        # under that policy (the SDK's default policy would hide what to correct: effectgate's
        # Invalid text tells the model, as every gated tool's does)
        return await failed(tool, name, ctx, invalid_error(name, ctx.tool_arguments, outcome))

    async def _run_granted(
        self, ctx: ToolContext[Any], cctx: CallContext, pending: Pending, args: Any
    ) -> Any:
        grants = adapter_state(ctx.context)["grants"]
        token, settled = grants.get(pending.approval_id), False
        if not isinstance(token, str) and pending.status == "pending":
            # a call the SDK approved without pausing it (an always_approve decision): settle it now
            records = adapter_state(ctx.context)["approvals"]
            old = records.get(ctx.tool_call_id)  # of another approval: another run's call (a reused id)
            if not isinstance(old, MutableMapping) or old.get("approval_id") != pending.approval_id:
                records[ctx.tool_call_id] = paused_record(self.gate, cctx, ctx.tool_call_id, pending)
            await self.native.settle(ctx)
            token = grants.get(pending.approval_id)
            settled = isinstance(token, str)
        if not isinstance(token, str) or (pending.status != "approved" and not settled):
            record = adapter_state(ctx.context)["approvals"].get(ctx.tool_call_id)
            return await not_granted(self.gate, pending, record, granted=isinstance(token, str))
        # the token read back from the run context (which a stored state carries) must be this
        # call's approval's, at its version: another approval's grant runs nothing here
        bind_token(Paused.of(pending), token)
        executed = await execute_grant(self.gate, pending, token, args, sync=self._sync(pending.card.tool))
        grants.pop(pending.approval_id, None)
        record = adapter_state(ctx.context)["approvals"].get(ctx.tool_call_id)
        if isinstance(record, MutableMapping):
            record["native"] = "ran"  # the SDK's approval stays; there is nothing left to settle
        return model_output(executed) if isinstance(executed, Executed) else executed


def gate_tools(
    tools: Iterable[FunctionTool | Callable[..., Any]],
    gate: EffectGate,
    *,
    agent_id: str,
    unknown: Unknown = "raise",
    mode: Mode = "approval",
    native_approver: NativeApprover | None = None,
) -> list[FunctionTool]:
    """Gated copies of `tools` (FunctionTools or plain functions) for the agent `agent_id`.

    A tool without a row in the table (or outside the agent's allowlist) raises `UnknownTool`
    here, unless `unknown="refuse"`: then it is kept and every call of it is refused and recorded.
    `native_approver` is who `state.approve(item)` approves as (`_native_decisions`); without it a
    native approve runs nothing, and a native reject always closes the approval.
    """
    shared = GatedTools(gate, agent_id=agent_id, mode=mode, native_approver=native_approver)
    return [shared.wrap(as_function_tool(t), unknown) for t in tools]


__all__ = [
    "STATE_KEY",
    "GatedTools",
    "deferred_payload",
    "gate_tools",
    "is_deferred",
    "spec_tool",
    "table_tools",
]
