"""What the MCP server and the MCP proxy share: hints, descriptions, results, identity, grants.

Imported only with the `mcp` extra (it builds `mcp.types` values).

**Annotations are derived from the table row** (`annotations_for`), never the other way round;
they are hints for the client, and the gate enforces the row whatever a client does with them:

| effective class | readOnlyHint | destructiveHint | idempotentHint | openWorldHint |
|---|---|---|---|---|
| read | True | False | True | (unset) |
| write (autonomous) | False | False | True | (unset) |
| send, money | False | False | True | True |
| destructive | False | True | True | (unset) |

- idempotentHint ("calling repeatedly with the same arguments has no additional effect") holds
  for every class under the key rule the MCP side uses: a write runs once per (session, tool,
  origin message, args hash) and a gated call is one approval per (session, tool, origin
  message, subject), and the origin of an MCP call is derived from the call itself
  (`origin_for`), so within one session the same call again is the same request: a write is
  replayed, a gated call finds its approval (or, once it ran, its stored result). Across
  sessions it is not, and a client must not read the hint as more than "a retry is safe".
- send and money are not destructive in MCP's sense (they add a message, a payment; they
  overwrite nothing), but they are irreversible and reach the world outside: openWorldHint,
  and the description says who must approve. Only the destructive class claims destructiveHint.
- openWorldHint is left unset (the client's default) where the table does not say.
- A policy that gates writes (or leaves a class autonomous) changes the description, not the
  hints: the hints say what a tool does, the description what the gate will require.

**Identity** (`Identity`, `context_for`) comes from the server's configuration (command-line
flags, environment, or a callable the application passes for each request), never from tool
arguments: the model writes arguments, and a `user_id` among them is just an argument (the
row's schema refuses it, or the tool receives it as data). The session, user and agent are the
configured ones; `tool_call_id` is the MCP request id (audit only, never a key).

**The origin message** of an MCP call is `origin_for(tool, args)`: "mcp:" and the args hash of
the frozen arguments. MCP carries no user-message id, and a client re-issues a call rather than
a message, so the call itself is the message: the same call in the same session is the same
intent. A re-issued gated call therefore finds its approval (`Pending`), a call with other
arguments on the same subject amends the waiting approval (version + 1), and once a call ran,
its re-issue gets the stored result (`Executed(replay=True)`), never a second execution.
An application that knows its conversation's message ids passes them instead (`Identity.origin`).

**Approved calls run when the client calls again, with a grant delivered out of band.** The
store keeps only a grant token's hash, so the gate can run an approved call only with the token
its approval minted. The approving side hands each `Grant` to the server (`Grants.deliver`, the
`on_grant` of `effectgate.web.create_app` or of a Jupyter card, or the application's own
approval path); the token stays in the server process and never appears in a result. When the
client re-issues the call and the gate answers "approved" (`Pending(status="approved")`),
`gated_call` takes the grant for that approval and version, checks it is bound to it
(`adapter.bind_decision`) and that the re-issued arguments hash to the approved ones, and runs
it through `gate.execute`: once (the token is single use, the execution claimed atomically);
the next re-issue gets the stored result. The model cannot approve: only an approver's decision
mints a grant, and no tool argument can carry one. Where the approver runs the call itself
(`effectgate serve --execute`), the client's re-issue gets the stored result the same way.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import mcp.types as types

from .._calls import MAX_SESSION_BYTES
from .._execution import EXEC_PREFIX
from ..adapter import DecisionMismatch, Paused, bind_decision
from ..canonical import args_hash, digest, freeze
from ..context import CallContext
from ..effects import Effect, Policy
from ..errors import EffectGateError, NeedsReconciliation, TokenError
from ..gate import EffectGate
from ..outcomes import Executed, Grant, Invalid, Outcome, Pending, RefusalCode, Refused
from ..table import ToolSpec
from ..tokens import Keyring
from ._prior import call_once
from ._wire import answer_of, written_out

#: The `_meta` key of every result: what the gate did, for programs (the text is for the model).
META_KEY = "effectgate/outcome"


def annotations_for(spec: ToolSpec, *, title: str | None = None) -> types.ToolAnnotations:
    """The MCP hints of a table row (the mapping is in the module docstring)."""
    effect = spec.effect
    return types.ToolAnnotations(
        title=title,
        read_only_hint=effect is Effect.READ,
        destructive_hint=effect is Effect.DESTRUCTIVE,
        idempotent_hint=True,
        open_world_hint=True if effect in (Effect.SEND, Effect.MONEY) else None,
    )


def describe(spec: ToolSpec, *, policy: Policy | None = None) -> str:
    """The description an MCP client shows, opening with what the gate requires of this row:
    "[money: needs approval by finance] Refund an order." (the policy decides what is gated)."""
    policy = policy or Policy()
    effect = str(spec.effect)
    if policy.gates(spec.effect):
        needed = policy.approvals_needed(spec.effect)
        escalates = " (or a role its escalation rules name)" if spec.escalate else ""
        if needed > 1:
            tag = f"{effect}: needs {needed} distinct approvers with role {spec.approver_role}{escalates}"
        else:
            tag = f"{effect}: needs approval by {spec.approver_role}{escalates}"
    elif spec.effect is Effect.READ:
        tag = "read"
    else:
        tag = f"{effect}: runs once per request, recorded"
    return f"[{tag}] {spec.description}".rstrip()


def _text(text: str) -> list[types.ContentBlock]:
    return [types.TextContent(text=written_out(text))]  # sent as UTF-8 JSON (`_wire`)


def result_for(outcome: Outcome, *, card_url: str | None = None) -> types.CallToolResult:
    """The MCP result of a gate outcome. Executed: the result (structured when it is a JSON
    object). Pending: not an error, but plainly not executed, with the approval id, version and
    `card_url` if given. Refused and Invalid: errors with their code and message. Model-written
    values are only ever text; no result carries a grant token (no outcome holds one)."""
    if isinstance(outcome, Executed):
        meta = {
            "status": "executed",
            "replay": outcome.replay,
            "approval_id": outcome.approval_id,
            "version": outcome.version,
        }
        text, structured = answer_of(outcome.result)  # as the store writes it (`_wire`)
        return types.CallToolResult(
            content=_text(text),
            structured_content=structured,
            is_error=False,
            meta={META_KEY: meta},
        )
    if isinstance(outcome, Pending):
        approved = outcome.status == "approved"
        where = f"(approval {outcome.approval_id}, version {outcome.version})"
        if approved:
            lines = [
                f"NOT EXECUTED: {outcome.card.tool} is approved {where} but has not run: its grant "
                "has not reached this server.",
                "Call the tool again with the same arguments later: once it has run, you get its result.",
            ]
        else:
            lines = [
                f"NOT EXECUTED: {outcome.card.tool} is awaiting approval by "
                f"{outcome.card.approver_role} {where}; it has not run.",
                "Call the tool again with the same arguments once it is approved; it will run once.",
            ]
        if card_url:
            lines.append(f"Approval card: {card_url}")
        meta = {
            "status": "approved" if approved else "awaiting_approval",
            "approval_id": outcome.approval_id,
            "version": outcome.version,
            "approver_role": outcome.card.approver_role,
            "args_hash": outcome.card.args_hash,
            "card_url": card_url,
        }
        # No structuredContent: nothing ran, so there is no tool output to stand for.
        return types.CallToolResult(content=_text("\n".join(lines)), is_error=False, meta={META_KEY: meta})
    if isinstance(outcome, Refused):
        meta = {"status": "refused", "code": outcome.code, "approval_id": outcome.approval_id}
        return types.CallToolResult(content=_text(outcome.for_model()), is_error=True, meta={META_KEY: meta})
    assert isinstance(outcome, Invalid)
    errors = [{"pointer": e.pointer, "message": e.message} for e in outcome.errors]
    return types.CallToolResult(
        content=_text(outcome.for_model()),
        is_error=True,
        meta={META_KEY: {"status": "invalid", "errors": errors}},
    )


def error_result(name: str, exc: Exception) -> types.CallToolResult:
    """A tool (or the gate while running it) raised: an error result naming what happened.
    An unknown outcome says so; it is not retried, and the approver role has been notified."""
    if isinstance(exc, NeedsReconciliation):
        text = f"{name}: the outcome is unknown and needs reconciliation by a person; do not retry."
        code = "needs_reconciliation"
    elif isinstance(exc, EffectGateError):
        text = f"{name}: {type(exc).__name__}: {exc}"
        code = getattr(exc, "code", None) or getattr(exc, "reason", None) or type(exc).__name__
    else:
        text = f"{name} failed: {type(exc).__name__}: {exc}"
        code = "tool_error"
    return types.CallToolResult(
        content=_text(text), is_error=True, meta={META_KEY: {"status": "error", "code": str(code)}}
    )


@dataclass(frozen=True, kw_only=True)
class Identity:
    """Who is calling, as the server is configured: flags, environment, or the application's
    callable for each request. `origin`, when set, is the user message id the application
    knows (otherwise `origin_for` derives one from the call)."""

    user_id: str
    session_id: str
    agent_id: str
    run_id: str = ""
    origin: str | None = None

    def __post_init__(self) -> None:
        for name in ("user_id", "session_id", "agent_id"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"Identity.{name} must be a non-empty string (configure it)")
        # What every call's context would refuse (a NUL, a lone surrogate, a session no approval's
        # index holds), refused now: not at each call of a server that started and listed its tools
        try:
            ids = {"session_id": self.session_id, "user_id": self.user_id, "agent_id": self.agent_id}
            CallContext(**ids, origin_message_id=self.origin or "mcp:", run_id=self.run_id)
        except ValueError as exc:
            raise ValueError(f"Identity: {exc} (configure another)") from None
        if len(self.session_id.encode()) > MAX_SESSION_BYTES:
            raise ValueError(f"Identity.session_id is longer than {MAX_SESSION_BYTES} bytes (UTF-8)")


def origin_for(name: str, args: Any, spec: ToolSpec | None = None) -> str:
    """The origin message id of an MCP call: "mcp:" and the args hash of the frozen arguments
    (frozen as the gate freezes them, so 12000.0 and 12000 are one call). Arguments that cannot
    be frozen get an origin from the tool name alone; the gate refuses them before any key."""
    try:
        frozen = freeze(args, spec.schema if spec is not None else None)
        return "mcp:" + args_hash(name, frozen)
    except (EffectGateError, TypeError, ValueError):
        # a client's name may hold a lone surrogate: escaped, so this fallback cannot raise
        return "mcp:" + digest({"tool": str(name).encode("utf-8", "backslashreplace").decode()})


def context_for(
    identity: Identity,
    name: str,
    args: Any,
    *,
    spec: ToolSpec | None = None,
    call_id: str | int | None = None,
) -> CallContext:
    """The `CallContext` of one MCP call: identity from configuration, origin from the
    application or the call (`origin_for`), the MCP request id for the audit only."""
    return CallContext(
        session_id=identity.session_id,
        origin_message_id=identity.origin or origin_for(name, args, spec),
        user_id=identity.user_id,
        agent_id=identity.agent_id,
        run_id=identity.run_id,
        tool_call_id=None if call_id is None else str(call_id),
    )


class Grants:
    """Grants delivered to an MCP server by the approving side, held until the client re-issues
    the approved call. Thread-safe; the tokens never leave the process (not even in `repr`).

    `deliver` fits any `on_grant` hook (`effectgate.web.create_app`, Jupyter cards). Of two
    grants for one approval version (a regrant after a lapse) the later-expiring one is kept,
    whatever order they arrive in; the server drops expired grants after each call (`prune`):
    one that is never taken (its approval denied, or run by the approver) is not held forever."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._grants: dict[tuple[str, int], Grant] = {}

    def deliver(self, grant: Grant) -> None:
        key = (grant.approval_id, grant.version)
        with self._lock:
            held = self._grants.get(key)
            if held is None or grant.expires_at >= held.expires_at:  # a late, older one stays out
                self._grants[key] = grant

    def take(self, approval_id: str, version: int) -> str | None:
        """The token for this approval version, removed (a grant is used at most once)."""
        with self._lock:
            grant = self._grants.pop((approval_id, version), None)
        return grant.token if grant is not None else None

    def prune(self, now: float) -> None:
        """Drop the grants expired at `now` (the gate's clock): no gate would run them."""
        with self._lock:
            for key in [k for k, g in self._grants.items() if g.expires_at <= now]:
                del self._grants[key]

    def __len__(self) -> int:
        with self._lock:
            return len(self._grants)

    def __repr__(self) -> str:
        return f"Grants({len(self)} held)"


