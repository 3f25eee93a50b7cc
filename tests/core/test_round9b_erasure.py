"""Round 9b: erasure and legal holds with odd inputs (SQLite and PostgreSQL)."""

from __future__ import annotations

import secrets

from effectgate.redact import RedactionError, hold, holds
from effectgate.stores.sql import SQLStore

LONG_USER = secrets.token_hex(2500)  # 5000 bytes, incompressible: beyond a PostgreSQL btree entry


def test_a_hold_on_a_long_user_id_is_placed_or_refused_clearly(store: SQLStore) -> None:
    """The gate takes a user id of any length, and a hold must be placeable on every user it
    records; at worst it is refused with a RedactionError, never a raw database error."""
    try:
        placed = hold(store, user_id=LONG_USER, by="legal", reason="case 14")
    except RedactionError:
        assert holds(store) == []
    else:
        assert [h.user_id for h in holds(store)] == [placed.user_id] == [LONG_USER]


def test_a_database_made_before_loses_the_holds_user_index_at_setup(store: SQLStore) -> None:
    """A database an earlier release made has the index on eg_holds.user_id: setup drops it, and
    then a long user id can be held there too."""
    with store.engine.begin() as conn:
        conn.exec_driver_sql("CREATE INDEX IF NOT EXISTS ix_eg_holds_user_id ON eg_holds (user_id)")
    store.setup()
    placed = hold(store, user_id=LONG_USER, by="legal", reason="case 14")
    assert [h.id for h in holds(store)] == [placed.id]
