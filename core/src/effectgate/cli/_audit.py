"""`effectgate audit`: the command that reads the most, imported alone (no gate is made without
--app: the scan reads the stored records itself)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.text import Text

from .._manifest import ExportError, Manifest
from ..audit import audit
from ..stores.protocol import Store
from ..table import EffectTable
from ..tokens import Keyring
from ._render import EXIT_FINDINGS, EXIT_OK, _escape, _text, _write_json
from ._store import NotFound, _gate, _open, keyring_for


@contextmanager
def audited(args: argparse.Namespace) -> Iterator[tuple[Store, Keyring, EffectTable | None]]:
    """The store, keyring and table (with --app: the app's gate's) the scan uses. Without --app no
    gate is made: the scan reads the stored records alone, as over a gate of an empty table."""
    if args.app:
        with _gate(args) as gate:
            yield gate.store, gate.keyring, gate.table
    else:
        with _open(args.db) as store:
            yield store, keyring_for(args.db, create=False), None


def _cmd_audit(args: argparse.Namespace, out: Console) -> int:
    if args.pinned and not Path(args.pinned).is_file():
        raise NotFound(f"audit --pinned {args.pinned}: no such file")
    pinned = Manifest.load(args.pinned) if args.pinned else None
    with audited(args) as (store, keyring, table):
        if pinned is not None:  # the manifest's signature first: only then are its pins ours
            pinned.check(keyring)
            if pinned.heads is None:
                raise ExportError(f"{args.pinned} pins no chain heads (an export made before pins)")
        report = audit(
            store,
            table,
            keyring=keyring,
            chain=args.chain or pinned is not None,
            pinned=pinned.heads if pinned is not None else None,
        )
    args.verdict = EXIT_OK if report.clean else EXIT_FINDINGS  # kept if the reader goes away
    if args.json:
        _write_json(report.to_dict())
        return EXIT_OK if report.clean else EXIT_FINDINGS
    for f in report.findings:
        where = f"approval={f.approval_id} execution={f.execution_id}"
        out.print(Text.assemble((_escape(f.kind), "bold red"), " ", _text(f"{f.tool} {where}: {f.detail}")))
    for note in report.notes:  # not a finding, but the reader must see what was not checked
        out.print(_text(f"note: {note}"), style="bold yellow")
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
