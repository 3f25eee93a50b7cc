"""The report's charts as inline SVG, drawn with matplotlib (the one place it is imported).

Each chart is a static `<svg>` element: text stays text (`svg.fonttype` none, so no glyph paths),
nothing refers outside the document, and a page that embeds it needs no script, font or network.
Every label that comes from the ledger (tool names, roles, model identifiers) is drawn as plain
text: never parsed as mathtext (`text.parse_math` off), with invisible and reordering characters
written out (`<U+202E>`), and escaped by matplotlib's SVG writer like any XML text.
"""

from __future__ import annotations

import io
import re
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from html import escape
from typing import TYPE_CHECKING, Any, Literal

from .._textcheck import reveal
from ..errors import MissingDependency
from ._figures import Metrics, per_1000

try:
    import matplotlib as mpl
    from matplotlib.dates import DateFormatter, DayLocator
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator
except ImportError as exc:
    raise MissingDependency("matplotlib (the report's charts)", "report") from exc

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

_RC: dict[RcKeyType, Any] = {
    "svg.fonttype": "none",  # text as <text>, not paths: small, searchable, selectable
    "svg.hashsalt": None,  # a fresh salt per chart: ids stay unique when several share a page
    "text.parse_math": False,  # "$...$" in a tool name is text, never mathtext
    "text.usetex": False,
    "timezone": "UTC",  # the days are UTC days: labelled as such whatever a matplotlibrc says
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans", "Arial", "Helvetica"],
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
}
# rcParams are global: one chart at a time (the inbox draws in a thread pool)
_LOCK = threading.Lock()
_DECISIONS: tuple[tuple[Literal["approved", "denied", "edited", "expired"], str], ...] = (
    ("approved", "#1e8449"),
    ("denied", "#c0392b"),
    ("edited", "#d68910"),
    ("expired", "#7f8c8d"),
)
_MET, _MISSED, _NO_TARGET = "#1e8449", "#c0392b", "#5d6d7e"
_LABEL_MAX = 40


@dataclass(frozen=True)
class Chart:
    key: str  # latency, decisions, replays, gated_by_model, backlog
    title: str
    svg: str  # one <svg> element, ready to inline


def label(text: str) -> str:
    """Ledger text as a chart label: invisible characters written out, shortened to fit."""
    shown = reveal(text) or "(none)"
    return shown if len(shown) <= _LABEL_MAX else shown[: _LABEL_MAX - 1] + "…"


def charts(m: Metrics) -> list[Chart]:
    """The five charts of the report, in the order the pages show them."""
    with _LOCK, mpl.rc_context(_RC):
        return [
            _latency(m),
            _decisions(m),
            _replays(m),
            _gated_by_model(m),
            _backlog(m),
        ]


def _svg(key: str, title: str, fig: Figure) -> Chart:
    out = io.StringIO()
    fig.savefig(out, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = out.getvalue()
    text = text[text.index("<svg") :]  # no XML declaration or DOCTYPE inside an HTML page
    text = re.sub(r"\s*<metadata>.*?</metadata>", "", text, count=1, flags=re.DOTALL)
    aria = f'<svg role="img" aria-label="{escape(title)}"'
    return Chart(key, title, aria + text[len("<svg") :])


def _figure(rows: int = 0) -> tuple[Figure, Any]:
    fig = Figure(figsize=(7.0, min(9.0, 1.6 + 0.42 * max(rows, 2))), layout="constrained")
    return fig, fig.subplots()


def _empty(ax: Any, message: str) -> None:
    ax.set_axis_off()
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, color=_NO_TARGET)


def _dates(days: list[str]) -> list[datetime]:
    """ISO days as midnight (naive: matplotlib draws them as UTC)."""
    return [datetime.fromisoformat(d) for d in days]


