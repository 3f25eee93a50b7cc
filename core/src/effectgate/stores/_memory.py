"""Which SQLite URLs name a database held in memory (see `_dialect._sqlite_engine`) and which
file the others name, and how a database URL is printed."""

from __future__ import annotations

import os
import urllib.parse

import sqlalchemy as sa
from sqlalchemy.util import coerce_kw_type

from ..errors import StoreError

#: The one driver the store runs on each database, and what to write instead of another: one
#: whose module is missing, or an async one (`sqlite+aiosqlite`, whose first statement failed
#: with SQLAlchemy's MissingGreenlet: the store's transactions are not coroutines).
_DRIVERS = {
    "sqlite": (("sqlite", "sqlite+pysqlite"), "the sqlite3 driver: sqlite:///..."),
    "postgresql": (("postgresql", "postgresql+psycopg"), "the psycopg 3 driver: postgresql+psycopg://..."),
}


#: The options of a SQLite URL that SQLAlchemy converts for the driver (pysqlite's
#: `create_connect_args`), each with what it must be
_SQLITE_OPTIONS = {
    "uri": (bool, "true or false"),
    "timeout": (float, "a number"),
    "detect_types": (int, "a whole number"),
    "check_same_thread": (bool, "true or false"),
    "cached_statements": (int, "a whole number"),
}


def unparsed(url: object, exc: Exception) -> str:
    """The error for a database URL that does not parse (`exc`), without quoting it: it may hold a
    password. One that is no string (a `Path`) is named by its type."""
    use = "sqlite:///PATH or postgresql+psycopg://..."
    if isinstance(url, os.PathLike):
        return f"the database URL is a str, not a {type(url).__name__}: give sqlite:///{os.fspath(url)}"
    if not isinstance(url, str):
        return f"the database URL is a str, not {type(url).__name__}: give {use}"
    return f"cannot parse the database URL ({exc}); give {f'sqlite:///{url}' if '://' not in url else use}"


def check_driver(url: sa.engine.URL) -> None:
    """Refuse (StoreError) a URL that names a driver the store does not run on its database, a
    SQLite option its driver cannot take (`?timeout=abc`, one given twice: SQLAlchemy's
    conversion raised a bare ValueError or TypeError, naming no option), or SQLite URI options
    on a name that is not a URI."""
    names, use = _DRIVERS.get(url.get_backend_name(), ((url.drivername,), ""))
    if url.drivername not in names:
        raise StoreError(f"use {use} (got {url.drivername})")
    if url.get_backend_name() != "sqlite":
        return
    for key, (kind, what) in _SQLITE_OPTIONS.items():
        value = url.query.get(key)
        try:
            if isinstance(value, tuple):  # given twice: bool() takes any pair as true, `_last` not
                raise TypeError(key)
            coerce_kw_type({key: value}, key, kind)
        except (TypeError, ValueError):
            raise StoreError(
                f"the database URL's option {key} must be {what}, given once (got {value!r})"
            ) from None
    others = set(url.query) - set(_SQLITE_OPTIONS)  # SQLAlchemy appends them to the name
    if others and not (_uri(url) and str(url.database or "").startswith("file:")):
        # SQLite reads them only in a `file:` name: with uri=true another file (`x.db?mode=ro`)
        # was opened; without it SQLAlchemy dropped them with a warning (`?mode=ro`: read-write)
        raise StoreError(
            f"SQLite reads the URL's options ({', '.join(sorted(others))}) only in a name "
            "written as a URI: sqlite:///file:PATH?...&uri=true"
        )


