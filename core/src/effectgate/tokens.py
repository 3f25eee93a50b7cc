"""Grant tokens: HMAC-SHA256 with a key id, bound to one approval version and its args hash.

A token reads `eg1.<kid>.<approval_id>.<version>.<expires_ms>.<nonce>.<mac>`. The MAC covers
every field and the frozen args hash, so a token cannot be moved to another approval, version, grant
round (its nonce ends `_r<round>`) or arguments. The store keeps only sha256(token), compared in
constant time. Keys rotate through a `Keyring`: new tokens use `current`, older key ids verify.
"""

from __future__ import annotations

import binascii
import hashlib
import hmac
import os
import re
import secrets
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._owned import own
from .errors import MissingKeyring, TokenError

PREFIX = "eg1"
ENV_VAR = "EFFECTGATE_KEYRING"
MAX_TOKEN = 512
_KID = re.compile(r"[A-Za-z0-9_-]{1,32}")
_FIELD = re.compile(r"[A-Za-z0-9_-]{1,128}")
# version and expiry as `mint` writes them, no leading 0 (the MAC covers integers: "01" is "1")
_DIGITS9 = re.compile(r"0|[1-9][0-9]{0,8}")
_DIGITS16 = re.compile(r"0|[1-9][0-9]{0,15}")
_NONCE_LEN, _ROUND = 22, re.compile(r"_r(0|[1-9][0-9]{0,8})")  # token_urlsafe(16), then "_r<round>"
#: A well-formed token as one pattern (`Keyring.read`): exactly what its checks of the prefix, the
#: seven fields and each field's alphabet and length accept, and nothing else (ASCII only)
_TOKEN = re.compile(
    rf"{PREFIX}\.([A-Za-z0-9_-]{{1,32}})\.([A-Za-z0-9_-]{{1,128}})\.(0|[1-9][0-9]{{0,8}})"
    r"\.(0|[1-9][0-9]{0,15})\.([A-Za-z0-9_-]{1,128})\.([A-Za-z0-9_-]{1,128})"
)


@dataclass(frozen=True)
class TokenClaims:
    """The readable part of a token; trust it only after `Keyring.verify`."""

    kid: str
    approval_id: str
    version: int
    expires_at: float
    nonce: str
    mac: str = field(repr=False)  # with the fields above, it is the token (as `Grant.token`: no repr)

    @property
    def grant_round(self) -> int | None:
        """The approval's grant round that minted it (`mint`'s `round_`, signed into the nonce after
        its random part); None for a token an earlier release minted without one."""
        return int(found[1]) if (found := _ROUND.fullmatch(self.nonce, _NONCE_LEN)) else None


def token_hash(token: str) -> str:
    """What the store keeps instead of the token."""
    return hashlib.sha256(token.encode()).hexdigest()


