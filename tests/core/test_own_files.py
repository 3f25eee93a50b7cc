"""The file tools never read, write or delete effectgate's own files: a SQLite store's database,
its journals and its key file. `file_tools(".")` beside the default `effectgate.db` is a natural
first set-up; without this the model could read the grant keys (`effectgate.db.keys`, text) or
replace the ledger with a write (a write runs at once, unapproved). Effects are counted on disk.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from effectgate import Approver, CallContext, EffectGate, EffectTable, Grant, Keyring, Pending, open_store
from effectgate.tools import PathRefused, file_tools

AGENT = "coder"
OPS = (Approver("olga", "ops"), Approver("oscar", "ops"))


def ctx(message_id: str = "m1") -> CallContext:
    return CallContext(session_id="s1", origin_message_id=message_id, user_id="u1", agent_id=AGENT)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("hello\n")
    return work


@pytest.fixture
def gate(root: Path) -> Iterator[EffectGate]:
    """A gate whose SQLite store (and so its key file) lies inside the file tools' directory."""
    store = open_store(f"sqlite:///{root / 'ledger.db'}")
    store.setup()
    table = EffectTable(file_tools(root, approver_role="ops"))
    table.allow_all(AGENT)
    gate = EffectGate(table, store)
    gate.call("read_file", {"path": "notes.txt"}, ctx("m0"))  # the store is in use: WAL and keys exist
    try:
        yield gate
    finally:
        gate.close()
        store.close()


def snapshot(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in root.iterdir() if p.name.startswith("ledger.db")}


@pytest.mark.parametrize("name", ["ledger.db.keys", "ledger.db", "LEDGER.DB.KEYS"])
def test_the_model_cannot_read_the_store_or_its_keys(gate: EffectGate, root: Path, name: str) -> None:
    assert (root / "ledger.db.keys").exists()
    with pytest.raises(PathRefused) as refused:
        gate.call("read_file", {"path": name}, ctx())
    assert refused.value.code == "protected"  # a name that differs only in case too (macOS)


def test_a_search_never_shows_the_key_file(gate: EffectGate, root: Path) -> None:
    kid = (root / "ledger.db.keys").read_text().split(":", 1)[0].strip()
    found = gate.call("search_files", {"pattern": "*", "contains": kid}, ctx())
    assert getattr(found, "result", None) == {"path": ".", "matches": [], "truncated": False}


@pytest.mark.parametrize(
    "name", ["ledger.db", "ledger.db-wal", "ledger.db-shm", "ledger.db-journal", "ledger.db.keys"]
)
def test_a_write_never_replaces_or_plants_the_stores_files(gate: EffectGate, root: Path, name: str) -> None:
    keys = (root / "ledger.db.keys").read_bytes()
    planted = "k1:" + "00" * 32
    with pytest.raises(PathRefused) as refused:
        gate.call("write_file", {"path": name, "content": planted}, ctx())
    assert refused.value.code == "protected"
    assert (root / "ledger.db.keys").read_bytes() == keys
    # the target was neither replaced nor planted (the refused call's arguments are in the ledger)
    assert not (root / name).exists() or (root / name).read_bytes() != planted.encode()
    assert not (root / name).exists() or name in (
        "ledger.db",
        "ledger.db-wal",
        "ledger.db-shm",
        "ledger.db.keys",
    )
    assert gate.call("read_file", {"path": "notes.txt"}, ctx("m2")).result == "hello\n"  # type: ignore[union-attr]


def test_an_approved_delete_of_the_database_changes_nothing(gate: EffectGate, root: Path) -> None:
    before = (root / "ledger.db.keys").read_bytes()
    pending = gate.call("delete_file", {"path": "ledger.db.keys"}, ctx())
    assert isinstance(pending, Pending)
    for approver in OPS:  # two distinct approvers: a destructive row
        grant = gate.approve(pending.approval_id, version=1, approver=approver)
    assert isinstance(grant, Grant)
    with pytest.raises(PathRefused) as refused:
        gate.execute(grant.token)
    assert refused.value.code == "protected"
    assert (root / "ledger.db.keys").read_bytes() == before


def test_a_key_file_loaded_by_path_is_protected_too(tmp_path: Path, root: Path) -> None:
    """A keyring kept in a file inside the work directory (any store, PostgreSQL too)."""
    keys = root / "grants.keys"
    ring = Keyring.load_or_create(keys)
    store = open_store("sqlite://")
    store.setup()
    table = EffectTable(file_tools(root, approver_role="ops"))
    table.allow_all(AGENT)
    gate = EffectGate(table, store, keyring=ring)
    try:
        with pytest.raises(PathRefused) as refused:
            gate.call("read_file", {"path": "grants.keys"}, ctx())
        assert refused.value.code == "protected"
    finally:
        gate.close()
        store.close()


def test_another_name_of_the_key_file_is_protected(tmp_path: Path, root: Path) -> None:
    """A hard link to the key file inside the work directory (made by another process; the
    store itself lies outside it) is the key file all the same."""
    store = open_store(f"sqlite:///{tmp_path / 'outside.db'}")
    store.setup()
    table = EffectTable(file_tools(root))
    table.allow_all(AGENT)
    gate = EffectGate(table, store)
    os.link(tmp_path / "outside.db.keys", root / "copy.txt")
    try:
        with pytest.raises(PathRefused) as refused:
            gate.call("read_file", {"path": "copy.txt"}, ctx())
        assert refused.value.code == "protected"
        assert gate.call("read_file", {"path": "notes.txt"}, ctx("m2")).result == "hello\n"  # type: ignore[union-attr]
    finally:
        gate.close()
        store.close()
