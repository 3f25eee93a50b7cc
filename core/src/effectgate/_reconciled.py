"""What reconciliation reads: the idempotency keys it settles (an approval's, a write's) and the
answer of a tool's `reconcile(key)` hook, checked before anything is changed on it."""

from __future__ import annotations

from typing import Any

from ._deps import connection_lost
from ._execution import EXEC_PREFIX, WRITE_PREFIX
from ._rules import Reconciled
from .errors import PolicyViolation
from .stores._dialect import is_redacted
from .stores._statements import no_nul, possible_id
from .stores.protocol import Store
from .stores.records import ApprovalRow, ExecutionRow


def tool_of_write_key(key: object) -> str | None:
    """Write keys read `w_<tool>_<sha256 hex>`; text no database can hold (a NUL, a lone
    surrogate: typed into the CLI or the inbox) is none, and reaches no query."""
    if not isinstance(key, str) or not key.startswith(WRITE_PREFIX) or "_" not in key[len(WRITE_PREFIX) :]:
        return None
    if not possible_id(key):
        return None
    return key[len(WRITE_PREFIX) :].rsplit("_", 1)[0]


def last_run(store: Store, tool: str, key: str) -> ExecutionRow | None:
    """A write's last recorded run, whose fields its settlement copies (None: its worker died
    mid-run and left none, or the run is an earlier attempt's whose arguments were erased: a copy
    of their marker would be a row no entry seals). Refused as `erased` when the run awaiting
    reconciliation is a late run erased with its call (`_late_erasure`): as an approval's, its call
    ended."""
    ran = next((x for x in reversed(store.executions(tool=tool)) if x.idempotency_key == key), None)
    if ran is None or not is_redacted(ran.args_json):
        return ran
    if ran.status == "needs_reconciliation":
        raise erased(f"write {key}")
    return None


def approval_of_key(key: str) -> tuple[str, int] | None:
    if not key.startswith(EXEC_PREFIX) or "_v" not in key:
        return None
    approval_id, _, version = key[len(EXEC_PREFIX) :].rpartition("_v")
    if not version.isascii() or not version.isdigit() or len(version) > 18:  # int() of thousands of
        return None  # digits raises ValueError: a key inserted in the database, never the gate's
    return approval_id, int(version)


def not_reconcilable(what: str, *, stale: bool = False) -> PolicyViolation:
    """`what` is not awaiting reconciliation; or (`stale`) it ran again since its provider was
    asked, so a "not found" answered before is no evidence any more: asked again, it decides."""
    if stale:
        return PolicyViolation(
            f"{what} ran again while its provider was asked; reconcile it again", code="not_reconcilable"
        )
    return PolicyViolation(f"{what} is not awaiting reconciliation", code="not_reconcilable")


def erased(what: str) -> PolicyViolation:
    """`what`'s arguments were erased by `redact` (its seal verifies), which erases only calls that
    ended: nothing is awaiting reconciliation, and nothing could run it again (a "tampered" refusal
    would be a false alarm about a legitimate erasure)."""
    return PolicyViolation(
        f"{what}: its call ended and its arguments were erased (redact); it cannot be reconciled or settled",
        code="not_reconcilable",
    )


def no_hook(tool: str) -> PolicyViolation:
    return PolicyViolation(
        f"{tool} has no reconcile hook in the effect table; settle it with gate.settle()",
        code="not_reconcilable",
    )


def answered(found: Any, tool: str, key: str) -> Reconciled | None:
    """A reconcile hook's answer: None (the provider cannot tell) or a `Reconciled` whose `found`
    is a bool and whose `provider_ref` is text or None. Anything else is a TypeError saying so,
    before anything is changed: a `found` of None or "no" is no answer (read as a bool, None ran
    the call again, and "no" recorded it as having happened)."""
    if found is None:
        return None
    said: Any = vars(found) if isinstance(found, Reconciled) else {}  # as the hook built it
    if not isinstance(found, Reconciled):
        why = f"{type(found).__name__}, not Reconciled or None"
    elif type(said["found"]) is not bool:
        why = f"Reconciled(found=) of type {type(said['found']).__name__}, not bool"
    elif said["provider_ref"] is not None and not isinstance(said["provider_ref"], str):
        why = f"Reconciled(provider_ref=) of type {type(said['provider_ref']).__name__}, not text or None"
    else:
        return found
    raise TypeError(f"the reconcile hook of {tool} answered {why} for {key}: nothing was changed")


def expiry_landed(store: Store, key: str, now: float, reason: str, exc: BaseException) -> bool:
    """Whether `recover`'s expiry of `key` committed although `exc` (the connection lost, its
    reply never received: a failover) says otherwise: the record, read back, needs reconciliation
    for this lease's reason as of this pass (else no later pass announced or reconciled it)."""
    if not connection_lost(store, exc):
        return False
    record = store.get(key)
    return record is not None and (record.status, record.error, record.updated_at) == (
        "needs_reconciliation",
        no_nul(reason),
        now,
    )


def ended(store: Store, row: ApprovalRow) -> bool:
    """Whether the approval's version ended `failed` (settled "did not happen", or a definite
    failure), as its append-only executions say: the status column, which no seal covers, edited
    back to `approved` must not run a call again that a person said did not happen."""
    return any(
        x.version == row.version and x.status == "failed" for x in store.executions(approval_id=row.id)
    )
