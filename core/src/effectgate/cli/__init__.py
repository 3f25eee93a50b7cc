"""The `effectgate` command: setup, pending, show, approve, deny, audit, export, verify, report,
replay, redact, retain, hold, seal-rules, demo, serve.

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
    1   audit findings: `audit` found a divergence, `verify` found a broken export, `replay` found
        an intent the current table would refuse or route differently (or the demo failed one of
        its checks)
    2   usage error: bad arguments or options, a bad --app, no usable keyring
    3   not found: no approval with that id, no database (or manifest, export) file at that path
    4   refused: the gate refused the decision and recorded none (stale version, wrong role or
        approver, expired, already decided, confirm check failed, tampered record, policy
        violation, token error), `export` refused (audit findings, a foreign manifest),
        `redact`/`retain`/`hold` refused (a held user, a call still open, no such hold), or
        `approve --execute` recorded the approval and the gate refused to start its run (a tool
        this process cannot run): nothing ran, and the unspent grant token is printed
    5   store unavailable: the server is unreachable, the database file is corrupt, the URL cannot
        be parsed, the database has no effectgate schema or another schema version, or its
        driver is not installed
    6   approved, then the run failed: `approve --execute` recorded the approval, and its run
        then failed or its outcome is unknown (`effectgate show ID` says which); a store that
        became unavailable is still 5, and a bug 70
    70  internal error: an unexpected exception (a bug); EFFECTGATE_DEBUG=1 shows the traceback
    130 interrupted (Ctrl-C); an `approve` whose grant token was not yet shown or presented gives
        the grant back, so the call can be approved again
    141 the reader of the output went away (`effectgate audit | head -1`) before `audit`, `verify`,
        `replay` or `demo` reached its verdict; one reached is still its exit code (1 on findings)
"""

from __future__ import annotations

import argparse
import gc
import io
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

from rich.console import Console

from .. import __version__
from ..canonical import _SURROGATE
from . import _governance, _mcp
from ._args import allowed_host, file_name, moment, seconds, target, trusted_proxy
from ._audit import _cmd_audit
from ._commands import (
    _DEMOS,
    _cmd_approve,
    _cmd_demo,
    _cmd_deny,
    _cmd_export,
    _cmd_hash_secret,
    _cmd_pending,
    _cmd_replay,
    _cmd_serve,
    _cmd_setup,
    _cmd_show,
    _cmd_verify,
)
from ._render import (
    DEFAULT_DB,
    EXIT_BROKEN_PIPE,
    EXIT_OK,
    EXIT_USAGE,
    _card_panel,
    _console,
    _escape,
    _one_line,
    _short,
)
from ._report import _cmd_report
from ._store import UsageError, _failure, hidden, keyring_for

