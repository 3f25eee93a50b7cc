"""The commands: each takes the parsed arguments and the console, and returns an exit code."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from .._display import card_status, keyring_warnings, remaining, when
from ..audit import export_jsonl
from ..context import Approver
from ..export import ExportError, Manifest, Verified, export_chain, manifest_path, verify_export
from ..outcomes import Grant, PartialApproval, Recorded
from ..stores.records import SCHEMA_VERSION
from ..stores.sql import open_store
from ._args import check_new, check_output, check_unfinished, jsonl_output, signing_in
from ._render import (
    EXIT_FINDINGS,
    EXIT_OK,
    _card_panel,
    _pending_entry,
    _run,
    _short,
    _text,
    _write_json,
)
from ._report import _targets
from ._store import (
    NotFound,
    NotRun,
    StoreUnavailable,
    UsageError,
    _gate,
    _make_gate,
    _open,
    _parse,
    _sqlite_file,
    _where,
    check_listen,
    given_back,
    holds_records,
    keyring_for,
    pending_cards,
    run_approved,
)


def _cmd_setup(args: argparse.Namespace, out: Console) -> int:
    parsed = _parse(args.db)
    _check_keys(args.db, parsed)
    with open_store(args.db) as store:
        store.setup()
        empty = not holds_records(store)
    where = _where(parsed)
    key_file, keys = _setup_keys(args.db, parsed, empty=empty)
    if args.json:
        _write_json({"db": where, "schema_version": SCHEMA_VERSION, "key_file": key_file})
        return EXIT_OK
    out.print(_text(f"effectgate schema {SCHEMA_VERSION} ready at {where}; {keys}"))
    return EXIT_OK


def _check_keys(url: str, parsed: Any) -> None:
    """Refuse (usage error, before the schema is made) a keyring `setup` would report in use that
    no command can load: a malformed $EFFECTGATE_KEYRING, or a key file beside the SQLite file that
    is no key file (its text, its mode, not a regular file)."""
    db, env = _sqlite_file(parsed), "EFFECTGATE_KEYRING" in os.environ  # set but empty: refused too
    keys = None if env or db is None else Path(f"{db}.keys")
    if keys is not None and keys.is_symlink() and not keys.exists():
        raise UsageError(f"the key file {keys} is a symbolic link to nothing: remove it; nothing was set up")
    if env or (keys is not None and keys.exists()):
        try:
            keyring_for(url, create=False)
        except ValueError as exc:
            where = "$EFFECTGATE_KEYRING: " if env and not str(exc).startswith("$") else ""
            raise UsageError(f"{where}{exc}; nothing was set up") from exc


def _setup_keys(url: str, parsed: Any, *, empty: bool) -> tuple[str | None, str]:
    """The development key file of a SQLite file, created as the gate would create it (mode 0600)
    unless $EFFECTGATE_KEYRING is set or the ledger already holds records (a new key would verify
    nothing sealed under the old one): the key file's path (or None) and a line saying which."""
    if os.environ.get("EFFECTGATE_KEYRING"):
        return None, "keys from $EFFECTGATE_KEYRING"
    db = _sqlite_file(parsed)
    if db is None:
        if parsed.get_backend_name() == "sqlite":
            return None, "an in-memory database gets a fresh keyring in each process"
        return None, "set $EFFECTGATE_KEYRING in every process that uses it (a server has no key file)"
    keys = Path(f"{db}.keys")
    if keys.exists():
        return str(keys), f"kept the development key file {keys}"
    if not empty:
        return None, (
            f"NO key file {keys}: the ledger holds records, so restore the key file they were sealed "
            "with or set $EFFECTGATE_KEYRING (a new key would verify nothing stored)"
        )
    keyring_for(url, create=True)
    return str(keys), f"created the development key file {keys} (mode 0600; keep it beside the database)"


def _cmd_pending(args: argparse.Namespace, out: Console) -> int:
    with _gate(args) as gate:
        cards = keyring_warnings(gate, pending_cards(gate, args.role, args.session, app=args.app))
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
        [card] = keyring_warnings(gate, [gate.card(args.id)])
        now, run = gate.clock.now(), _run(gate.store.executions(approval_id=card.approval_id))
        status = card_status(gate, card.approval_id) or (card.status, card.status)
    if args.json:  # `status` is the column; `shown_status` what the executions and sealed decisions say
        _write_json({**card.to_dict(), "run": run, "shown_status": status[1]})
    else:
        out.print(_card_panel(card, now=now, run=run, status=status))
    return EXIT_OK


