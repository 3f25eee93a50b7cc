"""A list filtered by a text no row can hold (a NUL, a lone surrogate) is empty on every store:
PostgreSQL refused the query ("text fields cannot contain NUL") where SQLite answered nothing, so
a typo in a session id read as the database being down (`gate.pending(session_id=...)`)."""

from __future__ import annotations

import pytest

from effectgate.stores import SQLStore

ODD = ["s\x00x", "s\ud800x"]


@pytest.mark.parametrize("value", ODD, ids=["nul", "surrogate"])
def test_lists_filtered_by_text_no_row_holds_are_empty(store: SQLStore, value: str) -> None:
    assert store.approvals(session_id=value) == []
    assert store.approvals(status=[value, "pending"], role=value) == []
    assert store.executions(approval_id=value) == []
    assert store.executions(tool=value) == []
    assert store.events(kind=value) == []
    assert store.events(approval_id=value, session_id=value) == []
