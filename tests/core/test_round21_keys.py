"""Round 21, keys, tokens, seals and the chain: a grant spelled two ways, a keyring given text
secrets, a grant no token reader accepts, and a chain whose last checkpoint's key was retired
(refused as a keyring mismatch naming the key, not as an edit). Effects counted at the receiver;
records read back. SQLite and PostgreSQL (`store`) where a store is involved."""

from __future__ import annotations

import hashlib

import pytest

from effectgate import Approver, EffectGate, Executed, Grant, Keyring, Pending, Policy
from effectgate.chain import ChainError, seal_chain, verify_chain
from effectgate.errors import TokenError
from effectgate.examples.shop import Shop, app, context
from effectgate.notify import WebhookNotifier
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from .conftest import ShopGate
from .test_chain import sql, unguard

REFUND = {"order_id": "1042", "amount": 1200, "currency": "GBP"}
FINANCE = Approver("fiona", "finance")
HEX = "5f0e9a1b2c3d4e5f60718293a4b5c6d7e8f90112233445566778899aabbccdde"


def granted(gate: EffectGate, message: str = "m1", **args: object) -> Grant:
    pending = gate.call("refund_order", {**REFUND, **args}, context(message))
    assert isinstance(pending, Pending), pending
    grant = gate.approve(pending.approval_id, version=pending.version, approver=FINANCE)
    assert isinstance(grant, Grant)
    return grant


# -- 1. one grant, one spelling -------------------------------------------------------------------


def test_a_grant_respelled_with_leading_zeros_is_malformed_and_the_grant_runs_once(
    shop_gate: ShopGate,
) -> None:
    """The token's MAC covers its version and expiry as integers, so "01" and "1" verified alike:
    two strings were one grant to `Keyring.verify` (only execute's hash check told them apart).
    A token has one spelling: a respelled one is malformed before anything is looked up."""
    shop, gate = shop_gate
    grant = granted(gate)
    head, kid, approval_id, version, expires, nonce, mac = grant.token.split(".")
    for respelled in (
        ".".join((head, kid, approval_id, "0" + version, expires, nonce, mac)),
        ".".join((head, kid, approval_id, version, "0" + expires, nonce, mac)),
    ):
        with pytest.raises(TokenError) as refused:
            Keyring.read(respelled)
        assert refused.value.reason == "malformed"
        with pytest.raises(TokenError) as refused:
            gate.execute(respelled)
        assert refused.value.reason == "malformed"
    assert Keyring.read(grant.token).version == int(version)  # the minted spelling reads
    assert isinstance(gate.execute(grant.token), Executed)
    assert shop.receiver.count("refund") == 1


def test_a_token_of_version_zero_or_expiry_zero_still_reads() -> None:
    """A lone zero is the one spelling of zero: it is not a leading zero."""
    claims = Keyring.read("eg1.k1.ap1.0.0.nonce.mac")
    assert (claims.version, claims.expires_at) == (0, 0.0)


def test_a_tokens_claims_never_show_the_token_in_their_repr(shop_gate: ShopGate) -> None:
    """`Grant` keeps its token out of its repr (a live credential in a notebook's output or a
    log), but the claims `Keyring.read` and `adapter.bind_decision` return printed every field,
    the MAC too: the token, whole. Their repr leaves the MAC out; the grant still runs once."""
    shop, gate = shop_gate
    grant = granted(gate)
    claims = Keyring.read(grant.token)
    assert claims.mac not in repr(claims)
    assert claims.approval_id in repr(claims)
    assert isinstance(gate.execute(grant.token), Executed)
    assert shop.receiver.count("refund") == 1


# -- 2. keyrings built from what is not bytes ------------------------------------------------------


