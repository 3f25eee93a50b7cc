"""The gate's explicit dependencies, and the event log every part writes to.

`EffectGate` is a facade: the work is done by parts (proposals, decisions, execution,
reconciliation, notices) that each receive what they use as constructor arguments, the way
pydantic-ai's agent graph hands a deps dataclass to its nodes. `Deps` is the shared, immutable
part of that; `Events` builds and appends the audit events and records the table rows and
policies approvals are made under.

`Events.refuse` is where a call's refusal (unknown tool, not allowed, out of scope, in progress,
needs reconciliation, or one an adapter decided) is recorded, so it is logged there, at INFO on
the "effectgate._deps" logger: the code, the tool (as given, quoted), the agent and the session;
never the arguments. A refusal of a tool absent from the table names it in its detail only.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._clock import Clock
from ._logging import logger
from ._seal import rule_seal
from .canonical import canonical_json
from .context import CallContext
from .effects import Policy
from .outcomes import RefusalCode, Refused
from .stores.base import Claimed
from .stores.protocol import Store
from .stores.records import ApprovalRow
from .table import EffectTable, ToolSpec
from .tokens import Keyring

log = logger(__name__)

_ONE_ATTEMPT = json.dumps({"attempts": 1})


def _nothing() -> None:
    return None


def connection_lost(store: Store, exc: BaseException, handled: BaseException | None = None) -> bool:
    """Whether a store operation failed because the database connection was lost (its COMMIT's
    outcome unknown). A loss in the middle of a transaction surfaces as its ROLLBACK's error,
    raised while handling the loss: the exceptions raised since the transaction began are looked
    at (`__context__`), not what the caller was already handling when it called (`handled`)."""
    seen: BaseException | None = exc
    while seen is not None and seen is not handled:
        if store.lost_connection(seen):
            return True
        seen = seen.__context__
    return False


def claim_landed(store: Store, key: str, claim: object, payload_hash: str, exc: BaseException) -> bool:
    """Whether a transaction that made `claim` (a `Claimed`, or None: it made none) committed
    although `exc` (the connection lost, its reply never received: a failover) says otherwise:
    the record, read back, is in flight under this claim's lease for these arguments, so the tool
    runs now (else it never ran, and the same call was refused `in_progress`, or reconciling it
    again `not_reconcilable`, until the lease ran out)."""
    if not isinstance(claim, Claimed) or not connection_lost(store, exc):
        return False
    record = store.get(key)
    return (
        record is not None
        and record.status == "in_progress"
        and record.lease_owner == claim.owner
        and record.payload_hash == payload_hash
    )


@dataclass(frozen=True, kw_only=True)
class Deps:
    """What every part of the gate reads: the table, the store, the policy, keys, time, ids."""

    table: EffectTable
    store: Store
    policy: Policy
    keyring: Keyring
    clock: Clock
    ids: Callable[[], str]


class Events:
    """Builds audit events (one shape for every part) and appends them."""

    def __init__(self, deps: Deps) -> None:
        self.table = deps.table
        self.store = deps.store
        self.policy = deps.policy
        self.clock = deps.clock
        self.keyring = deps.keyring
        self._recorded_rules: set[str] = set()

    def event(
        self,
        kind: str,
        *,
        spec: ToolSpec | None = None,
        tool: str | None = None,
        ctx: CallContext | None = None,
        row: ApprovalRow | None = None,
        args_hash_: str | None = None,
        **detail: Any,
    ) -> dict[str, Any]:
        event: dict[str, Any] = {
            "at": self.clock.now(),
            "kind": kind,
            "detail_json": detail,
            "table_fingerprint": self.table.fingerprint,
        }
        # item by item, not update(**fields): no keyword dict built and merged (every event of
        # an approved call names its row)
        if spec is not None:
            event["tool"] = spec.name
            event["effect"] = str(spec.effect)
            event["row_fingerprint"] = spec.fingerprint
        if tool is not None:
            event["tool"] = tool
        if row is not None:
            event["approval_id"] = row.id
            event["version"] = row.version
            event["tool"] = row.tool
            event["effect"] = row.effect
            event["args_hash"] = row.args_hash
            event["session_id"] = row.session_id
            event["user_id"] = row.user_id
            event["origin_message_id"] = row.origin_message_id
            event["agent_id"] = row.agent_id
            event["run_id"] = row.run_id
            event["model_id"] = row.model_id
        if ctx is not None:
            event.update(
                session_id=ctx.session_id,
                origin_message_id=ctx.origin_message_id,
                user_id=ctx.user_id,
                agent_id=ctx.agent_id,
                run_id=ctx.run_id,
                model_id=ctx.model_id,
            )
            if ctx.tool_call_id:
                event["detail_json"] = {**detail, "tool_call_id": ctx.tool_call_id}
        if args_hash_ is not None:
            event["args_hash"] = args_hash_
        return event

    def read_row(
        self, kind: str, spec: ToolSpec, ctx: CallContext, args_hash: str, attempts: int, error: str = ""
    ) -> tuple[Any, ...]:
        """A read record as a tuple in `records.READ_COLUMNS` order (built on the call path);
        its detail is the attempts made, the last error (a failed read) and the tool call id."""
        if attempts == 1 and not error and not ctx.tool_call_id:
            text = _ONE_ATTEMPT  # the common case: no dict, no dump
        else:
            detail: dict[str, Any] = {"attempts": attempts}
            if error:
                detail["error"] = error
            if ctx.tool_call_id:
                detail["tool_call_id"] = ctx.tool_call_id
            text = json.dumps(detail)
        return (
            self.clock.now(),
            kind,
            spec.name,
            "read",
            args_hash,
            ctx.session_id,
            ctx.origin_message_id,
            ctx.user_id,
            ctx.agent_id,
            ctx.run_id,
            self.table.fingerprint,
            spec.fingerprint,
            text,
            ctx.model_id,
        )

    def record(self, *events: dict[str, Any]) -> None:
        """Append events in their own transaction."""
        with self.store.transaction() as conn:
            self.store.append_events(conn, list(events))

    def refuse(
        self,
        code: RefusalCode,
        message: str,
        name: str,
        ctx: CallContext,
        spec: ToolSpec | None = None,
        approval_id: str | None = None,
        args_hash_: str | None = None,
    ) -> Refused:
        """Record a refusal and return it. A tool absent from the table (`spec` None) is named only
        in the event's detail, which erasure reaches: the name is model-written text (it can be
        personal), so its `tool` column stays empty. A write's refusal names its args hash
        (`args_hash_`): erasure finds a write's records by it (its message can quote the write's
        error)."""
        named: dict[str, Any] = {"tool_name": name} if spec is None else {}
        self.record(
            self.event(
                "refused",
                spec=spec,
                ctx=ctx,
                code=code,
                message=message,
                refused_approval=approval_id,
                args_hash_=args_hash_,
                **named,
            )
        )
        log.info(
            "call refused (%s): tool=%r agent=%r session=%r approval=%s",
            code,
            name,
            ctx.agent_id,
            ctx.session_id,
            approval_id,
        )
        return Refused(code=code, message=message, tool=name, approval_id=approval_id)

    def note_rules(self, conn: Any, spec: ToolSpec | None) -> Callable[[], None]:
        """Record the canonical form of `spec`'s row and of the policy inside `conn`'s transaction
        (only until this process knows them recorded), so the audit can check every approval
        against the rule it was made under, each with its seal (`_seal.rule_seal`: a rule recorded
        unsealed, by an earlier release, is sealed by the first call of this process that uses
        it). Call the returned function once the transaction has committed: only then are they
        known to be recorded."""
        rules = []
        if self.policy.fingerprint not in self._recorded_rules:
            rules.append(
                (self.policy.fingerprint, "policy", canonical_json(self.policy.canonical()).decode())
            )
        if spec is not None and spec.fingerprint not in self._recorded_rules:
            rules.append((spec.fingerprint, "row", canonical_json(spec.canonical()).decode()))
        if not rules:
            return _nothing
        self.store.add_rules(conn, [*rules, *(rule_seal(self.keyring, kind, fp) for fp, kind, _ in rules)])
        return lambda: self._recorded_rules.update(r[0] for r in rules)