class Keyring:
    """Signing keys by id; `current` signs, every key verifies."""

    def __init__(self, keys: Mapping[str, bytes], *, current: str) -> None:
        if current not in keys:
            raise ValueError(f"current key id {current!r} is not in the keyring")
        keys = {kid: _secret(kid, secret) for kid, secret in keys.items()}
        firsts: dict[bytes, str] = {}  # secret -> its first key id (a rotation must change the secret)
        for kid, secret in keys.items():
            if not _KID.fullmatch(kid):
                raise ValueError("a key id must be 1-32 letters, digits, '_' or '-'")  # not echoed
            if len(secret) < 32:
                raise ValueError(f"key {kid!r} is shorter than 32 bytes")
            if len(set(secret)) < 8:
                raise ValueError(
                    f"key {kid!r} is not random (all zeros, or a few repeated bytes): make one with "
                    'python -c "import secrets; print(secrets.token_hex(32))"'
                )
            if (same := firsts.setdefault(_hmac_key(secret), kid)) != kid:  # HMAC pads or hashes a key
                raise ValueError(f"key {kid!r} has the secret of key {same!r}: give each its own")
        self._keys, self.current = keys, current
        self._derived: dict[tuple[str, str], bytes] = {}
        # Each key's HMAC state with the key already absorbed: a MAC copies it (about a third
        # less work per MAC than keying HMAC again, for the audit's two seals per approval).
        self._hmacs = _keyed(self._keys)
        self._verifiers: dict[str, Callable[[bytes, str], bool]] = {}  # `verifies`, by purpose

    def __getstate__(self) -> dict[str, object]:
        # copy, deepcopy and pickle carry the keys; the keyed HMAC states are rebuilt from them
        return {k: v for k, v in self.__dict__.items() if k not in ("_hmacs", "_verifiers")}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._hmacs, self._verifiers = _keyed(self._keys), {}

    @classmethod
    def generate(cls, kid: str | None = None) -> Keyring:
        """A fresh random key. Its id is random too (unless given), so a grant signed by another
        keyring names a key this one does not hold: refused as a keyring mismatch, not as forged."""
        kid = kid or f"k{secrets.token_hex(4)}"
        return cls({kid: secrets.token_bytes(32)}, current=kid)

    @classmethod
    def parse(cls, text: str) -> Keyring:
        """From `kid:hex[,kid:hex...]`; the first key is current."""
        keys: dict[str, bytes] = {}
        for n, part in enumerate(text.strip().split(","), 1):
            kid, sep, hexkey = part.strip().partition(":")
            if not sep:
                raise ValueError("keyring entries look like kid:hexsecret")
            if not _KID.fullmatch(kid):  # not echoed: it may be a secret written first
                raise ValueError(
                    f"keyring entry {n}: a key id is 1-32 letters, digits, '_' or '-' (kid:hexsecret)"
                )
            if kid in keys:
                raise ValueError(f"key id {kid!r} appears twice in the keyring")
            try:
                keys[kid] = bytes.fromhex(hexkey)
            except ValueError:
                raise ValueError(f"key {kid!r} is not hex (kid:hexsecret[,kid:hexsecret...])") from None
        if not keys:
            raise ValueError("empty keyring")
        return cls(keys, current=next(iter(keys)))

    def holds(self, kid: str) -> bool:
        """Whether this keyring has a key with id `kid`."""
        return kid in self._keys

    @property
    def kids(self) -> tuple[str, ...]:
        """The key ids, the current one first."""
        return (self.current, *(k for k in self._keys if k != self.current))

    def derived_key(self, purpose: str, kid: str) -> bytes:
        """A key for one purpose derived from key `kid` (HMAC-SHA256 of the purpose), for keyed hashes
        per row (commitments to personal values); TokenError for a key this keyring does not hold."""
        if (cached := self._derived.get((purpose, kid))) is None:
            if (key := self._keys.get(kid)) is None:
                raise TokenError("unknown_key", f"no key with id {kid!r}")
            cached = self._derived[(purpose, kid)] = hmac.digest(
                key, f"{PREFIX}-derived|{purpose}".encode(), "sha256"
            )
        return cached

    def dumps(self) -> str:
        return ",".join(f"{kid}:{self._keys[kid].hex()}" for kid in self.kids)

    @classmethod
    def from_env(cls, var: str = ENV_VAR) -> Keyring | None:
        value = os.environ.get(var)
        if value is not None and not value.strip():  # set, but to nothing: a secret not injected
            raise ValueError(f"${var} is set but empty: unset it (a SQLite file's key file) or set one")
        return None if value is None else cls.parse(value)

    @classmethod
    def load_or_create(cls, path: str | Path) -> Keyring:
        """A development keyring kept in a 0600 file, created on first use. Every process that
        approves or executes against the same database needs the same keys; in production set
        EFFECTGATE_KEYRING from a secret store instead. The file is created atomically (written in
        full under a temporary name, then linked into place; a process that loses the race reads the
        winner's key). A file other users can read or write, or with a key that is not random, is
        refused with the fix in the message."""
        path = Path(path)
        own(path)  # never the file tools' to read or write (`_owned`)
        for _ in range(3):
            try:
                return cls._load_file(path)
            except FileNotFoundError:
                pass
            ring = cls.generate()
            tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                with os.fdopen(fd, "w") as fh:
                    fh.write(ring.dumps())
                    fh.flush()
                    os.fsync(fh.fileno())
                try:
                    os.link(tmp, path)  # fails if another process linked its file first
                except FileExistsError:
                    continue
                return ring
            finally:
                tmp.unlink(missing_ok=True)
        try:
            return cls._load_file(path)
        except FileNotFoundError:  # its name exists (the link above failed) and opens nothing
            raise ValueError(f"keyring file {path} names no file (a dangling symlink): remove it") from None

    @classmethod
    def _load_file(cls, path: Path) -> Keyring:
        # opened without waiting (a FIFO would block every command until a writer came), then
        # what was opened is checked: a regular file, that other users cannot read or write
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise ValueError(f"keyring file {path} is not a regular file: remove it")
        with open(fd) as fh:
            if (mode := st.st_mode & 0o777) & 0o077:
                raise ValueError(
                    f"keyring file {path} is readable or writable by other users (mode {mode:o}): "
                    f"run chmod 600 {path}"
                )
            try:
                return cls.parse(fh.read())
            except ValueError as exc:
                raise ValueError(
                    f"keyring file {path}: {exc}; delete the file to start a new development keyring "
                    "(grants minted with the old one stop working)"
                ) from exc

    def _mac(self, kid: str, body: str) -> str:
        if (state := self._hmacs.get(kid)) is None:
            raise TokenError(
                "keyring_mismatch",
                f"signed with key {kid!r}, which this keyring does not hold (keys: "
                f"{', '.join(sorted(self._keys))}): the process that approved and this one use different "
                "keyrings. Share one: set EFFECTGATE_KEYRING in both, or let both use the database's key "
                "file (DB.keys beside a SQLite database)",
            )
        return _mac_bytes(state, body.encode()).decode()

    @staticmethod
    def _body(kid: str, approval_id: str, version: int, expires_ms: int, nonce: str, args_hash: str) -> str:
        return f"{PREFIX}|{kid}|{approval_id}|{version}|{expires_ms}|{nonce}|{args_hash}"

    def mint(
        self, *, approval_id: str, version: int, args_hash: str, expires_at: float, round_: int | None = None
    ) -> str:
        expires_ms = int(expires_at * 1000)
        if not (0 <= expires_ms < 10**15 and _DIGITS9.fullmatch(str(version))):  # `verify` rounds it exactly
            raise ValueError(f"a grant's expiry ({expires_at!r}) or version ({version!r}) no token can hold")
        if round_ is not None and not (type(round_) is int and _DIGITS9.fullmatch(str(round_))):
            raise ValueError(f"a grant round ({round_!r}) no token can hold")
        nonce = secrets.token_urlsafe(_NONCE_LEN * 3 // 4) + ("" if round_ is None else f"_r{round_}")
        kid = self.current
        mac = self._mac(kid, self._body(kid, approval_id, version, expires_ms, nonce, args_hash))
        return f"{PREFIX}.{kid}.{approval_id}.{version}.{expires_ms}.{nonce}.{mac}"

    def sign(self, purpose: str, data: bytes) -> str:
        """A MAC over `data` for one purpose (domain-separated from grant tokens), with its key id:
        for state the application stores and must get back unchanged (e.g. an agent's memory)."""
        kid = self.current
        return f"{kid}.{self._mac(kid, self._signed_body(purpose, data))}"

    def verify_signature(self, purpose: str, data: bytes, signature: str) -> None:
        """Raise TokenError("forged") unless `signature` is this keyring's MAC of `data` for `purpose`."""
        if not isinstance(signature, str) or len(signature) > MAX_TOKEN or not signature.isascii():
            raise TokenError("forged", "the signature is not one of this keyring's")
        kid, _, mac = signature.partition(".")
        if not mac or kid not in self._keys:
            raise TokenError("forged", "the signature names no key of this keyring")
        if not hmac.compare_digest(mac, self._mac(kid, self._signed_body(purpose, data))):
            raise TokenError("forged", f"the {purpose} does not match its signature")

    def verifier(self, purpose: str) -> Callable[[bytes, str], bool]:
        """`verify_signature` as a predicate, for checking many signatures of one purpose (the
        audit's seals): True exactly when `verify_signature(purpose, data, signature)` would
        return. The purpose's prefix is built once (`_signed_body` spells the format: its body of
        no data without that data's digest); the comparison is constant-time."""
        sha256 = hashlib.sha256
        head = self._signed_body(purpose, b"").removesuffix(sha256(b"").hexdigest()).encode()
        states = self._hmacs

        def verifies(data: bytes, signature: str) -> bool:
            if not isinstance(signature, str) or len(signature) > MAX_TOKEN or not signature.isascii():
                return False
            kid, _, mac = signature.partition(".")
            if (state := states.get(kid)) is None or not mac:
                return False
            return hmac.compare_digest(
                mac.encode(), _mac_bytes(state, head + sha256(data).hexdigest().encode())
            )

        return verifies

    def verifies(self, purpose: str, data: bytes, signature: str) -> bool:
        """Whether `verify_signature(purpose, data, signature)` would return (rather than raise):
        the `verifier` of `purpose`, made once (a seal is checked on every decision's read)."""
        if (check := self._verifiers.get(purpose)) is None:
            check = self._verifiers[purpose] = self.verifier(purpose)
        return check(data, signature)

    def hmac_hex(self, data: bytes, *, kid: str | None = None) -> tuple[str, str]:
        """(key id, hex HMAC-SHA256 of `data`) with key `kid` (default: current), for signatures
        another program checks with a plain HMAC (webhooks). Use a keyring of its own for that:
        never the grant keyring."""
        kid = kid or self.current
        if (key := self._keys.get(kid)) is None:
            raise TokenError("unknown_key", f"no key with id {kid!r}")
        return kid, hmac.new(key, data, hashlib.sha256).hexdigest()

    def shares_key(self, other: Keyring) -> bool:
        """Whether the two keyrings hold any common key, as HMAC uses it (constant-time per pair)."""
        theirs = [_hmac_key(k) for k in other._keys.values()]
        return any(hmac.compare_digest(_hmac_key(a), b) for a in self._keys.values() for b in theirs)

    @staticmethod
    def _signed_body(purpose: str, data: bytes) -> str:
        return f"{PREFIX}-signed|{purpose}|{hashlib.sha256(data).hexdigest()}"

    @staticmethod
    def read(token: str) -> TokenClaims:
        """Split a token into its claims; TokenError(malformed) if it is not one: every field is
        checked for its alphabet and length before anything is parsed or looked up."""
        whole = _TOKEN.fullmatch(token) if type(token) is str and len(token) <= MAX_TOKEN else None
        if whole is not None:  # every check below passes: one match instead of six
            kid, approval_id, version, expires_ms, nonce, mac = whole.groups()
            return TokenClaims(kid, approval_id, int(version), int(expires_ms) / 1000, nonce, mac)
        if not isinstance(token, str):
            raise TokenError("malformed", "a token is a string")
        parts = token.split(".") if len(token) <= MAX_TOKEN and token.isascii() else []
        if len(parts) != 7 or parts[0] != PREFIX:
            raise TokenError("malformed", "not an effectgate grant token")
        _, kid, approval_id, version, expires_ms, nonce, mac = parts
        if not (_DIGITS9.fullmatch(version) and _DIGITS16.fullmatch(expires_ms)):
            raise TokenError("malformed", "version and expiry must be short decimal integers (no leading 0)")
        if not (_KID.fullmatch(kid) and all(_FIELD.fullmatch(f) for f in (approval_id, nonce, mac))):
            raise TokenError("malformed", "a token field holds characters or a length it cannot have")
        return TokenClaims(kid, approval_id, int(version), int(expires_ms) / 1000, nonce, mac)

    def verify(self, claims: TokenClaims, *, args_hash: str) -> None:
        """Check the MAC against the frozen args hash of the record; constant-time compare."""
        c = claims
        body = self._body(c.kid, c.approval_id, c.version, round(c.expires_at * 1000), c.nonce, args_hash)
        if not hmac.compare_digest(self._mac(c.kid, body), c.mac):
            raise TokenError("forged", "the token's signature does not match this approval")


def keyring_for(url: str, *, create: bool = True) -> Keyring:
    """The one keyring resolution the gate, the CLI and the inbox share: `$EFFECTGATE_KEYRING`;
    else, for a SQLite file, the development key file beside it (`DB.keys`, created atomically
    with mode 0600 when missing and `create`); an in-memory SQLite database gets a fresh keyring
    (nothing outlives the process). Any other database (PostgreSQL) without the variable raises
    `MissingKeyring`, saying how to configure one."""
    ring = Keyring.from_env()
    if ring is not None:
        return ring
    import sqlalchemy as sa

    from .stores._memory import in_memory, shown, sqlite_file

    try:
        parsed = sa.engine.make_url(url)
    except (sa.exc.ArgumentError, ValueError) as exc:  # the URL unquoted: it may hold a password
        raise MissingKeyring(f"cannot tell where the keys for this database URL live: {exc}") from None
    if parsed.get_backend_name() == "sqlite":
        if in_memory(parsed):  # any in-memory form, URI ones too: no key file for it
            return Keyring.generate()
        keys = Path(f"{sqlite_file(parsed)}.keys")  # the file of any URL form of the database
        if not create and not keys.exists():
            raise MissingKeyring(
                f"no keyring for {parsed.database}: set EFFECTGATE_KEYRING (kid:hexsecret), or keep the key "
                f"file {keys} beside the database (a new key would verify nothing stored under the old one)"
            )
        return Keyring.load_or_create(keys)
    raise MissingKeyring(
        f"no keyring for {shown(parsed)}: set EFFECTGATE_KEYRING to "
        'kid:hexsecret[,kid:hexsecret...] (make a key with: python -c "import secrets; '
        "print('k1:' + secrets.token_hex(32))\") in every process that approves or executes against "
        "this database, or pass keyring= to EffectGate"
    )


_URLSAFE = bytes.maketrans(b"+/", b"-_")


def _keyed(keys: Mapping[str, bytes]) -> dict[str, Any]:
    """Each key's keyed HMAC-SHA256 state: OpenSSL's own object (what `hmac.HMAC` wraps: a MAC is
    three C calls without the wrapper's three Python ones), else the `hmac.HMAC` (same methods)."""
    states = {kid: hmac.new(secret, digestmod="sha256") for kid, secret in keys.items()}
    return {kid: getattr(state, "_hmac", None) or state for kid, state in states.items()}


def _mac_bytes(state: Any, body: bytes) -> bytes:
    """The unpadded urlsafe base64 of the HMAC of `body`, from a keyed state (left unchanged)."""
    h = state.copy()
    h.update(body)
    return binascii.b2a_base64(h.digest(), newline=False).translate(_URLSAFE).rstrip(b"=")


def _secret(kid: object, secret: object) -> bytes:
    """A key's secret as bytes (from any bytes-like value); TypeError for text or a non-text id."""
    if not isinstance(kid, str):
        raise TypeError(f"a key id is text, not {type(kid).__name__}")
    if not isinstance(secret, bytes | bytearray | memoryview):  # the key id is not echoed (a secret?)
        raise TypeError(f"a key is bytes (bytes.fromhex(hexsecret)), not {type(secret).__name__}")
    return bytes(secret)


def _hmac_key(secret: bytes) -> bytes:
    """The key HMAC-SHA256 uses for `secret` (hashed beyond a 64-byte block, zero-padded to it):
    `s` and `s + b"\\0"` are one key, so they are one secret to a keyring."""
    return (hashlib.sha256(secret).digest() if len(secret) > 64 else secret).ljust(64, b"\0")
