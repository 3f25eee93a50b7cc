"""The SDK's own decisions, `state.approve(item)` and `state.reject(item)`, bridged to the gate.

    agent = gate_agent(base, effects=..., native_approver=Approver("fiona", "finance"))
    state.reject(item, rejection_message="not this one")   # closes effectgate's approval
    state.approve(item)                                     # approves in effectgate as fiona
    result = await Runner.run(agent, state)

When a run resumes, before the SDK decides which paused calls run, effectgate settles every
decision the SDK holds for a call effectgate registered and holds no grant for (it does this from
the gated tools' `is_enabled`, which the SDK evaluates with the run's context at the start of every
turn, including the resumed one):

- A native reject always closes the approval (`gate.deny`), so the subject is free for other
  sessions and the record says why: the reason is the SDK's rejection message (its default,
  "Tool execution was not approved.", when none was given). A rejection made in this process is
  recorded as the configured `native_approver` when its role may decide the call, else (and
  always for one a restored snapshot carried) as the system identity `sdk-reject` with the row's
  role: the application rejected in the SDK, and a rejection cannot raise anyone's privileges.
  A call that already ran (another copy of the same state was approved and resumed first) is
  not rejected: the model is told its stored result instead of the rejection message.
- A native approve goes through `gate.aapprove` (a run cancelled meanwhile voids the grant its
  thread committed) as the configured `native_approver` (an `Approver`, or a function of the run
  context returning one): role, version, args hash, self-approval and the two-person rule all
  hold. A grant is attached and the call runs once; a `PartialApproval` (a destructive call's
  first approver) takes the SDK's approval back, so the call stays paused until a second,
  distinct approver approves. Without `native_approver`, or when the gate refuses the decision,
  nothing runs and the model is told why (the message names the setting). An
  `always_approve=True` decision lets later calls of the tool reach `on_invoke_tool` without
  pausing: each is settled there, the same way, before it may run (this run's calls only).

Only a decision made in this process is settled: the SDK's flags are unsigned, so the approvals
a restored snapshot carries (edited into it, or saved with it and resumed again) are dropped when
effectgate first sees the restored state (while it loads), and those calls stay paused
(`_restored`). A flag is settled once: its record is marked, and a destructive call's first
approve is taken back. So one `state.approve` is one approver's decision, and the approver comes
from the application, never from the model or the snapshot: a function given as
`native_approver` should read who is deciding from the application's request, not from values a
stored snapshot could carry. Before deciding, the call's record is verified
(`_records.verified_approval`: the run's signed identity, the record's seal for this call id and
run, and the gate's store showing the approval is this run's, for this tool and args hash), so a
record pointed at another approval, or two records swapped, decide nothing (`TamperedState`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from agents import (
    FunctionTool,
    RunContextWrapper,
    ToolGuardrailFunctionOutput,
    ToolInputGuardrail,
    ToolInputGuardrailData,
)
from agents.tool import DEFAULT_APPROVAL_REJECTION_MESSAGE
from agents.tool_context import ToolContext

from effectgate import Approver, EffectGate, Executed, Grant, Outcome, Pending
from effectgate._logging import logger as guarded_logger
from effectgate.adapter import native_approver, rejecting_approver
from effectgate.errors import AlreadyDecided, EffectGateError, NeedsReconciliation, TokenError

from ._context import STATE_KEY, TamperedState
from ._native import model_output
from ._records import EDITED_ITEM, hash_of_call, same_invocation, sticky_elsewhere, verified_approval
from ._restored import observe
from ._spent import outcome_unknown, running_elsewhere, spent_answer

log = guarded_logger(__name__)  # a handler that raises changes no call (effectgate._logging)

#: Who the application's native decision comes from: a fixed approver, or one per run context.
NativeApprover = Approver | Callable[[Any], Approver | None]
#: The identity a native reject is recorded under when no configured approver may decide the call.
SDK_REJECT = "sdk-reject"
#: The identity a call's approval is closed under when its input guardrail refuses it before approval.
SDK_GUARDRAIL = "sdk-guardrail"
#: deferred mode: a gated call's registration (with its turn's other gated calls), by its ToolContext
Registered = Callable[[ToolContext[Any]], Awaitable[Outcome | None]]
NO_APPROVER = (
    "state.approve() on a gated call needs gate_agent(..., native_approver=Approver(id, role)) "
    "(or gate_tools(..., native_approver=...)), or approve it with "
    "approve_as(gate, state, paused, approver)"
)


def _records(context: Any) -> tuple[MutableMapping[str, Any], MutableMapping[str, Any]] | None:
    state = context.get(STATE_KEY) if isinstance(context, Mapping) else None
    if not isinstance(state, MutableMapping):
        return None
    approvals, grants = state.get("approvals"), state.get("grants")
    if not isinstance(approvals, MutableMapping) or not isinstance(grants, MutableMapping):
        return None
    return approvals, grants


def _take_back(ctx: RunContextWrapper[Any], call_id: str) -> bool:
    """Undo the SDK's per-call approval of `call_id` (the call is paused again) by editing its
    per-call lists, as 0.24 has no public way; a sticky `always_approve` cannot be (False)."""
    lists = [getattr(r, "approved", None) for r in getattr(ctx, "_approvals", {}).values()]
    found = [ids for ids in lists if isinstance(ids, list) and call_id in ids]
    for ids in found:
        ids.remove(call_id)
    return bool(found)


class NativeDecisions:
    """Settles the SDK's decisions for one set of gated tools (see the module docstring)."""

    def __init__(
        self, gate: EffectGate, *, agent_id: str, approver: NativeApprover | None, tools: Mapping[str, str]
    ) -> None:
        self.gate = gate
        self.agent_id = agent_id
        self.approver = approver
        # this gate's tools: a handoff's other gated agent settles its own; each by the name the
        # SDK keys its decisions by (`billing.refund_order` for a tool in `tool_namespace`)
        self.tools = tools

    async def settle(self, ctx: RunContextWrapper[Any]) -> None:
        """Decide in effectgate what the SDK decided alone; each record once (a marker is set
        before the first await, so concurrent callers of one turn skip it). The approvals a
        restored snapshot carried are dropped first (`_restored.observe`): only decisions made in
        this process, since effectgate first saw the state, are settled."""
        seen = observe(ctx)
        if seen is None or not getattr(ctx, "_approvals", None):
            return
        found = _records(ctx.context)
        if found is None:
            return
        approvals, grants = found
        todo: list[tuple[str, MutableMapping[str, Any], bool]] = []
        for call_id, record in list(approvals.items()):
            if not isinstance(record, MutableMapping) or record.get("native") is not None:
                continue
            approval_id, tool = record.get("approval_id"), record.get("tool")
            if not isinstance(approval_id, str) or not isinstance(tool, str) or tool not in self.tools:
                continue
            status = ctx.is_tool_approved(self.tools[tool], call_id)
            if status is None or (status and isinstance(grants.get(approval_id), str)):
                continue  # undecided, or approved with the application's grant (`approve`)
            if sticky_elsewhere(self.gate, ctx, call_id, record):
                continue  # an always_approve / always_reject of this run reaches its own calls only
            record["native"] = "settling"
            todo.append((call_id, record, status))
        for call_id, record, approved in todo:
            try:
                if approved:
                    await self._approve(ctx, call_id, record, grants)
                else:
                    restored = seen.restored_rejection(self.tools[str(record["tool"])], call_id)
                    await self._reject(ctx, call_id, record, restored=restored)
            except BaseException:
                record.pop("native", None)
                raise

    async def _owned_row(self, ctx: RunContextWrapper[Any], call_id: str) -> Any:
        """The approval's row, once the call's record verifies (`_records.verified_approval`)."""
        _, row = await asyncio.to_thread(verified_approval, self.gate, ctx.context, call_id)
        return row

    async def _approve(
        self,
        ctx: RunContextWrapper[Any],
        call_id: str,
        record: MutableMapping[str, Any],
        grants: MutableMapping[str, Any],
    ) -> None:
        approval_id, version = str(record["approval_id"]), record.get("version")
        await self._owned_row(ctx, call_id)
        if not same_invocation(ctx, call_id, record):  # the item approved is not the call registered
            record["native"], record["native_error"] = "refused", EDITED_ITEM
            return
        approver = native_approver(self.approver, ctx.context)
        if approver is None:
            record["native"], record["native_error"] = "refused", NO_APPROVER
            log.warning("%s: %s", record.get("tool"), NO_APPROVER)
            return
        if not isinstance(version, int):
            raise TamperedState(f"no version recorded for approval {approval_id}; nothing was approved")
        try:
            # `aapprove`: a run cancelled meanwhile voids the grant its thread committed (no one
            # holds its token), so the approval can be approved again
            decision = await self.gate.aapprove(approval_id, version=version, approver=approver)
        except EffectGateError as exc:
            record["native"] = "refused"
            record["native_error"] = f"state.approve() as {approver.id} ({approver.role}) was refused: {exc}"
            return
        if isinstance(decision, Grant):
            grants[approval_id], record["native"] = decision.token, "granted"
            return
        # PartialApproval: more distinct approvers are needed; the call waits for them
        if _take_back(ctx, call_id):
            record.pop("native", None)
        else:
            record["native"] = "refused"
            record["native_error"] = (
                f"{decision.approvals} of {decision.required} distinct approvers have approved; "
                "an always_approve decision cannot keep the call paused for the next one"
            )

    async def _reject(
        self, ctx: RunContextWrapper[Any], call_id: str, record: MutableMapping[str, Any], *, restored: bool
    ) -> None:
        approval_id, tool = str(record["approval_id"]), str(record["tool"])
        row = await self._owned_row(ctx, call_id)
        record["native"] = "rejected"
        if row is not None and row.status == "executed":  # it ran first (another copy of the state)
            await self._ran_first(ctx, call_id, tool, approval_id)
        if row is None or row.status not in ("pending", "approved", "denied"):
            return  # closed (expired, ran); 'denied' is the gate's to confirm (a sealed denial)
        reason = ctx.get_rejection_message(self.tools.get(tool, tool), call_id)
        reason = reason or DEFAULT_APPROVAL_REJECTION_MESSAGE
        # a rejection a restored snapshot carried was not made in this request: the system decides
        chosen = None if restored else native_approver(self.approver, ctx.context)
        approver = rejecting_approver(self.gate, chosen, row.approver_role, system=SDK_REJECT)
        try:
            await asyncio.to_thread(
                self.gate.deny, approval_id, approver=approver, reason=reason, version=record.get("version")
            )
        except EffectGateError as exc:  # decided meanwhile, or moved to a newer version
            log.info("state.reject() of approval %s not recorded: %s", approval_id, exc)
            running = isinstance(exc, AlreadyDecided) and exc.status == "executing"
            await self._ran_first(ctx, call_id, tool, approval_id, running=running)

    def guarded(
        self, tool: FunctionTool, *, gated: bool, deferred: Registered | None = None
    ) -> list[ToolInputGuardrail[Any]] | None:
        """A gated tool's input guardrails, each closing the call's undecided approval when it
        refuses the call (`withdraw`); in deferred mode `deferred` gives the call's registration."""
        if not gated or not tool.tool_input_guardrails:
            return tool.tool_input_guardrails

        def closing(guardrail: ToolInputGuardrail[Any]) -> ToolInputGuardrail[Any]:
            async def run(data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
                out = await guardrail.run(data)
                behavior = out.behavior
                if behavior["type"] != "allow":
                    why = behavior.get("message") or f"tool input guardrail {guardrail.get_name()} tripped"
                    await self.withdraw(data.context, str(why), deferred)
                return out

            return ToolInputGuardrail(guardrail_function=run, name=guardrail.get_name())

        return [closing(g) for g in tool.tool_input_guardrails]

    async def withdraw(self, ctx: ToolContext[Any], reason: str, deferred: Registered | None = None) -> None:
        """A call an input guardrail refused while it was undecided (the SDK's pre-approval tool
        input guardrails, which it runs after `needs_approval` registered the call): the SDK does
        not pause it, so its approval is closed (`gate.deny` as the system identity
        `sdk-guardrail` with the row's role, the guardrail's message as the reason) and no
        reviewer is asked to approve what the application's own policy refused. A guardrail run
        before an approved call executes, or on a call that registered nothing (the record under
        its id is another call's), decides nothing here. In deferred mode it never pauses: closed
        only if its turn registered an approval of its own for it (`deferred`; else None)."""
        call_id, tool = ctx.tool_call_id, ctx.tool_name
        if deferred is not None and tool in self.tools:
            done = await deferred(ctx)
            if isinstance(done, Pending) and done.status == "pending":
                await self._guardrail_deny(done.approval_id, done.card.approver_role, reason, done.version)
            return
        found = _records(ctx.context)
        record = found[0].get(call_id) if found is not None else None
        if found is None or not isinstance(record, MutableMapping) or tool not in self.tools:
            return
        if hash_of_call(self.gate, tool, ctx.tool_arguments) != record.get("args_hash"):
            return  # not the call the record registered: another run's under the same call id
        if ctx.is_tool_approved(self.tools[tool], call_id) is not None or isinstance(
            found[1].get(str(record.get("approval_id"))), str
        ):
            return  # decided (or granted): the guardrail runs before the call executes
        row = await self._owned_row(ctx, call_id)
        if row is None or row.status != "pending":
            return
        await self._guardrail_deny(row.id, row.approver_role, reason, record.get("version"))

    async def _guardrail_deny(self, approval_id: str, role: str, reason: str, version: Any) -> None:
        who = Approver(SDK_GUARDRAIL, role)
        try:
            await asyncio.to_thread(self.gate.deny, approval_id, approver=who, reason=reason, version=version)
        except EffectGateError as exc:  # decided meanwhile
            log.info("guardrail refusal of approval %s not recorded: %s", approval_id, exc)

    async def _ran_first(
        self, ctx: RunContextWrapper[Any], call_id: str, tool: str, approval_id: str, *, running: bool = False
    ) -> None:
        """A rejection that came after the call ran, while it runs, or after its run ended with an
        unknown outcome (a copy of the same snapshot was approved and resumed first): the model is
        told so ("Outcome unknown" for the last), not that the call was rejected."""
        done = await asyncio.to_thread(self.gate.result, approval_id)
        unknown = await asyncio.to_thread(outcome_unknown, self.gate, approval_id) if done is None else None
        if done is not None:
            text = ran_first(tool, approval_id, done)
        elif unknown is not None or running:
            text = unknown or running_elsewhere(tool, approval_id)
        else:
            return
        for key, sdk in getattr(ctx, "_approvals", {}).items():  # the SDK's text for the call (0.24)
            rejected = getattr(sdk, "rejected", None)
            if (isinstance(rejected, list) and call_id in rejected) or (
                rejected is True and getattr(key, "tool_key", key) == self.tools.get(tool, tool)
            ):
                sdk.rejection_messages[call_id] = text


def refusal(
    tool: str, record: Mapping[str, Any] | None, approval_id: str, version: int, status: str, *, granted: bool
) -> str:
    """What the model is told when the SDK approved a call effectgate will not run: no grant (and
    why: the native approve's refusal, or the setting that makes `state.approve()` work), or a
    grant for an approval that is no longer approved."""
    text = (
        f"Refused (not_approved): {tool} is approved in the run state but effectgate holds no "
        f"{'usable ' if granted else ''}grant for approval {approval_id} (version {version}, status "
        f"{status}); it has not run."
    )
    if granted:
        return text
    why = record.get("native_error") if isinstance(record, Mapping) else None
    return f"{text} {why if isinstance(why, str) else NO_APPROVER}."


async def not_granted(
    gate: EffectGate, pending: Pending, record: Mapping[str, Any] | None, *, granted: bool
) -> Any:
    """What the model is told of an approved call this run holds no grant for: when the grant of
    its approval (at its version) was presented by another resume of the run (a copy of the same
    snapshot approved and resumed first), the call's stored result or that it runs there (never
    "Refused" for a call that runs); else the `refusal`."""
    if pending.status == "approved" and not granted:
        spent = await asyncio.to_thread(_grant_spent, gate, pending.approval_id, pending.version)
        done = await asyncio.to_thread(gate.result, pending.approval_id) if spent else None
        if done is not None:
            return model_output(done)
        if spent:  # its outcome is unknown, or it runs there
            return await asyncio.to_thread(spent_answer, gate, pending.card.tool, pending.approval_id)
    return refusal(
        pending.card.tool, record, pending.approval_id, pending.version, pending.status, granted=granted
    )


def _grant_spent(gate: EffectGate, approval_id: str, version: int) -> bool:
    # the append-only rows (its token_used event, an execution), not the unsealed columns
    with gate.store.transaction() as conn:
        return gate.store.grant_spent(conn, approval_id, version)


def ran_first(tool: str, approval_id: str, done: Executed) -> str:
    """What the model is told of a call rejected after it ran (a copy of the same run state was
    approved and resumed first): its stored result, not a rejection."""
    return (
        f"{tool} had already run for this request (approval {approval_id}) when this rejection "
        f"was made, so it was not rejected. Its result: {model_output(done)}"
    )


def unknown_outcome(name: str, exc: NeedsReconciliation) -> str:
    """What the model is told of a call whose outcome is unknown (it raised while it ran, or an
    earlier run of it did): not a refusal, since the effect may have happened, and not to retry."""
    return (
        f"{name} needs reconciliation: its outcome is unknown ({exc.reason}), so it may have "
        "happened; a person will reconcile it. Do not call it again."
    )


async def execute_grant(
    gate: EffectGate, pending: Pending, token: str, args: Any, *, sync: bool
) -> Executed | str:
    """Run an approved call with its grant. A grant another resume of the same run spent (one
    snapshot resumed twice at once) is not a refusal: the model is told the stored result, or,
    while that resume is still running the call, that it runs there (never "Refused")."""
    try:
        if sync:
            return await asyncio.to_thread(gate.execute, token, args)
        return await gate.aexecute(token, args)
    except TokenError as exc:
        if exc.reason != "used":
            raise
        done = await asyncio.to_thread(gate.result, pending.approval_id)
        if done is not None:
            return done
        row = await asyncio.to_thread(gate.store.get_approval, pending.approval_id)
        if row is None or row.status != "approved":
            raise
        return await asyncio.to_thread(spent_answer, gate, pending.card.tool, pending.approval_id)


__all__ = [
    "NO_APPROVER",
    "SDK_REJECT",
    "NativeApprover",
    "NativeDecisions",
    "execute_grant",
    "not_granted",
    "ran_first",
    "refusal",
    "running_elsewhere",
    "unknown_outcome",
]