def test_a_keyring_of_text_secrets_is_refused_with_the_fix() -> None:
    """A hex text passed where bytes belong failed deep in hmac ("key: expected bytes or
    bytearray"); a bytearray failed as "unhashable type". Text is refused saying what to pass;
    a bytes-like secret is its bytes (a keyring of it mints and verifies as one of bytes)."""
    with pytest.raises(TypeError, match=r"bytes\.fromhex"):
        Keyring({"k1": HEX}, current="k1")  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="key id"):
        Keyring({1: bytes.fromhex(HEX)}, current=1)  # type: ignore[dict-item]
    ring = Keyring({"k1": bytearray.fromhex(HEX)}, current="k1")  # type: ignore[dict-item]
    same = Keyring({"k1": bytes.fromhex(HEX)}, current="k1")
    token = ring.mint(approval_id="ap1", version=1, args_hash="h", expires_at=1_800_000_000.0)
    same.verify(Keyring.read(token), args_hash="h")
    assert ring.dumps() == same.dumps() == f"k1:{HEX}"


def test_a_secret_hmac_takes_for_another_keys_is_that_key(store: SQLStore, clock: FakeClock) -> None:
    """HMAC zero-pads a key to its 64-byte block and hashes a longer one, so `s + b"\\0"` (or
    sha256 of a long `s`) is the key `s`. A keyring took both under two ids (a seal of one
    relabelled with the other's id verified), and a webhook keyring holding such a key passed
    the gate's check that its receiver cannot mint grants. Both are one secret."""
    key, long = bytes.fromhex(HEX), bytes.fromhex(HEX * 3)
    for first, other in ((key, key + b"\0"), (key, key + b"\0" * 32), (long, hashlib.sha256(long).digest())):
        with pytest.raises(ValueError, match="has the secret of key 'k1'"):
            Keyring({"k1": first, "k2": other}, current="k1")
    ring = Keyring({"k1": key}, current="k1")
    padded = Keyring({"w1": key + b"\0"}, current="w1")
    assert ring.shares_key(padded)
    assert not ring.shares_key(Keyring.generate())
    hook = WebhookNotifier("https://hooks.example/approvals", keyring=padded, clock=clock, background=False)
    try:
        with pytest.raises(ValueError, match="grant keyring"):
            app(store, keyring=ring, clock=clock, notify=hook)
    finally:
        hook.close()


# -- 3. a grant no reader accepts is never minted -------------------------------------------------


def test_a_grant_whose_expiry_no_token_can_hold_is_refused_before_it_is_counted(
    store: SQLStore, clock: FakeClock
) -> None:
    """`Policy(token_ttl=...)` takes any finite number of seconds, but a token's expiry is at most
    16 digits of milliseconds (and `verify` rounds it back exactly below 10**15): approve minted,
    counted and sealed a grant whose token every execute refused. It is refused at mint
    (ValueError), and nothing is recorded."""
    shop = Shop()
    policy = Policy(role_grants={"finance_lead": frozenset({"finance"})}, token_ttl=1e13)
    gate = EffectGate(shop.table(), store, policy=policy, keyring=Keyring.generate(), clock=clock)
    try:
        pending = gate.call("refund_order", REFUND, context("m1"))
        assert isinstance(pending, Pending)
        with pytest.raises(ValueError, match="expiry"):
            gate.approve(pending.approval_id, version=1, approver=FINANCE)
        rows = [a for a in gate.store.approvals() if a.id == pending.approval_id]
        assert [(a.status, a.grants, a.token_hash) for a in rows] == [("pending", 0, None)]
        assert shop.receiver.count("refund") == 0
        assert not [e for e in gate.store.events() if e.kind == "token_minted"]
    finally:
        gate.close()


def test_every_grant_mint_makes_verifies_and_one_it_cannot_make_is_refused() -> None:
    """Above 10**15 ms, `verify`'s float round trip of the expiry could miss the minted
    millisecond: a genuine grant (expiry 4409687845415.109 s) was refused as forged."""
    ring = Keyring.generate()
    for at in (0.0, 1_800_000_000.123, 10**12 - 0.001):
        ring.verify(
            Keyring.read(ring.mint(approval_id="a", version=1, args_hash="h", expires_at=at)), args_hash="h"
        )
    for at, version in ((4_409_687_845_415.109, 1), (10**12, 1), (-1.0, 1), (1.0, True), (1.0, 10**9)):
        with pytest.raises(ValueError, match="no token can hold"):
            ring.mint(approval_id="a", version=version, args_hash="h", expires_at=at)