def _cmd_approve(args: argparse.Namespace, out: Console) -> int:
    with _gate(args, need_app=True, approval=args.id) as gate:
        decision = gate.approve(args.id, version=args.version, approver=Approver(args.approver, args.role))
        with given_back(gate, decision):  # Ctrl-C before the token is shown or spent: never stranded
            now = gate.clock.now()
            # --execute: the approver runs the grant now (its token is spent here and never printed)
            done = (
                run_approved(gate, decision, args.db)
                if args.execute and isinstance(decision, Grant)
                else None
            )
            unrun, done = (done, None) if isinstance(done, NotRun) else (None, done)  # grant printed, raised
            _approved(args, out, decision, done, now)
    if unrun is not None:
        raise unrun
    return EXIT_OK


def _approved(args: argparse.Namespace, out: Console, decision: Any, done: Any, now: float) -> None:
    if args.json:
        kinds = {Grant: "grant", PartialApproval: "partial_approval", Recorded: "shadow_recorded"}
        kind = kinds[type(decision)]
        extra: dict[str, Any] = {} if isinstance(decision, Grant) else {"message": decision.message}
        fields = asdict(decision)
        if done is not None:
            fields.pop("token")
            extra["executed"] = {"result": done.result, "replay": done.replay}
        _write_json({"kind": kind, **fields, **extra})
    elif done is not None:
        out.print(_text(f"approved and executed {args.id} v{args.version}: {_short(done.result)}"))
    elif isinstance(decision, Grant):
        expires = f"{when(decision.expires_at)}, {remaining(decision.expires_at - now)}"
        head = f"approved {decision.approval_id} v{decision.version}; "
        out.print(_text(f"{head}grant token (single use, expires {expires}):"))
        print(decision.token, flush=True)
    else:
        out.print(_text(f"recorded: {decision.message}"))


def _cmd_deny(args: argparse.Namespace, out: Console) -> int:
    with _gate(args, approval=args.id) as gate:
        refused = gate.deny(
            args.id, approver=Approver(args.approver, args.role), reason=args.reason, version=args.version
        )
    if args.json:
        _write_json({"kind": "refused", **asdict(refused)})
    else:
        out.print(_text(f"denied {args.id}: {args.reason}"))
    return EXIT_OK


def _cmd_export(args: argparse.Namespace, out: Console) -> int:
    if args.jsonl:
        if args.out:
            check_output(args.db, "--out", args.out, also=[Path(args.out + ".partial")])
            check_new("--out", Path(args.out), force=args.force)
        written = 0
        # streamed: memory stays flat however large the ledger
        with _open(args.db) as store, jsonl_output(args.out) as f:
            for line in export_jsonl(store):
                f.write(line + "\n")
                written += 1
        if args.out:
            out.print(_text(f"wrote {written} records to {args.out}"))
        return EXIT_OK
    if not args.out:
        raise UsageError("export needs --out FILE (the signed manifest is written beside it)")
    out_file = Path(args.out)
    # every file the export writes, checked before the ledger's chain gets its checkpoints
    partials = [Path(f"{f}.partial") for f in (out_file, manifest_path(out_file))]
    check_output(args.db, "--out", args.out, also=[*partials, manifest_path(out_file)], renamed=True)
    check_unfinished("--out", args.out, partials, "nothing was exported or written")
    if args.after and not Path(args.after).is_file():
        raise NotFound(f"export --after {args.after}: no such file")
    after = Manifest.load(args.after) if args.after else None
    check_new("--out", out_file, manifest_path(out_file), force=args.force, after=after)
    with _open(args.db) as store:  # a mistyped path is "no database at" (3), not "no keyring"
        keyring = keyring_for(args.db, create=False)
        manifest = export_chain(store, keyring, args.out, after=after, settle=args.settle)
    if args.json:
        _write_json(asdict(manifest))
        return EXIT_OK
    span = (
        "no new records"
        if manifest.first_seq is None
        else f"records {manifest.first_seq}..{manifest.last_seq}"
    )
    out.print(
        _text(
            f"wrote {manifest.count} decision records ({span}) to {args.out}; chain head "
            f"{manifest.head[:16]}, signed with key {manifest.key_id} in {manifest_path(args.out)}"
        )
    )
    return EXIT_OK


def _cmd_verify(args: argparse.Namespace, out: Console) -> int:
    for flag, path in (("", args.file), ("--after ", args.after)):
        if path and not Path(path).is_file():
            raise NotFound(f"verify {flag}{path}: no such file")
    keyring = keyring_for(args.db, create=False)
    if not manifest_path(args.file).is_file():
        raise NotFound(f"verify {args.file}: no manifest {manifest_path(args.file)} beside it")
    try:
        verdict = verify_export(args.file, keyring, after=Manifest.load(args.after) if args.after else None)
    except ExportError as exc:  # --after is no manifest: a broken verdict (1), as a foreign one is
        verdict = Verified(False, 0, problem=str(exc))
    args.verdict = EXIT_OK if verdict.ok else EXIT_FINDINGS
    if args.json:
        _write_json(verdict.to_dict())
    elif verdict.ok:
        out.print(_text(f"ok: {verdict.count} records, chain and signed manifest verified"))
    else:
        seq = f" (seq {verdict.seq})" if verdict.seq else ""
        where = "" if verdict.line is None else f"line {verdict.line}{seq}"
        out.print(
            Text.assemble(
                ("BROKEN", "bold red"),
                " ",
                _text(f"{where}: {verdict.problem}" if where else str(verdict.problem)),
            )
        )
    return EXIT_OK if verdict.ok else EXIT_FINDINGS