__all__ = ["_card_panel", "_short", "keyring_for", "main"]


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad command line as one `effectgate: error:` line (exit 2)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _parser() -> argparse.ArgumentParser:
    def options(
        default: Any, app_default: Any, db: str = f"$EFFECTGATE_DB or {DEFAULT_DB}", app: bool = True
    ) -> _Parser:
        shared = _Parser(add_help=False)
        shared.add_argument("--db", default=default, help=f"database URL (default {db})")
        if app:  # the demo runs the shop's own table: an --app given to it is refused, not ignored
            shared.add_argument("--app", default=app_default, help="module:factory returning an EffectGate")
        return shared

    # Two copies of the options: argparse shares action objects between parents, and the
    # subcommands' copy must default to SUPPRESS so that an unset option does not overwrite
    # one given before the subcommand.
    common = options(argparse.SUPPRESS, argparse.SUPPRESS)
    top = options(None, os.environ.get("EFFECTGATE_APP"))
    parser = _Parser(
        prog="effectgate",
        description=" ".join(__doc__.split("\n\n")[0].split()),
        epilog="environment: EFFECTGATE_DB (the --db default), EFFECTGATE_APP (the --app default), "
        "EFFECTGATE_KEYRING (kid:hexsecret[,...]; else a SQLite file's key file DB.keys), "
        "EFFECTGATE_WEB_SECRET (the inbox's cookie key), EFFECTGATE_SSO_SECRET (the secret the "
        "proxy sends with --sso-header), EFFECTGATE_DEBUG (1, true, yes or on: tracebacks). "
        "exit codes: 0 ok, 1 audit findings, 2 usage error, 3 not found, 4 refused, "
        "5 store unavailable, 6 approved then the run failed, 70 internal error, 130 interrupted, "
        "141 output closed before the verdict",
        parents=[top],
    )
    parser.add_argument("--version", action="version", version=f"effectgate {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("setup", parents=[common], help="create the effectgate schema (or check its version)")
    p.add_argument("--json", action="store_true", help="the database and schema version as JSON")
    p = sub.add_parser("pending", parents=[common], help="list approvals waiting for a decision")
    p.add_argument("--role", help="only the approvals this role may decide")
    p.add_argument("--session", help="only the approvals of this session")
    p.add_argument("--json", action="store_true", help="the cards as JSON")
    p = sub.add_parser("show", parents=[common], help="show one approval's card, every argument whole")
    p.add_argument("id", help="the approval id (as `pending` lists it)")
    p.add_argument("--json", action="store_true", help="the card as JSON")
    p = sub.add_parser("approve", parents=[common], help="approve one version; prints the grant token")
    p.add_argument("id", help="the approval id")
    p.add_argument(
        "--version", type=int, required=True, help="the version you reviewed (a newer one refuses)"
    )
    p.add_argument("--as", dest="role", required=True, help="the approver's role")
    p.add_argument("--approver", required=True, help="the approver's id")
    p.add_argument("--json", action="store_true", help="the grant or partial approval as JSON")
    p.add_argument(
        "--execute",
        action="store_true",
        help="run the call now with the grant (once; the token is spent and not printed)",
    )
    p = sub.add_parser("deny", parents=[common], help="deny an approval with a reason")
    p.add_argument("id", help="the approval id")
    p.add_argument("--reason", required=True, help="why (the model is told)")
    p.add_argument("--as", dest="role", required=True, help="the approver's role")
    p.add_argument("--approver", required=True, help="the approver's id")
    p.add_argument("--version", type=int, help="the version you reviewed (a newer one refuses)")
    p.add_argument("--json", action="store_true", help="the refusal as JSON")
    p = sub.add_parser("audit", parents=[common], help="scan the ledger, seals verified; exit 1 on findings")
    p.add_argument("--json", action="store_true", help="the report as JSON")
    p.add_argument(
        "--chain", action="store_true", help="also recompute the ledger's hash chain (every checkpointed row)"
    )
    p.add_argument(
        "--pinned",
        type=file_name,
        metavar="MANIFEST",
        help="also check the chain still holds the heads this export's manifest pinned (implies --chain)",
    )
    p = sub.add_parser("export", parents=[common], help="the decision records as a signed hash chain")
    p.add_argument(
        "--out",
        type=file_name,
        help="the export file; its signed manifest goes beside it (FILE.manifest.json)",
    )
    p.add_argument(
        "--after",
        type=file_name,
        metavar="MANIFEST",
        help="continue this earlier export's chain: only what is new",
    )
    p.add_argument(
        "--settle", type=seconds, default=60.0, help="leave records newer than this (seconds) for later"
    )
    p.add_argument("--jsonl", action="store_true", help="instead: every row of every table, unsigned")
    p.add_argument("--force", action="store_true", help="replace an existing --out file (and its manifest)")
    p.add_argument("--json", action="store_true", help="the manifest as JSON")
    p = sub.add_parser(
        "verify", parents=[common], help="check an export's chain and manifest; exit 1 if broken"
    )
    p.add_argument("file", help="the export file (FILE.manifest.json beside it)")
    p.add_argument(
        "--after", type=file_name, metavar="MANIFEST", help="the earlier export this file must continue"
    )
    p.add_argument("--json", action="store_true", help="the verdict as JSON")
    p = sub.add_parser(
        "report",
        parents=[common],
        help="disagreement per tool and role, approval latency, replays, gated rates, backlog",
    )
    when = "ISO 8601, UTC unless it names a zone: 2026-12-01, 20261201 or 2026-12-01T09:00; or epoch seconds"
    p.add_argument("--since", type=moment, help=f"calls proposed at or after this time ({when})")
    p.add_argument("--until", type=moment, help=f"calls proposed before this time ({when})")
    p.add_argument(
        "--target",
        type=target,
        action="append",
        metavar="ROLE=SECONDS",
        help="a p95 latency target, per role",
    )
    p.add_argument("--json", action="store_true", help="the rates and figures as JSON")
    p.add_argument(
        "--html",
        type=file_name,
        metavar="FILE",
        help="also write the report with its charts as one static HTML file (the report extra)",
    )
    p = sub.add_parser(
        "replay", parents=[common], help="re-run approved intents against stubs; exit 1 on changes"
    )
    p.add_argument("--json", action="store_true", help="every intent's verdict as JSON")
    p = sub.add_parser("serve", parents=[common], help="the reviewer inbox (web), on 127.0.0.1")
    p.add_argument("--approvers", help="TOML file of [[approver]] id, role, secret (effectgate hash-secret)")
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765, help="the port (default 8765)")
    p.add_argument("--execute", action="store_true", help="execute approved calls at once")
    p.add_argument(
        "--sso-header",
        help="trust this header from a proxy as the approver id, only on requests carrying "
        "$EFFECTGATE_SSO_SECRET in X-Effectgate-Proxy-Secret (required)",
    )
    p.add_argument(
        "--allowed-host",
        type=allowed_host,
        action="append",
        metavar="NAME",
        help="also answer requests for this Host name (e.g. the proxy's); "
        "always: the --host address, localhost, 127.0.0.1, ::1",
    )
    p.add_argument(
        "--trusted-proxy",
        type=trusted_proxy,
        action="append",
        metavar="ADDR",
        help="believe X-Forwarded-For from this proxy address or network (default: from no one)",
    )
    p.add_argument(
        "--https-only",
        action="store_true",
        help="mark the session cookie Secure: set it whenever browsers reach the inbox over HTTPS "
        "(e.g. behind a TLS proxy), or a plain-HTTP request to the same name carries it in clear",
    )
    p.add_argument(
        "--target",
        type=target,
        action="append",
        metavar="ROLE=SECONDS",
        help="a p95 latency target for /metrics, per role",
    )
    p = sub.add_parser("hash-secret", help="read a secret on stdin; print its scrypt hash for --approvers")
    p.add_argument("--json", action="store_true", help='the hash as JSON: {"hash": ...}')
    _mcp.add_parser(sub, common)
    _governance.add_parsers(sub, common)
    demo_db = (
        "sqlite:///effectgate-demo.db; --framework langgraph: effectgate-demo-langgraph.db; "
        "never $EFFECTGATE_DB"
    )
    demo = options(argparse.SUPPRESS, argparse.SUPPRESS, db=demo_db, app=False)
    p = sub.add_parser("demo", parents=[demo], help="run the shop demo (ten conversations)")
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
    "verify": _cmd_verify,
    "report": _cmd_report,
    "replay": _cmd_replay,
    "demo": _cmd_demo,
    "serve": _cmd_serve,
    "hash-secret": _cmd_hash_secret,
    "mcp": _mcp.run,
    "redact": _governance._cmd_redact,
    "retain": _governance._cmd_retain,
    "hold": _governance._cmd_hold,
    "seal-rules": _governance._cmd_seal_rules,
}


