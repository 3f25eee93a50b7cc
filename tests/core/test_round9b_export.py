"""Round 9b review of the export and the ledger's hash chain: a row inserted below the first
checkpointed id (id 0 or negative, which no append-only trigger refuses) is a chain break, and a
manifest edited into deeply nested JSON is a broken export, not a raw RecursionError."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from effectgate import EffectGate
from effectgate.audit import audit
from effectgate.chain import verify_chain
from effectgate.export import ExportError, Manifest, manifest_path, verify_export
from effectgate.stores import SQLStore

from .test_chain import ledger as chain_ledger  # noqa: F401 - the fixture
from .test_chain import sql
from .test_export import ledger  # noqa: F401 - the fixture


@pytest.mark.parametrize("table", ["eg_decisions", "eg_events", "eg_executions"])
@pytest.mark.parametrize("row_id", [0, -1])
def test_a_row_inserted_below_the_first_checkpoint_is_a_chain_break(
    chain_ledger: EffectGate,  # noqa: F811
    table: str,
    row_id: int,
) -> None:
    store = chain_ledger.store
    assert isinstance(store, SQLStore)
    with store.reading() as conn:
        names = [c for c in conn.exec_driver_sql(f"SELECT * FROM {table} LIMIT 1").keys() if c != "id"]  # noqa: SIM118
    cols = ", ".join(names)
    # a copy of the first (sealed) row under an id no checkpoint's range starts at
    sql(store, f"INSERT INTO {table} (id, {cols}) SELECT {row_id}, {cols} FROM {table} WHERE id = 1")
    with store.reading() as conn:
        assert conn.exec_driver_sql(f"SELECT count(*) FROM {table} WHERE id = {row_id}").scalar() == 1
    breaks = verify_chain(store, chain_ledger.keyring)
    assert [b.table for b in breaks] == [table]
    assert not audit(store, chain_ledger.table, keyring=chain_ledger.keyring, chain=True).clean


def test_a_deeply_nested_manifest_is_a_broken_export_not_a_crash(
    ledger: tuple[EffectGate, Path],  # noqa: F811
) -> None:
    gate, path = ledger
    target = manifest_path(path)
    data = json.loads(target.read_text())
    data["heads"] = "NESTED"
    target.write_text(json.dumps(data).replace('"NESTED"', "[" * 900 + "]" * 900))
    verdict = verify_export(path, gate.keyring)
    assert not verdict.ok
    assert "manifest" in str(verdict.problem)
    with pytest.raises(ExportError):  # `export --after` and `audit --pinned` check it the same way
        Manifest.load(target).check(gate.keyring)
