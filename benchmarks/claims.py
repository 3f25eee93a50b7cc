"""(c) The idempotency store on its own: `claim` then `complete`, each key distinct.

Each is its own transaction (two commits per operation); the baseline is two `sqlite3`
commits of the same insert and update, measured in the same run.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from pathlib import Path

from effectgate import open_store
from effectgate.stores import Claimed

from ._raw import HASH, RawLedger
from ._timing import Plan, Stats, interleaved, paired_ratio


@dataclass(frozen=True)
class ClaimsResult:
    gated: Stats
    raw: Stats

    @property
    def per_second(self) -> float:
        return 1e9 / self.gated.median

    @property
    def ratio(self) -> float:
        return paired_ratio(self.gated, self.raw)


def run(directory: Path, plan: Plan) -> ClaimsResult:
    store = open_store(f"sqlite:///{directory / 'claims.db'}")
    store.setup()
    raw = RawLedger(directory / "raw-claims.db")
    ids = itertools.count()
    first = store.claim("check", HASH)
    if not isinstance(first, Claimed):
        raise RuntimeError(f"a fresh key was not claimed: {first!r}")
    store.complete("check", first.owner, {"ok": True})

    def claims(n: int) -> int:
        keys = [f"k{next(ids)}" for _ in range(n)]
        claim, complete = store.claim, store.complete
        start = time.perf_counter_ns()
        for key in keys:
            c = claim(key, HASH)
            if not isinstance(c, Claimed):
                raise RuntimeError(f"a fresh key was not claimed: {c!r}")
            complete(key, c.owner, {"ok": True})
        return time.perf_counter_ns() - start

    def raw_commits(n: int) -> int:
        cycle = raw.claim_cycle
        start = time.perf_counter_ns()
        for _ in range(n):
            cycle()
        return time.perf_counter_ns() - start

    try:
        stats = interleaved({"claims": claims, "raw": raw_commits}, plan)
    finally:
        store.close()
        raw.close()
    return ClaimsResult(gated=stats["claims"], raw=stats["raw"])
