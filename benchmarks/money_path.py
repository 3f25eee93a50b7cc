"""(b) The money path: propose, approve and execute a no-op money tool, against raw commits.

By the code (gate.py, _execution.py, _settle.py) the path is four write transactions, each one
commit: `call` -> `Proposals.propose` (1), `approve` (1), `execute` -> `execute_flow` in
`_execution.py` (verify the token, claim the key, mark the token used: 1) and
`Settlement.run_claimed` in `_settle.py` (store the result, mark executed: 1).
`count_commits` checks that on one untimed cycle; the baseline then times four `sqlite3`
commits of the same writes (see `_raw.py`), measured in the same run.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from effectgate import (
    Approver,
    CallContext,
    Effect,
    EffectGate,
    EffectTable,
    Grant,
    Pending,
    ToolSpec,
    open_store,
)

from ._raw import RawLedger
from ._timing import Plan, Stats, interleaved, paired_ratio

AGENT = "bench"
FINANCE = Approver("fiona", "finance")
EXPECTED_COMMITS = {"propose": 1, "approve": 1, "execute": 2}


@dataclass(frozen=True)
class MoneyResult:
    gated: Stats
    raw: Stats
    commits: dict[str, int]

    @property
    def ratio(self) -> float:
        return paired_ratio(self.gated, self.raw)


def count_commits(engine: sa.Engine, fn: Callable[[], Any]) -> tuple[int, Any]:
    """Write transactions (BEGIN IMMEDIATE ... COMMIT) that `fn` runs on `engine`."""
    writes = 0

    def on_execute(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        nonlocal writes
        if statement.strip().upper() == "BEGIN IMMEDIATE":
            writes += 1

    sa.event.listen(engine, "before_cursor_execute", on_execute)
    try:
        value = fn()
    finally:
        sa.event.remove(engine, "before_cursor_execute", on_execute)
    return writes, value


def run(directory: Path, plan: Plan) -> MoneyResult:
    runs = 0

    def pay(ref: str) -> dict[str, bool]:
        """Pay the reference (a no-op that counts its runs)."""
        nonlocal runs
        runs += 1
        return {"ok": True}

    store = open_store(f"sqlite:///{directory / 'money.db'}")
    store.setup()
    table = EffectTable(
        [ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance", subject=("ref",))]
    )
    table.allow(AGENT, ["pay"])
    gate = EffectGate(table, store)
    raw = RawLedger(directory / "raw-money.db")
    ids = itertools.count()

    def contexts(n: int) -> list[tuple[CallContext, dict[str, str]]]:
        out = []
        for _ in range(n):
            i = next(ids)
            ctx = CallContext(session_id=f"s{i}", origin_message_id="m1", user_id="u1", agent_id=AGENT)
            out.append((ctx, {"ref": f"r{i}"}))
        return out

    [(ctx, args)] = contexts(1)
    commits: dict[str, int] = {}
    commits["propose"], pending = count_commits(store.engine, lambda: gate.call("pay", args, ctx))
    if not isinstance(pending, Pending):
        raise RuntimeError(f"the money call did not pause: {pending!r}")
    commits["approve"], grant = count_commits(
        store.engine, lambda: gate.approve(pending.approval_id, version=pending.version, approver=FINANCE)
    )
    if not isinstance(grant, Grant):
        raise RuntimeError(f"the approval gave no grant: {grant!r}")
    commits["execute"], _ = count_commits(store.engine, lambda: gate.execute(grant.token))
    if runs != 1:
        raise RuntimeError(f"the money tool ran {runs} times for one approval")

    def gated(n: int) -> int:
        work = contexts(n)
        call, approve, execute = gate.call, gate.approve, gate.execute
        start = time.perf_counter_ns()
        for c, a in work:
            p = call("pay", a, c)
            if not isinstance(p, Pending):
                raise RuntimeError(f"the money call did not pause: {p!r}")
            g = approve(p.approval_id, version=p.version, approver=FINANCE)
            if not isinstance(g, Grant):
                raise RuntimeError(f"the approval gave no grant: {g!r}")
            execute(g.token)
        return time.perf_counter_ns() - start

    def raw_commits(n: int) -> int:
        cycle = raw.money_cycle
        start = time.perf_counter_ns()
        for _ in range(n):
            cycle()
        return time.perf_counter_ns() - start

    try:
        before = runs
        stats = interleaved({"gated": gated, "raw": raw_commits}, plan)
        cycles = plan.n * (plan.warmup + plan.repeats)
        if runs - before != cycles:
            raise RuntimeError(f"{cycles} approved cycles ran the tool {runs - before} times")
    finally:
        gate.close()
        store.close()
        raw.close()
    return MoneyResult(gated=stats["gated"], raw=stats["raw"], commits=commits)
