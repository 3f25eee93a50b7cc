"""Who may decide: approvers registered server-side, their secrets, sessions and CSRF tokens.

The role of a signed-in approver always comes from the registry, looked up again on every request
(a role change or a removal takes effect at once); the session cookie holds only a session id
(live server-side, see `_sessions`) and the CSRF token. Secrets are stored as scrypt hashes and
compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import tomllib
from collections.abc import Callable, Iterable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import TableError

_N, _R, _P = 2**14, 8, 1
# Compared against when the id is unknown, so a wrong id costs the same time as a wrong secret.
_DUMMY = "scrypt$16384$8$1$00000000000000000000000000000000$" + "00" * 32


def hash_secret(secret: str, *, salt: bytes | None = None) -> str:
    """An scrypt hash of `secret` for the approvers file: `scrypt$N$r$p$salt$hash` (hex)."""
    if not secret:
        raise ValueError("an approver's secret must not be empty")
    salt = salt if salt is not None else secrets.token_bytes(16)
    digest = hashlib.scrypt(secret.encode(), salt=salt, n=_N, r=_R, p=_P, dklen=32)
    return f"scrypt${_N}${_R}${_P}${salt.hex()}${digest.hex()}"


def verify_secret(secret: str, stored: str) -> bool:
    """Whether `secret` matches an `hash_secret` string; constant time in the digest compare."""
    try:
        scheme, n, r, p, salt, expected = stored.split("$")
        if scheme != "scrypt":
            return False
        digest = hashlib.scrypt(
            secret.encode(), salt=bytes.fromhex(salt), n=int(n), r=int(r), p=int(p), dklen=32
        )
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(digest.hex(), expected)


@dataclass(frozen=True)
class RegisteredApprover:
    """One person who may decide, with the role the server gives them."""

    id: str
    role: str
    secret_hash: str | None = None
    name: str = ""


class ApproverRegistry:
    """The server-side list of approvers. `verify` checks an SSO header value set by a trusted
    proxy and returns the approver id it vouches for (or None); see `create_app(sso_header=...)`."""

    def __init__(
        self,
        approvers: Iterable[RegisteredApprover] = (),
        *,
        verify: Callable[[str], str | None] | None = None,
    ) -> None:
        self._by_id: dict[str, RegisteredApprover] = {}
        for a in approvers:
            if not a.id or not a.role:
                raise TableError(a.id or "?", "approver", "an approver needs an id and a role")
            if a.id in self._by_id:
                raise TableError(a.id, "approver", "registered twice")
            self._by_id[a.id] = a
        self.verify = verify

    @classmethod
    def from_toml(cls, path: str | Path) -> ApproverRegistry:
        """`[[approver]]` tables with `id`, `role`, `secret` (an `hash_secret` string), `name`."""
        data = tomllib.loads(Path(path).read_text())
        rows: list[dict[str, Any]] = data.get("approver", [])
        unknown = {k for row in rows for k in row} - {"id", "role", "secret", "name"}
        if unknown:
            raise TableError(str(path), "approver", f"unknown keys {sorted(unknown)}")
        return cls(
            RegisteredApprover(
                id=str(r.get("id", "")),
                role=str(r.get("role", "")),
                secret_hash=r.get("secret"),
                name=str(r.get("name", "")),
            )
            for r in rows
        )

    def get(self, approver_id: str | None) -> RegisteredApprover | None:
        return self._by_id.get(approver_id) if approver_id else None

    def check_secret(self, approver_id: str, secret: str) -> RegisteredApprover | None:
        """The approver, when `secret` is theirs; None otherwise (same work for an unknown id)."""
        approver = self._by_id.get(approver_id)
        stored = approver.secret_hash if approver is not None and approver.secret_hash else _DUMMY
        ok = verify_secret(secret, stored)
        return approver if ok and approver is not None and approver.secret_hash else None

    def __len__(self) -> int:
        return len(self._by_id)


def csrf_token(session: MutableMapping[str, Any]) -> str:
    """The session's CSRF token, made on first use."""
    token = session.get("csrf")
    if not isinstance(token, str) or len(token) < 32:
        token = secrets.token_urlsafe(32)
        session["csrf"] = token
    return token


def csrf_ok(session: MutableMapping[str, Any], submitted: object) -> bool:
    expected = session.get("csrf")
    return (
        isinstance(expected, str)
        and isinstance(submitted, str)
        and bool(submitted)
        and hmac.compare_digest(expected.encode(), submitted.encode())
    )
