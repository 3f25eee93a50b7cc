"""Sandbox replay: would every recorded approval still verify, route and run the same way?

    report = replay(gate.store, table, policy)          # after a refactor or a table change
    for r in report.changed: print(r.approval_id, r.verdict, r.detail)

Each approved intent in the ledger (an approval that was approved: it ran, failed, awaits
reconciliation, or holds an unspent grant; whatever its status column says, one with an execution
recorded, and one a grant was minted for (its sealed count) that no denial revoked: `refused`,
tampered, when its status says it never was approved) is re-run through the current gate code
and the given table and policy, in a sandbox: a throwaway SQLite ledger, a fresh keyring, and every tool's
function replaced by a recorder (or the stub given for it), its snapshot and reconcile hooks
dropped, so nothing real is ever called, and no span reaches the application's tracer. Each
intent is proposed again with its recorded arguments and identity (session, origin message, user,
agent, run), approved by its recorded approvers in their recorded roles, and executed with the
grant. The verdict:

- `same`: it pauses for the recorded role and number of approvers, the recorded approvers'
  decisions grant it, and it runs once with exactly the recorded arguments (same args hash);
- `rerouted`: it would now run without approval, have another effect (a reclassified row), need
  another role or another number of approvers, or hash its arguments differently;
- `refused`: the current gate refuses it (the tool is gone or not allowed, the arguments no longer
  fit the schema, the caller is out of scope, a check fails, the recorded approvers may not decide,
  a stub raises: its definite failure or unknown outcome; an approved call still to run whose
  table row or policy changed since its proposal, whose grant `execute` would refuse),
  or its version has a recorded denial (a revoked grant never runs, whatever the status column says).

Each intent ends in the sandbox as it ended in the ledger, so a later intent's `confirm` check (a
refund's balance over the subject's history) counts what the ledger's own check counted: one whose
last recorded execution failed definitely (a card declined) fails there too (its recorder raises
`RecordedFailure`, a definite failure of every sandbox row), and one that never ran and never can
(its grant lapsed unpresented after its approval's deadline, as `effectgate.redact` tells it) is
granted and its grant revoked unpresented, never run.

Stored arguments are re-derived before they are used: an approval whose record no longer hashes
to its args hash is reported `refused` (tampered), never replayed. Given the ledger's `keyring`
(as `effectgate replay` does), so is an approval whose seal does not verify (erased or not), and a
decision whose seal does not verify is not one of its recorded approvers. An approval whose
arguments were erased by `effectgate.redact` cannot be replayed: it is listed in `redacted`, not
counted as changed; a redaction marker its redaction entry does not back (checked as the audit
does; given the keyring, only entries whose seal verifies count, so one inserted in the database
never hides the sealed one) is `refused` (tampered).
"""

from __future__ import annotations

import dataclasses
import json
import math
import tempfile
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ._audit_rows import is_shadow, marker_problem
from ._audit_sealed import sealed_entries
from ._ledger import context_of
from ._logging import quiet
from ._replayed import never_run, stale
from ._seal import approval_sealed, decision_intact
from ._telemetry import _api
from .canonical import hash_of_text
from .context import Approver
from .effects import Policy
from .errors import EffectGateError
from .gate import EffectGate
from .outcomes import Executed, Grant, Invalid, PartialApproval, Pending, Recorded, Refused
from .redact import is_redacted
from .report import modes
from .stores import open_store
from .stores.protocol import Store
from .stores.records import ApprovalRow, RedactedRow
from .table import EffectTable, ToolSpec
from .tokens import Keyring

Verdict = Literal["same", "rerouted", "refused"]
REPLAYED = ("approved", "executing", "executed", "failed", "needs_reconciliation")
_TAMPERED = "tampered: the stored record does not verify (its arguments, hash or seal)"
_DENIED = "tampered: the version has a recorded denial (its grant was revoked), whatever its status says"
_UNGRANTED = "tampered: a grant was minted for it (its sealed count), whatever its status says"
_REPLAYER = "effectgate-replay"  # who closes, in the sandbox, what an intent left waiting (`_close`)


@dataclass(frozen=True)
class Replayed:
    """One recorded intent and what the current gate would do with it."""

    approval_id: str
    version: int
    tool: str
    verdict: Verdict
    detail: str = ""


