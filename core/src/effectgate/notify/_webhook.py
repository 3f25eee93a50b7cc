"""A webhook notifier: signed, retried with backoff, off the gate's thread, every delivery recorded.

The gate calls the notifier after its transaction commits; the notifier only queues the notice
(a full queue drops it and records that), and one worker thread posts it. A failing or hanging
webhook therefore never blocks or breaks a call. Each notice ends as one event in the gate's log:
`webhook_delivered`, `webhook_failed` (with every attempt's status or error) or `webhook_dropped`;
at the interpreter's exit an open notifier first delivers what it holds (up to EXIT_TIMEOUT).
Only the webhook's host is recorded: a Slack webhook URL is itself a secret, so an error text
that quotes the URL (or its path) is recorded and logged with the host in its place.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import queue
import random
import re
import threading
import weakref
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from .._clock import SYSTEM_CLOCK, Clock
from .._logging import logger
from .._notice import Notification, NotificationKind
from ..tokens import Keyring
from ._message import delivery_id, message
from ._signature import DELIVERY, EVENT, sign

log = logger("effectgate.notify")

ALL_KINDS: tuple[NotificationKind, ...] = ("pending", "expiring", "needs_reconciliation")
RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
# Retry-After in seconds, ASCII digits only: `str.isdigit` accepts "²" (which `float` refuses)
# and "١٢٣" (which it reads); an HTTP-date or anything else is ignored.
_RETRY_AFTER = re.compile(r"[0-9]{1,6}")
_STOP = object()
# How long the interpreter's exit waits for each open notifier to deliver what it holds; what is
# still queued then is recorded as dropped (its worker thread ends with the interpreter).
EXIT_TIMEOUT = 30.0
DEFAULT_TIMEOUT = 5.0  # seconds, each of connect, read, write and pool, for the notifier's own client


@dataclass(frozen=True)
class Delivery:
    """How one notice went: `delivered`, the number of attempts and what each one got."""

    delivered: bool
    delivery_id: str
    attempts: int
    statuses: tuple[int | None, ...] = ()
    error: str | None = None
    waits: tuple[float, ...] = field(default=())


class WebhookNotifier:
    """Posts each notice to `url` as a Slack-compatible JSON message, signed with `keyring`.

    - `keyring`: the webhook's own keys (`Keyring.generate()` or `Keyring.parse("kid:hex")`), one
      per receiver (a signature names no endpoint); the gate refuses its grant keyring's keys.
    - `inbox_url`: where `effectgate serve` is reached; the message links to the card.
    - `kinds` / `roles`: which notices this webhook gets (e.g. one channel per approver role).
    - `attempts`, `backoff`, `max_backoff`: up to `attempts` tries; after a connection error, a
      timeout, 408/425/429 or 5xx it waits `backoff * 2**n` seconds (at most `max_backoff`; a
      Retry-After header is honoured up to that cap) with jitter, then re-signs and re-sends.
      Other 4xx answers are final.
    - `timeout`: seconds for each request's connect, read, write and pool wait, also with a
      `client` given; None: the client's own (DEFAULT_TIMEOUT for the notifier's own client).
    - `clock`: time for signatures and the waits between attempts (inject a FakeClock in tests).
    - `background=False` delivers in the caller's thread (scripts, the CLI, tests).
    """

    def __init__(
        self,
        url: str,
        *,
        keyring: Keyring,
        inbox_url: str | None = None,
        kinds: Collection[NotificationKind] = ALL_KINDS,
        roles: Collection[str] | None = None,
        attempts: int = 5,
        backoff: float = 1.0,
        max_backoff: float = 60.0,
        jitter: bool = True,
        timeout: float | None = None,
        clock: Clock = SYSTEM_CLOCK,
        client: httpx.Client | None = None,
        background: bool = True,
        queue_size: int = 1000,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"a webhook URL is http(s)://host/...; got scheme {parts.scheme!r}")
        try:  # refused now, not at every delivery; the message never quotes the URL (a secret)
            parts.port  # noqa: B018 - raises for a port out of range
            httpx.URL(url)
        except (ValueError, httpx.InvalidURL):
            raise ValueError(
                "the webhook URL is not a valid http(s) URL (a bad port, or a control character)"
            ) from None
        for name, names in (("kinds", kinds), ("roles", roles)):
            if isinstance(names, str):  # its letters would be the names: nothing would ever match
                raise TypeError(f"{name} is a collection of names, not one string: {name}={{{names!r}}}")
        unknown = set(kinds) - set(ALL_KINDS)
        if unknown:
            raise ValueError(f"unknown notification kinds {sorted(unknown)}; known: {list(ALL_KINDS)}")
        if not isinstance(attempts, int) or attempts < 1:  # 3.0 would fail every delivery (`range`)
            raise ValueError(f"attempts must be a whole number, at least 1; got {attempts!r}")
        for name, value in (("backoff", backoff), ("max_backoff", max_backoff)):
            if not 0 <= value < math.inf:  # NaN too: a retry would otherwise fail as "internal"
                raise ValueError(f"{name} must be a finite number of seconds, 0 or more; got {value!r}")
        if timeout is not None and not 0 < timeout < math.inf:
            raise ValueError(f"timeout must be a finite number of seconds above 0; got {timeout!r}")
        self.url = url
        self.target = parts.hostname
        # What an error text may quote of the URL: the whole URL (as given or as httpx spells
        # it), replaced by the host; then its secret parts alone, replaced by "…".
        parsed = httpx.URL(url)
        whole = {url, str(parsed), url.split("#")[0]}
        pieces = {parsed.raw_path.decode("ascii"), parts.path, parts.query, parts.password or ""}
        self._secrets = [(x, self.target) for x in sorted(whole, key=len, reverse=True)] + [
            (x, "…") for x in sorted(pieces, key=len, reverse=True) if len(x) > 1
        ]
        self.keyring = keyring
        self.inbox_url = inbox_url
        self.kinds = frozenset(kinds)
        self.roles = frozenset(roles) if roles is not None else None
        self.attempts = attempts
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.jitter = jitter
        self.clock = clock
        self._own_client = client is None
        self._timeout = timeout
        # given, it holds for a client given too (whose own default would otherwise rule)
        self._request_timeout = httpx.USE_CLIENT_DEFAULT if timeout is None else timeout
        self._client = client or self._new_client()
        self._background = background
        self._queue_size = queue_size
        self._random = random.Random()  # noqa: S311 - jitter, not a secret
        self._closed = False
        self._fresh()
        _NOTIFIERS.add(self)
        logging.getLogger("httpx").addFilter(_HIDE_URLS)  # once: a filter is added only once

    def _new_client(self) -> httpx.Client:
        return httpx.Client(timeout=self._timeout or DEFAULT_TIMEOUT, follow_redirects=False)

    def _fresh(self) -> None:
        """The worker's state: at construction, and again in a forked child (`_forked`)."""
        # Unbounded, so close() can always queue its stop; `queue_size` is kept by __call__.
        self._queue: queue.Queue[Any] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._lock = threading.Lock()

    def _forked(self) -> None:
        """In a forked child: the parent's worker thread, lock and queue are not its own (the
        parent delivers what it queued), nor are its own client's pooled connections (left to
        the parent, not closed: closing a TLS connection here would end the parent's)."""
        self._fresh()
        if self._own_client and not self._closed:
            self._client = self._new_client()

    # -- the hook the gate calls

    def wants(self, n: Notification) -> bool:
        return n.kind in self.kinds and (self.roles is None or n.approver_role in self.roles)

    def __call__(self, n: Notification) -> None:
        """Queue `n` for delivery (or deliver it now with `background=False`); never raises for
        a failing webhook, and never waits for one."""
        if not self.wants(n):
            return
        if not self._background:
            self.deliver(n)
            return
        # One step under the lock, as close() takes it: a notice is queued before close()'s stop
        # (and delivered) or refused as closed, never queued behind the stop, left undelivered.
        with self._lock:
            why = "the notifier is closed" if self._closed else None
            if why is None and 0 < self._queue_size <= self._queue.qsize():  # 0: unbounded, as Queue
                why = f"queue full ({self._queue_size})"
            if why is None:
                self._start()
                self._queue.put_nowait(n)
        if why is not None:
            self._record(n, "webhook_dropped", {"why": why})

    # -- delivery

    def deliver(self, n: Notification) -> Delivery:
        """Send one notice now, with retries; record and return how it went."""
        did = delivery_id(n)
        statuses: list[int | None] = []
        waits: list[float] = []
        error: str | None = None
        delivered = False
        try:
            msg = message(n, inbox_url=self.inbox_url, now=self.clock.now())
            body = json.dumps(msg, separators=(",", ":"), ensure_ascii=False).encode()
        except Exception as exc:  # a notice that cannot be rendered is recorded, not raised
            return self._finish(n, Delivery(False, did, 0, error=f"render: {exc!r}"))
        try:
            for attempt in range(1, self.attempts + 1):
                retry_after: str | None = None
                headers = {
                    "Content-Type": "application/json",
                    DELIVERY: did,
                    EVENT: n.kind,
                    **sign(self.keyring, body, int(self.clock.now())),
                }
                try:
                    # The status line is the answer: the body is never read (one that never ends
                    # would hold this delivery, and every notice queued behind it, for ever).
                    with self._client.stream(
                        "POST", self.url, content=body, headers=headers, timeout=self._request_timeout
                    ) as response:
                        pass
                except Exception as exc:
                    statuses.append(None)
                    error = self._redacted(f"{type(exc).__name__}: {exc}")
                    # Connection, timeout, protocol: worth another try; anything else (an invalid
                    # URL, a broken client) is final.
                    retryable = isinstance(exc, httpx.HTTPError)
                else:
                    statuses.append(response.status_code)
                    if response.is_success:
                        delivered, error = True, None
                        break
                    error = f"HTTP {response.status_code}"
                    retryable = response.status_code in RETRY_STATUS
                    retry_after = response.headers.get("retry-after")
                if not retryable or attempt == self.attempts:
                    break
                wait = self._wait(attempt, retry_after)
                waits.append(wait)
                self.clock.sleep(wait)
        except Exception as exc:  # a bug here still ends as one recorded failure, never a raise
            delivered, error = False, self._redacted(f"internal: {type(exc).__name__}: {exc}")
        outcome = Delivery(delivered, did, len(statuses), tuple(statuses), error, tuple(waits))
        return self._finish(n, outcome)

    def _wait(self, attempt: int, retry_after: str | None) -> float:
        wait: float = min(self.max_backoff, self.backoff * 2.0 ** (attempt - 1))
        if self.jitter:
            wait *= self._random.uniform(0.5, 1.0)
        if retry_after is not None and _RETRY_AFTER.fullmatch(retry_after.strip(" \t")):
            wait = max(wait, min(self.max_backoff, float(retry_after)))
        return wait

    def _redacted(self, text: str) -> str:
        """`text` with the webhook URL replaced by its host, and any secret part left by "…"."""
        for secret, shown in self._secrets:
            text = text.replace(secret, shown)
        return text

    def _finish(self, n: Notification, d: Delivery) -> Delivery:
        detail = {
            "notification": n.kind,
            "delivery": d.delivery_id,
            "target": self.target,
            "attempts": d.attempts,
            "statuses": list(d.statuses),
        }
        if d.error is not None:
            detail["error"] = d.error
        self._record(n, "webhook_delivered" if d.delivered else "webhook_failed", detail)
        if not d.delivered:
            log.warning("webhook to %s failed after %d attempts: %s", self.target, d.attempts, d.error)
        return d

    def _record(self, n: Notification, kind: str, detail: dict[str, Any]) -> None:
        try:
            n.record(kind, {"target": self.target, **detail})
        except Exception:  # the store is down: the log line is all that is left
            log.exception("could not record %s for %s", kind, n.approval_id or n.key)

    # -- the worker thread and the lifecycle

    def _start(self) -> None:
        """Start the worker unless it runs; the caller holds the lock."""
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._run, name="effectgate-webhook", daemon=True)
            self._worker.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:  # the queue is drained: the client is done with (see close)
                    self._close_client()
                    return
                self.deliver(item)
            except Exception:  # pragma: no cover - deliver records its own failures
                log.exception("webhook worker")
            finally:
                self._queue.task_done()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued notice has been delivered or given up; False on timeout."""
        with self._queue.all_tasks_done:
            return self._queue.all_tasks_done.wait_for(lambda: self._queue.unfinished_tasks == 0, timeout)

    def close(self, timeout: float | None = 30.0) -> None:
        """Deliver what is queued (up to `timeout`), stop the worker, close the HTTP client.
        A worker still delivering after `timeout` ends once the queue is drained, and closes the
        notifier's own client then (closed under it, what it still holds would fail)."""
        with self._lock:
            stop, self._closed = not self._closed, True
            worker = self._worker
            if stop and worker is not None and worker.is_alive():
                self._queue.put_nowait(_STOP)  # after every notice queued so far (see __call__)
        if worker is not None and worker.is_alive():
            worker.join(timeout)
        if worker is None or not worker.is_alive():
            self._close_client()

    def _close_client(self) -> None:
        """Close the notifier's own client (a client given is the caller's to close)."""
        if self._own_client:
            with self._lock:
                self._client.close()

    def __enter__(self) -> WebhookNotifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _drop_queued(self, why: str) -> None:
        """Take every notice still queued and record it as dropped."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not _STOP:
                self._record(item, "webhook_dropped", {"why": why})
            self._queue.task_done()


# The live notifiers: renewed in a forked child, closed at the interpreter's exit.
_NOTIFIERS: weakref.WeakSet[WebhookNotifier] = weakref.WeakSet()


class _HideUrls(logging.Filter):
    """httpx logs each request's URL at INFO (`HTTP Request: POST <url> ...`): a live notifier's
    URL is a secret, so it is written there as the notifier's errors write it (`_redacted`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            if isinstance(record.args, tuple):
                record.args = tuple(_hidden(a) if isinstance(a, httpx.URL) else a for a in record.args)
        except Exception:  # noqa: S110 - the line is logged as it was rather than lost
            pass
        return True


def _hidden(url: httpx.URL) -> httpx.URL | str:
    for notifier in list(_NOTIFIERS):
        if url.host == notifier.target:
            return notifier._redacted(str(url))
    return url


_HIDE_URLS = _HideUrls()


def _forked() -> None:
    for notifier in list(_NOTIFIERS):
        notifier._forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


@atexit.register
def _close_at_exit() -> None:
    """Deliver what open notifiers hold before the interpreter stops their daemon worker (up to
    EXIT_TIMEOUT each; one closed already is not waited for again); a notice still queued after
    that is recorded as dropped, never lost without a trace."""
    for notifier in list(_NOTIFIERS):
        try:
            if not notifier._closed:
                notifier.close(timeout=EXIT_TIMEOUT)
            notifier._drop_queued("the process exited before it was delivered")
        except Exception:  # the store may be gone at exit; nothing more can be done
            log.exception("webhook notifier at exit")