def _cmd_replay(args: argparse.Namespace, out: Console) -> int:
    from ..replay import replay  # it imports the gate: loaded by the commands that make one

    with _gate(args, need_app=True) as gate:
        report = replay(gate.store, gate.table, gate.policy, keyring=gate.keyring)
    args.verdict = EXIT_OK if report.clean else EXIT_FINDINGS
    if args.json:
        _write_json(report.to_dict())
        return EXIT_OK if report.clean else EXIT_FINDINGS
    for r in report.changed:
        line = _text(f"{r.tool} approval={r.approval_id} v{r.version}: {r.detail}")
        out.print(Text.assemble((r.verdict.upper(), "bold red"), " ", line))
    same = len(report.results) - len(report.changed)
    out.print(_text(f"{same} of {len(report.results)} approved intents replay the same against stubs"))
    if report.redacted:
        erased = len(report.redacted)
        out.print(_text(f"{erased} approved intent(s) not replayed: their arguments were erased"))
    return EXIT_OK if report.clean else EXIT_FINDINGS


def _cmd_serve(args: argparse.Namespace, out: Console) -> int:
    try:
        import uvicorn

        from ..web import ApproverRegistry, create_app
        from ..web._guard import MIN_SSO_SECRET
    except ImportError as exc:
        raise UsageError(f'the inbox needs the web extra ({exc}): pip install "effectgate[web]"') from exc
    if not args.approvers:
        raise UsageError("serve needs --approvers FILE (approvers are registered server-side)")
    try:
        approvers = ApproverRegistry.from_toml(args.approvers)
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read --approvers {args.approvers}: {exc}") from exc
    signing_in(approvers, args.approvers, sso=bool(args.sso_header))
    sso_secret = os.environ.get("EFFECTGATE_SSO_SECRET") or None
    if args.sso_header and (sso_secret is None or len(sso_secret) < MIN_SSO_SECRET):
        raise UsageError(
            f"--sso-header needs EFFECTGATE_SSO_SECRET (at least {MIN_SSO_SECRET} characters), the secret "
            "your proxy sends in X-Effectgate-Proxy-Secret: without it any local process can name an approver"
        )
    check_listen(args.host, args.port)
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
        sso_secret=sso_secret if args.sso_header else None,
        allowed_hosts=_allowed_hosts(args),
        https_only=args.https_only,
        latency_targets=_targets(args.target),
    )
    where = _where(_parse(args.db))
    out.print(
        _text(f"effectgate inbox on http://{args.host}:{args.port}/ ({len(approvers)} approvers; {where})")
    )
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning", **_proxy_options(args))
    except SystemExit as exc:  # uvicorn's start-up failure (the port taken since `check_listen`)
        raise StoreUnavailable(f"cannot listen on {args.host}:{args.port}; choose another --port") from exc
    return EXIT_OK


def _allowed_hosts(args: argparse.Namespace) -> list[str]:
    """The Host names `serve` answers: the bind address, the loopback names, and --allowed-host."""
    names = [args.host.strip("[]").lower(), "localhost", "127.0.0.1", "::1", *(args.allowed_host or [])]
    return list(dict.fromkeys(names))


def _proxy_options(args: argparse.Namespace) -> dict[str, Any]:
    """uvicorn's proxy settings: X-Forwarded-For is believed only from a --trusted-proxy. uvicorn's
    default believes it from 127.0.0.1, so any local client could pick its own address and
    escape the per-client sign-in limit."""
    trusted: list[str] = args.trusted_proxy or []
    if not trusted:
        return {"proxy_headers": False}
    return {"proxy_headers": True, "forwarded_allow_ips": trusted}


def _cmd_hash_secret(args: argparse.Namespace, out: Console) -> int:
    import getpass

    from ..web._auth import hash_secret

    if sys.stdin is None:  # `<&-`: no standard input to read the secret from
        raise UsageError("hash-secret reads the secret on its standard input, and it has none")
    # the line without its line break, Windows' too: no sign-in form sends one
    secret = sys.stdin.readline().rstrip("\r\n") if not sys.stdin.isatty() else getpass.getpass("secret: ")
    if not secret:
        raise UsageError("an empty secret")
    if args.json:
        _write_json({"hash": hash_secret(secret)})
    else:
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
    url = args.db if args.db_given else default
    _parse(url)  # as every command: a path names the URL to give, no password is ever printed
    return run_demo(url, out)