@dataclass(frozen=True)
class ReplayReport:
    results: tuple[Replayed, ...]
    calls: Mapping[str, list[dict[str, Any]]] = field(default_factory=dict[str, list[dict[str, Any]]])
    redacted: tuple[str, ...] = ()  # approvals whose arguments were erased: nothing left to replay

    @property
    def changed(self) -> tuple[Replayed, ...]:
        return tuple(r for r in self.results if r.verdict != "same")

    @property
    def clean(self) -> bool:
        return not self.changed

    def to_dict(self) -> dict[str, Any]:
        return {
            "clean": self.clean,
            "results": [dataclasses.asdict(r) for r in self.results],
            "redacted": list(self.redacted),
        }


class RecordedFailure(Exception):
    """A recorder's definite failure: the ledger recorded this intent's run as failed."""


class Recorder:
    """A stub tool: records each call's arguments, answers `{"stub": name}` (or, `failing`,
    raises `RecordedFailure`)."""

    def __init__(self, name: str, calls: dict[str, list[dict[str, Any]]]) -> None:
        self.name = name
        self.calls = calls
        self.failing = False

    def __call__(self, **kwargs: Any) -> Any:
        self.calls[self.name].append(kwargs)
        if self.failing:
            raise RecordedFailure(f"{self.name} failed, as the ledger recorded")
        return {"stub": self.name}


def sandbox_table(
    table: EffectTable, calls: dict[str, list[dict[str, Any]]], stubs: Mapping[str, Callable[..., Any]]
) -> EffectTable:
    """`table` with every tool's function a recorder (or its stub) and no snapshot or reconcile
    hook (they call the real system); schemas, roles, checks kept (`RecordedFailure` a definite
    failure of each row)."""
    specs = [
        dataclasses.replace(
            s,
            fn=stubs.get(s.name) or Recorder(s.name, calls),
            reconcile=None,
            snapshot=None,
            definite_failures=(*s.definite_failures, RecordedFailure),
        )
        for s in table
    ]
    sandbox = EffectTable(specs)
    for agent in table.agents():
        sandbox.allow(agent, table.allowlist(agent))
    return sandbox


def replay(
    store: Store,
    table: EffectTable,
    policy: Policy | None = None,
    *,
    stubs: Mapping[str, Callable[..., Any]] | None = None,
    keyring: Keyring | None = None,
) -> ReplayReport:
    """Replay every approved intent of `store` against `table` and `policy` in a sandbox (see
    the module docstring). `store` is only read; with its `keyring`, only sealed rows count."""
    calls: dict[str, list[dict[str, Any]]] = defaultdict(list)
    approvers: dict[tuple[str, int], list[Approver]] = defaultdict(list)
    denied: set[tuple[str, int]] = set()  # versions with a denial: the gate never runs them
    for d in store.all_decisions():
        if d.decision == "deny" and (keyring is None or decision_intact(keyring, d)):
            denied.add((d.approval_id, d.version))
        if d.decision == "approve" and (keyring is None or decision_intact(keyring, d)):
            try:
                approver = Approver(d.approver_id, d.role)
            except (TypeError, ValueError):  # no approver's id and role: edited in, none of them
                continue
            approvers[(d.approval_id, d.version)].append(approver)
    # what ran is read from the append-only executions, not from the status column (no seal covers it)
    last: dict[str, str] = {}  # each approval's last recorded outcome, in id order
    for ex in store.executions():
        if ex.approval_id is not None:
            last[ex.approval_id] = str(ex.status)
    ran = set(last)
    rows = [r for r in store.approvals() if r.status in REPLAYED or r.id in ran or _granted(r, denied)]
    rows.sort(key=_order)
    erased = sealed_entries(store, keyring) if any(is_redacted(r.args_json) for r in rows) else {}
    # a marker no (sealed) redaction entry backs erased nothing: the row is tampered, replayed as such
    forged = {r.id for r in rows if is_redacted(r.args_json) and _forged(erased, keyring, r)}
    redacted = tuple(r.id for r in rows if is_redacted(r.args_json) and r.id not in forged)
    rows = [r for r in rows if not is_redacted(r.args_json) or r.id in forged]
    shadow = {f for f, mode in modes(store).items() if mode == "shadow"}
    never = never_run(store, rows, ran)
    to_run = {r.id for r in rows if r.status == "approved" and r.id not in ran and r.id not in never}
    results: list[Replayed] = []
    with tempfile.TemporaryDirectory(prefix="effectgate-replay-") as where:
        sandbox_store = open_store(f"sqlite:///{Path(where) / 'sandbox.db'}")
        sandbox_store.setup()
        gate = EffectGate(
            sandbox_table(table, calls, stubs or {}),
            sandbox_store,
            policy=policy,
            keyring=Keyring.generate(),
            tracer_provider=_no_spans(),  # not the application's global tracer: nothing here ran
        )
        try:
            with quiet():  # its proposals and executions are not the application's: not logged
                for row in rows:
                    recorded = approvers[(row.id, row.version)]
                    if row.id in forged or (keyring is not None and not approval_sealed(keyring, row)):
                        results.append(Replayed(row.id, row.version, str(row.tool), "refused", _TAMPERED))
                        continue
                    if (row.id, row.version) in denied:  # its status says otherwise: edited
                        results.append(Replayed(row.id, row.version, str(row.tool), "refused", _DENIED))
                        continue
                    if row.status not in REPLAYED and row.id not in ran:  # granted: its status edited
                        results.append(Replayed(row.id, row.version, str(row.tool), "refused", _UNGRANTED))
                        continue
                    # proposed in shadow mode: its recorded row says so, or its (sealed) subject key
                    was_shadow = row.row_fingerprint in shadow or is_shadow(None, str(row.subject_key))
                    live = row.id in to_run and not was_shadow  # a grant still to run
                    if (changed := stale(row, table, policy or Policy()) if live else None) is not None:
                        results.append(Replayed(row.id, row.version, str(row.tool), "refused", changed))
                        continue
                    results.append(
                        _one(
                            gate,
                            row,
                            recorded,
                            calls,
                            shadow=was_shadow,
                            run=row.id not in never,
                            failed=last.get(row.id) == "failed",
                        )
                    )
                    if results[-1].verdict != "same":
                        _close(gate, sandbox_store)
        finally:
            gate.close()
            sandbox_store.close()
    return ReplayReport(tuple(results), dict(calls), redacted)


