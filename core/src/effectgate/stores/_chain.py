"""The SQL of the ledger's own hash chain (see `effectgate.chain`): signed checkpoints in
`eg_chain`, and the chained tables' rows streamed in id order as plain tuples."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from . import _dialect
from . import _queries as Q
from .records import ChainRow, RuleRow

#: The append-only tables the chain covers, and their columns in chain order.
CHAINED: dict[str, sa.Table] = {
    "eg_decisions": Q.T_DECISIONS,
    "eg_executions": Q.T_EXECUTIONS,
    "eg_events": Q.T_EVENTS,
}


def columns(table: str) -> tuple[str, ...]:
    return tuple(c.name for c in CHAINED[table].columns)


class ChainSQL:
    """The store's chain primitives (`protocol.ChainLedger`); mixed into `SQLStore`."""

    def checkpoints(self, conn: Connection) -> list[ChainRow]:
        q = sa.select(Q.T_CHAIN).order_by(Q.T_CHAIN.c.id)
        return [ChainRow(**r._mapping) for r in conn.execute(q)]

    def rule_rows(self, conn: Connection) -> list[RuleRow]:
        """Every `eg_rules` row, rules and their seal rows (`_seal.RULE_SEAL`), in this transaction."""
        return [
            RuleRow(**r._mapping) for r in conn.execute(sa.select(Q.T_RULES)) if type(r.fingerprint) is str
        ]

    def append_checkpoint(self, conn: Connection, row: Mapping[str, Any]) -> None:
        conn.execute(sa.insert(Q.T_CHAIN), dict(row))

    def chain_rows(
        self, conn: Connection, table: str, *, after_id: int | None, upto_id: int | None = None
    ) -> Iterator[tuple[Any, ...]]:
        """The rows of `table` with after_id < id (<= upto_id), in id order, as tuples in
        `columns(table)` order (streamed: the events table is the largest). `after_id` None: from
        the first row, whatever its id (a row inserted at id 0 or below is chained, not skipped)."""
        if table not in CHAINED:
            raise ValueError(f"{table} is not chained")
        bounds = [f"id > {int(after_id)}"] if after_id is not None else []
        bounds += [f"id <= {int(upto_id)}"] if upto_id is not None else []
        where = f" WHERE {' AND '.join(bounds)}" if bounds else ""
        sql = f"SELECT {', '.join(columns(table))} FROM {table}{where} ORDER BY id"
        return _dialect.stream(conn, sql, batch=5000)
