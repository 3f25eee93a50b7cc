"""The file tools (`effectgate.tools.files`): what each does inside the work directory, their
rows, and how the gate runs them (writes once with before/after state, deletes after two
approvals, refusals recorded as nothing having happened). Effects are counted on disk.

Hostile paths, symlink swaps and the property over path strings: test_files_tools_hostile.py.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from effectgate import (
    Approver,
    CallContext,
    Effect,
    EffectTable,
    Executed,
    Grant,
    PartialApproval,
    Pending,
    ToolSpec,
)
from effectgate.errors import TableError
from effectgate.stores import SQLStore
from effectgate.tools import PathRefused, file_tools
from effectgate.tools import files as files_module

from ._files_tree import SECRET, Tree, make_tree, specs, tools
from .conftest import MakeGate

AGENT = "coder"
OLGA, OMAR = Approver("olga", "ops"), Approver("omar", "ops")


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    return make_tree(tmp_path / "files")  # the SQLite store lives in tmp_path itself


def ctx(message_id: str = "m1") -> CallContext:
    return CallContext(session_id="s1", origin_message_id=message_id, user_id="u1", agent_id=AGENT)


def leftovers(directory: Path) -> list[str]:
    """Temporary files a write left behind (there must be none)."""
    return [p.name for p in directory.rglob(".effectgate-*")]


# -- the rows


def test_rows_name_their_effects_subjects_and_definite_failures(tree: Tree) -> None:
    """read_file, list_dir and search_files are reads, write_file a write with a snapshot,
    delete_file destructive under the given role; the path is the subject; refusals are definite."""
    rows = specs(tree.root)
    assert {n: s.effect for n, s in rows.items()} == {
        "read_file": Effect.READ,
        "list_dir": Effect.READ,
        "search_files": Effect.READ,
        "write_file": Effect.WRITE,
        "delete_file": Effect.DESTRUCTIVE,
    }
    assert rows["delete_file"].approver_role == "ops"
    for name in ("read_file", "write_file", "delete_file"):
        assert rows[name].subject == ("path",)
        assert rows[name].subject_of({"path": "a.txt"}) == {"path": "a.txt"}
    assert rows["write_file"].snapshot is not None
    assert rows["delete_file"].snapshot is not None
    assert all(set(s.definite_failures) == {PathRefused, FileNotFoundError} for s in rows.values())
    assert rows["write_file"].validate({"path": "a", "content": "x", "mode": "w"})  # extra refused
    assert rows["read_file"].validate({"path": "a.txt"}) == []


def test_no_approver_role_no_delete_and_prefix_names(tree: Tree) -> None:
    """Without an approver role there is no delete_file; `prefix` renames every tool."""
    assert [s.name for s in file_tools(tree.root)] == ["read_file", "list_dir", "search_files", "write_file"]
    named = [s.name for s in file_tools(tree.root, approver_role="ops", prefix="docs_")]
    assert named == [
        "docs_read_file",
        "docs_list_dir",
        "docs_search_files",
        "docs_write_file",
        "docs_delete_file",
    ]
    table = EffectTable([*file_tools(tree.root, approver_role="ops"), *file_tools(tree.outside, prefix="o_")])
    assert len(table) == 9


def test_a_root_that_is_not_a_directory_or_a_bad_limit_is_refused_when_built(tree: Tree) -> None:
    """The root must exist and be a directory, and limits must be positive, when the rows are made."""
    with pytest.raises(FileNotFoundError):
        file_tools(tree.base / "missing")
    with pytest.raises(NotADirectoryError):
        file_tools(tree.root / "a.txt")
    with pytest.raises(TableError, match="max_read_bytes"):
        file_tools(tree.root, max_read_bytes=0)
    with pytest.raises(TableError, match="max_results"):
        file_tools(tree.root, max_results=True)


# -- read_file, list_dir, search_files


def test_read_file_reads_text_by_a_normalized_path(tree: Tree) -> None:
    """A file is read by any path that stays inside, `..` within the directory included."""
    read = tools(tree.root)["read_file"]
    assert read("a.txt") == "alpha\n"
    assert read("./docs/../a.txt") == "alpha\n"
    assert read("docs//readme.md") == "hello docs\n"


def test_read_file_refuses_files_over_the_limit_and_binary_files(tree: Tree) -> None:
    """Over `max_read_bytes` (by size) is refused as too large; bytes that are not UTF-8 as not text."""
    (tree.root / "bin").write_bytes(b"\xff\xfe\x00")
    read = tools(tree.root, max_read_bytes=5)["read_file"]
    with pytest.raises(PathRefused, match="larger than the 5-byte limit") as caught:
        read("a.txt")
    assert caught.value.code == "too_large"
    with pytest.raises(PathRefused, match="not UTF-8 text"):
        read("bin")


def test_a_file_that_grows_after_its_size_was_checked_is_cut_off(
    tree: Tree, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read itself is capped: a file within the limit at fstat that grows before the read is refused."""
    (tree.root / "grows.txt").write_text("1234")
    real_read = os.read
    grown: list[int] = []

    def read_after_growth(fd: int, n: int) -> bytes:
        if not grown:
            grown.append(1)
            with open(tree.root / "grows.txt", "a") as f:
                f.write("x" * 100)
        return real_read(fd, n)

    read = tools(tree.root, max_read_bytes=10)["read_file"]
    monkeypatch.setattr(os, "read", read_after_growth)
    with pytest.raises(PathRefused, match="larger than the 10-byte limit"):
        read("grows.txt")
    assert grown == [1]


