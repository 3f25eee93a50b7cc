"""Keys that just work, safely: one keyring resolution for the gate, the CLI and the inbox.

`EffectGate(table, store)` with no keyring uses $EFFECTGATE_KEYRING, else a SQLite file's key file
beside it (made atomically, 0600), else refuses at construction (a server database) saying how to
configure one. A grant from another keyring is refused as a keyring mismatch, with the fix.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from effectgate import EffectGate, Keyring, Pending, open_store
from effectgate.cli import main
from effectgate.errors import MissingKeyring, TamperedRecord, TokenError
from effectgate.examples.shop import Shop, app, context

REFUND = {"order_id": "1042", "amount": 6000, "currency": "GBP"}


@pytest.fixture(autouse=True)
def no_env_keyring(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EFFECTGATE_KEYRING", raising=False)


def test_a_gate_on_a_sqlite_file_uses_the_key_file_beside_it(tmp_path: Path) -> None:
    """With no keyring given, a gate on a SQLite file makes (and then reuses) DB.keys, mode 0600."""
    db = tmp_path / "shop.db"
    store = open_store(f"sqlite:///{db}")
    store.setup()
    with EffectGate(Shop().table(), store) as first, EffectGate(Shop().table(), store) as second:
        keys = Path(f"{db}.keys")
        assert stat.S_IMODE(os.stat(keys).st_mode) == 0o600
        assert first.keyring.dumps() == second.keyring.dumps() == keys.read_text()
    store.close()


def test_an_approval_from_the_cli_executes_in_an_application_built_like_the_quick_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`effectgate approve` and an application that passes no keyring share the database's key
    file, so the CLI's grant runs in the application (it was refused as forged before)."""
    db = tmp_path / "shop.db"
    url = f"sqlite:///{db}"
    store = open_store(url)
    store.setup()
    shop = Shop()
    gate = app(store, shop=shop)  # no keyring: the resolution picks DB.keys
    try:
        pending = gate.call("refund_order", REFUND, context("m1"))
        assert isinstance(pending, Pending)
        code = main(
            [
                "--db",
                url,
                "--app",
                "effectgate.examples.shop:app",
                "approve",
                pending.approval_id,
                "--version",
                "1",
                "--as",
                "finance",
                "--approver",
                "fiona",
            ]
        )
        assert code == 0
        token = capsys.readouterr().out.strip().splitlines()[-1]
        gate.execute(token)
        assert shop.receiver.count("refund") == 1
    finally:
        gate.close()
        store.close()


@pytest.mark.postgres
def test_a_server_database_without_a_keyring_is_refused_at_construction(pg_url: str) -> None:
    """On PostgreSQL with no EFFECTGATE_KEYRING and no keyring given, the gate refuses to start and
    says how to configure one (a per-process random key would refuse every other process's grant)."""
    store = open_store(pg_url)
    store.setup()
    try:
        with pytest.raises(MissingKeyring, match="EFFECTGATE_KEYRING"):
            EffectGate(Shop().table(), store)
    finally:
        store.close()


def test_a_grant_from_another_keyring_is_a_keyring_mismatch(tmp_path: Path) -> None:
    """A token minted under another keyring is refused as a keyring mismatch that names the fix."""
    store = open_store(f"sqlite:///{tmp_path / 'a.db'}")
    store.setup()
    shop = Shop()
    mine, theirs = app(store, shop=shop), app(store, keyring=Keyring.generate(), shop=shop)
    try:
        pending = mine.call("refund_order", REFUND, context("m1"))
        assert isinstance(pending, Pending)
        from effectgate import Approver

        with pytest.raises(TamperedRecord, match="keyring mismatch"):  # sealed under mine
            theirs.approve(pending.approval_id, version=1, approver=Approver("fiona", "finance"))
        token = theirs.keyring.mint(
            approval_id=pending.approval_id, version=1, args_hash=pending.card.args_hash, expires_at=2e9
        )
        with pytest.raises(TokenError) as raised:
            mine.execute(token)
        assert raised.value.reason == "keyring_mismatch"
        assert "EFFECTGATE_KEYRING" in str(raised.value)
        assert shop.receiver.count("refund") == 0
    finally:
        mine.close()
        theirs.close()
        store.close()