def _date_axis(ax: Any, days: list[datetime]) -> None:
    """UTC days along x, half a day of margin either side, at most seven labelled days."""
    first, last = min(days), max(days)
    ax.set_xlim(first - timedelta(hours=12), last + timedelta(hours=12))
    step = max(1, -(-((last - first).days + 1) // 7))
    ax.xaxis.set_major_locator(DayLocator(interval=step))  # type: ignore[no-untyped-call]
    ax.xaxis.set_major_formatter(DateFormatter("%Y-%m-%d"))  # type: ignore[no-untyped-call]


def _latency(m: Metrics) -> Chart:
    title = "p95 approval latency per role, against its target"
    roles = list(m.latency_p95_s)
    fig, ax = _figure(len(roles))
    if not roles:
        _empty(ax, "no gated call in this window")
        return _svg("latency", title, fig)
    seconds = [v for r in roles for v in (m.latency_p95_s[r], m.latency_targets.get(r)) if v is not None]
    scale, unit = (60.0, "minutes") if max(seconds, default=0) >= 120 else (1.0, "seconds")
    for i, role in enumerate(roles):
        p95, target, met = m.latency_p95_s[role], m.latency_targets.get(role), m.latency_met(role)
        colour = _NO_TARGET if met is None else _MET if met else _MISSED
        ax.barh(i, (p95 or 0) / scale, color=colour, height=0.6)
        if target is not None:
            ax.plot([target / scale] * 2, [i - 0.4, i + 0.4], color="#1d232b", linewidth=2)
        verdict = "no decision" if p95 is None else "met" if met else "MISSED" if met is False else ""
        shown = "-" if p95 is None else f"{p95 / scale:.1f}"
        if p95 is not None and target is not None and not met and shown == f"{target / scale:.1f}":
            shown = repr(p95 / scale)  # missed by less than the rounding: never shown as the target
        ax.annotate(
            f" {shown} {verdict}",
            ((p95 or 0) / scale, i),
            va="center",
            fontsize=8,
        )
    ax.set_yticks(range(len(roles)), [label(r) for r in roles])
    ax.invert_yaxis()
    ax.set_xlabel(f"p95 latency, {unit} (the black mark is the role's target)")
    ax.set_title(title, loc="left")
    return _svg("latency", title, fig)


def _decisions(m: Metrics) -> Chart:
    title = "decisions per tool: share of the calls that settled"
    tools = [t for t in m.decision_rates if t.settled]
    fig, ax = _figure(len(tools) * 2)
    if not tools:
        _empty(ax, "no settled gated call in this window")
        return _svg("decisions", title, fig)
    width = 0.8 / len(_DECISIONS)
    for k, (what, colour) in enumerate(_DECISIONS):
        offsets = [i - 0.4 + width * (k + 0.5) for i in range(len(tools))]
        values = [100 * (t.rate(what) or 0) for t in tools]
        ax.barh(offsets, values, height=width, color=colour, label=what)
    ax.set_yticks(range(len(tools)), [f"{label(t.tool)} ({t.settled})" for t in tools])
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("% of settled calls (decided or expired); edited overlaps approved and denied")
    fig.legend(loc="outside lower center", ncols=len(_DECISIONS), fontsize=8, frameon=False)
    ax.set_title(title, loc="left")
    return _svg("decisions", title, fig)


def _replays(m: Metrics) -> Chart:
    overall = m.replay_rate
    title = "replays absorbed" + ("" if overall is None else f": {100 * overall:.1f}% of calls in all")
    proposals = {d: n for d, n, _ in m.gated_by_day}
    replays = dict(m.replays_by_day)
    days = sorted(d for d in set(proposals) | set(replays) if proposals.get(d, 0) + replays.get(d, 0))
    fig, ax = _figure()
    if not days:
        _empty(ax, "no gated call in this window")
        return _svg("replays", title, fig)
    rates = [100 * replays.get(d, 0) / (proposals.get(d, 0) + replays.get(d, 0)) for d in days]
    ax.plot(_dates(days), rates, marker="o", color="#2e86c1")
    _date_axis(ax, _dates(days))
    ax.set_ylim(bottom=0)
    ax.set_ylabel("% replays (same message again)")
    ax.set_title(title, loc="left")
    return _svg("replays", title, fig)


def _gated_by_model(m: Metrics) -> Chart:
    title = "gated proposals per 1,000 sessions, per model, per day"
    lines: dict[str, list[tuple[str, float]]] = {}
    for day, model, n, sessions in m.gated_by_model:
        rate = per_1000(n, sessions)
        if rate is not None:
            lines.setdefault(model, []).append((day, rate))
    fig, ax = _figure(len(lines))
    if not lines:
        _empty(ax, "no gated proposal in a day with sessions")
        return _svg("gated_by_model", title, fig)
    for model, points in sorted(lines.items()):
        # "model " first: matplotlib leaves out of the legend a label that starts with "_", and a
        # model id may (an unnamed series would be a line no one can tell apart)
        name = f"model {label(model)}" if model else "(no model id)"
        ax.plot(_dates([d for d, _ in points]), [r for _, r in points], marker="o", label=name)
    _date_axis(ax, _dates([d for d, _, _, _ in m.gated_by_model]))
    ax.set_ylim(bottom=0)
    ax.set_ylabel("gated proposals per 1,000 sessions")
    fig.legend(loc="outside right upper", fontsize=8, frameon=False)
    ax.set_title(title, loc="left")
    return _svg("gated_by_model", title, fig)


def _backlog(m: Metrics) -> Chart:
    title = f"needs_reconciliation backlog: {m.needs_reconciliation} now, by the day each began waiting"
    fig, ax = _figure()
    if not m.backlog_by_day:
        _empty(ax, "no operation awaits reconciliation")
        return _svg("backlog", title, fig)
    days = _dates([d for d, _ in m.backlog_by_day])
    ax.bar(days, [n for _, n in m.backlog_by_day], width=0.6, color=_MISSED)
    _date_axis(ax, days)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("records")
    ax.set_title(title, loc="left")
    return _svg("backlog", title, fig)
