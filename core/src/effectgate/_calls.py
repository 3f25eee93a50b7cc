"""Calls: routing one tool call (or one model step's calls) by its table row.

Unknown tools and tools off the agent's allowlist are refused; arguments are frozen once and
validated (`Invalid` with JSON pointers otherwise); reads run with their retries and are logged
in batches; writes run once per (session, tool, origin message, args hash) through the
idempotency store (both run by `_direct.Direct`; `call` runs a read inline, the hot path);
gated calls go to `Proposals`. Two calls of one gated tool in a step register neither.

Logged (logger "effectgate._calls", `_direct` included; refusals recorded through
`Events.refuse` are logged there): an invalid call at INFO with its JSON pointers only (a schema
message can quote an argument), a step's parallel calls at INFO, a write replayed at DEBUG.
Reads are not logged: they are the hot path, and their record is the read log.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from . import flow
from ._answers import shadowed
from ._deps import Deps, Events
from ._direct import Direct, error_of
from ._json import copied
from ._ledger import in_scope
from ._logging import logger
from ._notice import Notices
from ._proposals import Proposals
from ._readlog import ReadLog
from ._settle import Settlement
from ._telemetry import Spans
from .canonical import canonical_text, freeze_plain, hash_of_text
from .context import CallContext
from .effects import Effect
from .errors import ArgumentError, TamperedRecord
from .outcomes import Invalid, Outcome, Pending, Refused, executed
from .stores._dialect import REDACTED_PREFIX
from .table import SchemaError, ToolSpec

log = logger(__name__)

#: Arguments whose canonical text starts like an erasure marker (`{"$redacted": ...`, the smallest
#: key "$redacted") would be taken for erased ones by the audit, `redact`, the card and replay: the
#: key is reserved, and such a call is Invalid before anything is stored.
_RESERVED = SchemaError(
    "/$redacted", '"$redacted" is a reserved key (it marks erased values); call again without it'
)

#: The longest session id a gated call takes (UTF-8 bytes): PostgreSQL indexes an approval's
#: session id with its time (eg_approvals_session), and a btree entry holds at most 2704 bytes.
MAX_SESSION_BYTES = 2048

ToolCallLike = tuple[str, Mapping[str, Any]] | tuple[str, Mapping[str, Any], str | None]


def _a_context(ctx: object) -> None:
    if not isinstance(ctx, CallContext):  # before anything is read or recorded
        raise TypeError(f"ctx must be a CallContext (got {type(ctx).__name__})")


def with_call_id(ctx: CallContext, call_id: str | None) -> CallContext:
    return ctx if call_id is None else dataclasses.replace(ctx, tool_call_id=call_id)


class Calls:
    """Routes calls; see the module docstring."""

    def __init__(
        self,
        deps: Deps,
        events: Events,
        notices: Notices,
        reads: ReadLog,
        proposals: Proposals,
        settlement: Settlement,
        spans: Spans,
    ) -> None:
        self.table = deps.table
        self.policy = deps.policy
        self.events = events
        self.notices = notices
        self.reads = reads
        self.proposals = proposals
        self.spans = spans
        self.direct = Direct(deps, events, notices, reads, settlement)  # what a read or write runs

    def step_flow(self, calls: Sequence[ToolCallLike], ctx: CallContext) -> flow.Flow[list[Outcome]]:
        """One model step's calls as one flow (see `step`). A call whose stored approval does not
        verify is answered `Refused("tampered")` (recorded by `propose`), not raised: the other
        calls keep their outcomes and a re-run step is not stuck (`ForeignSeal` still raises)."""
        calls, out = tuple(calls), list[Outcome]()
        for call, (pending_flow, refused) in zip(calls, self.step(calls, ctx), strict=True):
            try:
                out.append((yield from pending_flow) if pending_flow is not None else refused)  # type: ignore[arg-type]
            except TamperedRecord as exc:
                if exc.foreign_key is not None:
                    raise
                out.append(
                    Refused(code="tampered", message=str(exc), tool=call[0], approval_id=exc.approval_id)
                )
        return out

    def step(self, calls: Sequence[ToolCallLike], ctx: CallContext) -> list[tuple[Any, Outcome | None]]:
        calls = tuple(calls)  # read twice: an iterator given would be spent by the count
        _a_context(ctx)
        for call in calls:  # before anything is recorded: a text or a dict would be read by index
            if not isinstance(call, tuple | list) or len(call) not in (2, 3):
                raise TypeError(f"a step's call is (name, args) or (name, args, call_id) (got {call!r:.80})")
        specs = [self.table.get(call[0]) for call in calls]  # a str subclass (an enum's) names a row too
        counts: dict[str, int] = {}
        for named in specs:  # counted by row
            if named is not None:
                counts[named.name] = counts.get(named.name, 0) + 1
        out: list[tuple[Any, Outcome | None]] = []
        refusals: list[dict[str, Any]] = []
        for call, spec in zip(calls, specs, strict=True):
            name, args = call[0], call[1]
            call_ctx = with_call_id(ctx, call[2] if len(call) > 2 else None)
            if spec is not None and self.policy.gates(spec.effect) and counts[spec.name] > 1:
                message = (
                    f"{counts[spec.name]} calls of {name} in one step; none was registered. "
                    f"Make one call with the arguments you intend."
                )
                refused = Refused(code="parallel_calls", message=message, tool=name)
                out.append((None, refused))
                refusals.append(self.events.event("refused", spec=spec, ctx=call_ctx, code="parallel_calls"))
                log.info(
                    "call refused (parallel_calls): tool=%s calls=%d agent=%r session=%r",
                    name,
                    counts[spec.name],
                    ctx.agent_id,
                    ctx.session_id,
                )
                self.spans.refused_call(refused)
            else:
                out.append((self.spans.call_flow(name, self.call_flow(name, args, call_ctx)), None))
        if refusals:
            self.events.record(*refusals)
        return out

    def call_flow(
        self, name: str, args: Mapping[str, Any], ctx: CallContext, *, edited_by: str | None = None
    ) -> flow.Flow[Outcome]:
        """Route one call. `edited_by` names the reviewer whose edit these arguments are (an
        adapter applying an edit decision); the amendment records it (`EffectGate.versions`)."""
        if edited_by is not None and (type(edited_by) is not str or not edited_by.strip()):
            raise TypeError(f"an edit's editor must be the reviewer's name (got {edited_by!r:.40})")
        routed = self.route(name, args, ctx)
        if not isinstance(routed, tuple):
            return routed
        return (yield from self.dispatch(*routed, ctx, edited_by=edited_by))

    def call(self, name: str, args: Mapping[str, Any], ctx: CallContext) -> Outcome:
        """`flow.drive(self.call_flow(name, args, ctx))` with a read run inline: the same checks,
        tool call, record and outcome, without a generator and its driver (the read hot path)."""
        routed = self.route(name, args, ctx, own=False)  # a read runs before this returns
        if not isinstance(routed, tuple):
            return routed
        spec, frozen_args, text, frozen = routed
        if spec.effect is not Effect.READ:
            if self.policy.gates(spec.effect):  # what `dispatch` does, without its generator
                return self.propose(routed, ctx, None)
            return flow.drive(self.dispatch(spec, frozen_args, text, frozen, ctx, edited_by=None))
        if spec.scope is not None and not in_scope(spec, frozen_args, ctx):
            return self.out_of_scope(spec, ctx)
        attempt = 1
        while True:
            try:
                result = flow.run_sync(spec.fn, frozen_args)  # what drive does with an Invoke
                break
            except spec.transient as exc:
                if not self.direct.retrying(spec, ctx, frozen, attempt, exc):
                    raise
                attempt += 1
            except Exception as exc:  # not transient: recorded as a failed read, then raised
                self.reads.add(self.events.read_row("read_failed", spec, ctx, frozen, attempt, error_of(exc)))
                raise
        self.reads.add(self.events.read_row("read", spec, ctx, frozen, attempt))
        return executed(spec.name, result)

    def route(
        self, name: str, args: Mapping[str, Any], ctx: CallContext, *, own: bool = True
    ) -> Outcome | tuple[ToolSpec, Mapping[str, Any], str, str]:
        """The refusal (recorded) or Invalid of a call that does not reach its row's effect;
        else its row, frozen arguments, their canonical text and the args hash, all computed
        here, at call time: what is checked, hashed, recorded and run. `own=False`: a read run
        before the caller gets control back may keep the caller's plain dict (no copy)."""
        _a_context(ctx)
        spec = self.table.get(name)
        if spec is None:
            return self.events.refuse(
                "unknown_tool", f"{name!r} is not a tool in the effect table", name, ctx
            )
        if not self.table.allowed(ctx.agent_id, name):
            return self.events.refuse(
                "not_allowed", f"agent {ctx.agent_id!r} may not call {name}", name, ctx, spec
            )
        plain_text = spec._derived.get("plain_text")  # simple schemas: one walk (canonical.plain_checker)
        if plain_text is not None and type(args) is dict:  # scalars: a copy is the frozen form, so the
            args = args.copy()  # caller changing its dict later (an acall's store work) changes nothing
        text = None if plain_text is None else plain_text(args)
        if text is None:
            if own or spec.effect is not Effect.READ:
                args = copied(args)  # checked, hashed and run: one copy, whatever the caller does
            checked = self.validate(spec, args)
            if isinstance(checked, Invalid):
                return self.invalid(spec, ctx, checked)
            args, plain = checked  # the frozen form
            text = canonical_text(args, plain=plain)  # one canonical form and one hash, at call time
        if text.startswith(REDACTED_PREFIX):  # every stored form of these arguments is this text
            return self.invalid(spec, ctx, Invalid(tool=spec.name, errors=(_RESERVED,)))
        return spec, args, text, hash_of_text(spec.name, text)

    def invalid(self, spec: ToolSpec, ctx: CallContext, invalid: Invalid) -> Invalid:
        """Record an invalid call (its JSON pointers and messages, never its values) and return it."""
        self.events.record(
            self.events.event("invalid", spec=spec, ctx=ctx, errors=[e.__dict__ for e in invalid.errors])
        )
        log.info(
            "call refused (invalid): tool=%s pointers=%s agent=%r session=%r",
            spec.name,
            [e.pointer or "/" for e in invalid.errors],
            ctx.agent_id,
            ctx.session_id,
        )
        return invalid

    def dispatch(
        self,
        spec: ToolSpec,
        args: Mapping[str, Any],
        text: str,
        frozen: str,
        ctx: CallContext,
        *,
        edited_by: str | None,
    ) -> flow.Flow[Outcome]:
        """A routed call by its row's effect: a read runs, a gated call is proposed, a write runs
        once through the idempotency store."""
        if spec.effect is Effect.READ:  # READ is always autonomous (Policy refuses to gate it)
            if not in_scope(spec, args, ctx):
                return self.out_of_scope(spec, ctx)
            return (yield from self.direct.read(spec, args, frozen, ctx))
        if self.policy.gates(spec.effect):
            flow.refuse_abandoned()  # a cancelled step's later call: no approval, no card
            return self.propose((spec, args, text, frozen), ctx, edited_by)
        if not in_scope(spec, args, ctx):
            return self.out_of_scope(spec, ctx)
        return (yield from self.direct.write(spec, args, frozen, text, ctx))

    def propose(
        self, routed: tuple[ToolSpec, Mapping[str, Any], str, str], ctx: CallContext, edited_by: str | None
    ) -> Outcome:
        """A gated call (as `route` returned it): proposed (or found, replayed, amended), a new
        card announced."""
        spec, args, text, frozen = routed
        session = ctx.session_id  # what an approval's index holds (stored rows are not refused later)
        if len(session) > MAX_SESSION_BYTES // 4 and len(session.encode()) > MAX_SESSION_BYTES:
            raise ValueError(
                f"CallContext.session_id is longer than {MAX_SESSION_BYTES} bytes (UTF-8): an approval's "
                "index cannot hold it on PostgreSQL; use a shorter id (e.g. a hash of this one)"
            )
        try:
            outcome = self.proposals.propose(spec, args, frozen, ctx, text=text, edited_by=edited_by)
        except TamperedRecord as exc:  # nothing changed; the refusal is recorded (its own commit)
            if exc.foreign_key is None:
                self.events.refuse("tampered", str(exc), spec.name, ctx, spec, exc.approval_id)
            raise
        if isinstance(outcome, Pending) and not outcome.replay:
            # a new approval, or a new version; a shadow one too: its reviewers decide it as usual
            self.notices.announce_card("pending", outcome.card)
        return shadowed(spec, outcome) if spec.shadow else outcome

    def out_of_scope(self, spec: ToolSpec, ctx: CallContext) -> Refused:
        name = spec.name
        return self.events.refuse(
            "out_of_scope", f"{name}: the caller may not access this subject", name, ctx, spec
        )

    @staticmethod
    def validate(spec: ToolSpec, args: Any) -> tuple[dict[str, Any], bool] | Invalid:
        """The frozen form of valid arguments and whether they were plain JSON as given (see
        `canonical.freeze_plain`), or Invalid with JSON pointers."""
        if not isinstance(args, Mapping):
            return Invalid(tool=spec.name, errors=(SchemaError("", "arguments must be a JSON object"),))
        try:
            frozen, plain = freeze_plain(args, spec.schema)
        except ArgumentError as exc:
            return Invalid(tool=spec.name, errors=(SchemaError(exc.pointer, exc.detail),))
        errors = spec.validate(frozen)
        return Invalid(tool=spec.name, errors=tuple(errors)) if errors else (frozen, plain)
