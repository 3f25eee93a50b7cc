"""The `effectgate` command: pending, show, approve, deny, audit, export, demo, serve.

`--db URL` everywhere (default: $EFFECTGATE_DB or sqlite:///effectgate.db). Commands that re-run
the table's checks (approve) need the application's gate: `--app module:factory`, where
`factory(store, keyring=...)` returns an EffectGate ($EFFECTGATE_APP). Grant tokens are signed
with $EFFECTGATE_KEYRING, or for a SQLite file with a development keyring beside it (DB.keys).

Bad input prints one line on stderr and exits 2 with nothing changed; an audit that finds a
divergence exits 1.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from .audit import audit, export_jsonl
from .context import Approver
from .effects import Policy
from .errors import EffectGateError
from .gate import EffectGate
from .outcomes import Card, Grant
from .stores.sql import SQLStore, open_store
from .table import EffectTable
from .tokens import Keyring

DEFAULT_DB = "sqlite:///effectgate.db"


class UsageError(Exception):
    """Bad command-line input; exit 2."""


def keyring_for(url: str) -> Keyring:
    """$EFFECTGATE_KEYRING, else a development keyring file next to a SQLite database."""
    ring = Keyring.from_env()
    if ring is not None:
        return ring
    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        return Keyring.load_or_create(f"{parsed.database}.keys")
    raise UsageError("set EFFECTGATE_KEYRING (kid:hexsecret) for a non-file database")


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


def _open(url: str) -> SQLStore:
    store = open_store(url)
    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database and not Path(parsed.database).exists():
        raise UsageError(f"no database at {parsed.database}")
    return store


def _gate(args: argparse.Namespace, store: SQLStore, *, need_app: bool) -> EffectGate:
    if args.app:
        factory = _load_app(args.app)
        try:
            gate = factory(store, keyring=keyring_for(args.db))
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
    return EffectGate(EffectTable(), store, policy=Policy(), keyring=keyring_for(args.db))


def _card_panel(card: Card) -> Panel:
    body = Table.grid(padding=(0, 2))
    body.add_column(style="bold")
    body.add_column(overflow="fold")
    rows = [
        ("tool", f"{card.tool}  ({card.effect}, {card.reversibility})"),
        ("status", f"{card.status}, version {card.version}"),
        ("approver role", card.approver_role),
        ("approvals", f"{card.approvals_given} of {card.approvals_required}"),
        ("subject", json.dumps(card.subject, sort_keys=True) if card.subject else "-"),
        ("arguments", json.dumps(dict(card.args), indent=2, sort_keys=True)),
        ("args sha256", card.args_hash),
        ("session / user", f"{card.session_id} / {card.user_id}"),
        ("owner", card.owner or "-"),
        ("expires at", f"{card.expires_at:.0f} (epoch s)"),
        *(("note", n) for n in card.notes),
    ]
    for key, value in rows:
        body.add_row(key, value)
    return Panel(body, title=f"approval {card.approval_id}", expand=False)


def _cmd_pending(args: argparse.Namespace, out: Console) -> int:
    with _open(args.db) as store:
        cards = _gate(args, store, need_app=False).pending(role=args.role, session_id=args.session)
    if args.json:
        out.print_json(json.dumps([c.to_dict() for c in cards]))
        return 0
    table = Table(title=f"{len(cards)} pending approval(s)")
    table.add_column("id", no_wrap=True, min_width=32)  # approve needs the whole id
    for col in ("v", "tool", "role", "subject", "args", "approvals"):
        table.add_column(col, overflow="fold")
    for c in cards:
        table.add_row(
            c.approval_id,
            str(c.version),
            c.tool,
            c.approver_role,
            json.dumps(c.subject),
            json.dumps(dict(c.args), sort_keys=True),
            f"{c.approvals_given}/{c.approvals_required}",
        )
    out.print(table)
    return 0


def _cmd_show(args: argparse.Namespace, out: Console) -> int:
    with _open(args.db) as store:
        card = _gate(args, store, need_app=False).card(args.id)
    if args.json:
        out.print_json(json.dumps(card.to_dict()))
    else:
        out.print(_card_panel(card))
    return 0


def _cmd_approve(args: argparse.Namespace, out: Console) -> int:
    with _open(args.db) as store:
        decision = _gate(args, store, need_app=True).approve(
            args.id, version=args.version, approver=Approver(args.approver, args.role)
        )
    if isinstance(decision, Grant):
        out.print(
            f"approved {decision.approval_id} v{decision.version}; grant token (single use, expires "
            f"{decision.expires_at:.0f}):"
        )
        print(decision.token)
    else:
        out.print(f"recorded: {decision.message}")
    return 0


def _cmd_deny(args: argparse.Namespace, out: Console) -> int:
    with _open(args.db) as store:
        _gate(args, store, need_app=False).deny(
            args.id, approver=Approver(args.approver, args.role), reason=args.reason, version=args.version
        )
    out.print(f"denied {args.id}: {args.reason}")
    return 0


def _cmd_audit(args: argparse.Namespace, out: Console) -> int:
    with _open(args.db) as store:
        table = _gate(args, store, need_app=False).table if args.app else None
        report = audit(store, table)
    if args.json:
        out.print_json(json.dumps(report.to_dict()))
    else:
        for f in report.findings:
            out.print(
                f"[red]{f.kind}[/red] {f.tool} approval={f.approval_id} "
                f"execution={f.execution_id}: {f.detail}"
            )
        m = report.metrics
        assert m is not None
        out.print(
            f"{'clean' if report.clean else 'DIVERGED'}: {len(report.findings)} finding(s); "
            f"{m.executions} executions, {m.approved} approved, {m.denied} denied, "
            f"{m.replays_absorbed} replays absorbed, p95 approval latency "
            f"{'-' if m.approval_latency_p95_s is None else f'{m.approval_latency_p95_s:.1f}s'}, "
            f"{m.gated_proposals_per_1000_sessions:.0f} gated proposals per 1,000 sessions"
        )
    return 0 if report.clean else 1


def _cmd_export(args: argparse.Namespace, out: Console) -> int:
    if not args.jsonl:
        raise UsageError("export needs --jsonl (the only format)")
    with _open(args.db) as store:
        lines = list(export_jsonl(store))
    if args.out:
        Path(args.out).write_text("".join(line + "\n" for line in lines))
        out.print(f"wrote {len(lines)} records to {args.out}")
    else:
        sys.stdout.write("".join(line + "\n" for line in lines))
    return 0


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
    gate = _gate(args, store, need_app=True)

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
    out.print(f"effectgate inbox on http://{args.host}:{args.port}/ ({len(approvers)} approvers; {args.db})")
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


def _cmd_hash_secret(args: argparse.Namespace, out: Console) -> int:
    import getpass

    from .web._auth import hash_secret

    secret = sys.stdin.readline().rstrip("\n") if not sys.stdin.isatty() else getpass.getpass("secret: ")
    if not secret:
        raise UsageError("an empty secret")
    print(hash_secret(secret))
    return 0


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


def _parser() -> argparse.ArgumentParser:
    def options(default: Any, app_default: Any) -> argparse.ArgumentParser:
        shared = argparse.ArgumentParser(add_help=False)
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
    parser = argparse.ArgumentParser(prog="effectgate", description=__doc__.split("\n")[0], parents=[top])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pending", parents=[common], help="list approvals waiting for a decision")
    p.add_argument("--role")
    p.add_argument("--session")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("show", parents=[common], help="show one approval's card")
    p.add_argument("id")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("approve", parents=[common], help="approve one version; prints the grant token")
    p.add_argument("id")
    p.add_argument("--version", type=int, required=True)
    p.add_argument("--as", dest="role", required=True, help="the approver's role")
    p.add_argument("--approver", required=True, help="the approver's id")
    p = sub.add_parser("deny", parents=[common], help="deny an approval with a reason")
    p.add_argument("id")
    p.add_argument("--reason", required=True)
    p.add_argument("--as", dest="role", required=True)
    p.add_argument("--approver", required=True)
    p.add_argument("--version", type=int)
    p = sub.add_parser("audit", parents=[common], help="scan: every gated execution has its approval")
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed its one-line usage error
        return 2 if exc.code else 0
    args.db_given = args.db is not None
    args.db = args.db or os.environ.get("EFFECTGATE_DB") or DEFAULT_DB
    out = Console(highlight=False)
    try:
        return _COMMANDS[args.command](args, out)
    except (UsageError, EffectGateError, ValueError, LookupError) as exc:
        message: Any = exc.args[0] if isinstance(exc, LookupError) and exc.args else exc
        print(f"effectgate: error: {message}", file=sys.stderr)
        return 2
    except sa.exc.OperationalError as exc:
        print(f"effectgate: error: database: {str(exc.orig).splitlines()[0]}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
