"""What the gate needs from a store, as protocols: the approval ledger (here), the idempotency
store (`_idempotency_ledger`) and the ledger's upkeep (`_upkeep_ledgers`: redaction and holds, the
hash chain), composed into `Store`. Import every one of them from this module.

The gate depends on these, never on `SQLStore` or a backend's private methods. A backend
implements every method; `SQLStore` is the one implementation (SQLite and PostgreSQL) and
`tests/conformance/stores.py` the contract every backend passes. Methods taking `conn` run inside
the caller's transaction (from `transaction()` or `reading()`) and never commit on their own.

Errors: every method may raise `StoreError` when the database refuses (no schema, another schema
version) and the driver's own errors when it is unreachable; what a method raises beyond that is
in its docstring.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Literal, Protocol

from ._idempotency_ledger import IdempotencyLedger
from ._upkeep_ledgers import ChainLedger, RedactionLedger
from .records import ApprovalRow, DecisionRow, EventRow, ExecutionRow, RuleRow

__all__ = ["ApprovalLedger", "ChainLedger", "IdempotencyLedger", "RedactionLedger", "Store"]


class ApprovalLedger(Protocol):
    """Approvals, their intent keys, decisions, executions, events and recorded rules."""

    url: str  # where the store lives (the keyring resolution reads it: `tokens.keyring_for`)

    def check(self) -> None:
        """Refuse (`StoreError`) a database without the schema or of another schema version."""

    def transaction(self) -> AbstractContextManager[Any]:
        """A write transaction: commits on success, rolls back on error."""

    def reading(self) -> AbstractContextManager[Any]:
        """A read-only transaction (never waits for the write lock where the backend can)."""

    def lock(self, conn: Any, name: str) -> None:
        """Serialise transactions that name the same lock (until this one ends)."""

    def approval(self, conn: Any, approval_id: str) -> ApprovalRow | None:
        """The approval row, or None."""

    def locked_approval(self, conn: Any, approval_id: str) -> ApprovalRow | None:
        """The approval row read after taking its subject's lock (as `lock(conn, "subject:" +
        subject_key)` does, until the transaction ends), or None."""

    def locked_decided(self, conn: Any, approval_id: str) -> tuple[ApprovalRow | None, list[DecisionRow]]:
        """`locked_approval`, and the `decisions` of the version it read, in one read."""

    def locked_decided_at(
        self, conn: Any, approval_id: str
    ) -> tuple[ApprovalRow | None, list[DecisionRow], tuple[Any, Any]]:
        """`locked_decided`, and the `at` and detail of the event that proposed its version
        (`_deadline`; (None, None) without one), in the same read."""

    def proposal_times(
        self, conn: Any, approval_ids: Collection[str]
    ) -> dict[tuple[str, int], tuple[Any, Any]]:
        """(approval id, version) to the `at` and detail of the first event (by id) that proposed
        or amended it (`_deadline`); a version with none is left out."""

    def approval_for_key(self, conn: Any, key: str) -> ApprovalRow | None:
        """The approval an intent key was recorded against, or None."""

    def call_approvals(
        self, conn: Any, key: str, session_id: str, tool: str, message: str, args_hash: str
    ) -> tuple[ApprovalRow | None, ApprovalRow | None]:
        """`approval_for_key(key)`, and the newest approval of the session's tool that the
        message proposed with these arguments (whatever intent key it was filed under)."""

    def key_version(self, conn: Any, key: str) -> int | None:
        """The approval version an intent key was recorded against, or None."""

    def pending_of_session(self, conn: Any, session_id: str) -> list[ApprovalRow]:
        """The session's pending approvals (status pending, deadline passed or not), newest first."""

    def in_flight_elsewhere(
        self, conn: Any, subject_key: str, session_id: str, now: float
    ) -> ApprovalRow | None:
        """Another session's approval on the subject that is pending, or granted and usable."""

    def proposal_reads(
        self, conn: Any, session_id: str, key: str, subject_key: str, now: float, record: str
    ) -> tuple[list[ApprovalRow], ApprovalRow | None, ApprovalRow | None, bool]:
        """`pending_of_session`, `approval_for_key`, `in_flight_elsewhere`, and whether the
        idempotency record `record` exists, in one read."""

    def approvals_due(self, conn: Any, now: float) -> list[ApprovalRow]:
        """Pending approvals whose deadline has passed."""

    def approvals_expiring(self, conn: Any, now: float, until: float) -> list[ApprovalRow]:
        """Pending approvals still open at `now` that lapse at or before `until`."""

    def has_event(self, conn: Any, kind: str, approval_id: str, version: int) -> bool:
        """Whether an event of `kind` is recorded for this approval version."""

    def subject_history(
        self, conn: Any, tool: str, subject_key: str, exclude: str | None
    ) -> list[ApprovalRow]:
        """The subject's approvals of `tool`, oldest first (without `exclude`)."""

    def execution_outcomes(self, conn: Any, approval_ids: Collection[str]) -> dict[str, str]:
        """What the append-only executions say became of each listed approval's grant:
        "succeeded" when any of its executions succeeded, else the status of its latest
        ("needs_reconciliation": the outcome is unknown; "failed"); with no execution yet but a
        grant presented (its "token_used" event: running now, or its worker died and its outcome
        is unknown), "presented". An approval with none of these is absent. Unlike the
        approval's `status` column (not sealed), these cannot be edited without breaking the
        executions' and events' chains."""

    def decisions_of(self, conn: Any, approval_ids: Collection[str]) -> list[DecisionRow]:
        """Every decision recorded for the listed approvals (all versions and rounds), in the
        order recorded, in one read of the decisions' approval index: a subject's history."""

    def executions_of(self, conn: Any, approval_ids: Collection[str]) -> list[ExecutionRow]:
        """Every execution row of the listed approvals, in order, through the executions'
        approval index (the history page's runs)."""

    def grant_spent(self, conn: Any, approval_id: str, version: int) -> bool:
        """Whether a grant of this approval version was presented (its "token_used" event) or an
        execution of it recorded, read in the caller's transaction: what execute checks before it
        claims a version whose status column and token_used_at (neither sealed) say it never ran."""

    def insert_approval(self, conn: Any, row: ApprovalRow) -> None:
        """Insert a new approval row."""

    def update_approval(
        self,
        conn: Any,
        approval_id: str,
        *,
        expect_status: Sequence[str],
        expect_version: int | None = None,
        values: Mapping[str, Any],
    ) -> bool:
        """Compare-and-set on status (and version); True if the row changed."""

    def add_key(self, conn: Any, key: str, approval_id: str, version: int, origin: str) -> bool:
        """Record an intent key unless present; True if this call recorded it."""

    def add_decision(self, conn: Any, **values: Any) -> None:
        """Append a decision row (append-only)."""

    def decisions(self, conn: Any, approval_id: str, version: int | None = None) -> list[DecisionRow]:
        """An approval's decisions (of one version), in order."""

    def append_events(self, conn: Any, events: Sequence[Mapping[str, Any]]) -> None:
        """Append audit events (append-only)."""

    def append_reads(self, conn: Any, rows: Sequence[tuple[Any, ...]]) -> None:
        """Append read records, tuples in `records.READ_COLUMNS` order (append-only)."""

    def append_execution(self, conn: Any, **values: Any) -> None:
        """Append an execution row (append-only)."""

    def add_rules(self, conn: Any, rules: Sequence[tuple[str, str, str]]) -> None:
        """Record (fingerprint, kind, canonical JSON) rules unless present (append-only)."""

    def approvals(
        self,
        *,
        status: str | Sequence[str] | None = None,
        role: str | None = None,
        session_id: str | None = None,
        limit: int | None = None,
        status_not: Sequence[str] | None = None,
    ) -> list[ApprovalRow]:
        """Approvals, newest first (its own read transaction); `status_not` leaves those statuses out."""

    def get_approval(self, approval_id: str) -> ApprovalRow | None:
        """One approval (its own read transaction)."""

    def executions(self, *, approval_id: str | None = None, tool: str | None = None) -> list[ExecutionRow]:
        """Execution rows, in order."""

    def events(
        self, *, kind: str | None = None, approval_id: str | None = None, session_id: str | None = None
    ) -> list[EventRow]:
        """Event rows, in order; of one kind, approval and session when those are given."""

    def first_proposed(self, approval_ids: Collection[str]) -> dict[str, int]:
        """For each of `approval_ids` (a few: one model step's calls) with a "proposed" event,
        the id of its first one; an approval with none is left out, and no ids give {} (its own
        read transaction). Event ids are assigned in increasing order and the log is append-only,
        so these order the approvals by when each was first proposed, whatever order a caller's
        own copy of the calls (a checkpoint) has."""

    def all_decisions(self) -> list[DecisionRow]:
        """Every decision row, in order."""

    def rules(self) -> dict[str, RuleRow]:
        """Every recorded rule by fingerprint."""

    def audit_rows(
        self, conn: Any, what: Literal["approvals", "decisions", "gated_executions", "other_executions"]
    ) -> Iterator[tuple[Any, ...]]:
        """Stream one table's rows as tuples, in the columns of `sql.AUDIT_QUERIES`."""

    def audit_counts(self, conn: Any) -> Mapping[str, int]:
        """ "replays" (replay events) and "sessions" (distinct sessions in the event log)."""

    def report_rows(
        self,
        conn: Any,
        what: Literal[
            "decisions",
            "gated_by_day",
            "sessions_by_day",
            "sessions_by_model",
            "replays_by_day",
            "backlog_by_day",
            "erased_backlog",
        ],
        *,
        since: float | None = None,
        until: float | None = None,
        now: float | None = None,
    ) -> Sequence[tuple[Any, ...]]:
        """One of the report's aggregates, grouped by the database (a few rows however large the
        ledger), over calls proposed (events recorded) in [since, until); None leaves an end open.
        Columns, in order: "decisions" (tool, approver role, row fingerprint, status (a pending
        approval past its expiry at `now`, the store's clock by default, is "expired"), edited by a
        reviewer 0/1, decided with a finite latency 0/1, count); "gated_by_day" (UTC day number, model id,
        proposals not rejected); "sessions_by_day" (day, distinct non-empty session ids);
        "sessions_by_model" (day, model id, distinct sessions with an event of that model's calls);
        "replays_by_day" (day, replay events of an approval); "backlog_by_day" (day the record was
        last updated, erased with its call 0/1, needs_reconciliation records now: not windowed);
        "erased_backlog" (the redaction entry's redaction id, table, row key, column, commitment,
        args hash, kept facts and seal, and the record's day, per entry of a record counted
        erased). A day number counts whole UTC days since 1970-01-01."""

    def latency_p95(
        self, conn: Any, role: str, *, since: float | None = None, until: float | None = None
    ) -> float | None:
        """The p95 (nearest rank, `report.p95_rank`) approval latency among `role`'s approvals
        proposed in [since, until) that were decided (not rejected, pending or expired), each from
        its first "proposed" event to its version's deny decision, else the last approve of the
        version's first grant round (append-only records, never the unsealed decided_at and
        created_at columns), a latency that is not a finite number left out; None when none is."""

    def marked_values(self, conn: Any) -> Iterator[tuple[str, str, tuple[Any, ...], dict[str, str]]]:
        """Every personal value that starts like a redaction marker, per row: (table, row key,
        (approval id, tool, args hash, status), {column: text}), filtered by the database."""

    def every_row(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """Every row of every effectgate table, as (table, {column: value}), streamed from one
        read transaction, each table in key order."""


class Store(ApprovalLedger, IdempotencyLedger, RedactionLedger, ChainLedger, Protocol):
    """The approval ledger, the idempotency store and their upkeep in one database (one transaction
    can span them)."""
