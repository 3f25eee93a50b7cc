"""The audit scan, its metrics, and the JSONL export, all from the stored rows.

A clean audit means: nothing ran that the table, at the time, did not allow. The scan re-derives
everything it checks from the rows themselves, never trusting a stored copy of a conclusion:

- every hash is recomputed from the stored arguments (approvals and executions); arguments erased by
  `effectgate.redact` are accepted only with their sealed redaction entry, which names the hash they had
  and the facts kept (a marker without one, or an unsealed entry beside it, is `redaction_forged`);
- every approval and decision seal is verified with the keyring (when one is given), and each approval's
  status (no seal covers it) against its sealed grants and denial (`status_tampered`);
- the table row and the policy each approval was made under are read from `eg_rules` (their
  canonical form, checked against its fingerprint), and the required role and number of distinct
  approvers are derived from them and compared with what was recorded and what was decided;
- every gated execution needs its approval, the same args hash, the executed version, enough
  distinct, validly sealed approvers holding the required role in the round that minted its last
  grant (as at execute; none if a sealed release gave it back), no sealed denial of that version
  (a revoked grant: the gate refuses to run it whatever the status column says), and ran once;
- every execution is checked against the recorded table row it names: a row not recorded for its
  tool (with the keyring: not sealed by it, `_seal.rule_seal`, unless it is the row of the
  execution's sealed approval), or an unsealed (or no) policy that alone lets it run unapproved, is
  `rule_missing`, a gated row (under its policy) run unapproved is `no_approval` whatever its
  `effect` column says, one that differs from the row's is `reclassified`, and a call proposed in
  shadow mode (its row, or its approval's, a shadow row) that ran is `shadow_executed`;
- a policy that lets send, money or destructive calls run alone, or drops the second approver of
  destructive calls, is reported wherever an approval or execution was made under it.

Each kind of finding has its own code (`FindingKind`). The scan streams rows as tuples (never
ORM objects) and leaves counting to SQL: the event log, the largest table, is only aggregated.
Checking is CPU-bound (every seal is an HMAC, every hash recomputed), so a large ledger on a file
or server database is split at its median approval id and the upper half is scanned by a forked
child on its own connection, with the same checks; its findings follow the lower half's, in the
order one scan would report them (`_fork_half`). Each approval is read with its decisions and
executions in one transaction of one process.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import threading
from collections import Counter
from collections.abc import Callable, Generator, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection as Pipe
from typing import Any

from . import _audit_rows as col
from . import _pins
from ._audit_rows import Finding, FindingKind
from ._audit_scan import Scan
from ._audit_sealed import backing, hidden_entry, orphaned
from ._seal import seal_rules
from .chain import verify_chain
from .effects import Policy
from .report._figures import APPROVED, p95
from .stores._aggregates import AggregateSQL
from .stores._queries import AuditTable
from .stores.protocol import Store
from .table import EffectTable
from .tokens import Keyring

__all__ = ["AuditReport", "Finding", "FindingKind", "Metrics", "audit", "export_jsonl", "seal_rules"]


@dataclass(frozen=True)
class Metrics:
    approval_latency_p95_s: float | None
    approved: int
    denied: int
    expired: int
    rejected: int
    replays_absorbed: int
    gated_proposals: int
    sessions: int
    gated_proposals_per_1000_sessions: float
    executions: int


#: The note of an audit given pins that pin nothing (`audit(pinned={})`).
PINNED_NOTHING = (
    "the manifest pins no chain heads (it was exported from a ledger with no checkpoints): "
    "nothing was checked against its pins"
)


@dataclass(frozen=True)
class AuditReport:
    """`notes`: what the reader must know about what was checked, not a finding (still clean)."""

    findings: list[Finding] = field(default_factory=list[Finding])
    metrics: Metrics | None = None
    seals_checked: bool = True
    notes: tuple[str, ...] = ()

    @property
    def clean(self) -> bool:
        return not self.findings

    def to_dict(self) -> dict[str, Any]:
        return {
            "clean": self.clean,
            "seals_checked": self.seals_checked,
            "notes": list(self.notes),
            "findings": [asdict(f) for f in self.findings],
            "metrics": asdict(self.metrics) if self.metrics else None,
        }


def audit(
    store: Store,
    table: EffectTable | None = None,
    policy: Policy | None = None,
    *,
    keyring: Keyring | None = None,
    chain: bool = False,
    pinned: Mapping[str, Any] | None = None,
) -> AuditReport:
    """Scan the store (see the module docstring). With `table`, also compare every executed approval
    against the table as it is now (a reclassification shows). With `keyring` (the gate's), every seal
    is verified; without one, `seals_checked` is False. `policy` is accepted for compatibility: the scan
    uses the policy recorded with each approval and execution. With `chain` (and `keyring`), the
    ledger's own hash chain is recomputed too (`effectgate.chain`): a checkpointed row deleted, inserted
    or edited is a `chain_broken` finding. `pinned`: the chain heads an export's manifest pinned
    (`Manifest.heads`, its signature checked by the caller); each one no longer in the chain as pinned
    is a `chain_broken` finding too (`effectgate._pins`); pins mean nothing without the chain verified
    up to them, so `pinned` implies `chain`; `chain` needs the keyring (ValueError without one, before
    anything is read). Pins that pin nothing (`{}`: a manifest exported from a ledger with no
    checkpoints) are no finding, but the report says so in its `notes`."""
    del policy
    chain = chain or pinned is not None
    if chain and keyring is None:
        raise ValueError("audit(chain=True or pinned=...) needs the keyring: its checkpoints are signed")
    scan = Scan(store, table, keyring)
    half = _fork_half(store, scan)  # the upper half of a large ledger, in a second process
    if half is None:
        with store.reading() as conn:
            _scan_range(scan, store, conn)
            for ex in store.audit_rows(conn, "other_executions"):
                scan.executed(ex, {})
            counts = store.audit_counts(conn)
            forged = _forged_markers(scan, store, conn)
    else:
        # The event log is counted by the database on a connection of its own meanwhile (SQLite
        # counts in C without the GIL): it keeps the two processes' shares of the work even.
        # The values that start like an erasure marker are checked there too (`_forged_markers`).
        with ThreadPoolExecutor(max_workers=1) as pool:
            counted = pool.submit(_counts, store)
            marked = pool.submit(_forged_markers_apart, scan, store)
            with store.reading() as conn:
                try:
                    _scan_range(scan, store, conn, high=half.split)
                except BaseException:
                    half.stop()
                    raise
                part = half.result()
                _merge(scan, part or _half_here(scan, store, conn, half.split))
                for ex in store.audit_rows(conn, "other_executions"):
                    scan.executed(ex, {})
            counts = counted.result()
            forged = marked.result()
    statuses = scan.statuses
    proposals = sum(statuses.values()) - statuses["rejected"]
    sessions = counts["sessions"]
    metrics = Metrics(
        approval_latency_p95_s=p95(scan.latencies),
        approved=sum(statuses[s] for s in APPROVED),  # then run, failed, or awaiting reconciliation
        denied=statuses["denied"],
        expired=statuses["expired"],
        rejected=statuses["rejected"],
        replays_absorbed=counts["replays"],
        gated_proposals=proposals,
        sessions=sessions,
        gated_proposals_per_1000_sessions=(1000.0 * proposals / sessions) if sessions else 0.0,
        executions=scan.succeeded,
    )
    scan.findings.extend(forged)  # after every row's own findings, in one order either way
    if chain and keyring is not None:  # checked above
        for b in verify_chain(store, keyring):  # its entries read with its rows (one snapshot)
            scan.add("chain_broken", b.table, f"ids {b.first_id}..{b.last_id}: {b.problem}")
    for b in _pins.breaks(store, pinned):
        scan.add("chain_broken", b.table, f"up to id {b.last_id}: {b.problem}")
    notes = (PINNED_NOTHING,) if pinned is not None and not pinned else ()
    return AuditReport(scan.findings, metrics, seals_checked=keyring is not None, notes=notes)


def _scan_range(
    scan: Scan, store: Store, conn: Any, *, low: str | None = None, high: str | None = None
) -> None:
    """Check the approvals whose id is in [low, high) with their decisions and executions (and
    the executions whose approval id is in the range but names no approval)."""

    def rows(what: AuditTable) -> Generator[tuple[Any, ...], None, None]:
        if low is None and high is None:
            yield from store.audit_rows(conn, what)
        else:
            assert isinstance(store, AggregateSQL)  # only an SQL store is split (`_fork_half`)
            yield from store.audit_rows(conn, what, low=low, high=high)

    # Three streams ordered by approval id, merged: each approval is checked with its own decisions
    # and executions, nothing kept once done (memory stays flat); stepped by hand, one row ahead (most
    # approvals have one decision and one run), and closed here even if a check raises.
    decisions = _texts(rows("decisions"), col.D_APPROVAL, lambda d: None)  # allows nothing
    executions = _texts(rows("gated_executions"), col.E_APPROVAL, lambda ex: scan.executed(ex, {}))
    with closing(decisions), closing(executions), closing(rows("approvals")) as approvals:
        d, ex = next(decisions, None), next(executions, None)
        for a in approvals:
            approval_id = a[col.A_ID]
            if type(approval_id) is not str:  # no decision or execution names it (`_texts`)
                scan.approval(a, [])
                continue
            while ex is not None and ex[col.E_APPROVAL] < approval_id:  # its approval does not exist
                scan.executed(ex, {})
                ex = next(executions, None)
            while d is not None and d[col.D_APPROVAL] < approval_id:  # decisions of no approval
                d = orphaned(d, decisions, scan.decision_sealed, scan.findings)
            mine: list[tuple[Any, ...]] = []
            while d is not None and d[col.D_APPROVAL] == approval_id:
                mine.append(d)
                d = next(decisions, None)
            bar = scan.approval(a, mine)
            runs: dict[str, int] = {}
            while ex is not None and ex[col.E_APPROVAL] == approval_id:
                scan.executed(ex, runs, bar)
                ex = next(executions, None)
        while ex is not None:
            scan.executed(ex, {})
            ex = next(executions, None)
        while d is not None:
            d = orphaned(d, decisions, scan.decision_sealed, scan.findings)


def _texts(
    stream: Iterator[tuple[Any, ...]], at: int, other: Callable[[tuple[Any, ...]], None]
) -> Generator[tuple[Any, ...], None, None]:
    """The rows whose approval id (column `at`) is text; each other one (a blob SQLite kept) to `other`."""
    for row in stream:
        if type(row[at]) is str:
            yield row
        else:
            other(row)


#: From this many approvals on, the upper half of the approval ids is scanned in a second
#: process while this one scans the lower half (below it, starting the process costs more).
PARALLEL_FROM = 20_000


@dataclass(frozen=True)
class Part:
    """What a scan of one range of approval ids found (`_part`, `_merge`)."""

    findings: list[Finding]
    weakened: dict[int, str]  # index in findings -> the policy its policy_weakened finding names
    statuses: Counter[str]
    latencies: list[float]
    succeeded: int


def _part(scan: Scan) -> Part:
    return Part(scan.findings, scan.weakened, scan.statuses, scan.latencies, scan.succeeded)


def _merge(scan: Scan, part: Part) -> None:
    """Add the findings and counts of the scan of a later range of approval ids, as if `scan`
    had gone on into it: a weakened policy is still reported once, where first seen."""
    for i, finding in enumerate(part.findings):
        policy = part.weakened.get(i)
        if policy is not None:
            if policy in scan.reported_policies:
                continue
            scan.reported_policies.add(policy)
            scan.weakened[len(scan.findings)] = policy
        scan.findings.append(finding)
    scan.statuses.update(part.statuses)
    scan.latencies.extend(part.latencies)
    scan.succeeded += part.succeeded


@dataclass
class _Half:
    """The scan of the approvals from `split` on, running in a forked child."""

    split: str
    process: Any
    pipe: Pipe

    def result(self) -> Part | None:
        """The child's findings and counts, once it has ended; None if it failed (scanned here)."""
        try:
            part = self.pipe.recv()
        except (EOFError, OSError):
            part = None
        finally:
            self.pipe.close()
            self.process.join()
        return part if isinstance(part, Part) else None

    def stop(self) -> None:
        """End the child now (this process gave up on the scan)."""
        self.pipe.close()
        self.process.terminate()
        self.process.join()


def _fork_half(store: Store, scan: Scan) -> _Half | None:
    """Scan the upper half of a large ledger's approvals in a forked child (CPU-bound: a second core
    halves it). None for a store not a file or server SQL store, a small ledger, one core, no safe
    fork (not Linux, or other threads, whose locks a child would copy) or none (daemonic, fork fails)."""
    if (
        not isinstance(store, AggregateSQL)
        or not sys.platform.startswith("linux")  # fork is safe there (not so on macOS)
        or len(os.sched_getaffinity(0)) < 2
        or threading.active_count() > 1
        or multiprocessing.current_process().daemon
    ):
        return None
    with store.reading() as conn:
        split = store.audit_split(conn, at_least=PARALLEL_FROM)
    if split is None:
        return None
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(store, scan, split, send), daemon=True)
    with closing(send):  # the child's end of the pipe: the child has its own copy
        try:
            process.start()
        except OSError:  # no process to be had (a limit on processes, or memory): scanned here
            receive.close()
            return None
    return _Half(split, process, receive)


