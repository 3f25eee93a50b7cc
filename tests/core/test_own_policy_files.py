"""The files that govern the gate are effectgate's own too: the effect table loaded from TOML and
the inbox's approver file. With either inside the file tools' directory, a write (which runs at
once) could reclassify a money tool as a read, or add an approver whose secret the writer knows;
both take effect at the next start."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from effectgate import CallContext, EffectGate, EffectTable, open_store
from effectgate.tools import PathRefused, file_tools
from effectgate.web._auth import ApproverRegistry, hash_secret

TABLE = """
[tools.refund_order]
effect = "money"
approver_role = "finance"
"""


def ctx() -> CallContext:
    return CallContext(session_id="s1", origin_message_id="m1", user_id="u1", agent_id="coder")


@pytest.fixture
def work(tmp_path: Path) -> Iterator[tuple[Path, EffectGate]]:
    root = tmp_path / "work"
    root.mkdir()
    store = open_store("sqlite://")
    store.setup()
    table = EffectTable(file_tools(root))
    table.allow_all("coder")
    gate = EffectGate(table, store)
    try:
        yield root, gate
    finally:
        gate.close()
        store.close()


def test_the_effect_table_file_is_not_the_models_to_rewrite(work: tuple[Path, EffectGate]) -> None:
    root, gate = work
    policy = root / "effects.toml"
    policy.write_text(TABLE)
    EffectTable.from_toml(policy, {"refund_order": lambda order_id: None})
    with pytest.raises(PathRefused) as refused:
        gate.call("write_file", {"path": "effects.toml", "content": TABLE.replace("money", "read")}, ctx())
    assert refused.value.code == "protected"
    assert policy.read_text() == TABLE


def test_the_approver_file_is_not_the_models_to_rewrite(work: tuple[Path, EffectGate]) -> None:
    root, gate = work
    approvers = root / "approvers.toml"
    text = f'[[approver]]\nid = "fiona"\nrole = "finance"\nsecret = "{hash_secret("s3cret")}"\n'
    approvers.write_text(text)
    ApproverRegistry.from_toml(approvers)
    added = text + text.replace("fiona", "mallory")
    with pytest.raises(PathRefused) as refused:
        gate.call("write_file", {"path": "approvers.toml", "content": added}, ctx())
    assert refused.value.code == "protected"
    assert approvers.read_text() == text
