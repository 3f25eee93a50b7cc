"""Round 7 review of the file tools (`effectgate.tools`): what a model that controls the
arguments can still do to the work directory and to effectgate's own files beside it. Effects
are counted on disk (and in the ledger)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import CallContext, Effect, EffectGate, EffectTable, Pending, Policy, Refused, open_store
from effectgate.tools import PathRefused, file_tools

AGENT = "coder"


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
    """A gate whose SQLite store lies inside the file tools' directory (`file_tools(".")`)."""
    store = open_store(f"sqlite:///{root / 'ledger.db'}")
    store.setup()
    table = EffectTable(file_tools(root, approver_role="ops"))
    table.allow_all(AGENT)
    gate = EffectGate(table, store)
    gate.call("read_file", {"path": "notes.txt"}, ctx("m0"))  # the store is in use
    try:
        yield gate
    finally:
        gate.close()
        store.close()


@pytest.mark.parametrize("path", ["ledger.db-journal/x", "ledger.db-journal/sub/x"])
def test_a_write_never_makes_a_directory_under_a_stores_file_name(
    gate: EffectGate, root: Path, path: str
) -> None:
    """write_file makes the missing directories on its path; one named as a journal of the store
    (`ledger.db-journal`, absent while the store runs in WAL mode) would make every new
    connection to the ledger fail ("disk I/O error": SQLite takes it for a hot journal), so the
    gate, its inbox and its CLI could record nothing more. Refused as `protected`, nothing made."""
    with pytest.raises(PathRefused) as refused:
        gate.call("write_file", {"path": path, "content": "x"}, ctx())
    assert refused.value.code == "protected"
    assert not (root / "ledger.db-journal").exists()
    engine = sa.create_engine(f"sqlite:///{root / 'ledger.db'}")  # a new connection still opens
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM sqlite_master").scalar_one() > 0
    finally:
        engine.dispose()


def search(root: Path, **limits: int) -> Any:
    return {spec.name: spec.fn for spec in file_tools(root, **limits)}["search_files"]


@pytest.mark.parametrize(
    ("limits", "kwargs"),
    [
        ({"max_results": 1}, {"pattern": "*.txt"}),  # one .txt file: its one match is all there is
        ({"max_results": 1}, {"contains": "hello"}),  # one line holds it
        ({"max_results": 2}, {"pattern": "*"}),  # two files, two matches
        ({"max_search_files": 2}, {"pattern": "*"}),  # two files, both looked at
    ],
)
def test_a_search_that_found_everything_is_not_truncated(
    root: Path, limits: dict[str, int], kwargs: dict[str, str]
) -> None:
    """`truncated` tells the model that more may match than it was shown; a search whose last
    match (or file) was exactly at the limit, with nothing left to find, said so all the same."""
    (root / "z.md").write_text("bye\n")
    (root / "zz").mkdir()  # an empty directory after the last file: nothing more in it
    out = search(root, **limits)(**kwargs)
    assert out["truncated"] is False, out
    full = search(root)(**kwargs)
    assert out["matches"] == full["matches"]


@pytest.mark.parametrize(
    ("limits", "kwargs", "shown"),
    [
        ({"max_results": 1}, {"pattern": "*"}, 1),
        ({"max_results": 1}, {"contains": "e"}, 1),
        ({"max_search_files": 1}, {"pattern": "*"}, 1),
    ],
)
def test_a_search_cut_at_its_limit_is_truncated(
    root: Path, limits: dict[str, int], kwargs: dict[str, str], shown: int
) -> None:
    (root / "z.md").write_text("bye\n")
    out = search(root, **limits)(**kwargs)
    assert out["truncated"] is True
    assert len(out["matches"]) == shown


@pytest.mark.xfail(
    strict=True,
    reason="design: an autonomous write is keyed by (session, tool, message, arguments), so "
    "within one message a write back to earlier content (A, B, A) replays the first write's "
    "stored result (replay=True, 'created': True) and the file keeps B; keying the file rows by "
    "the file's state (or by call order) is a gate-level decision",
)
def test_a_write_back_to_earlier_content_in_one_message_is_applied(gate: EffectGate, root: Path) -> None:
    """A model that tries a change and reverts it in one turn (write A, write B, write A) is told
    each write ran; the file must end as the last write says."""
    for content in ("A\n", "B\n", "A\n"):
        gate.call("write_file", {"path": "plan.md", "content": content}, ctx())
    assert (root / "plan.md").read_text() == "A\n"


@pytest.mark.parametrize("path", ["../outside.txt", "/etc/passwd", "notes.txt/", ".", "a/../../b"])
def test_a_delete_of_a_path_the_tools_refuse_never_reaches_an_approver(
    gate: EffectGate, root: Path, path: str
) -> None:
    """A delete waits for two approvers; one of a path the tools refuse as text (absolute, `..`
    out of the work directory, a directory) can never run, so it is refused when proposed, with
    the reason, instead of asking two people to approve it and failing after they have."""
    out = gate.call("delete_file", {"path": path}, ctx())
    assert isinstance(out, Refused), out
    assert out.code == "confirm_failed"
    assert "refused" in out.message
    assert gate.store.approvals() == []
    assert (root / "notes.txt").read_text() == "hello\n"


def test_a_delete_of_a_good_path_still_waits_for_approval(gate: EffectGate) -> None:
    out = gate.call("delete_file", {"path": "./notes.txt"}, ctx())
    assert isinstance(out, Pending)
    assert len(gate.store.approvals()) == 1


def test_a_gated_write_of_a_path_the_tools_refuse_never_reaches_an_approver(root: Path) -> None:
    store = open_store(f"sqlite:///{root / 'ledger.db'}")
    store.setup()
    table = EffectTable(file_tools(root, approver_role="ops"))
    table.allow_all(AGENT)
    with EffectGate(table, store, policy=Policy(autonomous=frozenset({Effect.READ}))) as gate:
        out = gate.call("write_file", {"path": "../outside.txt", "content": "x"}, ctx())
        assert isinstance(out, Refused)
        assert out.code == "confirm_failed"
        assert isinstance(gate.call("write_file", {"path": "ok.txt", "content": "x"}, ctx()), Pending)
        assert [row.tool for row in store.approvals()] == ["write_file"]
    store.close()
    assert not (root.parent / "outside.txt").exists()