async def gated_call(
    gate: EffectGate, name: str, args: Mapping[str, Any], ctx: CallContext, *, grants: Grants | None
) -> Outcome:
    """`gate.acall` (`_prior.call_once`), and for a call the gate answers "approved": `run_approved`.
    Then expired grants are dropped (after the call: its own expired grant is refused as such)."""
    try:
        outcome = await call_once(gate, name, gate.table.get(name), args, ctx)
        if not isinstance(outcome, Pending) or outcome.status != "approved":
            return outcome
        return await run_approved(gate, name, args, outcome, grants=grants)
    finally:
        if grants is not None:
            grants.prune(gate.clock.now())


async def run_approved(
    gate: EffectGate, name: str, args: Mapping[str, Any], pending: Pending, *, grants: Grants | None
) -> Outcome:
    """An approved call re-issued by the client: what became of its grant if it was presented
    (the stored result, or a refusal saying it runs or its outcome is unknown); else run it now
    (`gate.aexecute`), once, with the grant delivered for that approval version, when the
    re-issued arguments hash to the approved ones. Otherwise `pending` as it is."""
    spent = await asyncio.to_thread(_spent, gate, pending)
    if spent is not None or grants is None:
        return spent or pending
    spec = gate.table.get(name)
    try:
        same = args_hash(name, freeze(args, spec.schema if spec else None)) == pending.card.args_hash
    except EffectGateError:
        same = False
    if not same:
        return pending  # the approval is for other arguments: the grant stays for that call
    token = grants.take(pending.approval_id, pending.version)
    if token is None:
        return pending
    try:
        bind_decision(gate, Paused.of(pending), token)
        return await gate.aexecute(token, args)
    except DecisionMismatch:
        return pending  # the approval moved on: the grant was for a version that is gone
    except TokenError as exc:
        return Refused(code=_token_code(exc), message=f"{name}: the grant was refused: {exc}", tool=name)
    except BaseException:  # also the task's cancellation (the client cancelled, or went away)
        # Failed before its claim committed (the store, while binding or checking the grant), the
        # token is still good: keep it. Once claimed, the next re-issue gets what became of it
        # (`_spent`) and never presents it.
        expires = Keyring.read(token).expires_at
        grants.deliver(
            Grant(approval_id=pending.approval_id, version=pending.version, token=token, expires_at=expires)
        )
        raise