def test_list_dir_lists_entries_and_does_not_follow_symlinks(tree: Tree) -> None:
    """Entries come sorted with their type; a symlink is listed as one, and cannot be listed into."""
    listing = tools(tree.root)["list_dir"]
    out = listing()
    assert out["path"] == "."
    assert out["truncated"] is False
    assert out["entries"] == [
        {"name": "a.txt", "type": "file", "size": 6},
        {"name": "docs", "type": "dir"},
        {"name": "fifo", "type": "other"},
        {"name": "li", "type": "symlink"},
        {"name": "lo", "type": "symlink"},
        {"name": "ls", "type": "symlink"},
        {"name": "z", "type": "symlink"},
    ]
    assert listing("docs")["entries"] == [{"name": "readme.md", "type": "file", "size": 11}]
    with pytest.raises(PathRefused, match="symlink"):
        listing("lo")
    with pytest.raises(PathRefused, match="not a directory"):
        listing("a.txt")
    assert tools(tree.root, max_results=2)["list_dir"]()["truncated"] is True


def test_search_files_by_glob_substring_and_text_never_through_a_symlink(tree: Tree) -> None:
    """Names match a glob or a substring; `contains` gives lines; nothing under lo/ or li/ is seen."""
    (tree.root / "docs" / "notes.md").write_text("one\nhello two\nthree hello\n")
    search = tools(tree.root)["search_files"]
    assert search("*.md")["matches"] == [{"path": "docs/notes.md"}, {"path": "docs/readme.md"}]
    assert search("read")["matches"] == [{"path": "docs/readme.md"}]
    assert search("docs/*.md", path=".")["matches"] == [{"path": "docs/notes.md"}, {"path": "docs/readme.md"}]
    assert search(contains="hello")["matches"] == [
        {"path": "docs/notes.md", "line": 2, "text": "hello two"},
        {"path": "docs/notes.md", "line": 3, "text": "three hello"},
        {"path": "docs/readme.md", "line": 1, "text": "hello docs"},
    ]
    assert search(contains=SECRET)["matches"] == []  # outside/ holds it, reachable only by symlinks
    assert search("*", path="docs")["matches"] == [{"path": "docs/notes.md"}, {"path": "docs/readme.md"}]
    limited = tools(tree.root, max_results=1)["search_files"](contains="hello")
    assert limited == {
        "path": ".",
        "matches": [{"path": "docs/notes.md", "line": 2, "text": "hello two"}],
        "truncated": True,
    }
    with pytest.raises(PathRefused, match="symlink"):
        search("*", path="lo")


def test_search_skips_files_over_the_read_limit(tree: Tree) -> None:
    """A text search does not read a file larger than `max_read_bytes`."""
    (tree.root / "big.txt").write_text("needle " * 10)
    (tree.root / "small.txt").write_text("needle")
    found = tools(tree.root, max_read_bytes=20)["search_files"](contains="needle")
    assert [m["path"] for m in found["matches"]] == ["small.txt"]


# -- write_file and delete_file


