"""Opening the database and the gate for a command, and what a failure means (exit codes)."""

from __future__ import annotations

import argparse
import re
import shlex
import socket
import sqlite3
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa

from .._audit_rows import Rules
from .._devkeys import holds_records as holds_records
from .._manifest import ExportError
from ..chain import ChainError
from ..effects import Policy
from ..errors import (
    ApprovalError,
    EffectGateError,
    IdempotencyError,
    MissingDependency,
    MissingKeyring,
    PolicyViolation,
    StoreError,
    TokenError,
    UnknownApproval,
    describe,
)
from ..redact import RedactionError
from ..stores._memory import sqlite_file
from ..stores.sql import SQLStore, open_store
from ..table import EffectTable
from ..tokens import Keyring
from ..tokens import keyring_for as _keyring_for
from ._render import (
    EXIT_INTERNAL,
    EXIT_NOT_FOUND,
    EXIT_RAN_FAILED,
    EXIT_REFUSED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
)

if TYPE_CHECKING:  # the gate is imported when a command makes one (`audit` alone makes none)
    from ..gate import EffectGate
    from ..outcomes import Card, Executed, Grant


class CommandError(Exception):
    """A failure reported in one line; `exit_code` says which kind (see the module docstring)."""

    exit_code = EXIT_USAGE


class UsageError(CommandError):
    """Bad command-line input: arguments, options, --app, keyring; exit 2."""


class NotFound(CommandError):
    """No database file at the path given; exit 3."""

    exit_code = EXIT_NOT_FOUND


class RunFailed(CommandError):
    """`approve --execute`: the approval was recorded, then its run failed or its outcome is
    unknown (not "nothing changed"); exit 6."""

    exit_code = EXIT_RAN_FAILED


class NotRun(CommandError):
    """`approve --execute`: the approval was recorded, and the gate refused to start its run (a
    tool this process cannot run, such as a framework's native tool): nothing ran, and the grant
    is unspent (its token is printed, as without --execute); exit 4."""

    exit_code = EXIT_REFUSED


def run_approved(gate: EffectGate, grant: Grant, url: str) -> Executed | NotRun:
    """The execution of a grant just recorded; a run refused before it started is a `NotRun`
    (returned, for the grant to be printed), one that failed or may have run a `RunFailed`."""
    try:
        return gate.execute(grant.token)
    except Exception as exc:
        code, why = _failure(exc, url)
        if code == EXIT_INTERNAL and _run_failed(gate, grant.approval_id):  # the tool's own exception
            why = describe(exc)
        elif code in (EXIT_UNAVAILABLE, EXIT_INTERNAL):  # the database, or a bug: said as such
            raise
        approval = f"{grant.approval_id} v{grant.version}"
        if _never_started(gate, grant.approval_id):
            return NotRun(f"approved {approval} (recorded), but nothing ran: {why}; the grant is unspent")
        raise RunFailed(f"approved {approval} (recorded), then its run failed: {why}") from exc


def _never_started(gate: EffectGate, approval_id: str) -> bool:
    """Whether the approval's grant was never presented (no `token_used_at`, no execution): the
    gate refused before its claim, so nothing ran. The store cannot say: not known, so False."""
    try:
        row = gate.store.get_approval(approval_id)
        return (
            row is not None
            and row.token_used_at is None
            and not gate.store.executions(approval_id=approval_id)
        )
    except Exception:
        return False


def _run_failed(gate: EffectGate, approval_id: str, *, ended: bool = False) -> bool:
    """Whether the approval's latest run is recorded as failed (`ended`: recorded at all): the tool
    raised an exception its row declares definite (any type the application defines), no bug of ours."""
    try:
        runs = gate.store.executions(approval_id=approval_id)
    except Exception:  # the store cannot say: the exception is reported as it is
        return False
    return bool(runs) and (ended or runs[-1].status == "failed")


