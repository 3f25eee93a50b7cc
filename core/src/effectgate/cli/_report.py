"""`effectgate report`: the disagreement rates and the rollout figures in the terminal, as JSON
(`--json`) or as one static HTML page with charts (`--html FILE`, the report extra)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Literal

from rich.console import Console
from rich.table import Table

from ..errors import MissingDependency, MissingKeyring
from ..report import Metrics, check_charts, figures, write_html
from ..report._html import erased_note, latency_cells
from ..tokens import Keyring, keyring_for
from ._args import check_not_export, check_output
from ._render import EXIT_OK, _text, _write_json
from ._store import UsageError, _open


def _targets(given: list[tuple[str, float]] | None) -> dict[str, float]:
    """`--target finance=300` (seconds) per role, as parsed by `_args.target`."""
    return dict(given or ())


def _cmd_report(args: argparse.Namespace, out: Console) -> int:
    since, until = args.since, args.until
    if since is not None and until is not None and since >= until:  # an empty report reads as "no calls"
        raise UsageError(f"--since must be before --until: the window [{since}, {until}) holds no call")
    targets = _targets(args.target)
    if args.html:
        # never over the ledger, its key, a missing dir (nor the partial it is first written to), nor
        # a symlink, pipe or device: the partial is renamed over the path, which would replace it
        page = Path(args.html)
        partial = [page.with_name(page.name + ".partial")] if page.name else []  # "/" has no name
        check_output(args.db, "--html", args.html, also=partial, renamed=True)
        check_not_export("--html", page)
        try:
            check_charts()  # before the ledger is read: a missing extra fails at once
        except MissingDependency as exc:
            raise UsageError(f"--html draws charts: {exc}") from exc
    try:  # the seals are checked with the ledger's keyring; without one the report says so
        keyring: Keyring | None = keyring_for(args.db, create=False)
    except MissingKeyring:
        keyring = None
    with _open(args.db) as store:
        report = figures(store, since=since, until=until, targets=targets, keyring=keyring)
        now = store.clock.now()
    if args.html:
        written = write_html(report, args.html, generated_at=now)
        if not args.json:
            out.print(_text(f"wrote the report with its charts to {written}"))
    if args.json:
        _write_json(report.to_dict())
        return EXIT_OK
    if args.html:
        return EXIT_OK
    if report.note:
        out.print(_text(report.note), style="bold red")
    for by, rates in (("tool", report.by_tool), ("role", report.by_role)):
        grid = Table(title=f"disagreement by {by} (denied or edited over decided)", title_justify="left")
        columns = (
            by,
            "mode",
            "decided",
            "approved",
            "denied",
            "edited",
            "disagreement",
            "expired",
            "pending",
        )
        for column in columns:
            grid.add_column(column, justify="left" if column in (by, "mode") else "right")
        for r in rates:
            rate = "-" if r.disagreement is None else f"{100 * r.disagreement:.1f}%"
            counts = [str(n) for n in (r.decided, r.approved, r.denied, r.edited)]
            grid.add_row(_text(r.key), r.mode, *counts, rate, str(r.expired), str(r.undecided - r.expired))
        out.print(grid)
    m = report.metrics
    grid = Table(title="approval latency, p95 per role", title_justify="left")
    for column in ("role", "p95", "target", "met"):
        grid.add_column(column)
    for role, p95 in m.latency_p95_s.items():
        target = m.latency_targets.get(role)
        met = m.latency_met(role)
        grid.add_row(
            _text(role), *latency_cells(p95, target), "-" if met is None else ("met" if met else "MISSED")
        )
    out.print(grid)
    _print_rollout(m, out)
    return EXIT_OK


def _print_rollout(m: Metrics, out: Console) -> None:
    """The report's rollout lines below its tables: decision rates, replays, gated proposals."""
    grid = Table(title="decisions per tool (over settled calls: decided or expired)", title_justify="left")
    for column in ("tool", "settled", "approved", "denied", "edited", "expired", "pending"):
        grid.add_column(column, justify="left" if column == "tool" else "right")
    for t in m.decision_rates:
        rates = ["-" if (v := t.rate(w)) is None else f"{100 * v:.1f}%" for w in _DECISIONS]
        grid.add_row(_text(t.tool), str(t.settled), *rates, str(t.pending))
    out.print(grid)
    replay_rate = m.replay_rate
    shown = "-" if replay_rate is None else f"{100 * replay_rate:.1f}%"
    out.print(
        _text(
            f"{m.proposals} gated proposals, {m.replays_absorbed} replays absorbed"
            f" ({shown}); needs_reconciliation backlog: "
            f"{m.needs_reconciliation}{erased_note(m)}"
        )
    )
    for day, proposals, sessions in m.gated_by_day:
        per = f"{1000 * proposals / sessions:.0f}" if sessions else "-"
        out.print(
            _text(f"  {day}: {proposals} gated proposals, {sessions} sessions, {per} per 1,000 sessions")
        )
    for day, model, proposals, sessions in m.gated_by_model:
        per = f"{1000 * proposals / sessions:.0f}" if sessions else "-"
        name = model or "(no model id)"
        out.print(_text(f"  {day} {name}: {proposals} gated proposals, {per} per 1,000 sessions"))


_DECISIONS: tuple[Literal["approved", "denied", "edited", "expired"], ...] = (
    "approved",
    "denied",
    "edited",
    "expired",
)