def test_write_file_creates_replaces_and_keeps_the_mode(tree: Tree) -> None:
    """A write makes missing directories, replaces a file whole (its mode kept), leaves no temp file."""
    write = tools(tree.root)["write_file"]
    assert write("new/dir/n.txt", "first") == {"path": "new/dir/n.txt", "bytes": 5, "created": True}
    assert (tree.root / "new" / "dir" / "n.txt").read_text() == "first"
    os.chmod(tree.root / "a.txt", 0o640)
    assert write("./a.txt", "é") == {"path": "a.txt", "bytes": 2, "created": False}
    assert (tree.root / "a.txt").read_text() == "é"
    assert stat.S_IMODE((tree.root / "a.txt").stat().st_mode) == 0o640
    assert leftovers(tree.root) == []


def test_a_write_that_fails_midway_leaves_the_file_as_it_was(
    tree: Tree, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write is atomic: a failure while writing leaves the old content and no temporary file."""
    write = tools(tree.root)["write_file"]

    def full_disk(fd: int, data: Any) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full_disk)
    with pytest.raises(PathRefused, match="No space"):  # nothing changed: a definite failure
        write("a.txt", "new content")
    monkeypatch.undo()
    assert (tree.root / "a.txt").read_text() == "alpha\n"
    assert leftovers(tree.root) == []


def test_write_file_refuses_content_over_the_limit_and_non_files(tree: Tree) -> None:
    """Content over `max_write_bytes`, a directory, a FIFO or a symlink as the target: refused, unchanged."""
    write = tools(tree.root, max_write_bytes=4)["write_file"]
    with pytest.raises(PathRefused, match="larger than the 4-byte limit"):
        write("a.txt", "12345")
    for path, why in [
        ("docs", "a directory"),
        ("fifo", "a FIFO"),
        ("ls", "symlink"),
        (".", "work directory"),
    ]:
        with pytest.raises(PathRefused, match=why):
            write(path, "x")
    assert (tree.root / "a.txt").read_text() == "alpha\n"
    assert os.readlink(tree.root / "ls") == "../outside/secret.txt"
    assert (tree.outside / "secret.txt").read_text() == SECRET
    assert leftovers(tree.root) == []


def test_delete_file_removes_a_file_and_refuses_the_rest(tree: Tree) -> None:
    """A file is unlinked; a directory, a symlink (the link stays) and a FIFO are refused; a missing
    file is FileNotFoundError naming the relative path."""
    delete = tools(tree.root)["delete_file"]
    assert delete("docs/../a.txt") == {"path": "a.txt", "deleted": True, "bytes": 6}
    assert not (tree.root / "a.txt").exists()
    for path, why in [
        ("docs", "a directory"),
        ("ls", "symlink"),
        ("lo/secret.txt", "symlink"),
        ("fifo", "FIFO"),
    ]:
        with pytest.raises(PathRefused, match=why):
            delete(path)
    with pytest.raises(FileNotFoundError, match=r"'a\.txt'"):
        delete("a.txt")
    assert (tree.root / "ls").is_symlink()
    assert (tree.outside / "secret.txt").read_text() == SECRET


def test_the_snapshot_records_existence_size_hash_and_small_text(tree: Tree) -> None:
    """A missing file (or directory) is `exists: False`; a small UTF-8 file carries its text, a
    larger or binary one only its size and hash."""
    state = specs(tree.root, snapshot_text_bytes=8)["write_file"].snapshot
    assert state is not None
    assert state({"path": "nope/x"}) == {"path": "nope/x", "exists": False}
    small = state({"path": "./a.txt"})
    assert small["text"] == "alpha\n"
    assert small["size"] == 6
    assert small["exists"] is True
    assert len(small["sha256"]) == 64
    assert "text" not in state({"path": "docs/readme.md"})
    with pytest.raises(PathRefused, match="symlink"):
        state({"path": "ls"})


# -- through the gate


def file_gate(make_gate: MakeGate, tree: Tree) -> Any:
    table = EffectTable(file_tools(tree.root, approver_role="ops"))
    table.allow_all(AGENT)
    return make_gate(table)


def test_a_write_runs_once_with_its_before_and_after_state(
    make_gate: MakeGate, tree: Tree, store: SQLStore
) -> None:
    """A write through the gate records the file before and after; the same message again replays
    the stored result and does not write a second time (checked on disk)."""
    gate = file_gate(make_gate, tree)
    out = gate.call("write_file", {"path": "a.txt", "content": "beta\n"}, ctx("m1"))
    assert isinstance(out, Executed)
    assert out.result == {"path": "a.txt", "bytes": 5, "created": False}
    assert out.before["text"] == "alpha\n"
    assert out.after["text"] == "beta\n"
    [row] = store.executions(tool="write_file")
    assert json.loads(row.before_json or "")["text"] == "alpha\n"
    assert json.loads(row.after_json or "")["text"] == "beta\n"
    (tree.root / "a.txt").write_text("changed by someone else\n")
    again = gate.call("write_file", {"path": "a.txt", "content": "beta\n"}, ctx("m1"))
    assert isinstance(again, Executed)
    assert again.replay
    assert (tree.root / "a.txt").read_text() == "changed by someone else\n"


def test_a_refused_write_is_recorded_as_failed_and_changes_nothing(
    make_gate: MakeGate, tree: Tree, store: SQLStore
) -> None:
    """A write through a symlink out raises PathRefused; the record says it failed; outside is intact."""
    gate = file_gate(make_gate, tree)
    before = tree.outside_state()
    with pytest.raises(PathRefused, match="symlink"):
        gate.call("write_file", {"path": "lo/secret.txt", "content": "pwned"}, ctx())
    assert tree.outside_state() == before
    [record] = store.idempotency_records()
    assert record.status == "failed"
    assert "PathRefused" in (record.error or "")
    with pytest.raises(PathRefused, match="escapes"):
        gate.call("read_file", {"path": "../outside/secret.txt"}, ctx())


def test_a_delete_waits_for_two_approvers_and_then_runs_once(
    make_gate: MakeGate, tree: Tree, store: SQLStore
) -> None:
    """delete_file pauses; a second message asking the same is the same approval (the path is the
    subject); after two distinct approvals it runs once, the deleted text recorded."""
    gate = file_gate(make_gate, tree)
    first = gate.call("delete_file", {"path": "a.txt"}, ctx("m1"))
    assert isinstance(first, Pending)
    again = gate.call("delete_file", {"path": "a.txt"}, ctx("m2"))
    assert isinstance(again, Pending)
    assert again.approval_id == first.approval_id
    assert again.replay
    assert (tree.root / "a.txt").exists()
    partial = gate.approve(again.approval_id, version=1, approver=OLGA)
    assert isinstance(partial, PartialApproval)
    grant = gate.approve(again.approval_id, version=1, approver=OMAR)
    assert isinstance(grant, Grant)
    done = gate.execute(grant.token)
    assert isinstance(done, Executed)
    assert done.result["deleted"] is True
    assert not (tree.root / "a.txt").exists()
    assert done.before["text"] == "alpha\n"
    assert done.after == {"path": "a.txt", "exists": False}
    [row] = store.executions(tool="delete_file")
    assert row.status == "succeeded"


def test_an_approved_delete_of_a_symlink_fails_definitely(
    make_gate: MakeGate, tree: Tree, store: SQLStore
) -> None:
    """An approved delete of a symlink is refused when it runs: the approval ends `failed` (nothing
    happened, not an unknown outcome), and the link and its target are intact."""
    gate = file_gate(make_gate, tree)
    pending = gate.call("delete_file", {"path": "ls"}, ctx())
    assert isinstance(pending, Pending)
    gate.approve(pending.approval_id, version=1, approver=OLGA)
    grant = gate.approve(pending.approval_id, version=1, approver=OMAR)
    assert isinstance(grant, Grant)
    with pytest.raises(PathRefused, match="symlink"):
        gate.execute(grant.token)
    row = store.get_approval(pending.approval_id)
    assert row is not None
    assert row.status == "failed"
    assert (tree.root / "ls").is_symlink()
    assert (tree.outside / "secret.txt").read_text() == SECRET


def test_rows_can_join_a_table_of_other_tools(tree: Tree) -> None:
    """The rows are ordinary ToolSpecs: they sit beside the application's own and are fingerprinted."""

    def ping() -> str:
        return "pong"

    table = EffectTable([ToolSpec(name="ping", effect=Effect.READ, fn=ping), *file_tools(tree.root)])
    assert "read_file" in table
    assert table["write_file"].fingerprint
    assert files_module.__all__ == ["PathRefused", "file_tools"]