class Interrupted(CommandError):
    """Ctrl-C while `approve` held a grant it had not shown or spent; exit 130 (128 + SIGINT)."""

    exit_code = 130


@contextmanager
def given_back(gate: EffectGate, decision: object) -> Iterator[None]:
    """Gives back (a sealed release) the grant just minted when the command is interrupted, or its
    reader goes away, before its token was shown or presented: else the approval stays approved
    with a grant no one holds until it lapses. `approve` then grants it again (a new round)."""
    try:
        yield
        sys.stdout.flush()  # the token reached the reader, or the pipe is broken here
    except (KeyboardInterrupt, BrokenPipeError) as exc:
        token = getattr(decision, "token", None)
        if not isinstance(token, str):
            raise
        try:
            gate.release(token)
            void = "it was given back (void; nothing ran): approve it again"
        except TokenError:  # presented: its run started, and ended (recorded) or was cut short
            void = (
                "its run ended: `effectgate show ID` says how"
                if _run_failed(gate, getattr(decision, "approval_id", ""), ended=True)
                else "its run was cut short, its outcome unknown: the application's `gate.recover()` "
                "takes it to reconciliation once its lease lapses (it never runs twice)"
            )
        except Exception as lost:  # the store is gone: the grant lapses at its expiry
            void = f"its grant could not be given back ({describe(lost)}): it lapses at its expiry"
        if isinstance(exc, BrokenPipeError):
            raise
        what = f"{getattr(decision, 'approval_id', '')} v{getattr(decision, 'version', '')}"
        raise Interrupted(f"interrupted after approving {what}; {void}") from None


class StoreUnavailable(CommandError):
    """The database cannot be used: unparseable URL, unreachable server, unreadable file; exit 5."""

    exit_code = EXIT_UNAVAILABLE


def check_listen(host: str, port: int) -> None:
    """Refuse a port outside 1-65535 (a usage error) or an address this process cannot listen on
    (in use, not permitted, not a local address: exit 5), before the server says it is serving.
    The probe binds as uvicorn does (SO_REUSEADDR) and closes at once."""
    if not 1 <= port <= 65535:
        raise UsageError(f"--port {port}: a port is a number from 1 to 65535")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except (socket.gaierror, UnicodeError) as exc:
        raise UsageError(f"--host {host}: not an address this machine has ({exc})") from exc
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            raise StoreUnavailable(
                f"cannot listen on {host}:{port}: {exc.strerror or exc}; choose another --port"
            ) from exc


# -- text


def _masked(url: str) -> str:
    """`url` with everything from the user's `:` to the last `@` hidden: a password may hold `/`
    or an unescaped `@` (which SQLAlchemy takes as the end of the password); and its query's."""
    return hidden(re.sub(r"(://[^/@:]*:).*@", r"\1***@", url))


_QUERY_SECRET = re.compile(r"(?i)(\w*password=)[^&\s]*")


def hidden(text: str) -> str:
    """`text` with the value of every `password=` (or `sslpassword=`) hidden: libpq reads a
    password from a URL's query, and SQLAlchemy's `hide_password` hides only the user's."""
    return _QUERY_SECRET.sub(r"\1***", text)


def _where(parsed: sa.engine.URL) -> str:
    """The database URL as printed: no password anywhere."""
    return hidden(parsed.render_as_string(hide_password=True))


_HOST = re.compile(r"[A-Za-z0-9._%:,-]*")  # names, IPv4, IPv6 (zone ids), host lists


