"""The money path's shortcuts give exactly what the longer forms they replace give."""

from __future__ import annotations

import dataclasses
import json
import pickle
import random
import re
from typing import Any

import pytest

from effectgate import Keyring
from effectgate._intent import subject_keys
from effectgate._json import dumps
from effectgate._seal import seal_approval
from effectgate.canonical import digest, key_of
from effectgate.errors import ArgumentError, TokenError
from effectgate.outcomes import Card
from effectgate.stores._statements import record_of
from effectgate.stores.base import IdempotencyRecord
from tests.conformance.stores import approval_row

_KID = re.compile(r"[A-Za-z0-9_-]{1,32}")
_FIELD = re.compile(r"[A-Za-z0-9_-]{1,128}")


def reference_read(token: Any) -> tuple[Any, ...] | None:
    """`Keyring.read` as its field-by-field checks decide: the claims, or None (malformed)."""
    if not isinstance(token, str) or len(token) > 512 or not token.isascii():
        return None
    parts = token.split(".")
    if len(parts) != 7 or parts[0] != "eg1":
        return None
    _, kid, approval_id, version, expires_ms, nonce, mac = parts
    if not (re.fullmatch(r"[0-9]{1,9}", version) and re.fullmatch(r"[0-9]{1,16}", expires_ms)):
        return None
    if not (_KID.fullmatch(kid) and _FIELD.fullmatch(approval_id) and _FIELD.fullmatch(nonce)):
        return None
    if not _FIELD.fullmatch(mac):
        return None
    return (kid, approval_id, int(version), int(expires_ms) / 1000, nonce, mac)


def mutations(token: str, rng: random.Random) -> list[Any]:
    alphabet = "aZ9_-.+/=é\n \x00٣"
    out: list[Any] = [token, token + "\n", "\n" + token, token.upper(), token * 2, None, 7, token.encode()]
    parts = token.split(".")
    for index, (char, limit) in enumerate([("e", 3), ("k", 32), ("a", 128), ("9", 9), ("9", 16), ("n", 128)]):
        for length in (0, 1, limit, limit + 1):
            out.append(".".join([*parts[:index], char * length, *parts[index + 1 :]]))
    out += [".".join([*parts[:6], "m" * length]) for length in (0, 128, 129)]
    for _ in range(400):
        chars = list(token)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(chars) + 1)
            op = rng.random()
            if op < 0.4 and at < len(chars):
                chars[at] = rng.choice(alphabet)
            elif op < 0.7:
                chars.insert(at, rng.choice(alphabet) * rng.choice([1, 1, 9, 40, 130]))
            elif at < len(chars):
                del chars[at]
        out.append("".join(chars))
    return out


def test_read_accepts_exactly_what_its_field_checks_accept() -> None:
    """A token reads (to the same claims) exactly when every field check passes, else it is malformed."""
    rng = random.Random(15)
    ring = Keyring.generate()
    token = ring.mint(approval_id="a" * 32, version=12, args_hash="h" * 64, expires_at=1_800_000_000.5)
    for candidate in mutations(token, rng):
        expected = reference_read(candidate)
        if expected is None:
            with pytest.raises(TokenError) as raised:
                Keyring.read(candidate)
            assert raised.value.reason == "malformed"
        else:
            assert dataclasses.astuple(Keyring.read(candidate)) == expected


def test_verifies_is_verify_signature_as_a_predicate() -> None:
    """`verifies` is True exactly when `verify_signature` returns, for good and bad signatures."""
    ring, other = Keyring.generate(), Keyring.generate()
    good = ring.sign("approval", b"body")
    kid, _, mac = good.partition(".")
    signatures: list[Any] = [good, other.sign("approval", b"body"), f"{kid}.{mac[:-1]}A", f"{kid}.", kid]
    signatures += [f"nokey.{mac}", good + "é", good + "x" * 600, "", None]
    for purpose, data in (("approval", b"body"), ("decision", b"body"), ("approval", b"other")):
        for signature in signatures:
            try:
                ring.verify_signature(purpose, data, signature)
                returned = True
            except TokenError:
                returned = False
            assert ring.verifies(purpose, data, signature) is returned
    assert pickle.loads(pickle.dumps(ring)).verifies("approval", b"body", good)


