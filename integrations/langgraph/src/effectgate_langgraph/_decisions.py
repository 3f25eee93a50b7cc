"""The interrupt payload and the decisions a resume may carry.

Nothing here talks to the gate: it shapes what a person sees and reads what they answered. The
gate (`_step.py`) applies the answer; the core decides whether it holds.

Interrupt payload (one per model step, `type == "effectgate.approval"`)::

    {
      "type": "effectgate.approval",
      "session_id": "<thread_id>",
      "origin_message_id": "<id of the last HumanMessage>",
      "requests": [                       # every gated call of the step still waiting, in
                                          # the order their approvals were first proposed
        {
          "approval_id": "...", "version": 1, "args_hash": "sha256:...",
          "tool": "refund_order", "tool_call_id": "call_1",   # tool_call_id: audit only
          "call_args_hash": "sha256:...", # the call as the checkpoint holds it
          "status": "pending",            # or "approved": a grant exists, not yet presented
          "card": {...},                  # effectgate Card.to_dict(): frozen args, subject,
                                          # reversibility, approver_role, expiry, notes, ...
          "allowed_decisions": ["approve", "deny", "edit"],   # ["deny"] on a mismatch; no
                                          # "edit" where none can apply (`_offered`)
          "mismatch": None,               # or why the call no longer matches its approval
        }
      ],
      "refused": [{"approval_id": "...", "reason": "..."}],   # the previous answer's refusals
      # the same requests in langchain's HITL shape, for tools that render HITLRequest:
      "action_requests": [{"name": "refund_order", "args": {...},
                           "description": "<card, as a Markdown code block>"}],
      "review_configs": [{"action_name": "refund_order",
                          "allowed_decisions": ["approve", "edit", "reject"]}],  # as above
      "signature": "<kid>.<mac>",         # see below
    }

A request has a `mismatch` when the call in the checkpoint is not its approval's current
arguments nor an earlier version a reviewer's edit replaced (the checkpoint was edited, or a
later user message amended the approval), or when the approval was proposed for another user
than the one the run resumes for. Nothing runs for it; only a deny is accepted.

`signature` is the gate keyring's MAC (`effectgate.adapter.sign_state`, purpose
"langgraph.approval") over the session, origin message and user id of the step and, per request,
`approval_id, version, args_hash, tool, tool_call_id, call_args_hash` and `shown`: a digest of its
card (but `status` and `approvals_given`, which a grant changes) and `mismatch`. Its HITL action
request must show the card's tool and arguments, described by the card. The node never reads a
payload back: each run it rebuilds the waiting calls from the gate and the checkpoint and signs
them again. An application can check a payload it stored with `is_signed_payload` and its own
user id (as `resume(..., gate=, user_id=)` does), and a decision may echo `"signature"`: it is
then refused unless the step, as it stands now, signs the same (the checkpoint, the approval or
the identity changed since it was shown).

Resume value: a mapping from approval id to decision (or HITL's answer, below)::

    {"<approval_id>": {"type": "approve", "token": "<grant token>"}}
    {"<approval_id>": {"type": "deny", "reason": "not this order"}}
    {"<approval_id>": {"type": "edit", "args": {...}}}

- approve carries the grant token that `gate.approve(...)` or `effectgate approve ...` printed.
  The token is bound to one approval, version and args hash; the node presents it to
  `gate.execute` with the call's arguments.
- deny carries a reason the model is told. It is recorded through `gate.deny` as the
  application's `native_approver` when their role may decide the call, otherwise as the node's
  resume identity holding the card's role: whoever may resume the graph may always stop a call.
  The approver is never read from the resume value: a deny that names one (`"approver"`) is
  refused, so a record never claims a person the application did not name.
- edit carries new arguments (langchain's `{"edited_action": {"name", "args"}}` is read too).
  They go back through the table as a new version of the same approval, which needs its own
  approval: the edit is never approved on the reviewer's word alone. It may not change the
  call's subject.
- Every decision may also name `"version"` and `"args_hash"`; when present they must match the
  waiting card. HITL's `"reject"` (with `"message"`) is read as deny.

langchain's HumanInTheLoopMiddleware answer, `{"decisions": [...]}`, is read by position against
the payload's `action_requests` (`_hitl.py`): there `{"type": "approve"}` without a token is a
`NativeApprove` (approved through `gate.approve` as the application's `native_approver`) and
`{"type": "reject", "message"?}` a `Reject` (always closes the approval); either one naming an
`"approver"` is refused, as a deny is.

A decision that names no waiting approval, a token for another approval or version, or a
version or hash that does not match is refused: nothing runs, and the step asks again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from effectgate import CallContext, EffectGate, Pending
from effectgate.adapter import TamperedState, sign_state, verify_state
from effectgate.outcomes import VersionEntry

from ._display import as_text, described, shown

PAYLOAD_TYPE = "effectgate.approval"
ALLOWED: tuple[str, ...] = ("approve", "deny", "edit")
HITL_ALLOWED: tuple[str, ...] = ("approve", "edit", "reject")


class ApprovalRequest(TypedDict):
    """One gated call waiting for a person (an entry of the payload's `requests`)."""

    approval_id: str
    version: int
    args_hash: str
    tool: str
    tool_call_id: str | None
    call_args_hash: str
    status: str
    card: dict[str, Any]
    allowed_decisions: list[str]
    mismatch: str | None


class RefusedDecision(TypedDict):
    approval_id: str
    reason: str


class ApprovalPayload(TypedDict):
    """The value of the one interrupt a gated step raises; see the module docstring."""

    type: str
    session_id: str
    origin_message_id: str
    requests: list[ApprovalRequest]
    refused: list[RefusedDecision]
    action_requests: list[dict[str, Any]]
    review_configs: list[dict[str, Any]]
    signature: str


@dataclass(frozen=True)
class Waiting:
    """A gated call of the step whose approval is still open. `call_hash` is the args hash of
    the call as the checkpoint holds it; `mismatch` says why it no longer matches its approval
    (then only a denial is accepted); `proposed`: the id of the approval's first "proposed"
    event in the gate's store, which places it among the step's waiting calls
    (`_hitl.in_proposal_order`; None: not looked up, or none recorded)."""

    call_id: str | None
    tool: str
    args: Mapping[str, Any]
    pending: Pending
    call_hash: str = ""
    mismatch: str | None = None
    proposed: int | None = None


SIGNED = ("approval_id", "version", "args_hash", "tool", "tool_call_id", "call_args_hash")


def signed_fields(requests: Sequence[ApprovalRequest], ctx: CallContext) -> dict[str, Any]:
    """What the payload's signature covers: who the step runs for, and each waiting call as the
    approval holds it, as the checkpoint holds it, and as the reviewer is shown it."""
    signed = [{**{k: r[k] for k in SIGNED}, "shown": shown(r)} for r in requests]  # type: ignore[literal-required]
    return {
        "session_id": ctx.session_id,
        "origin_message_id": ctx.origin_message_id,
        "user_id": ctx.user_id,
        "requests": signed,
    }


def is_signed_payload(gate: EffectGate, value: object, user_id: str) -> bool:
    """Whether `value` (an interrupt's payload) is one this gate's node raised for `user_id`: its
    signature verifies over the session, origin message and requests it carries, and each action
    request shows its card. A tool's own interrupt that copies the payload's `type` does not."""
    if not isinstance(value, Mapping) or value.get("type") != PAYLOAD_TYPE:
        return False
    requests, actions = value.get("requests"), value.get("action_requests")
    if not isinstance(requests, list) or not all(isinstance(r, Mapping) for r in requests):
        return False
    if not isinstance(actions, list) or len(actions) != len(requests):
        return False
    if not all(map(described, requests, actions)):
        return False
    try:  # a forged card nested deeper than Python recurses is refused, never raised
        fields = {
            "session_id": value.get("session_id"),
            "origin_message_id": value.get("origin_message_id"),
            "user_id": user_id,
            "requests": [{**{k: r.get(k) for k in SIGNED}, "shown": shown(r)} for r in requests],
        }
        verify_state(gate, "langgraph.approval", fields, value.get("signature"))
    except (TamperedState, RecursionError):
        return False
    return True


def _offered(gate: EffectGate, w: Waiting) -> tuple[str, ...]:
    """The decisions the step can apply to `w`: only a deny on a mismatch. An edit only where
    the step can apply one: not for a call that names no subject (the core would propose it
    anew), nor for an approval already approved, nor one a reviewer's edit already moved past
    the checkpoint's call (the core answers either with the approval as it stands)."""
    if w.mismatch:
        return ("deny",)
    spec = gate.table.get(w.tool)
    editable = (
        spec is not None
        and spec.subject_of(w.args) is not None
        and w.pending.status == "pending"
        and w.call_hash == w.pending.card.args_hash
    )
    return ALLOWED if editable else tuple(d for d in ALLOWED if d != "edit")


def payload(
    gate: EffectGate, waiting: Sequence[Waiting], refused: Sequence[RefusedDecision], ctx: CallContext
) -> ApprovalPayload:
    requests: list[ApprovalRequest] = []
    actions: list[dict[str, Any]] = []
    reviews: list[dict[str, Any]] = []
    for w in waiting:
        card = w.pending.card
        requests.append(
            {
                "approval_id": w.pending.approval_id,
                "version": w.pending.version,
                "args_hash": card.args_hash,
                "tool": w.tool,
                "tool_call_id": w.call_id,
                "call_args_hash": w.call_hash,
                "status": w.pending.status,
                "card": card.to_dict(),
                "allowed_decisions": list(offered := _offered(gate, w)),
                "mismatch": w.mismatch,
            }
        )
        actions.append({"name": w.tool, "args": dict(card.args), "description": as_text(card.render())})
        hitl = [d for d in HITL_ALLOWED if ("deny" if d == "reject" else d) in offered]
        reviews.append({"action_name": w.tool, "allowed_decisions": hitl})
    return {
        "type": PAYLOAD_TYPE,
        "session_id": ctx.session_id,
        "origin_message_id": ctx.origin_message_id,
        "requests": requests,
        "refused": list(refused),
        "action_requests": actions,
        "review_configs": reviews,
        "signature": sign_state(gate, "langgraph.approval", signed_fields(requests, ctx)),
    }


def edited(history: Sequence[VersionEntry], call_hash: str, version: int, ctx: CallContext) -> bool:
    """Whether reviewers' edits alone turned the checkpoint's call (`call_hash`) into `version`."""
    earlier = [v for v in history if v.args_hash == call_hash and v.version < version]
    later = [v for v in history if earlier and earlier[-1].version < v.version <= version]
    # A reviewer's edit is recorded as one (`edited_by`): a version the same message proposed
    # again (a re-run of an edited checkpoint) is not an edit, whoever approved it.
    return (
        bool(earlier)
        and earlier[-1].origin_message_id == ctx.origin_message_id
        and all(v.edited_by is not None and v.args_hash != call_hash for v in later)
    )


@dataclass(frozen=True)
class Approve:
    token: str


@dataclass(frozen=True)
class Deny:
    reason: str


@dataclass(frozen=True)
class Edit:
    args: Mapping[str, Any]


@dataclass(frozen=True)
class NativeApprove:
    """HITL's `{"type": "approve"}`: no grant; approved through `gate.approve` as the
    application's configured native approver, or refused."""


@dataclass(frozen=True)
class Reject:
    """HITL's `{"type": "reject"}`: closes the approval; recorded as the native approver when
    their role may decide the call, else as the system identity `hitl-reject`."""

    reason: str


Decision = Approve | Deny | Edit | NativeApprove | Reject


DENY_NAMES_APPROVER = (
    "a deny is recorded as the application's approver (native_approver, else the node's "
    "resume_identity), never as one named in the resume value: send it without 'approver'; "
    "nothing was applied"
)

HITL_NAMES_APPROVER = (
    "a HumanInTheLoopMiddleware reject or approve is recorded as the application's approver "
    "(native_approver, else hitl-reject for a reject), never as one named in the resume value: "
    "send it without 'approver'; nothing was applied"
)


class DecisionRefused(Exception):
    """A decision that cannot be applied; `reason` goes back to the person in the next payload."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


def read_decision(
    raw: object, waiting: Waiting, signature: str | None = None, *, hitl: bool = False
) -> Decision:
    """Parse one decision against the card it answers; DecisionRefused if it does not fit. A
    decision that echoes the payload's `signature` must echo the one this step would sign now:
    a different one means the paused step changed since the reviewer saw it. `hitl`: the
    decision came in langchain's `{"decisions": [...]}` (see `read_hitl` and `_hitl.py`)."""
    if not isinstance(raw, Mapping):
        raise DecisionRefused("a decision is an object with a 'type'")
    if "signature" in raw and raw["signature"] != signature:
        raise DecisionRefused(
            "the decision answers a payload this step no longer matches (its calls, versions or "
            "identity changed since it was shown); review the new payload"
        )
    kind: object = raw.get("type")
    if "version" in raw and raw["version"] != waiting.pending.version:
        raise DecisionRefused(
            f"the decision is for version {raw['version']!r}; the approval is at version "
            f"{waiting.pending.version}"
        )
    if "args_hash" in raw and raw["args_hash"] != waiting.pending.card.args_hash:
        raise DecisionRefused("the decision's args_hash does not match the waiting card")
    if hitl and (kind == "reject" or (kind == "approve" and raw.get("token") is None)):
        if "approver" in raw:  # recorded as the application's approver, as a deny is
            raise DecisionRefused(HITL_NAMES_APPROVER)
        return read_hitl(raw, waiting)
    if kind == "approve":
        token = raw.get("token")
        if not isinstance(token, str) or not token:
            raise DecisionRefused("approve needs the grant token from gate.approve or `effectgate approve`")
        return Approve(token)
    if kind in ("deny", "reject"):
        reason = raw.get("reason", raw.get("message"))
        if not isinstance(reason, str) or not reason.strip():
            raise DecisionRefused("deny needs a reason the model can be told")
        if "approver" in raw:
            raise DecisionRefused(DENY_NAMES_APPROVER)
        return Deny(_kept(reason))
    if kind == "edit":
        args = raw.get("args")
        action = raw.get("edited_action")
        if args is None and isinstance(action, Mapping):
            if action.get("name", waiting.tool) != waiting.tool:
                raise DecisionRefused("an edit cannot switch to another tool")
            args = action.get("args")
        if not isinstance(args, Mapping):
            raise DecisionRefused("edit needs 'args', an object of the tool's arguments")
        return Edit(dict(args))
    if hitl and kind == "respond":
        raise DecisionRefused(
            "a respond decision answers in the tool's place; a gated call runs as approved or not "
            "at all: approve, edit or reject it"
        )
    allowed = "approve, edit, reject" if hitl else "approve, deny, edit"
    raise DecisionRefused(f"unknown decision type {kind!r}; allowed: {allowed}")


def read_hitl(raw: Mapping[str, Any], waiting: Waiting) -> Decision:
    """HITL's tokenless approve and its reject. A reject's reason is its message, or langchain's
    own wording when none is given (the model is told it, and the record keeps it)."""
    if raw.get("type") == "approve":
        return NativeApprove()
    message = raw.get("message")
    if message is not None and not isinstance(message, str):
        raise DecisionRefused("a reject's 'message' is text the model can be told")
    if message and message.strip():
        return Reject(_kept(message))
    return Reject(
        f"User rejected the tool call for `{waiting.tool}`. The tool was not executed. Do not "
        "retry this tool call unless the user explicitly requests it."
    )


def _kept(reason: str) -> str:
    """A reason the store can keep: one with a lone surrogate (what JSON's "\\ud800" decodes to)
    is refused here, before it reaches the database's encoder."""
    try:
        reason.encode("utf-8")
    except UnicodeEncodeError:
        raise DecisionRefused(
            "the reason holds a lone surrogate (an unpaired \\ud800-\\udfff escape), which no "
            "database can keep; nothing was applied: send it as plain text"
        ) from None
    return reason