def _tolerant_output() -> None:
    """Model text the terminal's encoding cannot carry is written as escapes, never a crash."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")


_DEBUG_ON = frozenset({"1", "true", "yes", "on"})  # EFFECTGATE_DEBUG=0 is no, not yes
_VERDICTS = frozenset({"audit", "verify", "replay", "demo"})  # their exit code is their answer


def _broken_pipe(args: argparse.Namespace | None) -> int:
    """The exit code when the reader went away: a command's verdict is never lost (`audit | head`
    with findings still exits 1); a verdict not yet reached exits 141, as if killed by SIGPIPE;
    any other command's output was simply not all wanted (0)."""
    if args is None:
        return EXIT_OK  # `--help | head`
    verdict: int | None = getattr(args, "verdict", None)
    if verdict is not None:
        return verdict
    return EXIT_BROKEN_PIPE if args.command in _VERDICTS else EXIT_OK


class _EscapedLog(logging.Formatter):
    """A log line whose message is printed as `_text` prints values: control, invisible and
    reordering characters (and line breaks) escaped, since a warning may quote a tool's error,
    which may quote model-written arguments."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{record.name}: {record.levelname.lower()}: {_escape(record.getMessage())}"
        more = [self.formatException(record.exc_info)] if record.exc_info else []
        if record.stack_info:
            more.append(self.formatStack(record.stack_info))
        return "\n".join([line, *(_escape(text, newlines=True) for text in more)])


@contextmanager
def _gate_warnings() -> Iterator[None]:
    """While a command runs, the `effectgate` logger's warnings go to stderr escaped. Without a
    handler Python's last-resort handler wrote them raw. `propagate` is off so that no root
    handler writes them raw a second time; both are put back when `main` returns, so a program or
    test that calls `main` keeps its own logging set-up (library use installs nothing)."""
    logger = logging.getLogger("effectgate")
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(_EscapedLog())
    propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns its exit code (see the module docstring)."""
    with _gate_warnings():
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    if argv is None:
        # Run as the program (arguments from sys.argv): the modules' objects live until the
        # process exits, so they leave the cyclic collector's care (`gc.freeze`). It then walks
        # only what the command makes: fewer passes during the command, and about 0.1 s less at
        # exit, where the interpreter's last collection would walk every imported module.
        gc.freeze()
    _tolerant_output()
    url = os.environ.get("EFFECTGATE_DB") or DEFAULT_DB
    args: argparse.Namespace | None = None
    try:
        try:
            args = _parser().parse_args(argv)
        except SystemExit as exc:  # --help, printed by argparse
            return EXIT_USAGE if exc.code else EXIT_OK
        if _SURROGATE.search(str(getattr(args, "id", "") or "")):  # a non-UTF-8 byte in argv
            why = "holds a lone surrogate: give it as UTF-8 text (nothing was changed)"
            raise UsageError(f"the id {args.id!r} {why}")
        args.db_given = bool(args.db)  # `--db ""` is no URL: the default, as below (the demo's own)
        args.db = url = args.db or url
        out = _console(demo=args.command == "demo")
        code = args.verdict = _COMMANDS[args.command](args, out)
        sys.stdout.flush()  # a reader that went away fails here, inside main, not at exit
        if argv is None and args.command == "audit" and not args.app:  # no application code ran
            # Its answer written and its store closed, the program leaves without the teardown
            # that frees the scan's objects and every module one by one (tens of ms).
            sys.stderr.flush()
            os._exit(code)
        return code
    except BrokenPipeError:  # `effectgate show ID | head`: the rest was not wanted; stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return _broken_pipe(args)
    except Exception as exc:
        if os.environ.get("EFFECTGATE_DEBUG", "").strip().lower() in _DEBUG_ON:
            raise
        code, message = _failure(exc, url)
        print(f"effectgate: error: {_one_line(hidden(message))}", file=sys.stderr)
        return code
