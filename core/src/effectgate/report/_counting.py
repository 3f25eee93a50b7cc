"""The report's figures, counted by the database: each store query is an aggregate grouped by the
database (`Store.report_rows`), so the report holds a few rows however large the ledger; only the
p95 reads one number per role (`Store.latency_p95`, the value at the p95 rank). The results are
`_figures`' dataclasses; see the package docstring for what each figure means."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import date, timedelta
from typing import Any, Literal

from ..canonical import digest
from ..stores.protocol import Store
from ..tokens import Keyring
from ._figures import UNDECIDED, Figures, Metrics, Mode, Rate, ToolRates
from ._verify import Found, backlog, bounds, set_apart, standing, unsealed

_EPOCH = date(1970, 1, 1)


def _targets(targets: Mapping[str, float] | None) -> dict[str, float]:
    """The p95 targets per role, each a finite number of seconds > 0 (as `--target` takes them)."""
    out = dict(targets or {})
    for role, t in out.items():
        if isinstance(t, bool) or not isinstance(t, int | float) or not (math.isfinite(t) and t > 0):
            raise ValueError(f"latency target of role {role!r}: {t!r} is not a finite number of seconds > 0")
    return out


def modes(store: Store) -> dict[str, Mode]:
    """Each recorded row fingerprint's mode, from bodies that hash to their fingerprint (a rule's
    seal row is no rule)."""
    out: dict[str, Mode] = {}
    for fingerprint, rule in store.rules().items():
        if rule.kind == "seal":
            continue
        try:  # ValueError too: NaN or an integer canonical JSON refuses (`digest`)
            body = json.loads(rule.body_json)
            hashes = isinstance(body, dict) and digest(body) == fingerprint
        except (ValueError, RecursionError):  # RecursionError: nested past the parser's depth
            continue
        if hashes:
            out[fingerprint] = "shadow" if body.get("shadow") is True else "live"
    return out


def edited_approvals(store: Store) -> set[str]:
    """Approvals a reviewer edited (an amendment recorded with `edited_by`)."""
    edited: set[str] = set()
    for event in store.events(kind="amended"):
        try:
            detail = json.loads(event.detail_json or "{}")
        except (ValueError, RecursionError):  # edited in: no edit (as the report's SQL reads it)
            continue
        if event.approval_id and isinstance(detail, dict) and detail.get("edited_by"):
            edited.add(event.approval_id)
    return edited


def _rates(rows: Sequence[tuple[Any, ...]], mode_of: Mapping[str, Mode], by: str) -> list[Rate]:
    groups: dict[tuple[str, Mode], Rate] = {}
    for tool, role, fingerprint, status, edited, _decided_at, n in rows:
        # None: an approval whose seal does not verify (`_verify.set_apart`)
        mode = "unverified" if fingerprint is None else mode_of.get(fingerprint, "unverified")
        tool, role = str(tool), str(role)  # SQLite keeps a blob edited into a text column: as text
        key = tool if by == "tool" else role
        groups.setdefault((key, mode), Rate(key, mode)).add(tool, status, bool(edited), int(n))
    return [groups[k] for k in sorted(groups)]


def _tool_rates(rates: list[Rate]) -> list[ToolRates]:
    """`rates` by tool, over both modes."""
    out: dict[str, ToolRates] = {}
    for r in rates:
        t = out.setdefault(r.key, ToolRates(r.key))
        t.decided += r.decided
        t.approved += r.approved
        t.denied += r.denied
        t.edited += r.edited
        t.expired += r.expired
        t.pending += r.undecided - r.expired
    return [out[k] for k in sorted(out)]


def _checked(
    store: Store, rows: Sequence[tuple[Any, ...]], found: Found | None, mode_of: Mapping[str, Mode]
) -> tuple[list[tuple[Any, ...]], int | None]:
    """The "decisions" aggregate with the approvals `_verify.unsealed` found set apart, and how
    many were (None: `found` is None, no seal was checked)."""
    if (broken := standing(found, mode_of)) is None:
        return list(rows), None
    if not broken:
        return list(rows), 0
    moved = set_apart(rows, broken, edited_approvals(store))
    return moved, sum(int(r[-1]) for r in moved if r[2] is None)


def _day(number: int) -> str | None:
    """A UTC day number (whole days since 1970-01-01) as an ISO date; None for a day at or past
    the calendar's ends (a time no clock gives: an edited row), which no per-day figure places."""
    try:
        day = _EPOCH + timedelta(days=int(number))
    except OverflowError:
        return None
    return day.isoformat() if date.min < day < date.max else None


def _by_day(rows: Sequence[tuple[Any, ...]]) -> list[tuple[str, int]]:
    """(day number, count) rows as (ISO day, count), in day order; a day `_day` cannot place is left out."""
    return sorted((day, int(n)) for d, n in rows if (day := _day(d)) is not None)


