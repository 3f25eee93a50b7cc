"""(b) The money path: propose, approve and execute a no-op money tool, against raw commits.

By the code (gate.py, _execution.py, _settle.py) the path is four write transactions, each one
commit: `call` -> `Proposals.propose` (1), `approve` (1), `execute` -> `execute_flow` in
`_execution.py` (verify the token, claim the key, mark the token used: 1) and
`Settlement.run_claimed` in `_settle.py` (store the result, mark executed: 1).
`count_commits` checks that on one untimed cycle. The peer the targets hold against is the
database's own work for what the gate commits: a second untimed cycle's write statements are
recorded from the store's engine, and `_raw.SameWrites` replays those rows (fresh ids each cycle)
through plain `sqlite3` on a database the store set up, in the same four transactions. Beside it,
`_raw.RawLedger` writes small rows into a minimal schema of its own (`minimal`: what the gate's
wider rows, seals and indexes cost on top). All three are interleaved in the same run.
"""

from __future__ import annotations

import itertools
import time
import uuid
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

from ._raw import RawLedger, SameWrites, Statement
from ._timing import Plan, Stats, interleaved, paired_ratio

AGENT = "bench"
FINANCE = Approver("fiona", "finance")
EXPECTED_COMMITS = {"propose": 1, "approve": 1, "execute": 2}
EVENTS_PER_CYCLE = 5  # proposed, approved, token_minted, token_used, executed


@dataclass(frozen=True)
class MoneyResult:
    gated: Stats
    raw: Stats  # the same writes (`SameWrites`): the peer the targets hold against
    minimal: Stats  # small rows in a minimal schema (`RawLedger`)
    commits: dict[str, int]

    @property
    def ratio(self) -> float:
        return paired_ratio(self.gated, self.raw)

    @property
    def minimal_ratio(self) -> float:
        return paired_ratio(self.gated, self.minimal)


def count_commits(engine: sa.Engine, fn: Callable[[], Any]) -> tuple[int, Any]:
    """Write transactions (BEGIN IMMEDIATE ... COMMIT) that `fn` runs on `engine`."""
    transactions, value = record_writes(engine, fn)
    return len(transactions), value


def record_writes(engine: sa.Engine, fn: Callable[[], Any]) -> tuple[list[list[Statement]], Any]:
    """The write statements `fn` runs on `engine` with their parameters, grouped by transaction
    (each BEGIN IMMEDIATE starts one); reads are left out."""
    transactions: list[list[Statement]] = []

    def on_execute(_conn: Any, _cursor: Any, statement: str, parameters: Any, _ctx: Any, many: bool) -> None:
        text = statement.strip().upper()
        if text == "BEGIN IMMEDIATE":
            transactions.append([])
        elif not text.startswith("SELECT"):
            if not transactions:
                raise RuntimeError(f"a write outside a transaction: {statement}")
            if many:
                parameters = [tuple(row) for row in parameters]
            elif isinstance(parameters, dict):
                parameters = dict(parameters)
            else:
                parameters = tuple(parameters)
            transactions[-1].append((statement, parameters, many))

    sa.event.listen(engine, "before_cursor_execute", on_execute)
    try:
        value = fn()
    finally:
        sa.event.remove(engine, "before_cursor_execute", on_execute)
    return transactions, value


def _inserted(transactions: list[list[Statement]], table: str, column: str) -> str:
    """The value of `column` in the recorded INSERT into `table` (named parameters)."""
    for tx in transactions:
        for sql, params, many in tx:
            if sql.startswith(f"INSERT INTO {table} ") and not many and isinstance(params, dict):
                return str(params[column])
    raise RuntimeError(f"the recorded cycle has no INSERT INTO {table} with {column}")


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
            # 32 hex digits, as long as the recorded cycle's random ones: the same row sizes
            session, ref = f"{next(ids):032x}", f"{next(ids):032x}"
            ctx = CallContext(session_id=session, origin_message_id="m1", user_id="u1", agent_id=AGENT)
            out.append((ctx, {"ref": ref}))
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

    # A second cycle, recorded: the rows the `SameWrites` peer writes. Its session and reference
    # are long random hex, so that they (and the approval id, subject and intent keys derived
    # from them) can be replaced by fresh values wherever they occur.
    session, ref = uuid.uuid4().hex, uuid.uuid4().hex
    ctx = CallContext(session_id=session, origin_message_id="m1", user_id="u1", agent_id=AGENT)

    def cycle() -> None:
        p = gate.call("pay", {"ref": ref}, ctx)
        assert isinstance(p, Pending)
        g = gate.approve(p.approval_id, version=p.version, approver=FINANCE)
        assert isinstance(g, Grant)
        gate.execute(g.token)

    transactions, _ = record_writes(store.engine, cycle)
    if len(transactions) != sum(EXPECTED_COMMITS.values()) or runs != 2:
        raise RuntimeError(f"the recorded cycle made {len(transactions)} transactions, {runs - 1} runs")
    identities = [
        _inserted(transactions, "eg_approvals", "id"),
        session,
        ref,
        _inserted(transactions, "eg_approvals", "subject_key"),
        _inserted(transactions, "eg_intent_keys", "key"),
    ]
    peer = open_store(f"sqlite:///{directory / 'same-writes.db'}")
    peer.setup()
    peer.close()
    same = SameWrites(directory / "same-writes.db", transactions, identities)
    prepared = same.cycles(plan.n * (plan.warmup + plan.repeats))  # parameters built before any timer

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

    def same_writes(n: int) -> int:
        cycles = [prepared.pop() for _ in range(n)]
        start = time.perf_counter_ns()
        same.run(cycles)
        return time.perf_counter_ns() - start

    def minimal(n: int) -> int:
        cycle = raw.money_cycle
        start = time.perf_counter_ns()
        for _ in range(n):
            cycle()
        return time.perf_counter_ns() - start

    try:
        before = runs
        stats = interleaved({"gated": gated, "same": same_writes, "minimal": minimal}, plan)
        cycles = plan.n * (plan.warmup + plan.repeats)
        if runs - before != cycles:
            raise RuntimeError(f"{cycles} approved cycles ran the tool {runs - before} times")
        left, per_cycle = same.counts(), {"events": EVENTS_PER_CYCLE}
        if any(v != cycles * per_cycle.get(k, 1) for k, v in left.items()):
            raise RuntimeError(f"{cycles} replayed cycles left {left}")
    finally:
        gate.close()
        store.close()
        raw.close()
        same.close()
    return MoneyResult(gated=stats["gated"], raw=stats["same"], minimal=stats["minimal"], commits=commits)
