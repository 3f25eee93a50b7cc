"""The personal columns of the ledger's rows (`records.PERSONAL`): read as redaction `Target`s,
a batch of keys per statement (a user's or a rule's records can outnumber the parameters one
statement binds), and overwritten with redaction markers (`overwrite`: the append-only triggers
refuse anything else)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from . import _queries as Q
from ._redaction import Target
from .records import PERSONAL

_TABLES: dict[str, sa.Table] = {
    "eg_approvals": Q.T_APPROVALS,
    "eg_executions": Q.T_EXECUTIONS,
    "eg_events": Q.T_EVENTS,
    "eg_decisions": Q.T_DECISIONS,
    "eg_idempotency": Q.T_IDEMPOTENCY,
}
_KEYS = {"eg_idempotency": "key"}


def _key(table: str) -> sa.Column[Any]:
    return _TABLES[table].c[_KEYS.get(table, "id")]


def _select(conn: Connection, table: str, where: Any, extra: Sequence[str]) -> list[Target]:
    t = _TABLES[table]
    columns = [_key(table), *(t.c[c] for c in PERSONAL[table]), *(t.c[c] for c in extra)]
    key, personal = _key(table).name, PERSONAL[table]
    rows = conn.execute(sa.select(*columns).where(where).order_by(_key(table)))
    return [
        Target(table=table, key=str(m[key]), values={c: m[c] for c in personal}, **{n: m[n] for n in extra})
        for m in (row._mapping for row in rows)
    ]


def _in(column: sa.Column[Any], values: Iterable[str]) -> Any:
    return column.in_(listed) if (listed := sorted(set(values))) else sa.false()


#: Values per IN list: a user's or a rule's records can number hundreds of thousands, beyond
#: SQLite's (32,766) and PostgreSQL's (65,535) bound parameters per statement.
_BATCH = 500


def _batches(values: Iterable[str]) -> Iterator[list[str]]:
    listed = sorted(set(values))
    for start in range(0, len(listed), _BATCH):
        yield listed[start : start + _BATCH]


def _select_in(
    conn: Connection, table: str, col: Any, values: Iterable[str], extra: Sequence[str], also: Any = True
) -> list[Target]:
    """`_select` of the rows whose `col` is one of `values` (and `also`), a batch per statement."""
    found = [
        t for batch in _batches(values) for t in _select(conn, table, sa.and_(col.in_(batch), also), extra)
    ]
    return sorted(found, key=lambda t: (int(t.key) if t.key.isdigit() else 0, t.key))


def overwrite(conn: Connection, table: str, key: str, values: Mapping[str, str]) -> None:
    """Write redaction markers into personal columns of one row."""
    if unknown := set(values) - set(PERSONAL[table]):
        raise ValueError(f"{table}: {sorted(unknown)} are not personal columns")
    column = _key(table)
    typed: Any = int(key) if column.type.python_type is int else key
    conn.execute(sa.update(_TABLES[table]).where(column == typed).values(**values))
