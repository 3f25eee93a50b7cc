"""effectgate's benchmarks: `python -m benchmarks` (add `--smoke` for a few-second check).

Measurements taken in one run and reported as ratios against a baseline measured in the
same run, because on a shared machine absolute timings drift by tens of percent between runs
(see /work/shared/FRAMEWORKS.md section 4):

- (a) the read path: `gate.call` of a trivial read tool against calling the function directly;
- (b) the money path: propose, approve and execute a no-op money tool, against the raw cost of
  the SQLite commits that path performs (the same pragmas, the same writes, plain `sqlite3`);
- (c) the idempotency store: `claim` plus `complete` on distinct keys, as claims per second and
  against the two raw commits they need; and with 1, 4 and 16 writer processes on one shared
  file, `store.run` against the same two commits in raw `sqlite3` (processes.py, which also runs
  alone: `python -m benchmarks.processes`).

Each case is the median (with p10 and p90) of repeated blocks after a warm-up, timed with
`time.perf_counter_ns`, the cases of one measurement interleaved so drift hits them alike.
Nothing here is collected by pytest; tests/test_benchmarks_smoke.py runs `--smoke`.
"""
