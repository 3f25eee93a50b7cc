"""Grant tokens: HMAC bound to one approval version and its args hash; keyrings that rotate."""

from __future__ import annotations

import base64
import copy
import hashlib
import hmac
import os
import pickle
import stat
from pathlib import Path
from typing import Any

import pytest

from effectgate import Keyring
from effectgate.errors import TokenError
from effectgate.tokens import token_hash

HASH = "a" * 64
# Fixed, random-looking keys (a key of one repeated byte is refused as not random).
KEY_01, KEY_02, KEY_07, KEY_CD = (hashlib.sha256(n.encode()).hexdigest() for n in ("01", "02", "07", "cd"))
EXPIRES = 1_800_000_300.0


def mint(ring: Keyring, *, approval_id: str = "ap1", version: int = 1, args_hash: str = HASH) -> str:
    return ring.mint(approval_id=approval_id, version=version, args_hash=args_hash, expires_at=EXPIRES)


def verify_reason(ring: Keyring, token: str, args_hash: str = HASH) -> str:
    with pytest.raises(TokenError) as raised:
        ring.verify(Keyring.read(token), args_hash=args_hash)
    return raised.value.reason


def replace_part(token: str, index: int, value: str) -> str:
    parts = token.split(".")
    parts[index] = value
    return ".".join(parts)


def test_minted_token_verifies_and_reads_back_its_claims() -> None:
    """A token verifies against its args hash and carries its approval, version, expiry and key id."""
    ring = Keyring.generate("k1")
    token = mint(ring, approval_id="ap1", version=3)
    claims = Keyring.read(token)
    ring.verify(claims, args_hash=HASH)
    assert (claims.kid, claims.approval_id, claims.version, claims.expires_at) == ("k1", "ap1", 3, EXPIRES)


def test_token_with_a_fractional_expiry_verifies() -> None:
    """An expiry that is not a whole second survives the millisecond encoding."""
    ring = Keyring.generate()
    token = ring.mint(approval_id="ap1", version=1, args_hash=HASH, expires_at=1_800_000_300.123)
    ring.verify(Keyring.read(token), args_hash=HASH)


def test_two_mints_of_the_same_grant_differ() -> None:
    """Each token carries a fresh nonce."""
    ring = Keyring.generate()
    assert mint(ring) != mint(ring)


def test_token_is_bound_to_the_args_hash() -> None:
    """Verified against another args hash, the token is forged."""
    ring = Keyring.generate()
    assert verify_reason(ring, mint(ring), args_hash="b" * 64) == "forged"


@pytest.mark.parametrize(
    ("index", "value"),
    [(2, "ap2"), (3, "2"), (4, str(int(EXPIRES * 1000) + 1000)), (5, "another_nonce")],
    ids=["approval", "version", "expiry", "nonce"],
)
def test_changing_any_claim_breaks_the_mac(index: int, value: str) -> None:
    """The MAC covers every field: a changed approval, version, expiry or nonce is forged."""
    ring = Keyring.generate()
    assert verify_reason(ring, replace_part(mint(ring), index, value)) == "forged"


def test_changed_mac_character_is_forged() -> None:
    """Changing one character of the MAC is detected."""
    ring = Keyring.generate()
    token = mint(ring)
    mac = token.split(".")[6]
    assert (
        verify_reason(ring, replace_part(token, 6, mac[:-1] + ("A" if mac[-1] != "A" else "B"))) == "forged"
    )


def test_token_from_another_keyring_with_the_same_kid_is_forged() -> None:
    """Another secret under the same key id does not verify."""
    assert verify_reason(Keyring.generate("k1"), mint(Keyring.generate("k1"))) == "forged"


def test_token_under_an_unknown_key_id_is_refused() -> None:
    """A token naming a key id the keyring lacks raises unknown_key."""
    assert verify_reason(Keyring.generate("k1"), mint(Keyring.generate("k9"))) == "keyring_mismatch"


@pytest.mark.parametrize(
    "token",
    ["", "eg1.k1.ap1", "eg2.k1.ap1.1.100.nonce.mac", "eg1.k1.ap1.one.100.nonce.mac", "eg1.k1.ap1.1.soon.n.m"],
    ids=["empty", "short", "prefix", "version", "expiry"],
)
def test_malformed_tokens_are_refused(token: str) -> None:
    """Anything that is not seven dot-separated fields with integer version and expiry is malformed."""
    with pytest.raises(TokenError) as raised:
        Keyring.read(token)
    assert raised.value.reason == "malformed"


def test_token_hash_is_what_the_store_keeps() -> None:
    """token_hash is a stable sha256 hex that does not contain the token."""
    token = mint(Keyring.generate())
    assert token_hash(token) == token_hash(token)
    assert len(token_hash(token)) == 64
    assert token not in token_hash(token)


# -- rotation


def test_rotated_keyring_verifies_tokens_of_the_old_key() -> None:
    """After rotation to k2, a token minted under k1 still verifies."""
    old = Keyring.generate("k1")
    token = mint(old)
    rotated = Keyring.parse(f"k2:{KEY_CD},{old.dumps()}")
    rotated.verify(Keyring.read(token), args_hash=HASH)


