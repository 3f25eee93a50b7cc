"""Round 10, the cryptographic boundary: grant tokens, keyrings, key files and seals under
hostile input (an edited database row, a planted key file)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import Approver, EffectGate, Grant, Keyring, Pending
from effectgate.audit import audit
from effectgate.chain import seal_chain, verify_chain
from effectgate.errors import TamperedRecord, TokenError
from effectgate.examples.shop import context
from effectgate.redact import redact
from effectgate.testing import FakeClock

from .conftest import ShopGate

REFUND = {"order_id": "1042", "amount": 12000, "currency": "GBP"}
FINANCE = Approver("fiona", "finance")


def granted(gate: EffectGate) -> Grant:
    pending = gate.call("refund_order", REFUND, context("m1"))
    assert isinstance(pending, Pending), pending
    grant = gate.approve(pending.approval_id, version=pending.version, approver=FINANCE)
    assert isinstance(grant, Grant)
    return grant


def edit(gate: EffectGate, approval_id: str, **columns: object) -> None:
    sets = ", ".join(f"{c} = :{c}" for c in columns)
    with gate.store.engine.begin() as conn:  # behind effectgate's back
        done = conn.execute(
            sa.text(f"UPDATE eg_approvals SET {sets} WHERE id = :id"), {"id": approval_id, **columns}
        )
        assert done.rowcount == 1


def refusals(gate: EffectGate) -> list[Any]:
    return [e for e in gate.store.events() if e.kind == "token_refused"]


def test_a_token_hash_edited_into_text_that_is_not_ascii_is_a_recorded_refusal(shop_gate: ShopGate) -> None:
    """The stored token hash is compared in constant time, which Python refuses for text that is
    not ASCII: an edited column was a raw TypeError, unrecorded, instead of a refused grant."""
    shop, gate = shop_gate
    grant = granted(gate)
    edit(gate, grant.approval_id, token_hash="é" * 64)
    with pytest.raises(TokenError) as refused:
        gate.execute(grant.token)
    assert refused.value.reason == "forged"
    assert shop.receiver.count("refund") == 0
    assert [e.approval_id for e in refusals(gate)] == [grant.approval_id]


def test_a_seal_edited_into_a_blob_is_a_tampered_record_on_every_path(shop_gate: ShopGate) -> None:
    """SQLite keeps a blob in a text column: the seal check said no, but telling a keyring
    mismatch from an edit raised TypeError at approve (and on the card's warning)."""
    shop, gate = shop_gate
    if gate.store.engine.dialect.name != "sqlite":
        pytest.skip("PostgreSQL refuses a blob in a text column")
    grant = granted(gate)
    edit(gate, grant.approval_id, seal=b"k1.abc")
    with pytest.raises(TokenError) as refused:
        gate.execute(grant.token)
    assert refused.value.reason == "tampered"
    with pytest.raises(TamperedRecord):
        gate.approve(grant.approval_id, version=grant.version, approver=Approver("bob", "finance"))
    assert shop.receiver.count("refund") == 0


def test_a_key_file_that_is_a_dangling_symlink_is_a_clear_error(tmp_path: Path) -> None:
    """The link cannot be replaced and opens nothing: a ValueError naming the file, not a raw
    FileNotFoundError after three attempts (and no key file is made elsewhere)."""
    target = tmp_path / "elsewhere" / "planted"
    (tmp_path / "db.keys").symlink_to(target)
    with pytest.raises(ValueError, match=r"db\.keys"):
        Keyring.load_or_create(tmp_path / "db.keys")
    assert not target.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["db.keys"]


@pytest.mark.parametrize("text", ["{secret}:k1", "k1:{secret},{secret}:k2", "{secret}x:{secret}"])
def test_a_keyring_written_secret_first_never_echoes_the_secret(text: str) -> None:
    """A key id that is not one (a secret written before the colon) was quoted in the error,
    which the CLI prints and logs keep."""
    secret = "4d2ddb9aa76a38f949d25f25ee6ef56ba6d39dbc0cf141ccf1ab88001715388a"
    with pytest.raises(ValueError, match="key id") as raised:
        Keyring.parse(text.format(secret=secret))
    assert secret[:16] not in str(raised.value)
    with pytest.raises(ValueError, match="key id") as raised:
        Keyring({secret: bytes.fromhex(secret)}, current=secret)
    assert secret[:16] not in str(raised.value)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to chown")
@pytest.mark.xfail(
    strict=True,
    reason="design decision: refusing a key file owned by another user would also refuse root "
    "(a container) reading a developer's key file",
)
def test_a_key_file_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    """README: the key file is refused when other users can read it. One owned by another user
    (mode 0600: its owner reads and rewrites it) is read by a process running as root."""
    path = tmp_path / "db.keys"
    path.write_text(Keyring.generate().dumps())
    path.chmod(0o600)
    os.chown(path, 4242, 4242)
    with pytest.raises(ValueError, match="owned"):
        Keyring.load_or_create(path)


@pytest.mark.parametrize(
    ("column", "value"), [("at", float("inf")), ("first_id", 2**60), ("count", -(2**60))]
)
def test_a_checkpoint_edited_beyond_json_is_a_break_not_a_crash(
    shop_gate: ShopGate, clock: FakeClock, column: str, value: object
) -> None:
    """A value of the column's own type that has no exact JSON form (an infinite time, an id
    beyond 2**53) is an edit like any other: the chain names the break, nothing raises."""
    gate = shop_gate.gate
    granted(gate)
    gate.flush()
    assert seal_chain(gate.store, gate.keyring, now=clock.now() + 61)
    with gate.store.transaction() as conn:
        if conn.dialect.name == "sqlite":
            conn.exec_driver_sql("DROP TRIGGER IF EXISTS eg_chain_no_update")
        else:
            conn.exec_driver_sql("DROP TRIGGER IF EXISTS eg_chain_append_only ON eg_chain")
        edit = f"UPDATE eg_chain SET {column} = :v WHERE table_name = 'eg_events'"
        conn.execute(sa.text(edit), {"v": value})
    breaks = verify_chain(gate.store, gate.keyring)
    assert "eg_events" in {b.table for b in breaks}
    assert "chain_broken" in {f.kind for f in audit(gate.store, keyring=gate.keyring, chain=True).findings}


def test_a_redaction_entry_edited_into_a_blob_is_a_finding_not_a_crash(
    shop_gate: ShopGate, clock: FakeClock
) -> None:
    """SQLite keeps a blob in a text column of a redaction entry: its seal is checked over
    canonical JSON, and the chain reads its commitment as text; the audit named nothing and
    raised instead."""
    _, gate = shop_gate
    if gate.store.engine.dialect.name != "sqlite":
        pytest.skip("PostgreSQL refuses a blob in a text column")
    gate.execute(granted(gate).token)
    gate.flush()
    assert seal_chain(gate.store, gate.keyring, now=clock.now() + 61)
    assert redact(gate.store, gate.keyring, user_id="u1", by="dpo", reason="erasure").values
    assert verify_chain(gate.store, gate.keyring) == []
    with gate.store.transaction() as conn:
        conn.exec_driver_sql("DROP TRIGGER IF EXISTS eg_redacted_no_update")
        conn.exec_driver_sql("UPDATE eg_redacted SET commitment = X'00'")
    assert not audit(gate.store, gate.table, keyring=gate.keyring).clean
    assert verify_chain(gate.store, gate.keyring)
    assert "chain_broken" in {f.kind for f in audit(gate.store, keyring=gate.keyring, chain=True).findings}


def test_an_erasure_over_a_checkpoint_whose_key_id_is_a_blob_is_refused_cleanly(
    shop_gate: ShopGate, clock: FakeClock
) -> None:
    """An erasure needs the key of every checkpoint; one whose key id an edit made a blob is not
    a key this keyring holds: refused as a mismatch (nothing erased), where naming it raised
    TypeError."""
    _, gate = shop_gate
    if gate.store.engine.dialect.name != "sqlite":
        pytest.skip("PostgreSQL refuses a value of another type")
    gate.execute(granted(gate).token)
    gate.flush()
    assert seal_chain(gate.store, gate.keyring, now=clock.now() + 61)
    with gate.store.transaction() as conn:
        conn.exec_driver_sql("DROP TRIGGER IF EXISTS eg_chain_no_update")
        conn.exec_driver_sql("UPDATE eg_chain SET key_id = X'00'")
    with pytest.raises(TokenError) as refused:
        redact(gate.store, gate.keyring, user_id="u1", by="dpo", reason="erasure")
    assert refused.value.reason == "keyring_mismatch"
    with gate.store.reading() as conn:
        assert list(gate.store.redacted(conn)) == []
