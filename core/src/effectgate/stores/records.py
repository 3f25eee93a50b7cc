"""The tables, as SQLModel classes. Times are float seconds since the epoch (see _dialect.py).

Append-only: `eg_events`, `eg_decisions`, `eg_executions`, `eg_rules`, `eg_redacted`, `eg_chain`
(the dialect installs triggers that refuse UPDATE and DELETE on them, except a redaction marker
written into a personal column, see `PERSONAL`). Mutable state: `eg_approvals` (status, version,
token hash), `eg_intent_keys` (insert-only mapping of keys to approvals), `eg_idempotency` and
`eg_holds` (a legal hold can be released).

What decides (an approval's tool, arguments hash, required role and number of approvers, the
table row and policy it was proposed under, how many grants it has had; a decision's approver,
role and round) is sealed with the gate's keyring (`seal` columns, see `_seal.py`) and checked
again whenever it is read back to decide something: a row edited in the database is refused.
Version 2 added the seals, `policy_fingerprint`, `grants`, decision rounds and `eg_rules`.
Version 3 added `model_id` to approvals, executions and events, `eg_redacted`, `eg_holds` and
`eg_chain`, and lets the append-only tables' personal columns (`PERSONAL`) be overwritten by a
redaction marker (the new columns default to ''). Version 4 made the ids of the append-only
tables (and the chain's id ranges) 64-bit on PostgreSQL, whose SERIAL ids stopped the ledger at
2^31 events. Version 5: `eg_idempotency.user_id`. `SQLStore.setup` upgrades each in place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from operator import attrgetter
from typing import Any

from sqlalchemy import BigInteger, Column, Index, Integer, Text, event, text
from sqlmodel import Field, SQLModel

SCHEMA_VERSION = 5

#: The type of an id of an append-only table and of the chain's id ranges: BIGINT (BIGSERIAL as
#: a primary key) on PostgreSQL, where INTEGER ends at 2^31 - 1; INTEGER on SQLite, whose
#: INTEGER PRIMARY KEY is the 64-bit rowid (a BIGINT key there would not be one).
BIG_ID = BigInteger().with_variant(Integer(), "sqlite")
#: The columns of type `BIG_ID`, by table (`_upgrade._3_to_4` widens them).
BIG_ID_COLUMNS: dict[str, tuple[str, ...]] = {
    "eg_decisions": ("id",),
    "eg_events": ("id",),
    "eg_executions": ("id",),
    "eg_redacted": ("id",),
    "eg_chain": ("id", "first_id", "last_id", "count"),
}
BIG_ID_TABLES = tuple(BIG_ID_COLUMNS)


def _big_id() -> Any:
    return Field(default=None, primary_key=True, sa_type=BIG_ID)


def _model_id() -> Any:
    # server_default: a version 2 database upgraded in place gets '' for its existing rows
    return Field(default="", sa_column_kwargs={"server_default": ""})


class SchemaVersionRow(SQLModel, table=True):
    __tablename__ = "eg_schema_version"
    id: int = Field(default=1, primary_key=True)
    version: int
    applied_at: float


#: The subject's approvals (`in_flight_elsewhere`, `subject_history`). It holds no status, so the
#: two status changes of every approved call (approved, executed) leave it alone: SQLite rewrites
#: only the indexes whose columns an UPDATE changes, one page each per commit. It replaced
#: (subject_key, status) (`_upgrade.REPLACED_INDEXES`).
APPROVAL_SUBJECT_INDEX = Index("eg_approvals_subject", "subject_key", "tool")
#: The session's approvals, newest last (`pending_of_session` at every propose, `approvals` by
#: session): ordered without a sort, and like the subject index rewritten by no status change. It
#: replaced (session_id, tool, subject_key, status).
APPROVAL_SESSION_INDEX = Index("eg_approvals_session", "session_id", "created_at")


class ApprovalTable(SQLModel, table=True):
    __tablename__ = "eg_approvals"
    __table_args__ = (
        APPROVAL_SESSION_INDEX,
        APPROVAL_SUBJECT_INDEX,
        Index("eg_approvals_status_created", "status", "created_at"),
    )
    id: str = Field(primary_key=True)
    session_id: str
    origin_message_id: str
    user_id: str
    agent_id: str
    run_id: str = ""
    tool: str
    effect: str
    reversibility: str
    owner: str | None = None
    subject_key: str
    subject_json: str | None = Field(default=None, sa_column=Column(Text))
    args_json: str = Field(sa_column=Column(Text, nullable=False))
    args_hash: str
    approver_role: str
    notes_json: str = Field(default="[]", sa_column=Column(Text, nullable=False))
    approvals_required: int
    status: str
    version: int = 1
    created_at: float
    updated_at: float
    expires_at: float
    decided_at: float | None = None
    reason: str | None = Field(default=None, sa_column=Column(Text))
    row_fingerprint: str
    table_fingerprint: str
    policy_fingerprint: str = ""
    has_confirm: bool = False
    grants: int = 0
    seal: str = ""
    token_hash: str | None = None
    token_kid: str | None = None
    token_expires_at: float | None = None
    token_used_at: float | None = None
    model_id: str = _model_id()


class IntentKeyRow(SQLModel, table=True):
    __tablename__ = "eg_intent_keys"
    key: str = Field(primary_key=True)
    # no index: keys are looked up by key (the primary key), never by approval
    approval_id: str
    version: int
    origin_message_id: str
    created_at: float


class DecisionTable(SQLModel, table=True):
    __tablename__ = "eg_decisions"
    id: int | None = _big_id()
    approval_id: str = Field(index=True)
    version: int
    grant_round: int = 0
    approver_id: str
    role: str
    decision: str
    reason: str | None = Field(default=None, sa_column=Column(Text))
    at: float
    seal: str = ""


#: A read record, the bulk of the log, enters no index: its row is one B-tree insert, not three
#: (`_upgrade.indexes` replaces the full indexes of databases made before). A query by kind says
#: `kind <> 'read'` so that SQLite sees the partial index answers it (`_queries.NOT_READ`). Its
#: WHERE clause is given to the dialect of each engine made and each `create_all` (`partial_where`):
#: naming a dialect's option loads that dialect, and a SQLite process never loads PostgreSQL's.
_PARTIAL = (
    (Index("eg_events_kind", "kind"), "kind <> 'read'"),
    (Index("eg_events_approval", "approval_id"), "approval_id IS NOT NULL"),
)
EVENT_INDEXES = tuple(index for index, _ in _PARTIAL)


def partial_where(dialect: str) -> None:  # each partial index its WHERE clause on `dialect`, once
    for index, where in _PARTIAL if dialect in ("sqlite", "postgresql") else ():
        if index.dialect_options[dialect]["where"] is None:
            index.dialect_kwargs[f"{dialect}_where"] = text(where)


@event.listens_for(SQLModel.metadata, "before_create")  # `setup` over a caller's own engine too
def _where_before_ddl(metadata: Any, conn: Any, **kw: Any) -> None:
    partial_where(conn.dialect.name)  # before create_all, so before `_upgrade.indexes`


class EventRow(SQLModel, table=True):
    __tablename__ = "eg_events"
    __table_args__ = EVENT_INDEXES
    id: int | None = _big_id()
    at: float
    kind: str
    approval_id: str | None = None
    version: int | None = None
    tool: str | None = None
    effect: str | None = None
    args_hash: str | None = None
    session_id: str | None = None
    origin_message_id: str | None = None
    user_id: str | None = None
    agent_id: str | None = None
    run_id: str | None = None
    table_fingerprint: str | None = None
    row_fingerprint: str | None = None
    detail_json: str = Field(default="{}", sa_column=Column(Text, nullable=False))
    model_id: str | None = None  # the model that proposed the call the event is about


class ExecutionRow(SQLModel, table=True):
    __tablename__ = "eg_executions"
    id: int | None = _big_id()
    at: float
    approval_id: str | None = Field(default=None, index=True)
    version: int | None = None
    tool: str
    effect: str
    args_hash: str
    args_json: str = Field(sa_column=Column(Text, nullable=False))
    idempotency_key: str
    status: str
    session_id: str
    origin_message_id: str
    user_id: str
    agent_id: str
    run_id: str = ""
    table_fingerprint: str
    row_fingerprint: str
    policy_fingerprint: str = ""
    before_json: str | None = Field(default=None, sa_column=Column(Text))
    after_json: str | None = Field(default=None, sa_column=Column(Text))
    result_json: str | None = Field(default=None, sa_column=Column(Text))
    error: str | None = Field(default=None, sa_column=Column(Text))
    model_id: str = _model_id()


class IdempotencyRow(SQLModel, table=True):
    __tablename__ = "eg_idempotency"
    key: str = Field(primary_key=True)
    payload_hash: str
    status: str
    lease_owner: str | None = None
    lease_expires_at: float | None = None
    result_json: str | None = Field(default=None, sa_column=Column(Text))
    error: str | None = Field(default=None, sa_column=Column(Text))
    provider_ref: str | None = None
    attempts: int = 1
    created_at: float
    updated_at: float
    user_id: str | None = None  # the call's user (schema 5): `redact` finds its calls in flight


class RuleRow(SQLModel, table=True):
    """The canonical form of a table row or a policy, under its fingerprint (content-addressed):
    the audit checks each approval against the rule as it was when the approval was made."""

    __tablename__ = "eg_rules"
    fingerprint: str = Field(primary_key=True)
    kind: str
    body_json: str = Field(sa_column=Column(Text, nullable=False))
    at: float


class RedactedRow(SQLModel, table=True):
    """One personal value erased by a redaction (`effectgate.redact`): which table, row and
    column, the value's commitment (the keyring's MAC of the erased text: the chain and a holder
    of the original can still check it, nobody can read it back), and for arguments the hash they
    had and the facts kept. Sealed with the keyring: an edited entry, or a marker without one,
    is an audit finding."""

    __tablename__ = "eg_redacted"
    __table_args__ = (Index("eg_redacted_row", "table_name", "row_key"),)
    id: int | None = _big_id()
    redaction_id: str = Field(index=True)
    table_name: str
    row_key: str
    column_name: str
    commitment: str
    args_hash: str | None = None
    kept_json: str | None = Field(default=None, sa_column=Column(Text))
    at: float
    seal: str


class HoldRow(SQLModel, table=True):
    """A legal hold on one user's records: while it is not released, neither a redaction nor a
    retention rule erases anything of theirs."""

    __tablename__ = "eg_holds"
    id: str = Field(primary_key=True)
    user_id: str  # no index: a btree refuses a long user id, and the few holds are read whole
    reason: str = Field(sa_column=Column(Text, nullable=False))
    placed_by: str
    at: float
    released_at: float | None = None
    released_by: str | None = None


class ChainRow(SQLModel, table=True):
    """A signed checkpoint of the ledger's own hash chain (`effectgate.chain`): the rows of one
    append-only table with ids in (the previous checkpoint's last id, `last_id`], chained from
    `start` to `head`, under key `key_id` (personal values enter as their keyed hashes, so an
    erasure keeps the chain)."""

    __tablename__ = "eg_chain"
    id: int | None = _big_id()
    table_name: str = Field(index=True)
    first_id: int = Field(sa_type=BIG_ID)
    last_id: int = Field(sa_type=BIG_ID)
    count: int = Field(sa_type=BIG_ID)
    start: str
    head: str
    key_id: str
    at: float
    signature: str


APPEND_ONLY = ("eg_events", "eg_decisions", "eg_executions", "eg_rules", "eg_redacted", "eg_chain")

#: The columns that may hold personal data (arguments, results, free text), per table: what a
#: redaction overwrites with a marker. Everything else (ids, hashes, amounts' facts, times, the
#: approval chain) is kept.
PERSONAL: dict[str, tuple[str, ...]] = {
    "eg_approvals": ("args_json", "subject_json", "notes_json", "reason"),
    "eg_executions": ("args_json", "before_json", "after_json", "result_json", "error"),
    "eg_events": ("detail_json",),
    "eg_decisions": ("reason",),
    "eg_idempotency": ("result_json", "error"),
}

#: The columns of a read record, in the order `append_reads` takes them (a narrow event row: reads
#: are the most frequent record, so they are built as tuples on the call path, not as dicts).
READ_COLUMNS = (
    "at",
    "kind",
    "tool",
    "effect",
    "args_hash",
    "session_id",
    "origin_message_id",
    "user_id",
    "agent_id",
    "run_id",
    "table_fingerprint",
    "row_fingerprint",
    "detail_json",
    "model_id",
)


@dataclass(kw_only=True, slots=True)
class ApprovalRow:
    """One `eg_approvals` row as the gate reads and writes it: a plain record (building an ORM
    object per read cost more than the read itself). Fields and defaults are the table's."""

    id: str
    session_id: str
    origin_message_id: str
    user_id: str
    agent_id: str
    run_id: str = ""
    tool: str
    effect: str
    reversibility: str
    owner: str | None = None
    subject_key: str
    subject_json: str | None = None
    args_json: str
    args_hash: str
    approver_role: str
    notes_json: str = "[]"
    approvals_required: int
    status: str
    version: int = 1
    created_at: float
    updated_at: float
    expires_at: float
    decided_at: float | None = None
    reason: str | None = None
    row_fingerprint: str
    table_fingerprint: str
    policy_fingerprint: str = ""
    has_confirm: bool = False
    grants: int = 0
    seal: str = ""
    token_hash: str | None = None
    token_kid: str | None = None
    token_expires_at: float | None = None
    token_used_at: float | None = None
    model_id: str = ""

    def model_copy(self, *, update: Mapping[str, Any]) -> ApprovalRow:
        return replace(self, **update)

    def model_dump(self) -> dict[str, Any]:
        return dict(zip(APPROVAL_COLUMNS, _approval_values(self), strict=True))


@dataclass(kw_only=True, slots=True)
class DecisionRow:
    """One `eg_decisions` row, as a plain record."""

    id: int | None = None
    approval_id: str
    version: int
    grant_round: int = 0
    approver_id: str
    role: str
    decision: str
    reason: str | None = None
    at: float
    seal: str = ""

    def model_dump(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in DECISION_COLUMNS}


APPROVAL_COLUMNS = tuple(f.name for f in fields(ApprovalRow))
_approval_values = attrgetter(*APPROVAL_COLUMNS)  # every field, in order, in one C call
DECISION_COLUMNS = tuple(f.name for f in fields(DecisionRow))
assert tuple(c.name for c in ApprovalTable.__table__.columns) == APPROVAL_COLUMNS  # type: ignore[attr-defined]
assert tuple(c.name for c in DecisionTable.__table__.columns) == DECISION_COLUMNS  # type: ignore[attr-defined]
