"""One step of the crash proofs, in a fresh process: recover the last intent, run the next, die.

    python -m tests.proofs._executor '<job json>'      (cwd: the repository root)

The job holds `url` (the store), `keyring` (`Keyring.dumps()` text), `provider` (its base URL),
`lookups` (whether the provider can be asked by key), `shift` (how far the recovering clock runs
ahead of the wall clock), `recover` and `execute` (each null or {approval_id, token}) and `kill`:
null, {"seam": "claim" | "provider" | "stored"} or {"statement": k}.

Recovery runs first on its own store and gate, with the shifted clock: `gate.recover()`, then,
if the approval is still approved with no idempotency record (the first process died before
its claim committed), the same token is executed again. Execution then runs on a store with the
wall clock and SIGKILLs this process where `kill` says: at the start of the tool (after the
claim), after the provider answered (before the result is stored), right after
`gate.execute` returned (before reporting), or after the k-th SQL statement the execution issued.

Each stage prints one JSON line and flushes it: {"notified": ...} from the reconciliation hook,
{"recovered": ...}, {"executed": ...} with the number of statements the execution issued.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

import sqlalchemy as sa

from effectgate import EffectGate, Keyring, ReconciliationNotice, open_store
from effectgate._execution import exec_key

from ._money import LaterClock, Refunds, money_table


def report(**line: Any) -> None:
    print(json.dumps(line, default=str), flush=True)


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def notified(notice: ReconciliationNotice) -> None:
    report(notified=notice.key, approval_id=notice.approval_id, role=notice.approver_role)


def recover(job: dict[str, Any], keyring: Keyring) -> None:
    clock = LaterClock(job["shift"])
    store = open_store(job["url"], clock=clock)
    refunds = Refunds(job["provider"], lookups=job["lookups"])
    gate = EffectGate(
        money_table(refunds), store, keyring=keyring, clock=clock, on_needs_reconciliation=notified
    )
    touched = gate.recover()
    approval_id, token = job["recover"]["approval_id"], job["recover"]["token"]
    row = store.get_approval(approval_id)
    assert row is not None, approval_id
    reran = False
    if row.status == "approved" and store.get(exec_key(row)) is None:
        gate.execute(token)
        reran = True
    report(recovered=approval_id, touched=touched, reran=reran)
    gate.close()
    refunds.close()
    store.close()


def execute(job: dict[str, Any], keyring: Keyring) -> None:
    kill = job["kill"] or {}
    seam, at = kill.get("seam"), kill.get("statement")
    store = open_store(job["url"])
    statements = 0

    def counted(*_: Any) -> None:
        nonlocal statements
        statements += 1
        if statements == at:
            die()

    refunds = Refunds(
        job["provider"],
        lookups=job["lookups"],
        before_call=die if seam == "claim" else None,
        after_response=die if seam == "provider" else None,
    )
    gate = EffectGate(money_table(refunds), store, keyring=keyring, on_needs_reconciliation=notified)
    # Count only the execution's statements (not the gate's schema check on construction).
    sa.event.listen(store.engine, "after_cursor_execute", counted)
    outcome = gate.execute(job["execute"]["token"])
    if seam == "stored":
        die()
    report(executed=job["execute"]["approval_id"], replay=outcome.replay, statements=statements)
    gate.close()
    refunds.close()
    store.close()


def main(argv: list[str]) -> None:
    job = json.loads(argv[0])
    keyring = Keyring.parse(job["keyring"])
    if job.get("recover"):
        recover(job, keyring)
    if job.get("execute"):
        execute(job, keyring)


if __name__ == "__main__":
    main(sys.argv[1:])
