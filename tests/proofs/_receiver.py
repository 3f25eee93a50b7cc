"""A payment provider on 127.0.0.1 that counts every charge where it lands.

`POST /refunds` charges. With `honour_keys=True` it behaves like a real provider: a repeated
`Idempotency-Key` returns the original charge and charges nothing, and `GET /refunds/<key>`
looks a charge up by its key (404 when the provider never saw the key). With
`honour_keys=False` every POST charges and there is no lookup (501), like a provider that
cannot tell whether it already did something. Every request is recorded either way.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Seen:
    """One request as the provider received it."""

    method: str
    path: str
    idempotency_key: str | None


class PaymentProvider:
    """Start with `with PaymentProvider() as provider:`; `provider.url` is its base URL."""

    def __init__(self, *, honour_keys: bool = True) -> None:
        self.honour_keys = honour_keys
        self._lock = threading.Lock()
        self._requests: list[Seen] = []
        self._charges: list[dict[str, Any]] = []
        self._by_key: dict[str, dict[str, Any]] = {}
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="provider", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> PaymentProvider:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    # -- what the provider saw

    @property
    def requests(self) -> list[Seen]:
        with self._lock:
            return list(self._requests)

    @property
    def charges(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._charges)

    def charges_by_key(self) -> Counter[str | None]:
        """How many charges each idempotency key caused."""
        return Counter(c["idempotency_key"] for c in self.charges)

    def posts_by_key(self) -> Counter[str | None]:
        """How many times each idempotency key was POSTed (charged or absorbed)."""
        return Counter(r.idempotency_key for r in self.requests if r.method == "POST")

    # -- the provider's behaviour (called from the server's threads)

    def _post(self, key: str | None, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self._requests.append(Seen("POST", "/refunds", key))
            if self.honour_keys and key is not None and key in self._by_key:
                return 200, self._by_key[key]
            charge = {
                "id": f"re_{len(self._charges) + 1}",
                "status": "succeeded",
                "order_id": body.get("order_id"),
                "amount": body.get("amount"),
                "idempotency_key": key,
            }
            self._charges.append(charge)
            if self.honour_keys and key is not None:
                self._by_key[key] = charge
            return 201, charge

    def _get(self, path: str, key: str) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self._requests.append(Seen("GET", path, key))
            if not self.honour_keys:
                return 501, {"error": "this provider cannot look a refund up by key"}
            charge = self._by_key.get(key)
            return (200, charge) if charge is not None else (404, {"error": "no refund with this key"})


def _handler(provider: PaymentProvider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # HTTP/1.1 keeps connections alive: a child's httpx client reuses one socket.
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if self.path != "/refunds":
                self._answer(404, {"error": "not found"})
                return
            self._answer(*provider._post(self.headers.get("Idempotency-Key"), body))

        def do_GET(self) -> None:
            prefix = "/refunds/"
            if not self.path.startswith(prefix) or len(self.path) == len(prefix):
                self._answer(404, {"error": "not found"})
                return
            self._answer(*provider._get(self.path, self.path[len(prefix) :]))

        def _answer(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # quiet: the test counts instead
            return

        def handle(self) -> None:
            # A client killed with SIGKILL drops its socket mid-conversation; that is the point.
            try:
                super().handle()
            except (ConnectionError, TimeoutError):
                return

    return Handler