def _parse(url: str) -> sa.engine.URL:
    """The database URL, or StoreUnavailable naming what cannot be parsed (no password shown)."""
    try:
        parsed = sa.engine.make_url(url)
    except (sa.exc.ArgumentError, ValueError) as exc:
        schemed = re.match(r"[A-Za-z][\w+.-]+:", url)  # `sqlite:/x.db` is no path (`C:` may be one)
        fix = "sqlite:///PATH or postgresql+psycopg://..." if schemed else f"sqlite:///{_masked(url)}"
        raise StoreUnavailable(f"cannot parse the database URL {_masked(url)!r}: {exc}; give {fix}") from exc
    where = _where(parsed)
    if parsed.host is not None and "@" in parsed.host:  # the rest of a password with an `@` in it
        raise StoreUnavailable(
            f"cannot parse the database URL {_masked(url)!r}: escape @ in a password as %40"
        )
    if parsed.host is not None and not _HOST.fullmatch(parsed.host):
        raise StoreUnavailable(
            f"cannot parse the database URL {where!r}: {parsed.host!r} is not a host name or address"
        )
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise StoreUnavailable(
            f"unsupported database URL {where!r}: use sqlite:///PATH or postgresql+psycopg://..."
        )
    return parsed


def _sqlite_file(parsed: sa.engine.URL) -> Path | None:
    file = sqlite_file(parsed)  # None in memory; the path of a URI form (`file:PATH?uri=true`)
    return None if file is None else Path(file)


def keyring_for(url: str, *, create: bool = True) -> Keyring:
    """`effectgate.tokens.keyring_for`, with a missing keyring as a usage error (exit 2)."""
    try:
        return _keyring_for(url, create=create)
    except MissingKeyring as exc:
        raise UsageError(str(exc)) from exc


