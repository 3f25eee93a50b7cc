"""In-place upgrades of an older effectgate schema, run by `SQLStore.setup` under its lock.

Each step takes a database from one version to the next and never loses a row: columns are
added with a default for the rows already there, and new tables are created by `create_all`
after the steps. A version with no step (older than the oldest step, or newer than this
release) is refused, as before.
"""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.schema import CreateIndex

from ..errors import StoreError
from .records import APPROVAL_SESSION_INDEX, APPROVAL_SUBJECT_INDEX, BIG_ID_COLUMNS, EVENT_INDEXES


def _2_to_3(conn: Connection) -> None:
    # the model that proposed a call, on approvals, executions ('' for rows written before) and
    # events (NULL before)
    for table in ("eg_approvals", "eg_executions"):
        conn.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN model_id VARCHAR NOT NULL DEFAULT ''")
    conn.exec_driver_sql("ALTER TABLE eg_events ADD COLUMN model_id VARCHAR")  # NULL before


def _3_to_4(conn: Connection) -> None:
    # PostgreSQL's SERIAL ids (int4, and their sequences) ended the ledger at 2^31 rows: widen
    # them, and the chain's id ranges, to BIGINT (each table rewritten once, under the setup
    # lock). SQLite's INTEGER PRIMARY KEY is 64-bit already. A table a version 2 database lacks
    # is created by `create_all` after the steps, already 64-bit.
    if conn.dialect.name != "postgresql":
        return
    present = set(sa.inspect(conn).get_table_names())
    for table, columns in BIG_ID_COLUMNS.items():
        if table not in present:
            continue
        widen = ", ".join(f"ALTER COLUMN {c} TYPE BIGINT" for c in columns)
        conn.exec_driver_sql(f"ALTER TABLE {table} {widen}")
        sequence = conn.exec_driver_sql(f"SELECT pg_get_serial_sequence('{table}', 'id')").scalar()
        if sequence is not None:
            conn.exec_driver_sql(f"ALTER SEQUENCE {sequence} AS BIGINT")


def _4_to_5(conn: Connection) -> None:
    # the user a claim is made for (NULL for the records written before): `redact` refuses while
    # a call of the user is in flight, which no other row names until it settles
    if "user_id" not in {c["name"] for c in sa.inspect(conn).get_columns("eg_idempotency")}:
        conn.exec_driver_sql("ALTER TABLE eg_idempotency ADD COLUMN user_id VARCHAR")


STEPS: dict[int, Callable[[Connection], None]] = {2: _2_to_3, 3: _3_to_4, 4: _4_to_5}

#: Indexes of earlier releases that `indexes` drops: full indexes on eg_events, which every read
#: record entered; the approvals' (subject_key, status) and (session_id, tool, subject_key,
#: status), which every status change rewrote; and the intent keys' approval id, which no query
#: reads (each is one more page written per commit); and the holds' user id, which refused a hold
#: on a user id longer than a PostgreSQL btree entry (2704 bytes) that the gate records.
REPLACED_INDEXES = (
    "ix_eg_events_kind",
    "ix_eg_events_approval_id",
    "eg_approvals_subject_status",
    "eg_approvals_session_subject",
    "ix_eg_intent_keys_approval_id",
    "ix_eg_holds_user_id",
)
#: Indexes of this release that an older database may lack (`indexes` creates them).
ADDED_INDEXES = (*EVENT_INDEXES, APPROVAL_SUBJECT_INDEX, APPROVAL_SESSION_INDEX)


def indexes(conn: Connection) -> None:
    """Bring the indexes to this release's (idempotent, on every setup): an index changes no row
    and no query's answer, so it needs no schema version. Only those to drop or create are
    touched: PostgreSQL's CREATE INDEX IF NOT EXISTS locks its table even when the index exists,
    so a worker's setup on a current database, while other workers run, waited for their
    transactions and deadlocked with them (it holds eg_events, they hold eg_approvals)."""
    inspector = sa.inspect(conn)
    tables = ("eg_events", "eg_approvals", "eg_intent_keys", "eg_holds")  # those of the indexes above
    present = {i["name"] for t in tables for i in inspector.get_indexes(t)}
    for name in REPLACED_INDEXES:
        if name in present:
            conn.exec_driver_sql(f"DROP INDEX IF EXISTS {name}")
    for index in ADDED_INDEXES:
        if index.name not in present:
            conn.execute(CreateIndex(index, if_not_exists=True))


def upgrade(conn: Connection, found: int, target: int, *, where: str) -> None:
    """Run the steps from version `found` to `target` inside `conn`'s transaction."""
    if found > target or any(v not in STEPS for v in range(found, target)):
        raise StoreError(
            f"the database at {where} has effectgate schema version {found}; this effectgate "
            f"(schema {target}) neither reads nor writes it. Use the effectgate release that "
            "created it, or start a new database"
        )
    for version in range(found, target):
        STEPS[version](conn)
