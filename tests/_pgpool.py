"""Empty PostgreSQL databases for the tests, reused once proven empty again.

`CREATE DATABASE` copies template1 and costs about 0.2 s of server time on a 2-core machine; with
1,500 PostgreSQL tests that was a fifth of `make test`. A database a test has finished with is
emptied instead (its connections ended, its `public` schema dropped and made again) and handed to
the next test only if it then looks exactly as a fresh one did: no schema, relation, function,
type, extension, event trigger, large object, publication, default privilege or database-level
setting beyond a fresh database's, the same `public` owner and privileges, no other connection.
Anything else (a test that altered the database, a connection that would not end) and the
database is dropped as before, and the next test gets a new one.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported when a pool is made: the adapters' compat venvs have no psycopg
    import psycopg

#: What a database holds beyond its public schema's contents, and who may use it: equal to a
#: freshly created database's, or the database is not reused.
_FINGERPRINT = """
SELECT
  (SELECT count(*) FROM pg_namespace
    WHERE nspname <> 'public' AND nspname <> 'information_schema' AND nspname !~ '^pg_'),
  (SELECT count(*) FROM pg_class WHERE relnamespace = 'public'::regnamespace),
  (SELECT count(*) FROM pg_proc WHERE pronamespace = 'public'::regnamespace),
  (SELECT count(*) FROM pg_type WHERE typnamespace = 'public'::regnamespace),
  (SELECT count(*) FROM pg_collation WHERE collnamespace = 'public'::regnamespace),
  (SELECT count(*) FROM pg_operator WHERE oprnamespace = 'public'::regnamespace),
  (SELECT string_agg(extname, ',' ORDER BY extname) FROM pg_extension),
  (SELECT count(*) FROM pg_event_trigger),
  (SELECT count(*) FROM pg_largeobject_metadata),
  (SELECT count(*) FROM pg_publication),
  (SELECT count(*) FROM pg_default_acl),
  (SELECT count(*) FROM pg_db_role_setting
    WHERE setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())),
  (SELECT coalesce(datacl::text, '') || datallowconn::text || datconnlimit::text
          || datdba::regrole::text || coalesce(datcollate, '') || coalesce(datctype, '')
     FROM pg_database WHERE datname = current_database()),
  (SELECT nspowner::regrole::text || coalesce(nspacl::text, '') FROM pg_namespace
    WHERE nspname = 'public'),
  (SELECT coalesce(obj_description(oid, 'pg_namespace'), '') FROM pg_namespace
    WHERE nspname = 'public')
"""

_EMPTY_PUBLIC = (
    "DROP SCHEMA public CASCADE; CREATE SCHEMA public AUTHORIZATION pg_database_owner; "
    "GRANT USAGE ON SCHEMA public TO PUBLIC; COMMENT ON SCHEMA public IS {comment}"
)


class DatabasePool:
    """Hands out empty databases on one server (`conninfo` names its maintenance database)."""

    def __init__(self, conninfo: str) -> None:
        import psycopg

        self._admin = psycopg.connect(conninfo, autocommit=True)
        self._conninfo = conninfo
        self._free: list[str] = []
        self._fresh: tuple[object, ...] | None = None
        self._comment = "NULL"

    def take(self) -> str:
        if self._free:
            return self._free.pop()
        name = f"t_{uuid.uuid4().hex[:16]}"
        self._admin.execute(f"CREATE DATABASE {name}")
        if self._fresh is None:
            with self._connect(name) as conn:
                self._fresh = self._fingerprint(conn)
                comment = conn.execute("SELECT obj_description('public'::regnamespace, 'pg_namespace')")
                found = comment.fetchone()
                if found is not None and found[0] is not None:
                    self._comment = "'" + str(found[0]).replace("'", "''") + "'"
        return name

    def give_back(self, name: str) -> None:
        """Empty `name` for the next test, or drop it when it cannot be proven empty."""
        import psycopg

        try:
            if self._empty(name):
                self._free.append(name)
                return
        except psycopg.Error:
            pass
        self._drop(name)

    def close(self) -> None:
        for name in self._free:
            self._drop(name)
        self._free.clear()
        self._admin.close()

    def _empty(self, name: str) -> bool:
        if not self._alone(name):
            return False
        with self._connect(name) as conn:
            conn.execute("SET lock_timeout = '5s'")
            conn.execute(_EMPTY_PUBLIC.format(comment=self._comment).encode())
            clean = self._fingerprint(conn) == self._fresh
        return clean and self._alone(name)

    def _alone(self, name: str) -> bool:
        """End every other connection to `name`, waiting up to 5 s for each to go."""
        query = "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"
        for _ in range(3):
            pids = [row[0] for row in self._admin.execute(query, (name,)).fetchall()]
            if not pids:
                return True
            for pid in pids:
                self._admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))
        return False

    def _drop(self, name: str) -> None:
        self._admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def _connect(self, name: str) -> psycopg.Connection:
        import psycopg

        return psycopg.connect(self._conninfo.rsplit("/", 1)[0] + f"/{name}", autocommit=True)

    @staticmethod
    def _fingerprint(conn: psycopg.Connection) -> tuple[object, ...]:
        row = conn.execute(_FINGERPRINT).fetchone()
        assert row is not None
        return tuple(row)
