"""Sign-in state kept on the server: live sessions and the failed-login throttle.

The session cookie is signed, but a signature alone cannot be revoked: a copied cookie would
keep working after sign-out until it expires. So the cookie carries only a random session id,
and a session counts only while its id is live here. Signing out removes it; it also ends on
its own `max_age` seconds after sign-in (absolute, not sliding), and when the approver's secret
is no longer the one it signed in with (a secret replaced after a leak). The registry lives in
the process: a restart signs everyone out, and the inbox runs as one process (`effectgate serve`).

Time comes from the gate's clock, so tests move it with `FakeClock.advance` instead of waiting.
"""

from __future__ import annotations

import math
import secrets
import threading
from dataclasses import dataclass

from .._clock import Clock

#: Keys kept per throttle before stale ones are swept (bounds memory under a spray of ids).
_SWEEP_AT = 10_000
#: A submitted approver id is counted by at most this many characters.
_ID_CHARS = 200


@dataclass(frozen=True)
class _Live:
    approver_id: str
    expires_at: float
    secret_hash: str | None = None  # the secret signed in with: a new one ends the session


class Sessions:
    """Live sign-ins by session id. Thread-safe."""

    def __init__(self, clock: Clock, *, max_age: float) -> None:
        self._clock = clock
        self._max_age = max_age
        self._live: dict[str, _Live] = {}
        self._lock = threading.Lock()

    def start(self, approver_id: str, secret_hash: str | None = None) -> str:
        """A new live session for `approver_id`, signed in with the secret `secret_hash`; returns
        its id (for the signed cookie)."""
        sid = secrets.token_urlsafe(32)
        now = self._clock.now()
        with self._lock:
            for old in [k for k, v in self._live.items() if v.expires_at <= now]:
                del self._live[old]
            self._live[sid] = _Live(approver_id, now + self._max_age, secret_hash)
        return sid

    def approver(self, sid: object) -> tuple[str, str | None] | None:
        """The approver id of a live, unexpired session and the secret hash it signed in with;
        None for anything else."""
        if not isinstance(sid, str) or not sid:
            return None
        with self._lock:
            live = self._live.get(sid)
            if live is None:
                return None
            if live.expires_at <= self._clock.now():
                del self._live[sid]
                return None
            return live.approver_id, live.secret_hash

    def end(self, sid: object) -> None:
        """End a session (sign-out); an unknown id is ignored."""
        if isinstance(sid, str):
            with self._lock:
                self._live.pop(sid, None)


class LoginThrottle:
    """Failed sign-ins counted per approver id and per client address over a sliding window.

    `begin` reserves an attempt before the secret is checked: the attempt counts as a failure
    until `succeeded` says otherwise, so parallel guesses cannot slip past the limit while the
    (deliberately slow) secret check runs. Once a key holds its limit of failures within
    `window` seconds, `begin` refuses without a check until the oldest of them ages out.
    """

    def __init__(self, clock: Clock, *, per_approver: int, per_client: int, window: float) -> None:
        if per_approver < 1 or per_client < 1 or window <= 0:
            raise ValueError("login limits must be positive")
        self._clock = clock
        self._limits = {"approver": per_approver, "client": per_client}
        self._window = window
        self._failures: dict[tuple[str, str], list[float]] = {}
        self._lock = threading.Lock()

    def _recent(self, key: tuple[str, str], now: float) -> list[float]:
        kept = [t for t in self._failures.get(key, ()) if t > now - self._window]
        if kept:
            self._failures[key] = kept
        else:
            self._failures.pop(key, None)
        return kept

    def begin(self, approver_id: str, client: str) -> int | None:
        """None: go ahead and check the secret (the attempt is counted). Otherwise the whole
        seconds until an attempt is allowed again; nothing is counted and nothing is checked."""
        keys = (("approver", approver_id[:_ID_CHARS]), ("client", client))
        now = self._clock.now()
        with self._lock:
            if len(self._failures) > _SWEEP_AT:
                for key in list(self._failures):
                    self._recent(key, now)
            wait = 0.0
            for key in keys:
                recent = self._recent(key, now)
                if len(recent) >= self._limits[key[0]]:
                    wait = max(wait, recent[-self._limits[key[0]]] + self._window - now)
            if wait > 0:
                return max(1, math.ceil(wait))
            for key in keys:
                self._failures.setdefault(key, []).append(now)
        return None

    def succeeded(self, approver_id: str, client: str) -> None:
        """The reserved attempt succeeded: the approver's failures are forgotten and the
        client's reserved attempt is returned (its earlier failures stay)."""
        with self._lock:
            self._failures.pop(("approver", approver_id[:_ID_CHARS]), None)
            stamps = self._failures.get(("client", client))
            if stamps:
                stamps.pop()
                if not stamps:
                    del self._failures[("client", client)]