def _spent(gate: EffectGate, pending: Pending) -> Outcome | None:
    """What became of an approved call whose grant was already presented (the approval still
    reads "approved" until its execution settles): its stored result, or a refusal saying it is
    running or its outcome is unknown (also when it was running and its lease ran out: `recover`
    settles that first). None when the grant has not been presented."""
    key = f"{EXEC_PREFIX}{pending.approval_id}_v{pending.version}"
    record = gate.store.get(key)
    tool = pending.card.tool
    if record is None:
        return None
    if record.status == "in_progress" and (
        record.lease_expires_at is not None and record.lease_expires_at <= gate.clock.now()
    ):
        # Nothing renews its lease: the worker that ran it stopped, and its outcome is unknown.
        # `recover` settles that as the gate's rules say (needs_reconciliation, the approver role
        # notified); the call is never run again.
        gate.recover()
        record = gate.store.get(key) or record
    if record.status == "succeeded":
        return gate.result(pending.approval_id)
    if record.status == "in_progress":
        message = f"{tool} (approval {pending.approval_id}) is running now; do not call it again"
        return Refused(code="in_progress", message=message, tool=tool, approval_id=pending.approval_id)
    if record.status == "needs_reconciliation":
        message = (
            f"{tool} (approval {pending.approval_id}) ran with an unknown outcome; a person must "
            "reconcile it. Do not retry"
        )
        return Refused(
            code="needs_reconciliation", message=message, tool=tool, approval_id=pending.approval_id
        )
    message = f"{tool} (approval {pending.approval_id}) ran and failed; a new attempt needs a new request"
    return Refused(code="failed", message=message, tool=tool, approval_id=pending.approval_id)


def _token_code(exc: TokenError) -> RefusalCode:
    """A refused grant's reason as a refusal code (`expired` stays; the rest are a mismatch)."""
    return "expired" if exc.reason == "expired" else "mismatch"


__all__ = [
    "META_KEY",
    "Grants",
    "Identity",
    "annotations_for",
    "context_for",
    "describe",
    "error_result",
    "gated_call",
    "origin_for",
    "result_for",
    "run_approved",
]
