"""What guards every request to the inbox before a route sees it: the Host names it answers
(`host_guard`: a page on another name re-pointed at the inbox by DNS rebinding gets 400), the
proxy's shared secret an SSO header needs beside it (`from_proxy`), and the response headers
(`SecurityHeaders`: no framing, no scripts, no referrer, no caching)."""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: The header a fronting proxy sets, beside the SSO header, to the shared secret (`sso_secret`).
PROXY_HEADER = "X-Effectgate-Proxy-Secret"
#: Host names served when `create_app` is given none: the loopback names.
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
MIN_SSO_SECRET = 16  # characters of the proxy's shared secret, so that it cannot be guessed


def host_guard(allowed_hosts: Sequence[str]) -> Middleware:
    """Answer only requests for these Host names (400 otherwise); a wildcard is `*.example.com`,
    and anything else holding a `*` (but `*` alone) is a ValueError."""
    for h in allowed_hosts:
        # Starlette checks this with `assert` at the first request (a 500 for every page, and
        # under `python -O` "*example.com" would serve "evilexample.com"): refused here instead.
        if h != "*" and "*" in h and not (h.startswith("*.") and "*" not in h[1:] and len(h) > 2):
            raise ValueError(f"allowed host {h!r}: a wildcard is written *.example.com")
    # an IPv6 literal arrives in brackets ("Host: [::1]:8765"), as Starlette compares it
    names = [f"[{h}]" if ":" in h and not h.startswith("[") else h for h in allowed_hosts]
    return Middleware(TrustedHostMiddleware, allowed_hosts=names, www_redirect=False)


def from_proxy(request: Request, secret: bytes) -> bool:
    """Whether the request carries the proxy's shared secret (compared in constant time)."""
    given = request.headers.get(PROXY_HEADER)
    # Starlette decodes header bytes as Latin-1: compare the bytes the proxy sent (the secret's
    # UTF-8), not that text encoded again (a secret with an umlaut would never match).
    return given is not None and bool(secret) and hmac.compare_digest(given.encode("latin-1"), secret)


_HEADERS = [
    # No framing (a card cannot be overlaid by another page), no scripts, no referrer leaks.
    (b"x-frame-options", b"DENY"),
    (
        b"content-security-policy",
        b"default-src 'none'; style-src 'self' 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'",
    ),
    (b"referrer-policy", b"no-referrer"),
    (b"x-content-type-options", b"nosniff"),
    (b"cache-control", b"no-store"),
]


class SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *_HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)
