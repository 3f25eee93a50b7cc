"""Commitments to personal values: what an erasure (`effectgate.redact`) keeps of an erased
value, what an export carries beside its chain (`effectgate.export`) and what the ledger's hash
chain links (`effectgate.chain`). A commitment is the value's keyed hash under every key of the
keyring; only the keyring's holder can compute one, so nobody can confirm a guess."""

from __future__ import annotations

import hmac

from .tokens import Keyring

COMMIT = "personal"  # the derived key of a personal value's commitment


def keyed_hash(key: bytes, text: str) -> str:
    """A personal value's keyed hash under one derived key (`keyring.derived_key(COMMIT, kid)`):
    what a commitment holds per key, and what the ledger's chain links (`effectgate.chain`)."""
    return hmac.digest(key, text.encode("utf-8", "surrogatepass"), "sha256").hex()


def _mac(keyring: Keyring, kid: str, text: str) -> str:
    return keyed_hash(keyring.derived_key(COMMIT, kid), text)


def commitment(keyring: Keyring, text: str) -> str:
    """A personal value's commitment: its keyed hash under every key of the keyring, as
    `kid.hex[,kid.hex...]` (current key first), so a chain sealed under an older key still checks
    an erased value. Only the keyring's holder can compute it: nobody can confirm a guess."""
    return ",".join(f"{kid}.{_mac(keyring, kid, text)}" for kid in keyring.kids)


def commitment_part(committed: object, kid: str) -> str | None:
    """The keyed hash under key `kid` in a commitment (None if it has none)."""
    if not isinstance(committed, str):  # a blob an edit stored (SQLite): it commits to nothing
        return None
    for part in committed.split(","):
        k, _, mac = part.partition(".")
        if k == kid:
            return mac
    return None


def commitment_holds(keyring: Keyring, text: str, committed: str) -> bool:
    """`text` is the value `committed` commits to (checked with a key both name)."""
    for part in committed.split(","):
        kid, _, mac = part.partition(".")
        if mac and keyring.holds(kid) and hmac.compare_digest(mac, _mac(keyring, kid, text)):
            return True
    return False