def disagreement(
    store: Store,
    *,
    by: Literal["tool", "role"] = "tool",
    since: float | None = None,
    until: float | None = None,
    keyring: Keyring | None = None,
) -> list[Rate]:
    """The rates per tool (or approver role) and mode, sorted by key then mode. With the ledger's
    `keyring`, an approval whose seal does not verify counts under mode "unverified"."""
    window, now = bounds(since, until), store.clock.now()  # pending past expiry: expired
    with store.reading() as conn:
        rows = store.report_rows(conn, "decisions", **window, now=now)
        broken = None if keyring is None else unsealed(store, conn, keyring, **window, now=now)
    mode_of = modes(store)  # the rules after the calls: see `figures`
    return _rates(_checked(store, rows, broken, mode_of)[0], mode_of, by)


def metrics(
    store: Store,
    *,
    since: float | None = None,
    until: float | None = None,
    targets: Mapping[str, float] | None = None,
    keyring: Keyring | None = None,
) -> Metrics:
    """p95 approval latency per role (against `targets`, seconds per role), replays absorbed,
    gated proposals per day against the sessions active that day (in all and per model), the
    decision rates per tool, and the reconciliation backlog."""
    return figures(store, since=since, until=until, targets=targets, keyring=keyring).metrics


def figures(
    store: Store,
    *,
    since: float | None = None,
    until: float | None = None,
    targets: Mapping[str, float] | None = None,
    keyring: Keyring | None = None,
) -> Figures:
    """Every figure of the report over calls proposed (events recorded) in [since, until), read in
    one read transaction: the disagreement rates by tool and role, and `metrics`. With the ledger's
    `keyring` every approval's seal is checked: one that does not verify counts under mode
    "unverified" (`Figures.unverified`); without it the figures say that no seal was checked."""
    window, goals = bounds(since, until), _targets(targets)
    now = store.clock.now()  # an approval pending past its expiry then is expired, not pending
    with store.reading() as conn:
        decisions = store.report_rows(conn, "decisions", **window, now=now)
        broken = None if keyring is None else unsealed(store, conn, keyring, **window, now=now)
        latencies: dict[str, int] = {}  # per role of any call not rejected: its decided calls
        proposals = 0
        for _tool, role, _fp, status, _edited, _decided_at, n in decisions:
            if status == "rejected":
                continue
            proposals += int(n)
            # whatever its decided_at column says: the p95 reads the decision's sealed record
            latencies[role] = latencies.get(role, 0) + (0 if status in UNDECIDED else int(n))
        p95s = {  # a role edited into another type (SQLite) as text, as `_rates` shows it
            str(role): store.latency_p95(conn, role, **window) if n else None
            for role, n in sorted(latencies.items(), key=lambda item: str(item[0]))
        }
        # a role with a target and no decided call is listed (no p95), never silently left out
        p95s = dict(sorted({**dict.fromkeys(goals), **p95s}.items()))
        gated = store.report_rows(conn, "gated_by_day", **window)
        sessions = dict(_by_day(store.report_rows(conn, "sessions_by_day", **window)))
        of_model = {
            (_day(d), str(m)): int(n) for d, m, n in store.report_rows(conn, "sessions_by_model", **window)
        }
        replayed = store.report_rows(conn, "replays_by_day", **window)
        waiting, erased = backlog(store, conn, keyring)
    by_day: dict[str, int] = defaultdict(int)
    by_model = []
    for d, model, n in gated:
        if (day := _day(d)) is None:
            continue
        by_day[day] += int(n)
        by_model.append((day, str(model), int(n), of_model.get((day, str(model)), 0)))
    # The rules read after the calls: a call's rule is recorded in its transaction and never
    # removed, so each fingerprint counted above names a rule read here (read before, a tool first
    # used meanwhile by another process would count as "unverified" with every seal verified).
    mode_of = modes(store)
    checked, unverified = _checked(store, decisions, broken, mode_of)
    by_tool = _rates(checked, mode_of, "tool")
    days = sorted(set(by_day) | set(sessions))
    return Figures(
        since=since,
        until=until,
        by_tool=by_tool,
        by_role=_rates(checked, mode_of, "role"),
        metrics=Metrics(
            since=since,
            until=until,
            latency_p95_s=p95s,
            latency_targets=goals,
            proposals=proposals,
            replays_absorbed=sum(int(n) for _, n in replayed),
            gated_by_day=[(d, by_day.get(d, 0), sessions.get(d, 0)) for d in days],
            needs_reconciliation=sum(n for _, n in waiting),
            gated_by_model=sorted(by_model),
            replays_by_day=_by_day(replayed),
            backlog_by_day=_by_day(waiting),
            backlog_erased=erased,
            decision_rates=_tool_rates(by_tool),
        ),
        unverified=unverified,
    )
