"""The `effectgate` command: setup, pending, show, approve, deny, audit, export, demo, serve.

`--db URL` everywhere (default: $EFFECTGATE_DB or sqlite:///effectgate.db). Commands that re-run
the table's checks (approve, serve) need the application's gate: `--app module:factory`, where
`factory(store, keyring=...)` returns an EffectGate ($EFFECTGATE_APP). Approvals and decisions are
sealed, and grant tokens signed, with $EFFECTGATE_KEYRING, or for a SQLite file with the
development keyring beside it (DB.keys); the command never invents a keyring for a database that
exists, since a new key verifies nothing stored under the old one.

Every value that came from a model or from the database is printed as text: never read as rich
markup or emoji codes, and with every character that renders as nothing, reorders the line or
drives the terminal (bidirectional controls, zero-width and control characters) written as an
escape such as \\u202e. `pending` shortens each argument to a fixed width and says what it hid;
`show` prints every argument whole. Off a terminal (a pipe, a file, a CI log) nothing is wrapped.

Exit codes (a failure prints one line, `effectgate: error: ...`, on stderr, never a traceback):

    0   ok
    1   audit findings: `audit` found a divergence (or the demo failed one of its checks)
    2   usage error: bad arguments or options, a bad --app, no usable keyring
    3   not found: no approval with that id, no database file at that path
    4   refused: the gate refused the decision and recorded none (stale version, wrong role or
        approver, expired, already decided, confirm check failed, tampered record, policy
        violation, token error)
    5   store unavailable: the server is unreachable, the database file is corrupt, the URL cannot
        be parsed, the database has no effectgate schema or another schema version, or its
        driver is not installed
    70  internal error: an unexpected exception (a bug); EFFECTGATE_DEBUG=1 shows the traceback
"""

from __future__ import annotations

import argparse
import importlib
import io
import json
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, NoReturn

import sqlalchemy as sa
from rich.console import Console
from rich.text import Text

from ._clock import SYSTEM_CLOCK
from ._display import remaining, when
from ._textcheck import hidden
from .audit import audit, export_jsonl
from .context import Approver
from .effects import Policy
from .errors import (
    ApprovalError,
    EffectGateError,
    IdempotencyError,
    MissingDependency,
    PolicyViolation,
    StoreError,
    TokenError,
    UnknownApproval,
)
from .gate import EffectGate
from .outcomes import Card, Grant, PartialApproval
from .stores.records import SCHEMA_VERSION
from .stores.sql import SQLStore, open_store
from .table import EffectTable
from .tokens import Keyring

DEFAULT_DB = "sqlite:///effectgate.db"

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_NOT_FOUND, EXIT_REFUSED, EXIT_UNAVAILABLE = 0, 1, 2, 3, 4, 5
EXIT_INTERNAL = 70

ARG_WIDTH = 60  # characters of one argument value in the `pending` list
LISTED_ARGS = 8  # arguments listed per approval in `pending`; the rest are counted
_PIPE_WIDTH = 100_000  # off a terminal: as wide as the content (a line is never folded)


class CommandError(Exception):
    """A failure reported in one line; `exit_code` says which kind (see the module docstring)."""

    exit_code = EXIT_USAGE


class UsageError(CommandError):
    """Bad command-line input: arguments, options, --app, keyring; exit 2."""


class NotFound(CommandError):
    """No database file at the path given; exit 3."""

    exit_code = EXIT_NOT_FOUND


class StoreUnavailable(CommandError):
    """The database cannot be used: unparseable URL, unreachable server, unreadable file; exit 5."""

    exit_code = EXIT_UNAVAILABLE


# -- text


def _escaped(ch: str) -> str:
    return f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else f"\\U{ord(ch):08x}"


def _escape(text: str, *, newlines: bool = False) -> str:
    """`text` with every character that is invisible, reorders the line or drives the terminal
    written as an escape (\\u202e), so what is printed is what is stored. `newlines`: keep line
    breaks (only for text this module laid out, such as indented JSON)."""
    if text.isascii() and text.isprintable():
        return text
    return "".join(
        ch if (ch.isprintable() and not hidden(ch)) or (newlines and ch == "\n") else _escaped(ch)
        for ch in text
    )