# -- 4. a chain whose last checkpoint's key was retired --------------------------------------------


def test_a_seal_after_the_checkpoints_key_was_retired_names_the_key_and_writes_nothing(
    store: SQLStore, clock: FakeClock
) -> None:
    """Rotating by replacing (the old key dropped) left the chain's checkpoints under a key the
    keyring no longer holds; a new approval sealed under the new key passed the keyring check, so
    the seal said the last checkpoint "does not verify: run `effectgate audit --chain`" (an edit)
    and the audit called every checkpoint "forged or edited" besides naming its key. The seal is
    refused as a keyring mismatch naming the key; the audit names the key, once per checkpoint."""
    old, new = Keyring.generate("k1"), Keyring.generate("k2")
    shop = Shop()
    before = app(store, keyring=old, clock=clock, shop=shop)
    after = app(store, keyring=new, clock=clock, shop=shop)
    try:
        assert isinstance(before.execute(granted(before).token), Executed)
        before.flush()
        made = seal_chain(store, old, now=clock.now() + 61)
        assert made
        assert isinstance(after.call("refund_order", {**REFUND, "order_id": "1043"}, context("m2")), Pending)
        after.flush()
        with pytest.raises(TokenError, match="'k1'") as refused:
            seal_chain(store, new, now=clock.now() + 61)
        assert refused.value.reason == "keyring_mismatch"
        with store.reading() as conn:
            assert len(store.checkpoints(conn)) == len(made)  # nothing written
        found = verify_chain(store, new)
        assert sorted(b.table for b in found) == sorted(c.table_name for c in made)
        assert all("'k1'" in b.problem and "forged" not in b.problem for b in found)
        assert verify_chain(store, Keyring.parse(f"{new.dumps()},{old.dumps()}")) == []
        assert shop.receiver.count("refund") == 1
    finally:
        after.close()
        before.close()


# -- 5. a blob in a personal column ----------------------------------------------------------------


def test_a_blob_in_a_personal_column_is_never_chained_as_the_text_that_spells_it(
    shop_gate: ShopGate, clock: FakeClock
) -> None:
    """A personal value entered the chain as the keyed hash of `str(value)`: a blob SQLite kept
    from an edit was checkpointed (every other column's blob is refused: "a value no gate
    writes"), and a text spelling the blob's repr (`b'{}'`) linked as the blob itself, so an edit
    from one to the other after the checkpoint went unseen. A blob there is refused, as elsewhere."""
    _, gate = shop_gate
    store = gate.store
    if store.engine.dialect.name != "sqlite":
        pytest.skip("PostgreSQL refuses a blob in a text column")
    assert isinstance(gate.call("get_order", {"order_id": "1042"}, context("m0")), Executed)
    gate.flush()
    first = min(e.id for e in store.events() if e.id is not None)
    unguard(store, "eg_events")
    sql(store, "UPDATE eg_events SET detail_json = :v WHERE id = :id", v="b'{}'", id=first)
    assert seal_chain(store, gate.keyring, now=clock.now() + 61)
    sql(store, "UPDATE eg_events SET detail_json = :v WHERE id = :id", v=b"{}", id=first)
    assert [b.table for b in verify_chain(store, gate.keyring)] == ["eg_events"]
    assert isinstance(gate.call("get_order", {"order_id": "1043"}, context("m1")), Executed)
    gate.flush()
    with store.reading() as conn:
        held = len(store.checkpoints(conn))
    newest = max(e.id for e in store.events() if e.id is not None)
    sql(store, "UPDATE eg_events SET detail_json = :v WHERE id = :id", v=b"{}", id=newest)
    with pytest.raises(ChainError, match="no gate writes"):
        seal_chain(store, gate.keyring, now=clock.now() + 61)
    with store.reading() as conn:
        assert len(store.checkpoints(conn)) == held  # nothing checkpointed