def _first_line(exc: BaseException) -> str:
    """The driver's message without its hints and SQL (psycopg adds lines; SQLAlchemy a link)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


_UNREACHABLE = re.compile(r"refused|resolve|timeout|timed out|no route|unreachable|no such file", re.I)


def _open(url: str) -> SQLStore:
    """The store at `url`, checked: NotFound for a missing SQLite file, StoreUnavailable for a URL,
    server or file that cannot be used, StoreError for a missing schema or another version."""
    parsed = _parse(url)
    where = _where(parsed)
    path = _sqlite_file(parsed)
    if path is not None and not path.exists():
        cwd = "" if path.is_absolute() else f" ({Path.cwd() / path})"  # read from this directory
        setup = f"effectgate --db {shlex.quote(_masked(url))} setup"
        raise NotFound(
            f"no database at {path}{cwd}: create it with `{setup}`, "
            "or give --db (or $EFFECTGATE_DB) the URL of an existing one"
        )
    store = open_store(url)
    try:
        store.check()
    except sa.exc.DBAPIError as exc:
        store.close()
        detail = _first_line(exc.orig or exc)
        if path is not None:
            raise StoreUnavailable(f"cannot read the SQLite database {path}: {detail}") from exc
        if _UNREACHABLE.search(detail):
            raise StoreUnavailable(f"the database server for {where} is unreachable: {detail}") from exc
        raise StoreUnavailable(f"cannot use the database at {where}: {detail}") from exc
    except BaseException:
        store.close()
        raise
    return store


def _make_gate(
    args: argparse.Namespace, store: SQLStore, *, need_app: bool, approval: str | None = None
) -> EffectGate:
    from ._app import EffectGate, load_app, same_database

    if args.app:
        factory = load_app(args.app)
        keyring = keyring_for(args.db, create=False)
        try:
            gate = factory(store, keyring=keyring)
        except TypeError as exc:
            raise UsageError(f"--app {args.app} must be factory(store, *, keyring): {exc}") from exc
        except EffectGateError:
            raise
        except Exception as exc:  # the app's own set-up failed (its table, its config): not ours
            raise UsageError(f"--app {args.app} failed: {describe(exc)}") from exc
        if not isinstance(gate, EffectGate):
            raise UsageError(f"--app {args.app} returned {type(gate).__name__}, not an EffectGate")
        if not same_database(gate.store, store):  # e.g. an adapter's own gate, returned as it is
            gate.close()
            raise UsageError(
                f"--app {args.app} returned a gate over another database than --db {_masked(args.db)}: "
                "build it over the store it is given, EffectGate(table, store, keyring=keyring)"
            )
        return gate
    if need_app:
        raise UsageError(
            f"{args.command} re-runs the table's checks: pass --app module:factory (or EFFECTGATE_APP)"
        )
    # Without --app: the stored records alone (seals are verified with the database's keyring),
    # and to decide `approval`, the policy recorded with it (as `pending_cards` lists it).
    keyring = keyring_for(args.db, create=False)
    policy = recorded_policy(store, keyring, approval) if approval is not None else None
    return EffectGate(EffectTable(), store, policy=policy or Policy(), keyring=keyring)


def recorded_policy(store: SQLStore, keyring: Keyring, approval_id: str) -> Policy | None:
    """The policy recorded with the approval (None for none, or one the gate never wrote)."""
    row = store.get_approval(approval_id)
    return Rules(store.rules(), keyring).policy(row.policy_fingerprint) if row is not None else None


@contextmanager
def _gate(
    args: argparse.Namespace, *, need_app: bool = False, approval: str | None = None
) -> Iterator[EffectGate]:
    with _open(args.db) as store:
        gate = _make_gate(args, store, need_app=need_app, approval=approval)
        try:
            yield gate
        except PolicyViolation as exc:  # a row "changed" only by its module's name: say so
            from ._moved import moved

            if exc.code == "reclassified" and approval and (hint := moved(gate, approval)):
                raise PolicyViolation(f"{exc}; {hint}", code=exc.code) from exc
            raise
        finally:
            gate.close()


def pending_cards(gate: EffectGate, role: str | None, session: str | None, *, app: str | None) -> list[Card]:
    """The pending cards, of `session`, that `role` may decide: without --app the gate's policy is
    empty (it grants no role another's), so by the policy recorded with each approval."""
    cards = gate.pending(role=role if app else None, session_id=session)
    if role is None or app:
        return cards
    rules = Rules(gate.store.rules(), gate.keyring)

    def may(card: Card) -> bool:
        row = gate.store.get_approval(card.approval_id)
        # None for a recorded policy the gate never wrote (edited in): `Rules.policy`
        policy = rules.policy(row.policy_fingerprint) if row is not None else None
        return (policy or gate.policy).role_satisfies(role, card.approver_role)

    return [c for c in cards if may(c)]


# -- output


def _failure(exc: Exception, url: str) -> tuple[int, str]:
    """The exit code and the one-line message for a failed command (the module docstring's table)."""
    if isinstance(exc, CommandError):
        return exc.exit_code, str(exc)
    if isinstance(exc, UnknownApproval):
        return EXIT_NOT_FOUND, str(exc)
    refused = ApprovalError | PolicyViolation | TokenError | IdempotencyError | ExportError | RedactionError
    if isinstance(exc, refused | ChainError):  # ChainError: the export's seal refused the ledger
        return EXIT_REFUSED, str(exc)
    if isinstance(exc, StoreError | MissingDependency):
        return EXIT_UNAVAILABLE, str(exc)
    if isinstance(exc, sa.exc.StatementError) and isinstance(exc.orig, UnicodeError):
        # a value given (an id from argv with a non-UTF-8 byte) that no database can hold: bad input
        return EXIT_USAGE, f"{exc.orig}: give the value as UTF-8 text (nothing was changed)"
    if isinstance(exc, sa.exc.SQLAlchemyError | sqlite3.Error):  # sqlite3's own: a row fetched
        return EXIT_UNAVAILABLE, f"database {_masked(url)}: {_first_line(getattr(exc, 'orig', None) or exc)}"
    if isinstance(exc, EffectGateError | ValueError | OSError):
        return EXIT_USAGE, str(exc)
    if isinstance(exc, LookupError):
        return EXIT_USAGE, str(exc.args[0] if exc.args else exc)
    return EXIT_INTERNAL, (
        f"unexpected {type(exc).__name__}: {exc} (a bug; EFFECTGATE_DEBUG=1 shows the traceback)"
    )