def _text(value: object, style: str = "") -> Text:
    """Stored or model text as a rich Text: never parsed as markup, and with its line breaks
    escaped, so one value cannot pass for another line of the output."""
    return Text(_escape(str(value)), style=style)


def _one_line(message: object) -> str:
    return _escape(" ".join(str(message).split()))


def _compact(value: Any) -> str:
    return _escape(json.dumps(value, ensure_ascii=False, sort_keys=True))


def _pretty(value: Any) -> str:
    return _escape(json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True), newlines=True)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else f"{text[:width]}… (+{len(text) - width} chars)"


def _short(value: Any, width: int = ARG_WIDTH) -> str:
    """`value` as compact JSON in about `width` characters: a long list or object shows the
    items that fit and how many more there are; anything else is cut, with the count of hidden
    characters."""
    text = _compact(value)
    if len(text) <= width or not isinstance(value, list | dict) or not value:
        return _cut(text, width)
    pieces: Iterator[str]
    if isinstance(value, list):
        pieces, noun, (first, last) = (_compact(v) for v in value), "item", "[]"
    else:
        pieces = (f"{_compact(k)}: {_compact(v)}" for k, v in sorted(value.items()))
        noun, (first, last) = "key", "{}"
    shown: list[str] = []
    used = 2
    for piece in pieces:
        if used + len(piece) > width:
            break
        shown.append(piece)
        used += len(piece) + 2
    if not shown:
        return _cut(text, width)
    hidden = len(value) - len(shown)
    noun += "" if hidden == 1 else "s"
    return f"{first}{', '.join(shown)}, … (+{hidden} more {noun}){last}"


def _fields(values: Mapping[str, Any]) -> list[str]:
    """One `name: value` line per argument, each value shortened; at most LISTED_ARGS lines."""
    items = sorted(values.items())
    lines = [f"{_cut(_escape(name), 24)}: {_short(v)}" for name, v in items[:LISTED_ARGS]]
    if len(items) > LISTED_ARGS:
        lines.append(f"… (+{len(items) - LISTED_ARGS} more arguments)")
    return lines


# -- the database, the keyring and the gate


def _masked(url: str) -> str:
    return re.sub(r"(://[^/@:]*:)[^@/]*@", r"\1***@", url)


_HOST = re.compile(r"[A-Za-z0-9._%:,-]*")  # names, IPv4, IPv6 (zone ids), host lists


def _parse(url: str) -> sa.engine.URL:
    """The database URL, or StoreUnavailable naming what cannot be parsed (no password shown)."""
    try:
        parsed = sa.engine.make_url(url)
    except (sa.exc.ArgumentError, ValueError) as exc:
        raise StoreUnavailable(f"cannot parse the database URL {_masked(url)!r}: {exc}") from exc
    where = parsed.render_as_string(hide_password=True)
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
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        return Path(str(parsed.database))
    return None


def keyring_for(url: str, *, create: bool = True) -> Keyring:
    """$EFFECTGATE_KEYRING, else the development keyring file next to a SQLite database (DB.keys),
    created when missing only if `create`. UsageError when there is none to use."""
    ring = Keyring.from_env()
    if ring is not None:
        return ring
    path = _sqlite_file(_parse(url))
    if path is None:
        raise UsageError("set EFFECTGATE_KEYRING (kid:hexsecret) for a non-file database")
    keys = Path(f"{path}.keys")
    if not create and not keys.exists():
        raise UsageError(
            f"no keyring for {path}: set EFFECTGATE_KEYRING (kid:hexsecret), or keep the key file "
            f"{keys} beside the database (a new key would verify nothing stored under the old one)"
        )
    return Keyring.load_or_create(keys)