def _one(
    gate: EffectGate,
    row: ApprovalRow,
    approvers: list[Approver],
    calls: dict[str, list[dict[str, Any]]],
    *,
    shadow: bool,
    run: bool = True,
    failed: bool = False,
) -> Replayed:
    """One intent; `shadow`: it was proposed in shadow mode (its recorded row says so), so the same
    is a shadow proposal that its recorded approvers approve and that never runs. `run` False: it
    never ran and never can (`_replayed.never_run`), so its grant is revoked unpresented; `failed`: its last
    recorded run failed definitely, so its recorder fails it again."""

    def verdict(kind: Verdict, detail: str = "") -> Replayed:
        return Replayed(row.id, row.version, str(row.tool), kind, detail)

    try:  # the hash is no seal, and SQLite keeps a value of another type edited into a column
        if hash_of_text(row.tool, row.args_json) != row.args_hash:
            return verdict("refused", _TAMPERED)
        args = json.loads(row.args_json)
        ctx = context_of(row)
    except (TypeError, ValueError, RecursionError):  # not text, not JSON, no identity
        return verdict("refused", _TAMPERED)
    before = len(calls[row.tool])
    try:
        out = gate.call(row.tool, args, ctx)
        if isinstance(out, Invalid):
            return verdict("refused", f"invalid: {out.message}")
        if isinstance(out, Refused) and out.code == "shadow" and out.approval_id is not None:
            if not shadow:
                return verdict("rerouted", "the row is in shadow mode now: it would not run")
            return _shadow_same(gate, out.approval_id, approvers, verdict)
        if isinstance(out, Refused):
            return verdict("refused", f"{out.code}: {out.message}")
        if shadow:
            return verdict(
                "rerouted", "proposed in shadow mode; the row is live now (it would pause and run)"
            )
        if isinstance(out, Executed):
            spec = gate.table.get(row.tool)
            effect = spec.effect if spec is not None else "?"
            return verdict("rerouted", f"runs without approval now (its row is {effect}, was {row.effect})")
        assert isinstance(out, Pending)
        card = out.card
        if card.effect != row.effect:  # reclassified (money to send), whoever approves it
            return verdict("rerouted", f"its row is {card.effect} now, was {row.effect}")
        if card.args_hash != row.args_hash:
            return verdict("rerouted", "its arguments hash differently now")
        if (card.approver_role, card.approvals_required) != (row.approver_role, row.approvals_required):
            return verdict(
                "rerouted",
                f"needs {card.approvals_required} x {card.approver_role} now, was "
                f"{row.approvals_required} x {row.approver_role}",
            )
        grant = None
        for approver in approvers:
            decision = gate.approve(out.approval_id, version=out.version, approver=approver)
            if isinstance(decision, Grant):
                grant = decision
                break
            if isinstance(decision, Recorded):
                return verdict("rerouted", "the row is in shadow mode now: it would not run")
            assert isinstance(decision, PartialApproval)
        if grant is None:
            return verdict("refused", f"the recorded approvers ({len(approvers)}) do not grant it now")
        if not run:  # lapsed: revoked, it holds nothing a later intent's checks count
            gate.deny(out.approval_id, approver=Approver(_REPLAYER, card.approver_role), reason="lapsed")
            return verdict("same")
        fn = gate.table.get(row.tool)
        recorder = fn.fn if fn is not None and isinstance(fn.fn, Recorder) else None
        try:
            if recorder is not None:
                recorder.failing = failed
            gate.execute(grant.token)
        except RecordedFailure:
            pass  # failed as it did in the ledger: its subject is free again
        except EffectGateError:
            raise
        except Exception as exc:  # a stub's definite failure: recorded failed, raised as it was
            return verdict("refused", f"the stub failed: {type(exc).__name__}: {exc}")
        finally:
            if recorder is not None:
                recorder.failing = False
    except EffectGateError as exc:
        return verdict("refused", f"{type(exc).__name__}: {exc}")
    ran = calls[row.tool][before:]
    if ran != [args] and not _stubbed(gate.table.get(row.tool)):
        return verdict("rerouted", f"ran {len(ran)} times or with other arguments")
    return verdict("same")


