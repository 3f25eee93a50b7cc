"""The audit's seal check gives `verify_signature`'s verdict on every seal it is shown."""

from __future__ import annotations

import secrets
from typing import Any

import pytest

from effectgate._seal import _verifies, seal_checker
from effectgate.canonical import ENCODE
from effectgate.tokens import Keyring

VALUES: tuple[Any, ...] = ("a1", 1, 0, "s1", "m1", "u1", "agent", "pay", "money", "k", "h" * 64, "finance", 1)


def _seal(keyring: Keyring, purpose: str, values: tuple[Any, ...]) -> str:
    return keyring.sign(purpose, ENCODE(list(values)).encode("utf-8", "surrogatepass"))


@pytest.mark.parametrize("key_bytes", [32, 64, 65, 100])
@pytest.mark.parametrize("purpose", ["approval", "decision"])
def test_the_audit_check_agrees_with_the_keyring(key_bytes: int, purpose: str) -> None:
    """Current and rotated keys verify; an edited value, an edited seal, another purpose's seal, an
    unknown key and a seal that is not text do not: exactly as `Keyring.verify_signature` says."""
    old = Keyring.parse(f"old:{secrets.token_hex(key_bytes)}")
    keyring = Keyring.parse(f"new:{secrets.token_hex(key_bytes)},{old.dumps()}")
    stranger = Keyring.parse(f"new:{secrets.token_hex(32)}")
    check = seal_checker(keyring, purpose)
    other = "decision" if purpose == "approval" else "approval"
    good = _seal(keyring, purpose, VALUES)
    edited = (*VALUES[:-1], 2)
    cases: list[tuple[tuple[Any, ...], Any]] = [
        (VALUES, good),
        (VALUES, _seal(old, purpose, VALUES)),
        (("é", "\u2028", None, 2.5, True), _seal(keyring, purpose, ("é", "\u2028", None, 2.5, True))),
        (edited, good),
        (VALUES, good[:-1] + ("A" if good[-1] != "A" else "B")),
        (VALUES, _seal(keyring, other, VALUES)),
        (VALUES, _seal(stranger, purpose, VALUES)),
        (VALUES, "new."),
        (VALUES, ""),
        (VALUES, None),
        (VALUES, b"new.x"),
        (VALUES, "né." + good),
        ((b"blob",), good),
    ]
    verdicts = [check(values, seal) for values, seal in cases]
    assert verdicts == [_verifies(keyring, purpose, values, seal or "") for values, seal in cases]
    assert verdicts[:3] == [True, True, True]
    assert not any(verdicts[3:])
