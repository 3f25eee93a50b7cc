from __future__ import annotations

import math
import threading


class FakeClock:
    """A clock that moves only when told: `advance(seconds)`; `sleep` advances instead of waiting.

    It never goes backwards, and never to a time no comparison can order (NaN, infinity)."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        if not math.isfinite(start):
            raise ValueError(f"a clock starts at a finite time, not {start!r}")
        self._now = start
        self._lock = threading.Lock()
        self.slept: list[float] = []

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            try:  # `nan < 0` is False: test it as finite, and the time it moves to as well
                ok = math.isfinite(seconds) and seconds >= 0 and math.isfinite(self._now + seconds)
            except OverflowError:  # an integer too large for a float
                ok = False
            if not ok:
                raise ValueError(f"a clock does not go backwards, or by {seconds!r}")
            self._now += seconds

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)  # first: a refused sleep is not recorded as slept
        self.slept.append(seconds)