def refuse_unusable(url: sa.engine.URL, where: str, *, create: bool) -> None:
    """Refuse (StoreError) the file a SQLite URL names before a connection opens it: a missing
    one (unless `create`, as `setup` does: sqlite3 created an empty file, left behind by a store
    that only reads), one in a missing directory, a directory, or a file that is not a SQLite
    database (sqlite3's bare "unable to open database file", "file is not a database")."""
    path = sqlite_file(url)
    if path is None:  # not SQLite, or in memory
        return
    if not os.path.exists(path):
        if not create:
            raise StoreError(
                f"no effectgate schema at {where} (no such file): run `effectgate setup` or call "
                "store.setup()"
            )
        if not os.path.isdir(os.path.dirname(path) or "."):
            raise StoreError(
                f"cannot create the database at {where}: {os.path.dirname(path)}/ does not exist"
            )
        return
    if os.path.isdir(path):
        raise StoreError(f"cannot read the SQLite database at {where}: it is a directory, not a file")
    try:
        with open(path, "rb") as file:
            head = file.read(16)
    except OSError:
        return  # unreadable: SQLite says why
    if head and head != b"SQLite format 3\x00":  # empty: a database SQLite creates
        raise StoreError(f"cannot read the SQLite database at {where}: file is not a database")


def sqlite_timeout(url: sa.engine.URL) -> float:
    """The seconds a SQLite writer waits for another's lock: the URL's `timeout` (checked by
    `check_driver`), else 30; from 0 to 2,000,000 (SQLite's busy_timeout is a C int of ms)."""
    value = _last(url.query.get("timeout"))
    seconds = 30.0 if value is None else float(value)
    if not 0 <= seconds <= 2_000_000:  # NaN too
        raise StoreError(
            f"the database URL's option timeout must be seconds from 0 to 2000000 (got {value!r})"
        )
    return seconds


def in_memory(url: sa.engine.URL) -> bool:
    """Whether `url` names an in-memory SQLite database: `sqlite://`, `sqlite:///:memory:`, or a
    URI form (`uri=true`) with `mode=memory`, `vfs=memdb` or the name `file::memory:`. Each
    connection to one may open a different empty database (unless `cache=shared`, whose locks
    do not wait), so the store keeps one connection for all its work."""
    if url.get_backend_name() != "sqlite":
        return False
    if url.database in (None, "", ":memory:"):
        return True
    if not _uri(url):
        return False  # no URI: the query is not SQLite's, the name is a file's
    name, query = str(url.database), url.query
    return (
        _last(query.get("mode")) == "memory"
        or _last(query.get("vfs")) == "memdb"
        or name.removeprefix("file:") == ":memory:"
    )


def sqlite_file(url: sa.engine.URL) -> str | None:
    """The path of the file a SQLite URL names (None: not SQLite, or in memory): `sqlite:///PATH`,
    or a URI form (`uri=true`) of the same file: `file:PATH`, `file:///PATH`, `file://localhost/PATH`
    (percent-escapes decoded, as SQLite does). Its key file is beside that path, whichever form."""
    if url.get_backend_name() != "sqlite" or in_memory(url):
        return None
    name = str(url.database)
    if not (_uri(url) and name.startswith("file:")):
        return name
    path = name.removeprefix("file:")
    if path.startswith("//"):  # an authority: empty or localhost
        path = path[2:].removeprefix("localhost")
    return urllib.parse.unquote(path)


def _uri(url: sa.engine.URL) -> bool:
    """Whether SQLite reads the URL's name as a URI (`uri=true`, as SQLAlchemy reads a flag)."""
    return str(_last(url.query.get("uri"))).strip().lower() in ("true", "yes", "on", "y", "t", "1")


def _last(value: str | tuple[str, ...] | None) -> str | None:
    """A query parameter's value (the last one, when the URL repeats it)."""
    return value[-1] if isinstance(value, tuple) else value


def shown(url: sa.engine.URL) -> str:
    """`url` as an error or a message prints it: no password, neither the user's nor one in the
    query (libpq reads `password` and `sslpassword` there; SQLAlchemy hides only the user's)."""
    secret = {k: "***" for k in url.query if k.lower().endswith("password")}
    return url.update_query_dict(secret).render_as_string(hide_password=True)
