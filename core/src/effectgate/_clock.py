"""Time, injected: stores and the gate take `clock=`, tests pass a FakeClock instead of sleeping.
And `uuid4_hex`, the gate's default ids and the claims' lease owners."""

from __future__ import annotations

import os
import time
from typing import Protocol


class Clock(Protocol):
    """Seconds since the epoch, and a way to wait (backoff between read retries)."""

    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The wall clock."""

    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


SYSTEM_CLOCK = SystemClock()


def uuid4_hex() -> str:
    """`uuid.uuid4().hex` without building a UUID (two per approved call): 16 random bytes with
    the version (4) and variant (RFC 4122) bits set as `uuid.UUID(..., version=4)` sets them."""
    data = bytearray(os.urandom(16))
    data[6] = (data[6] & 0x0F) | 0x40
    data[8] = (data[8] & 0x3F) | 0x80
    return data.hex()