def test_rotated_keyring_mints_with_the_current_key() -> None:
    """New tokens name the current key id, and the old keyring cannot verify them."""
    old = Keyring.generate("k1")
    rotated = Keyring.parse(f"k2:{KEY_CD},{old.dumps()}")
    token = mint(rotated)
    assert Keyring.read(token).kid == "k2"
    assert verify_reason(old, token) == "keyring_mismatch"


def test_retired_key_no_longer_verifies() -> None:
    """Once k1 is dropped from the keyring, its tokens are refused."""
    old = Keyring.generate("k1")
    token = mint(old)
    assert verify_reason(Keyring.parse(f"k2:{KEY_CD}"), token) == "keyring_mismatch"


# -- parse, dumps, files


def test_dumps_and_parse_round_trip() -> None:
    """parse(dumps()) keeps every key and the current one."""
    ring = Keyring({"k1": bytes.fromhex(KEY_01), "k2": bytes.fromhex(KEY_02)}, current="k2")
    again = Keyring.parse(ring.dumps())
    assert again.current == "k2"
    assert again.dumps() == ring.dumps()
    token = mint(ring)
    again.verify(Keyring.read(token), args_hash=HASH)


def test_dumps_puts_the_current_key_first() -> None:
    """The first entry of the text form is the current key."""
    ring = Keyring({"k1": bytes.fromhex(KEY_01), "k2": bytes.fromhex(KEY_02)}, current="k2")
    assert ring.dumps() == f"k2:{KEY_02},k1:{KEY_01}"


def test_parse_takes_the_first_key_as_current() -> None:
    """In `kid:hex,kid:hex` the first key signs."""
    ring = Keyring.parse(f" k7:{KEY_07} , k1:{KEY_01} ")
    assert ring.current == "k7"


@pytest.mark.parametrize("text", ["k1", "k1:zz", f"k1:{'01' * 8}", f"k.1:{KEY_01}"])
def test_parse_refuses_a_malformed_keyring(text: str) -> None:
    """No separator, bad hex, a key under 32 bytes or a key id with '.' is refused."""
    with pytest.raises(ValueError):  # noqa: PT011 - each case has its own message
        Keyring.parse(text)


def test_current_key_must_be_in_the_keyring() -> None:
    """The current key id must name one of the keys."""
    with pytest.raises(ValueError, match="current"):
        Keyring({"k1": bytes.fromhex(KEY_01)}, current="k2")


def test_from_env_reads_the_keyring(monkeypatch: pytest.MonkeyPatch) -> None:
    """EFFECTGATE_KEYRING holds the keyring's text form; unset, from_env gives None."""
    ring = Keyring.generate("k3")
    monkeypatch.setenv("EFFECTGATE_KEYRING", ring.dumps())
    loaded = Keyring.from_env()
    assert loaded is not None
    assert loaded.dumps() == ring.dumps()
    monkeypatch.delenv("EFFECTGATE_KEYRING")
    assert Keyring.from_env() is None


def test_load_or_create_makes_a_0600_file(tmp_path: Path) -> None:
    """The first call creates the keyring file readable by its owner only."""
    path = tmp_path / "keyring"
    ring = Keyring.load_or_create(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert path.read_text() == ring.dumps()


def test_load_or_create_loads_the_existing_file(tmp_path: Path) -> None:
    """A second call (another process) loads the same keys, so its tokens verify."""
    path = tmp_path / "keyring"
    first = Keyring.load_or_create(path)
    second = Keyring.load_or_create(path)
    assert second.dumps() == first.dumps()
    second.verify(Keyring.read(mint(first)), args_hash=HASH)


def test_signatures_keep_their_format_under_prepared_keys() -> None:
    """A signature is `kid.` + unpadded urlsafe base64 of HMAC-SHA256(key, "eg1-signed|purpose|"
    + sha256 hex of the data): computed here from the definition, with the standard library."""
    key = bytes(range(32))
    keyring = Keyring({"k1": key}, current="k1")
    data = "é seal body".encode()
    body = f"eg1-signed|approval|{hashlib.sha256(data).hexdigest()}".encode()
    expected = base64.urlsafe_b64encode(hmac.new(key, body, hashlib.sha256).digest()).rstrip(b"=").decode()
    assert keyring.sign("approval", data) == f"k1.{expected}"
    keyring.verify_signature("approval", data, f"k1.{expected}")
    assert keyring.verifier("approval")(data, f"k1.{expected}")
    assert not keyring.verifier("decision")(data, f"k1.{expected}")


@pytest.mark.parametrize("clone", [copy.copy, copy.deepcopy, lambda k: pickle.loads(pickle.dumps(k))])
def test_a_copied_keyring_signs_and_verifies_as_the_original(clone: Any) -> None:
    keyring = Keyring.generate()
    twin = clone(keyring)
    signature = keyring.sign("memory", b"state")
    twin.verify_signature("memory", b"state", signature)
    assert twin.sign("memory", b"state") == signature
    keyring.verify(Keyring.read(mint(twin)), args_hash=HASH)
