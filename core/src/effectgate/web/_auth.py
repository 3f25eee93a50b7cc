"""Who may decide: approvers registered server-side, their secrets, sessions and CSRF tokens.

The role of a signed-in approver always comes from the registry, looked up again on every request
(a role change or a removal takes effect at once); the session cookie holds only a session id
(live server-side, see `_sessions`) and the CSRF token. Secrets are stored as scrypt hashes and
compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
import threading
import tomllib
from collections.abc import Callable, Iterable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._export_file import read_small
from .._owned import own
from ..context import Approver, _storable
from ..errors import TableError

_log = logging.getLogger("effectgate.web")
_N, _R, _P = 2**14, 8, 1
_UNSTORABLE = "holds a NUL character or a lone surrogate: no database stores one with a decision"
# Compared against when the id is unknown, so a wrong id costs the same time as a wrong secret.
#: An `[[approver]]` header line as TOML allows it (spaces inside, a quoted key, a comment after).
_HEADER = re.compile(r"""\s*\[\[\s*(?:approver|"approver"|'approver')\s*\]\]\s*(?:#.*)?""")
_DUMMY = "scrypt$16384$8$1$00000000000000000000000000000000$" + "00" * 32


def hash_secret(secret: str, *, salt: bytes | None = None) -> str:
    """An scrypt hash of `secret` for the approvers file: `scrypt$N$r$p$salt$hash` (hex)."""
    if not secret:
        raise ValueError("an approver's secret must not be empty")
    salt = salt if salt is not None else secrets.token_bytes(16)
    digest = hashlib.scrypt(secret.encode(), salt=salt, n=_N, r=_R, p=_P, dklen=32)
    return f"scrypt${_N}${_R}${_P}${salt.hex()}${digest.hex()}"


def secret_problem(stored: str) -> str | None:
    """What is wrong with a stored secret hash (None when it has the `hash_secret` shape)."""
    parts = stored.split("$")
    if len(parts) != 6 or parts[0] != "scrypt":
        return "expected scrypt$N$r$p$salt$hash"
    _, n, r, p, salt, digest = parts
    if (n, r, p) != (str(_N), str(_R), str(_P)):  # what an unknown id costs (`_DUMMY`), and usable
        return f"N, r and p must be the ones `effectgate hash-secret` writes ({_N}${_R}${_P})"
    try:
        bytes.fromhex(salt)
        if len(bytes.fromhex(digest)) != 32:
            return "the hash must be 32 bytes of hex"
    except ValueError:
        return "the salt and hash must be hex"
    return None


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
        self._by_id = _index(approvers)
        self.verify = verify
        #: Why the registry refuses everyone (its file no longer loads); None while it is usable.
        self.problem: str | None = None

    def _current(self) -> dict[str, RegisteredApprover]:
        return self._by_id

    @classmethod
    def from_toml(cls, path: str | Path) -> ApproverRegistry:
        """`[[approver]]` tables with `id`, `role`, `secret` (an `hash_secret` string), `name`.
        Every entry is checked when the file is loaded: an unknown key, a missing id or role (or
        one holding a NUL), or a secret that is not an scrypt hash raises `ValueError` naming the
        file, the line of the entry and the fix (a secret's value is never echoed: it may be a
        password pasted in). The registry follows the file: it is read again whenever its content
        changes, so an approver removed from it, or given another role, loses what they had on
        their next request, without a restart (and the inbox ends their sessions, as it does
        those signed in with a secret since replaced). A change that does not load (or a file
        gone, or empty: caught mid-rewrite) refuses everyone until the file is fixed, never the
        list it replaced (which would keep a revoked approver), and ends no session (refused
        meanwhile): `problem` says why, and a warning is logged."""
        own(path)  # who may approve is never the file tools' to rewrite (`_owned`)
        return _FileRegistry(Path(path))

    def get(self, approver_id: str | None) -> RegisteredApprover | None:
        return self._current().get(approver_id) if approver_id else None

    def check_secret(self, approver_id: str, secret: str) -> RegisteredApprover | None:
        """The approver, when `secret` is theirs; None otherwise (same work for an unknown id)."""
        approver = self._current().get(approver_id)
        stored = approver.secret_hash if approver is not None and approver.secret_hash else _DUMMY
        ok = verify_secret(secret, stored)
        return approver if ok and approver is not None and approver.secret_hash else None

    def __len__(self) -> int:
        return len(self._current())


def _index(approvers: Iterable[RegisteredApprover]) -> dict[str, RegisteredApprover]:
    by_id: dict[str, RegisteredApprover] = {}
    for a in approvers:
        if not a.id or not a.role:
            raise TableError(a.id or "?", "approver", "an approver needs an id and a role")
        if not (_storable(a.id) and _storable(a.role)):  # its every decision would fail
            raise TableError(a.id, "approver", _UNSTORABLE)
        try:  # an id showing no character would record decisions by nobody (`Approver`)
            Approver(a.id, a.role)
        except ValueError as exc:
            raise TableError(a.id, "approver", str(exc)) from None
        if a.id in by_id:
            raise TableError(a.id, "approver", "registered twice")
        by_id[a.id] = a
    return by_id


def _load(path: Path, raw: bytes) -> dict[str, RegisteredApprover]:
    """The approvers of the file `path` holding `raw`, every entry checked (`from_toml`)."""
    text = raw.decode()
    if not text.strip():  # caught mid-rewrite (truncated, not yet written): as a file that does not load
        raise ValueError(f"{path} is empty (list at least one [[approver]])")
    data = tomllib.loads(text)
    rows: list[dict[str, Any]] = data.get("approver", [])
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        raise ValueError(f"{path}: approvers are [[approver]] tables (id, role, secret, name)")
    headers = [n for n, line in enumerate(text.splitlines(), 1) if _HEADER.fullmatch(line)]
    seen: set[str] = set()
    for i, row in enumerate(rows):
        where = f"{path}:{headers[i] if i < len(headers) else '?'}"
        unknown = set(row) - {"id", "role", "secret", "name"}
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)} (allowed: id, role, secret, name)")
        for key in ("id", "role"):
            if not isinstance(row.get(key), str) or not row[key]:
                raise ValueError(f'{where}: every approver needs a non-empty {key} = "..."')
            if not _storable(row[key]):
                raise ValueError(f"{where}: the {key} {_UNSTORABLE}")
        try:
            Approver(row["id"], row["role"])
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        if row["id"] in seen:
            raise ValueError(f"{where}: approver {row['id']!r} is listed twice")
        seen.add(row["id"])
        secret = row.get("secret")
        if secret is not None and (not isinstance(secret, str) or secret_problem(secret)):
            problem = secret_problem(secret) if isinstance(secret, str) else "it is not a string"
            raise ValueError(
                f"{where}: approver {row['id']!r}: secret is not a hash from `effectgate hash-secret` "
                f"({problem}); run `echo -n 'the secret' | effectgate hash-secret` and paste the "
                "scrypt$... line it prints"
            )
    return _index(
        RegisteredApprover(
            id=str(r.get("id", "")),
            role=str(r.get("role", "")),
            secret_hash=r.get("secret"),
            name=str(r.get("name", "")),
        )
        for r in rows
    )


class _FileRegistry(ApproverRegistry):
    """The approvers of a TOML file, read again whenever its bytes change (`from_toml`)."""

    def __init__(self, path: Path) -> None:
        raw = read_small(path, limit=None)  # a FIFO in its place would block the inbox
        super().__init__(_load(path, raw).values())
        self._path = path
        self._seen: bytes | None = raw  # None after a failed read: the next read loads
        self._lock = threading.Lock()

    def _current(self) -> dict[str, RegisteredApprover]:
        with self._lock:
            raw: bytes | None = None
            try:
                raw = read_small(self._path, limit=None)
                if raw != self._seen:
                    self._by_id, self.problem = _load(self._path, raw), None
            except (OSError, ValueError, TableError) as exc:  # refuse everyone: never the old list
                if self.problem is None:  # logged once per breakage, not on every request
                    _log.warning("%s no longer loads; no one may sign in or decide: %s", self._path, exc)
                self._by_id, self.problem = {}, str(exc)
            self._seen = raw
            return self._by_id


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
        and submitted.isascii()  # a lone surrogate (a multipart form's charset) encodes to nothing
        and hmac.compare_digest(expected.encode(), submitted.encode())
    )
