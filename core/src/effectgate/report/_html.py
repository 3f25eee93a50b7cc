"""`effectgate report --html`: the report as one self-contained static page.

The page needs nothing at view time: the charts are inline SVG (`_charts`), the style is inline,
there is no script, and its own Content-Security-Policy (`default-src 'none'`) keeps a browser from
fetching anything even if a value tried. Every value from the ledger (tool names, roles, model
identifiers) is written as text: escaped (`html.escape`), with invisible and reordering
characters written out (`<U+202E>`). The inbox's metrics page shows the same `body`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape
from pathlib import Path

from .._display import duration, when
from .._export_file import rewrite
from .._textcheck import reveal
from ._figures import Figures, Metrics, Rate, per_1000

CSP = "default-src 'none'; style-src 'unsafe-inline'; form-action 'none'; base-uri 'none'"
#: The classes `body` uses (the inbox adds them to its own page style).
STYLE = """
.eg-report { max-width: 1100px; }
.eg-report figure { background: #fff; border: 1px solid #d8dbe0; border-radius: 6px; }
.eg-report figure { margin: 0 0 1rem; padding: .6rem; }
.eg-report figure svg { max-width: 100%; height: auto; display: block; }
.eg-report table { border-collapse: collapse; margin: .4rem 0 1.2rem; background: #fff; }
.eg-report th, .eg-report td { border-bottom: 1px solid #e1e3e8; padding: .2rem .7rem; text-align: right; }
.eg-report th:first-child, .eg-report td:first-child, .eg-report td.text { text-align: left; }
.eg-report .missed { color: #c0392b; font-weight: bold; }
"""
_PAGE_STYLE = (
    "body { font: 15px/1.45 system-ui, sans-serif; margin: 1.2rem; color: #1d232b; background: #f4f5f7; }"
)


def _t(value: object) -> str:
    """Ledger text for HTML: what is stored, shown as text."""
    return escape(reveal(str(value)))


def erased_note(m: Metrics) -> str:
    """What the backlog's line adds for records erased with their call (counted apart), or ''."""
    n = m.backlog_erased
    return f" (and {n} erased with their call: nothing settles them)" if n else ""


def latency_cells(p95: float | None, target: float | None) -> tuple[str, str]:
    """A role's p95 and its target as text ("-" for none), as `duration` gives them, unless the
    two read the same and differ (300.4 s against 300 s, both "5m 0s" beside MISSED): then both
    as exact seconds, so the figures never contradict the verdict beside them."""
    shown = "-" if p95 is None else duration(p95), "-" if target is None else duration(target)
    if p95 is not None and target is not None and p95 != target and shown[0] == shown[1]:
        return f"{p95!r} s", f"{target!r} s"
    return shown


def _pct(part: int, whole: int) -> str:
    return "-" if not whole else f"{100 * part / whole:.1f}%"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _table(key: str, caption: str, head: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A table; cells are HTML already escaped by the caller."""
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<h3>{escape(caption)}</h3>\n<table data-table="{key}"><tr>{th}</tr>{body}</table>\n'


def _rates(by: str, rates: list[Rate]) -> str:
    head = (by, "mode", "decided", "approved", "denied", "edited", "disagreement", "expired", "pending")
    rows = [
        [
            _t(r.key),
            _t(r.mode),
            *(str(n) for n in (r.decided, r.approved, r.denied, r.edited)),
            _rate(r.disagreement),
            str(r.expired),
            str(r.undecided - r.expired),
        ]
        for r in rates
    ]
    return _table(f"by_{by}", f"disagreement by {by} (denied or edited over decided)", head, rows)


def body(figures: Figures) -> str:
    """The report as an HTML fragment (charts, then the figures as tables), every ledger value
    escaped. Raises `MissingDependency` without matplotlib (the report extra)."""
    from ._charts import charts  # the optional dependency, only when drawing

    m = figures.metrics
    parts = ['<div class="eg-report">']
    start = "the start" if figures.since is None else when(figures.since)
    end = "now" if figures.until is None else when(figures.until)
    parts.append(f"<p>{escape(f'calls proposed from {start} until {end}')}</p>")
    if figures.note is not None:  # no seal checked, or some that do not verify: said before any figure
        parts.append(f'<p class="missed" data-note="seals">{escape(figures.note)}</p>')
    parts.append(
        f"<p>{m.proposals} gated proposals, {m.replays_absorbed} replays absorbed ({_rate(m.replay_rate)}); "
        f"needs_reconciliation backlog: {m.needs_reconciliation}{escape(erased_note(m))}</p>"
    )
    for chart in charts(m):
        parts.append(f'<figure data-chart="{chart.key}">{chart.svg}</figure>')
    latency = []
    for role, p95 in m.latency_p95_s.items():
        target, met = m.latency_targets.get(role), m.latency_met(role)
        verdict = "-" if met is None else "met" if met else '<span class="missed">MISSED</span>'
        latency.append([_t(role), *map(escape, latency_cells(p95, target)), verdict])
    parts.append(
        _table("latency", "approval latency, p95 per role", ("role", "p95", "target", "met"), latency)
    )
    decisions = [
        [_t(t.tool), str(t.settled)]
        + [_pct(n, t.settled) for n in (t.approved, t.denied, t.edited, t.expired)]
        + [str(t.pending)]
        for t in m.decision_rates
    ]
    columns: tuple[str, ...] = ("tool", "settled", "approved", "denied", "edited", "expired", "pending")
    parts.append(_table("decisions", "decisions per tool (over settled calls)", columns, decisions))
    parts.append(_rates("tool", figures.by_tool))
    parts.append(_rates("role", figures.by_role))
    per_day = [[escape(d), str(n), str(s), _per(n, s)] for d, n, s in m.gated_by_day]
    columns = ("day (UTC)", "gated proposals", "sessions", "per 1,000 sessions")
    parts.append(_table("gated_by_day", "gated proposals per day", columns, per_day))
    per_model = [
        [escape(d), _t(model) if model else "(no model id)", str(n), str(s), _per(n, s)]
        for d, model, n, s in m.gated_by_model
    ]
    columns = ("day (UTC)", "model", "gated proposals", "sessions", "per 1,000 sessions")
    parts.append(_table("gated_by_model", "gated proposals per model per day", columns, per_model))
    parts.append("</div>")
    return "\n".join(parts)


def check_charts() -> None:
    """Raise `MissingDependency` (naming the report extra) unless the charts can be drawn."""
    from ._charts import charts  # noqa: F401  (importing it is the check)


def _per(proposals: int, sessions: int) -> str:
    rate = per_1000(proposals, sessions)
    return "-" if rate is None else f"{rate:.0f}"


def render_html(figures: Figures, *, generated_at: float | None = None) -> str:
    """The whole page: one file, nothing fetched at view time (see the module docstring)."""
    made = "" if generated_at is None else f"<p>generated {escape(when(generated_at))}</p>\n"
    return (
        '<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n'
        "<title>effectgate report</title>\n"
        f"<style>{_PAGE_STYLE}{STYLE}</style>\n</head>\n<body>\n<h1>effectgate report</h1>\n"
        f"{made}{body(figures)}\n</body>\n</html>\n"
    )


def write_html(figures: Figures, path: str | Path, *, generated_at: float | None = None) -> Path:
    """Write `render_html` to `path` (UTF-8), whole or not at all: into `path.partial`, renamed
    over `path` once written (a failed write leaves the file that was there); returns the path.
    FileExistsError, nothing written, when the partial exists (another write is under way)."""
    out = Path(path)
    page = render_html(figures, generated_at=generated_at)
    with rewrite(out, FileExistsError) as f:
        f.write(page)
    return out