def _shadow_same(
    gate: EffectGate, approval_id: str, approvers: list[Approver], verdict: Callable[..., Replayed]
) -> Replayed:
    """A shadow proposal again: its recorded approvers must complete its approval (nothing runs)."""
    decision = None
    for approver in approvers:
        decision = gate.approve(approval_id, version=1, approver=approver)
    if isinstance(decision, Recorded) and decision.complete:
        return verdict("same")
    return verdict("refused", f"the recorded approvers ({len(approvers)}) do not approve it now")


def _close(gate: EffectGate, sandbox: Store) -> None:
    """Deny what an intent that did not replay the same left waiting in the sandbox (a proposal
    rerouted, or granted and refused): it must not hold its subject or its session's quota when
    the next intent is proposed (each intent is judged on its own)."""
    for a in sandbox.approvals(status=["pending", "approved"]):
        try:
            closer = Approver(_REPLAYER, a.approver_role)
            gate.deny(a.id, approver=closer, reason="replayed", version=a.version)
        except EffectGateError:  # a grant already presented, or a shadow call: it holds nothing live
            continue


def _order(row: ApprovalRow) -> tuple[float, str]:
    """Replay order: by proposal time (text edited into a SQLite column: last), then id."""
    created: object = row.created_at
    return (created if isinstance(created, int | float) else math.inf, str(row.id))


def _forged(
    erased: Mapping[tuple[str, str, str], RedactedRow], keyring: Keyring | None, row: ApprovalRow
) -> bool:
    """A redaction marker in `row`'s arguments that its redaction entry does not back (as the audit
    checks it: `_audit_rows.marker_problem`; with `keyring`, the entry's seal too), or, with
    `keyring`, on an approval whose own seal does not verify (edited since: never "erased")."""
    if keyring is not None and not approval_sealed(keyring, row):
        return True
    entry = erased.get(("eg_approvals", row.id, "args_json"))
    return marker_problem(entry, keyring, row.args_json, row.args_hash) is not None


def _granted(row: ApprovalRow, denied: set[tuple[str, int]]) -> bool:
    """A grant was minted for `row` (its sealed count) and no denial revoked it: an approved intent,
    whatever its status column (no seal covers it) says."""
    revoked = row.status == "denied" and (row.id, row.version) in denied
    return type(row.grants) is int and row.grants > 0 and not revoked


def _no_spans() -> object | None:
    """A tracer provider that records nothing (None without OpenTelemetry: no spans anyway)."""
    api = _api()
    return None if api is None else api[0].NoOpTracerProvider()


def _stubbed(spec: ToolSpec | None) -> bool:
    """A stub the caller gave records nothing here: its calls cannot be compared."""
    return spec is not None and not isinstance(spec.fn, Recorder)


__all__ = ["RecordedFailure", "ReplayReport", "Replayed", "Verdict", "replay", "sandbox_table"]