def _first_line(exc: BaseException) -> str:
    """The driver's message without its hints and SQL (psycopg adds lines; SQLAlchemy a link)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


_UNREACHABLE = re.compile(r"refused|resolve|timeout|timed out|no route|unreachable|no such file", re.I)


def _open(url: str) -> SQLStore:
    """The store at `url`, checked: NotFound for a missing SQLite file, StoreUnavailable for a URL,
    server or file that cannot be used, StoreError for a missing schema or another version."""
    parsed = _parse(url)
    where = parsed.render_as_string(hide_password=True)
    path = _sqlite_file(parsed)
    if path is not None and not path.exists():
        raise NotFound(f"no database at {path}")
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


def _load_app(ref: str) -> Callable[..., EffectGate]:
    module, sep, attr = ref.partition(":")
    if not sep:
        raise UsageError(f"--app takes module:factory, got {ref!r}")
    try:
        factory = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"cannot load --app {ref}: {exc}") from exc
    if not callable(factory):
        raise UsageError(f"--app {ref} is not callable")
    return factory  # type: ignore[no-any-return]


def _make_gate(args: argparse.Namespace, store: SQLStore, *, need_app: bool) -> EffectGate:
    if args.app:
        factory = _load_app(args.app)
        keyring = keyring_for(args.db, create=False)
        try:
            gate = factory(store, keyring=keyring)
        except TypeError as exc:
            raise UsageError(f"--app {args.app} must be factory(store, *, keyring): {exc}") from exc
        if not isinstance(gate, EffectGate):
            raise UsageError(f"--app {args.app} returned {type(gate).__name__}, not an EffectGate")
        return gate
    if need_app:
        raise UsageError(
            f"{args.command} re-runs the table's checks: pass --app module:factory (or EFFECTGATE_APP)"
        )
    # Without --app: the stored records alone (seals are verified with the database's keyring).
    return EffectGate(EffectTable(), store, policy=Policy(), keyring=keyring_for(args.db, create=False))


@contextmanager
def _gate(args: argparse.Namespace, *, need_app: bool = False) -> Iterator[EffectGate]:
    with _open(args.db) as store:
        gate = _make_gate(args, store, need_app=need_app)
        try:
            yield gate
        finally:
            gate.close()


# -- output


class _Console(Console):
    def on_broken_pipe(self) -> None:
        # rich would exit 1 (in our table: audit findings); `main` stops quietly instead.
        raise BrokenPipeError


def _console(*, demo: bool = False) -> Console:
    """Rich output for people: no markup, emoji codes or highlighting, and off a terminal nothing
    is wrapped (lines are as long as their content, so a pipe, grep or a CI log sees whole values).
    The demo prints its own styled script (markup on) at the terminal's or the pipe's width."""
    if demo:
        return _Console(highlight=False, emoji=False)
    options: dict[str, Any] = {"highlight": False, "emoji": False, "markup": False}
    console = _Console(**options)
    return console if console.is_terminal else _Console(width=_PIPE_WIDTH, **options)


def _write_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=True) + "\n")


def _card_panel(card: Card, *, now: float | None = None) -> Text:
    """The whole card as `key  value` lines: every argument in full, the expiry with its
    countdown, the warnings first, the reason. No box and no padding, so a pipe gets each value
    once at its own length (the demos print it too)."""
    now = SYSTEM_CLOCK.now() if now is None else now
    rows: list[tuple[str, str, str]] = [
        *(("WARNING", _escape(w), "bold red") for w in card.warnings),
        ("tool", _escape(f"{card.tool}  ({card.effect}, {card.reversibility})"), ""),
        ("status", _escape(f"{card.status}, version {card.version}"), ""),
        ("approver role", _escape(card.approver_role), ""),
        ("approvals", f"{card.approvals_given} of {card.approvals_required}", ""),
        ("subject", _pretty(dict(card.subject)) if card.subject else "-", ""),
        ("arguments", _pretty(dict(card.args)), ""),
        ("args sha256", _escape(card.args_hash), ""),
        ("session / user", _escape(f"{card.session_id} / {card.user_id}"), ""),
        ("owner", _escape(card.owner or "-"), ""),
        ("created", when(card.created_at), ""),
        ("expires", f"{when(card.expires_at)} ({remaining(card.expires_at - now)})", ""),
        *(("note", _escape(n), "") for n in card.notes),
        *((("reason", _escape(card.reason), ""),) if card.reason else ()),
    ]
    view = Text(_escape(f"approval {card.approval_id}"), style="bold red" if card.warnings else "bold")
    for key, value, style in rows:
        for i, line in enumerate(value.split("\n")):
            view.append(f"\n  {key if i == 0 else '':<15} ", style="bold")
            view.append(line, style=style)
    return view


def _pending_entry(card: Card, now: float) -> Text:
    """One approval in the `pending` list: a heading line (the whole id, which `approve` needs),
    then each argument, shortened, on its own indented line."""
    entry = Text.assemble(
        (_escape(card.approval_id), "bold"),
        _text(
            f"  v{card.version}  {card.tool}  role {card.approver_role}  "
            f"{card.approvals_given}/{card.approvals_required} approvals  "
            f"expires {remaining(card.expires_at - now)}"
        ),
    )
    if card.warnings:
        entry.append(f"  ! {len(card.warnings)} warning(s): see show", "bold red")
    for line in _fields(card.args):
        entry.append("\n    " + line)
    return entry


# -- commands


def _cmd_setup(args: argparse.Namespace, out: Console) -> int:
    parsed = _parse(args.db)
    with open_store(args.db) as store:
        store.setup()
    out.print(
        _text(f"effectgate schema {SCHEMA_VERSION} ready at {parsed.render_as_string(hide_password=True)}")
    )
    return EXIT_OK


def _cmd_pending(args: argparse.Namespace, out: Console) -> int:
    with _gate(args) as gate:
        cards = gate.pending(role=args.role, session_id=args.session)
        now = gate.clock.now()
    if args.json:
        _write_json([c.to_dict() for c in cards])
        return EXIT_OK
    out.print(Text(f"{len(cards)} pending approval(s)"))
    for card in cards:
        out.print(_pending_entry(card, now))
    flagged = sum(1 for c in cards if c.warnings)
    if flagged:
        out.print(
            Text(f"! {flagged} approval(s) carry warnings: read them with `effectgate show ID`", "bold red")
        )
    return EXIT_OK


def _cmd_show(args: argparse.Namespace, out: Console) -> int:
    with _gate(args) as gate:
        card = gate.card(args.id)
        now = gate.clock.now()
    if args.json:
        _write_json(card.to_dict())
    else:
        out.print(_card_panel(card, now=now))
    return EXIT_OK


def _cmd_approve(args: argparse.Namespace, out: Console) -> int:
    with _gate(args, need_app=True) as gate:
        decision = gate.approve(args.id, version=args.version, approver=Approver(args.approver, args.role))
        now = gate.clock.now()
    if args.json:
        kind = "grant" if isinstance(decision, Grant) else "partial_approval"
        extra = {"message": decision.message} if isinstance(decision, PartialApproval) else {}
        _write_json({"kind": kind, **asdict(decision), **extra})
    elif isinstance(decision, Grant):
        expires = f"{when(decision.expires_at)}, {remaining(decision.expires_at - now)}"
        out.print(
            _text(
                f"approved {decision.approval_id} v{decision.version}; "
                f"grant token (single use, expires {expires}):"
            )
        )
        print(decision.token)
    else:
        out.print(_text(f"recorded: {decision.message}"))
    return EXIT_OK


def _cmd_deny(args: argparse.Namespace, out: Console) -> int:
    with _gate(args) as gate:
        refused = gate.deny(
            args.id, approver=Approver(args.approver, args.role), reason=args.reason, version=args.version
        )
    if args.json:
        _write_json({"kind": "refused", **asdict(refused)})
    else:
        out.print(_text(f"denied {args.id}: {args.reason}"))
    return EXIT_OK


def _cmd_audit(args: argparse.Namespace, out: Console) -> int:
    with _gate(args) as gate:
        report = audit(gate.store, gate.table if args.app else None, keyring=gate.keyring)
    if args.json:
        _write_json(report.to_dict())
        return EXIT_OK if report.clean else EXIT_FINDINGS
    for f in report.findings:
        where = f"approval={f.approval_id} execution={f.execution_id}"
        out.print(Text.assemble((_escape(f.kind), "bold red"), " ", _text(f"{f.tool} {where}: {f.detail}")))
    m = report.metrics
    assert m is not None
    p95 = "-" if m.approval_latency_p95_s is None else f"{m.approval_latency_p95_s:.1f}s"
    out.print(
        _text(
            f"{'clean' if report.clean else 'DIVERGED'}: {len(report.findings)} finding(s); "
            f"{'seals verified' if report.seals_checked else 'seals NOT verified'}; "
            f"{m.executions} executions, {m.approved} approved, {m.denied} denied, "
            f"{m.replays_absorbed} replays absorbed, p95 approval latency {p95}, "
            f"{m.gated_proposals_per_1000_sessions:.0f} gated proposals per 1,000 sessions"
        )
    )
    return EXIT_OK if report.clean else EXIT_FINDINGS


def _cmd_export(args: argparse.Namespace, out: Console) -> int:
    if not args.jsonl:
        raise UsageError("export needs --jsonl (the only format)")
    with _open(args.db) as store:
        lines = list(export_jsonl(store))
    if args.out:
        Path(args.out).write_text("".join(line + "\n" for line in lines))
        out.print(_text(f"wrote {len(lines)} records to {args.out}"))
    else:
        sys.stdout.write("".join(line + "\n" for line in lines))
    return EXIT_OK


def _cmd_serve(args: argparse.Namespace, out: Console) -> int:
    try:
        import uvicorn

        from .web import ApproverRegistry, create_app
    except ImportError as exc:
        raise UsageError(f'the inbox needs the web extra ({exc}): pip install "effectgate[web]"') from exc
    if not args.approvers:
        raise UsageError("serve needs --approvers FILE (approvers are registered server-side)")
    try:
        approvers = ApproverRegistry.from_toml(args.approvers)
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read --approvers {args.approvers}: {exc}") from exc
    if not len(approvers):
        raise UsageError(f"{args.approvers} registers no approver")
    store = _open(args.db)
    gate = _make_gate(args, store, need_app=True)

    def execute(grant: Any) -> Any:
        return gate.execute(grant.token)

    app = create_app(
        gate,
        approvers,
        secret_key=os.environ.get("EFFECTGATE_WEB_SECRET"),
        on_grant=execute if args.execute else None,
        sso_header=args.sso_header,
        https_only=args.https_only,
    )
    where = _parse(args.db).render_as_string(hide_password=True)
    out.print(
        _text(f"effectgate inbox on http://{args.host}:{args.port}/ ({len(approvers)} approvers; {where})")
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return EXIT_OK


def _cmd_hash_secret(args: argparse.Namespace, out: Console) -> int:
    import getpass

    from .web._auth import hash_secret

    secret = sys.stdin.readline().rstrip("\n") if not sys.stdin.isatty() else getpass.getpass("secret: ")
    if not secret:
        raise UsageError("an empty secret")
    print(hash_secret(secret))
    return EXIT_OK


_DEMOS = {"core": ("effectgate._demo", None), "langgraph": ("effectgate_langgraph.demo", "langgraph")}


def _cmd_demo(args: argparse.Namespace, out: Console) -> int:
    module_name, extra = _DEMOS[args.framework]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if extra is None:
            raise
        raise UsageError(
            f"the {args.framework} demo needs its adapter ({exc.name} is not installed): "
            f"pip install 'effectgate[{extra}]'"
        ) from exc
    default = "sqlite:///effectgate-demo.db" if extra is None else f"sqlite:///effectgate-demo-{extra}.db"
    run_demo: Callable[[str, Console], int] = module.run_demo
    return run_demo(args.db if args.db_given else default, out)


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad command line as one `effectgate: error:` line (exit 2)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _parser() -> argparse.ArgumentParser:
    def options(default: Any, app_default: Any) -> _Parser:
        shared = _Parser(add_help=False)
        shared.add_argument(
            "--db", default=default, help=f"database URL (default $EFFECTGATE_DB or {DEFAULT_DB})"
        )
        shared.add_argument("--app", default=app_default, help="module:factory returning an EffectGate")
        return shared

    # Two copies of the options: argparse shares action objects between parents, and the
    # subcommands' copy must default to SUPPRESS so that an unset option does not overwrite
    # one given before the subcommand.
    common = options(argparse.SUPPRESS, argparse.SUPPRESS)
    top = options(None, os.environ.get("EFFECTGATE_APP"))
    parser = _Parser(
        prog="effectgate",
        description=__doc__.split("\n")[0],
        epilog="exit codes: 0 ok, 1 audit findings, 2 usage error, 3 not found, 4 refused, "
        "5 store unavailable, 70 internal error",
        parents=[top],
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("setup", parents=[common], help="create the effectgate schema (or check its version)")
    p = sub.add_parser("pending", parents=[common], help="list approvals waiting for a decision")
    p.add_argument("--role")
    p.add_argument("--session")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("show", parents=[common], help="show one approval's card, every argument whole")
    p.add_argument("id")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("approve", parents=[common], help="approve one version; prints the grant token")
    p.add_argument("id")
    p.add_argument("--version", type=int, required=True)
    p.add_argument("--as", dest="role", required=True, help="the approver's role")
    p.add_argument("--approver", required=True, help="the approver's id")
    p.add_argument("--json", action="store_true", help="the grant or partial approval as JSON")
    p = sub.add_parser("deny", parents=[common], help="deny an approval with a reason")
    p.add_argument("id")
    p.add_argument("--reason", required=True)
    p.add_argument("--as", dest="role", required=True)
    p.add_argument("--approver", required=True)
    p.add_argument("--version", type=int)
    p.add_argument("--json", action="store_true", help="the refusal as JSON")
    p = sub.add_parser("audit", parents=[common], help="scan the ledger, seals verified; exit 1 on findings")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("export", parents=[common], help="export every record")
    p.add_argument("--jsonl", action="store_true")
    p.add_argument("--out")
    p = sub.add_parser("serve", parents=[common], help="the reviewer inbox (web), on 127.0.0.1")
    p.add_argument("--approvers", help="TOML file of [[approver]] id, role, secret (effectgate hash-secret)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--execute", action="store_true", help="execute approved calls at once")
    p.add_argument("--sso-header", help="trust this header from a proxy as the approver id")
    p.add_argument("--https-only", action="store_true", help="mark the session cookie Secure")
    sub.add_parser("hash-secret", help="read a secret on stdin; print its scrypt hash for --approvers")
    p = sub.add_parser("demo", parents=[common], help="run the shop demo (ten conversations)")
    p.add_argument(
        "--framework",
        choices=sorted(_DEMOS),
        default="core",
        help="core: the gate alone; langgraph: the same shop on a LangGraph graph",
    )
    return parser


_COMMANDS: dict[str, Callable[[argparse.Namespace, Console], int]] = {
    "setup": _cmd_setup,
    "pending": _cmd_pending,
    "show": _cmd_show,
    "approve": _cmd_approve,
    "deny": _cmd_deny,
    "audit": _cmd_audit,
    "export": _cmd_export,
    "demo": _cmd_demo,
    "serve": _cmd_serve,
    "hash-secret": _cmd_hash_secret,
}


def _failure(exc: Exception, url: str) -> tuple[int, str]:
    """The exit code and the one-line message for a failed command (the module docstring's table)."""
    if isinstance(exc, CommandError):
        return exc.exit_code, str(exc)
    if isinstance(exc, UnknownApproval):
        return EXIT_NOT_FOUND, str(exc)
    if isinstance(exc, ApprovalError | PolicyViolation | TokenError | IdempotencyError):
        return EXIT_REFUSED, str(exc)
    if isinstance(exc, StoreError | MissingDependency):
        return EXIT_UNAVAILABLE, str(exc)
    if isinstance(exc, sa.exc.SQLAlchemyError):
        return EXIT_UNAVAILABLE, f"database {_masked(url)}: {_first_line(getattr(exc, 'orig', None) or exc)}"
    if isinstance(exc, EffectGateError | ValueError | OSError):
        return EXIT_USAGE, str(exc)
    if isinstance(exc, LookupError):
        return EXIT_USAGE, str(exc.args[0] if exc.args else exc)
    return EXIT_INTERNAL, (
        f"unexpected {type(exc).__name__}: {exc} (a bug; EFFECTGATE_DEBUG=1 shows the traceback)"
    )


def _tolerant_output() -> None:
    """Model text the terminal's encoding cannot carry is written as escapes, never a crash."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns its exit code (see the module docstring)."""
    _tolerant_output()
    url = os.environ.get("EFFECTGATE_DB") or DEFAULT_DB
    try:
        try:
            args = _parser().parse_args(argv)
        except SystemExit as exc:  # --help, printed by argparse
            return EXIT_USAGE if exc.code else EXIT_OK
        args.db_given = args.db is not None
        args.db = url = args.db or url
        out = _console(demo=args.command == "demo")
        code = _COMMANDS[args.command](args, out)
        sys.stdout.flush()  # a reader that went away fails here, inside main, not at exit
        return code
    except BrokenPipeError:  # `effectgate show ID | head`: the rest was not wanted; stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except Exception as exc:
        if os.environ.get("EFFECTGATE_DEBUG"):
            raise
        code, message = _failure(exc, url)
        print(f"effectgate: error: {_one_line(message)}", file=sys.stderr)
        return code


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