@pytest.mark.parametrize(
    "update",
    [
        {},
        {"status": "approved", "updated_at": 3.0, "token_hash": "t"},
        {"grants": 1, "token_kid": "k", "seal": "x"},
        {"version": 2, "args_hash": "g" * 64, "approver_role": "cfo", "origin_message_id": "m2"},
    ],
)
def test_a_seal_with_an_update_is_the_seal_of_the_updated_row(update: dict[str, Any]) -> None:
    """Sealing `row` as `update` leaves it is sealing the row with those values written."""
    ring = Keyring.generate()
    row = approval_row("a1", created_at=1.0)
    assert seal_approval(ring, row, update) == seal_approval(ring, dataclasses.replace(row, **update))


def test_record_of_is_the_record_the_dataclass_builds() -> None:
    """A read idempotency row becomes the record its constructor makes, the result parsed."""
    row = ("k", "h", "succeeded", "o", None, '{"ok":true}', None, "ref", 2, 1.0, 2.0, "u1")
    record = record_of(row)
    assert record == IdempotencyRecord(
        key="k",
        payload_hash="h",
        status="succeeded",
        lease_owner="o",
        lease_expires_at=None,
        result={"ok": True},
        error=None,
        provider_ref="ref",
        attempts=2,
        created_at=1.0,
        updated_at=2.0,
        user_id="u1",
    )
    assert pickle.loads(pickle.dumps(record)) == record
    with pytest.raises(ValueError, match="shorter"):
        record_of(row[:-1])


@pytest.mark.parametrize(
    "subject",
    [{"ref": "r1"}, {"to": ["a@x", "b@x"], "n": 3}, {"amount": 1.5}, {"é\u2028": 'q"\\'}, {"\U0001f600": 1}],
)
@pytest.mark.parametrize("parts", [("intent", "s1", "pay", "m1"), ("intent-shadow", "sé", 'p"', "m\n")])
def test_subject_keys_are_the_digest_and_key_of_the_subject(subject: Any, parts: tuple[str, ...]) -> None:
    """One encoding of the subject gives the subject key and the intent key the long forms give."""
    assert subject_keys(subject, *parts) == (digest({"subject": subject}), key_of(*parts, subject))


def test_subject_keys_refuse_what_key_of_refuses() -> None:
    """A lone surrogate in a part is refused as `key_of` refuses it."""
    with pytest.raises(ArgumentError) as long_form:
        key_of("intent", "s\ud800", "pay", "m1", {"ref": "r"})
    with pytest.raises(ArgumentError) as short_form:
        subject_keys({"ref": "r"}, "intent", "s\ud800", "pay", "m1")
    short, long = short_form.value, long_form.value
    assert (short.pointer, str(short)) == (long.pointer, str(long))


def test_dumps_is_json_dumps_for_json_values() -> None:
    """An approval's subject and notes are written as `json.dumps` writes them."""
    for value in ({"ref": "é", "n": [1, 2.5, None, True]}, [], ["note: \u2028"], {"\U0001f600": "x"}):
        assert dumps(value) == json.dumps(value)


def test_a_card_from_a_record_is_the_dataclass_it_builds() -> None:
    """A card from a record equals one built by its constructor, and compares, replaces, pickles
    and stays frozen as the generated dataclass does."""
    card = Card.from_record(approval_row("a1", created_at=1.0))
    assert card == Card(**{f.name: getattr(card, f.name) for f in dataclasses.fields(Card)})
    assert dataclasses.replace(card) == card
    assert dataclasses.replace(card, reason="r").reason == "r"
    assert pickle.loads(pickle.dumps(card)) == card
    with pytest.raises(dataclasses.FrozenInstanceError):
        card.status = "approved"  # type: ignore[misc]