def _child(store: Store, scan: Scan, split: str, send: Pipe) -> None:
    """The forked child: scan [split, end) on its own connection, send what it found (if it can)."""
    try:
        assert isinstance(store, AggregateSQL)
        store.audit_forked()
        with store.reading() as conn:
            _scan_range(scan, store, conn, low=split)
        send.send(_part(scan))
    finally:
        send.close()


def _counts(store: Store) -> Mapping[str, int]:
    with store.reading() as conn:
        return store.audit_counts(conn)


def _half_here(scan: Scan, store: Store, conn: Any, split: str) -> Part:
    """Scan [split, end) here, in this transaction (no child did), merged as the child's would be."""
    own = Scan(store, scan.table, scan.keyring)
    _scan_range(own, store, conn, low=split)
    return _part(own)


def _forged_markers(scan: Scan, store: Store, conn: Any) -> list[Finding]:
    """Check every stored value that starts like a redaction marker against its sealed entry
    (`col.marker_problem`), in every personal column of every table: the database picks them out, so a
    ledger with nothing erased costs one filtered pass per table. The arguments `Scan` checks (every
    approval's, every execution's that ran) are not checked twice. A marker with no entry in the scan's
    copy has the entries read again once, in this transaction (a redaction that committed since writes
    its markers and entries together). Then each entry hidden beside one that backs its value (`backing`)."""
    found: list[Finding] = []
    (redacted, hidden), reread = (scan.redacted, scan.hidden), False
    for table, key, (approval_id, tool, args_hash, status), texts in store.marked_values(conn):
        for column, text in texts.items():
            arguments = column == "args_json"
            if arguments and (table == "eg_approvals" or (table == "eg_executions" and col.ran(status))):
                continue
            where = (table, key, column)
            if where not in redacted and not reread:
                (redacted, hidden), reread = backing(store.redacted(conn), scan.keyring), True
            problem = col.marker_problem(
                redacted.get(where), scan.keyring, text, args_hash if arguments else None
            )
            if problem is not None:
                ex = int(key) if table == "eg_executions" else None
                detail = f"{column} of {table} {key}: {problem}"
                found.append(Finding("redaction_forged", tool or "", detail, approval_id, ex))
    return found + [hidden_entry(e) for e in hidden]


def _forged_markers_apart(scan: Scan, store: Store) -> list[Finding]:
    with store.reading() as conn:
        return _forged_markers(scan, store, conn)


def export_jsonl(store: Store) -> Iterator[str]:
    """Every row of every effectgate table (`eg_*`: the schema version, approvals, intent keys,
    decisions, events, executions, idempotency records, rules, redaction entries, holds and
    checkpoints), one JSON object a line tagged by the table's name without `eg_`, each table in
    key order, read in one transaction and streamed (memory stays flat). Unsigned: `export_chain`
    writes the signed, verifiable export."""
    for table, row in store.every_row():
        yield json.dumps({"table": table.removeprefix("eg_"), **row}, sort_keys=True, default=str)
