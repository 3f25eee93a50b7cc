"""Which SQLite URLs name a database held in memory (see `_dialect._sqlite_engine`)."""

from __future__ import annotations

import sqlalchemy as sa


def in_memory(url: sa.engine.URL) -> bool:
    """Whether `url` names an in-memory SQLite database: `sqlite://`, `sqlite:///:memory:`, or a
    URI form (`uri=true`) with `mode=memory`, `vfs=memdb` or the name `file::memory:`. Each
    connection to one may open a different empty database (unless `cache=shared`, whose locks
    do not wait), so the store keeps one connection for all its work."""
    if url.get_backend_name() != "sqlite":
        return False
    if url.database in (None, "", ":memory:"):
        return True
    query = url.query
    if str(_last(query.get("uri"))).strip().lower() not in ("true", "yes", "on", "y", "t", "1"):
        return False  # no URI: the query is not SQLite's, the name is a file's
    name = str(url.database)
    return (
        _last(query.get("mode")) == "memory"
        or _last(query.get("vfs")) == "memdb"
        or name.removeprefix("file:") == ":memory:"
    )


def _last(value: str | tuple[str, ...] | None) -> str | None:
    """A query parameter's value (the last one, when the URL repeats it)."""
    return value[-1] if isinstance(value, tuple) else value
