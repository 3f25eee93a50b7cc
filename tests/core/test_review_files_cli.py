"""Review round: the confined file tools, the command line and the scripted planner.

Each test reproduces one defect found in review (see the docstrings); effects are counted on disk
or in the ledger's records, never in response text.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import sqlalchemy as sa

from effectgate import (
    Approver,
    CallContext,
    EffectGate,
    EffectTable,
    Executed,
    Grant,
    Pending,
    open_store,
)
from effectgate.cli import keyring_for, main
from effectgate.stores import SQLStore
from effectgate.tools import PathRefused, file_tools

from ._files_tree import Tree, make_tree, specs
from .conftest import MakeGate

AGENT = "coder"


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    return make_tree(tmp_path / "files")


def ctx(message_id: str = "m1") -> CallContext:
    return CallContext(session_id="s1", origin_message_id=message_id, user_id="u1", agent_id=AGENT)


def file_gate(make_gate: MakeGate, tree: Tree) -> Any:
    table = EffectTable(file_tools(tree.root, approver_role="ops"))
    table.allow_all(AGENT)
    return make_gate(table)


def test_a_write_through_a_missing_directory_and_back_records_the_file_it_replaces(
    make_gate: MakeGate, tree: Tree, store: SQLStore
) -> None:
    """`new/../a.txt` names the existing a.txt. The before snapshot walks without making
    directories, so it found no `new` and recorded a.txt as absent, while the write made `new`,
    climbed back and replaced a.txt: the ledger said a file was created where one was overwritten
    (its old text lost from the record), and an empty directory appeared that no record names.
    What the write changes must be what its before snapshot describes."""
    gate = file_gate(make_gate, tree)
    with pytest.raises(FileNotFoundError):
        gate.call("write_file", {"path": "new/../a.txt", "content": "beta\n"}, ctx())
    assert (tree.root / "a.txt").read_text() == "alpha\n"
    assert not (tree.root / "new").exists()
    [record] = store.idempotency_records()
    assert record.status == "failed"
    # nor a directory above one a `..` climbs out of (`new` holds no `x` once it is made)
    with pytest.raises(FileNotFoundError):
        gate.call("write_file", {"path": "new/x/../b.txt", "content": "b\n"}, ctx("m3"))
    assert not (tree.root / "new").exists()
    # where the directory exists, the same path replaces a.txt and records its old text
    (tree.root / "new").mkdir()
    out = gate.call("write_file", {"path": "new/../a.txt", "content": "beta\n"}, ctx("m2"))
    assert isinstance(out, Executed)
    assert (tree.root / "a.txt").read_text() == "beta\n"
    [row] = [r for r in store.executions(tool="write_file") if r.status == "succeeded"]
    assert json.loads(row.before_json or "{}")["text"] == "alpha\n"


# -- the command line


class Run(NamedTuple):
    code: int
    out: str
    err: str


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    for name in ("EFFECTGATE_DB", "EFFECTGATE_APP", "EFFECTGATE_KEYRING", "EFFECTGATE_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.chdir(tmp_path)

    def run(*argv: str) -> Run:
        code = main(list(argv))
        out, err = capsys.readouterr()
        return Run(code, out, err)

    return run


@pytest.fixture
def pending_delete(tree: Tree, tmp_path: Path) -> tuple[str, str]:
    """A SQLite ledger (with its key file) holding one pending `delete_file` of a.txt: (url, id)."""
    url = f"sqlite:///{tmp_path / 'files.db'}"
    table = EffectTable(file_tools(tree.root, approver_role="ops"))
    table.allow_all(AGENT)
    with open_store(url) as store:
        store.setup()
        with EffectGate(table, store, keyring=keyring_for(url)) as gate:
            pending = gate.call("delete_file", {"path": "a.txt"}, ctx())
    assert isinstance(pending, Pending)
    return url, pending.approval_id


def test_pending_and_show_survive_an_expiry_edited_to_no_time(
    pending_delete: tuple[str, str], cli: Any
) -> None:
    """An approval row whose expiry was edited in the database to a value no clock reaches
    (infinity; PostgreSQL also takes NaN) crashed `pending` and `show` with exit 70 ("a bug":
    OverflowError / ValueError from the countdown), hiding every other pending approval; `when`
    already shows such a time as "(not a date)". The listing and the card must still print."""
    url, approval_id = pending_delete
    with open_store(url) as store, store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE eg_approvals SET expires_at = :e"), {"e": math.inf})
    listed = cli("pending", "--db", url)
    assert listed.code == 0, listed.err
    assert approval_id in listed.out
    shown = cli("show", "--db", url, approval_id)
    assert shown.code == 0, shown.err


def _ledger(url: str) -> tuple[int, int]:
    with open_store(url) as store:
        return len(store.events()), len(store.approvals())


@pytest.mark.parametrize("where", ["subject", "export"])
def test_redact_input_nested_too_deep_is_a_usage_error(
    pending_delete: tuple[str, str], cli: Any, tmp_path: Path, where: str
) -> None:
    """`redact --subject` and every `--export` line are parsed before anything is erased; JSON
    nested deeper than the parser's recursion limit raised RecursionError, which is no
    ValueError: exit 70, "unexpected ... (a bug)", instead of the usage error (exit 2) any other
    malformed input gets."""
    url, _ = pending_delete
    deep = "[" * 100_000
    if where == "subject":
        extra = ["--subject", deep]
    else:
        export = tmp_path / "deep.jsonl"
        export.write_text(deep + "\n")
        extra = ["--export", str(export)]
    before = _ledger(url)
    run = cli("redact", "--db", url, "--user", "u2", "--by", "dpo", "--reason", "r", *extra)
    assert run.code == 2, run.err
    assert _ledger(url) == before


def test_a_write_does_not_carry_a_setuid_bit_over_to_the_new_content(tree: Tree) -> None:
    """`write_file` replaces a file by a new one and copies the old mode onto it, set-user-ID and
    set-group-ID bits included: model-written content became a set-user-ID program of the gate's
    user. A write into the file itself has the kernel clear those bits (`file_remove_privs`);
    the replacement must not keep them either. The permission bits stay."""
    target = tree.root / "tool.sh"
    target.write_text("#!/bin/sh\necho ok\n")
    os.chmod(target, 0o6755)
    write = specs(tree.root)["write_file"].fn
    write("tool.sh", "#!/bin/sh\necho pwned\n")
    mode = stat.S_IMODE(os.stat(target).st_mode)
    assert target.read_text() == "#!/bin/sh\necho pwned\n"
    assert mode == 0o755


FILES_APP = """
from effectgate import EffectGate, EffectTable
from effectgate.tools import file_tools

ROOT = {root!r}


def factory(store, *, keyring=None):
    table = EffectTable(file_tools(ROOT, approver_role="ops"))
    table.allow_all("coder")
    return EffectGate(table, store, keyring=keyring)
"""


def test_approve_execute_whose_execution_fails_is_not_reported_as_changing_nothing(
    pending_delete: tuple[str, str],
    cli: Any,
    tree: Tree,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`approve --execute` records the grant, then runs it. When the run fails definitely (the
    file is gone: FileNotFoundError), the command exits 2, "usage error: ... changes nothing",
    although the ledger now holds the grant and the approval is `failed`: a script reading the
    exit code believes nothing happened."""
    url, approval_id = pending_delete
    (tmp_path / "eg_review_files_app.py").write_text(FILES_APP.format(root=str(tree.root)))
    monkeypatch.syspath_prepend(str(tmp_path))
    approve = ["--db", url, "--app", "eg_review_files_app:factory", "approve", approval_id]
    approve += ["--version", "1", "--as", "ops"]
    assert cli(*approve, "--approver", "olga").code == 0
    (tree.root / "a.txt").unlink()
    run = cli(*approve, "--approver", "omar", "--execute")
    with open_store(url) as store:
        row = store.get_approval(approval_id)
        assert row is not None
        assert row.status == "failed"  # the grant was recorded and spent
    assert run.code == 6, run.err  # approved, then the run failed
    assert "recorded" in run.err


@pytest.mark.parametrize(
    ("url", "secret"),
    [
        ("postgresql+psycopg://eg:se/cret-pw@127.0.0.1:1/eg", "cret-pw"),  # a `/` in the password
        ("postgresql+psycopg://eg:sec@ret-pw@127.0.0.1:1/eg", "ret-pw"),  # an unescaped `@`
    ],
)
def test_a_database_password_is_never_printed(cli: Any, url: str, secret: str) -> None:
    """Error lines name the database with its password masked. `setup` fails on the driver's
    connection error, whose line masked the password with a pattern that stops at a `/`: a
    password holding one was printed whole. A password with an unescaped `@` is read by
    SQLAlchemy as ending at the first `@`, so the rest (taken as the host) was printed too."""
    for command in ("setup", "pending"):
        run = cli("--db", url, command)
        assert run.code in (2, 5), run.err
        assert secret not in run.err + run.out


def test_search_numbers_lines_as_the_file_breaks_them(tree: Tree) -> None:
    """`search_files(contains=...)` numbered lines with `str.splitlines`, which also breaks at a
    form feed (common in source files), vertical tab, \\x1c-\\x1e, NEL, U+2028 and U+2029: the
    line it reported was not the line of the file (as `grep -n` or an editor counts it), and
    an edit made at that line by the model lands elsewhere."""
    (tree.root / "src.py").write_text("import os\n\x0c\ndef f():\u2028    pass\nTARGET = 1\n")
    search = specs(tree.root)["search_files"].fn
    found = search("src.py", contains="TARGET")
    assert [m["line"] for m in found["matches"]] == [4]


def test_an_approved_delete_the_file_system_refuses_fails_definitely(
    make_gate: MakeGate, tree: Tree, store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`unlinkat` refused by the file system (an immutable file, a sticky directory of another
    user: EPERM/EACCES) removes nothing, but only PathRefused and FileNotFoundError are the rows'
    definite failures: the approved delete is recorded as an unknown outcome
    (needs_reconciliation), which no reconciler of the file tools can settle. Now a refusal
    (PathRefused "denied"): the approval ends failed, the file is still there."""
    gate = file_gate(make_gate, tree)
    pending = gate.call("delete_file", {"path": "a.txt"}, ctx())
    assert isinstance(pending, Pending)
    gate.approve(pending.approval_id, version=1, approver=Approver("olga", "ops"))
    grant = gate.approve(pending.approval_id, version=1, approver=Approver("omar", "ops"))
    assert isinstance(grant, Grant)
    real_unlink = os.unlink

    def refused(path: Any, *, dir_fd: int | None = None) -> None:
        if path == "a.txt":
            raise PermissionError(errno.EPERM, "Operation not permitted")
        real_unlink(path, dir_fd=dir_fd)

    monkeypatch.setattr(os, "unlink", refused)
    with pytest.raises(PathRefused, match="refused") as refused_by:
        gate.execute(grant.token)
    assert refused_by.value.code == "denied"
    monkeypatch.undo()
    assert (tree.root / "a.txt").read_text() == "alpha\n"
    row = store.get_approval(pending.approval_id)
    assert row is not None
    assert row.status == "failed"


def test_a_write_whose_directory_cannot_be_synced_is_recorded_as_done(
    make_gate: MakeGate, tree: Tree, store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the rename the file is replaced, for every reader. The directory's fsync that follows
    failed on file systems that do not sync a directory (EINVAL: some FUSE, network and
    virtual-machine shares), and the write then raised: the gate recorded it as failed with
    nothing changed, while the new text was on disk, and the model was told to try again."""
    gate = file_gate(make_gate, tree)
    real_fsync = os.fsync

    def no_dir_sync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "Invalid argument")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", no_dir_sync)
    out = gate.call("write_file", {"path": "a.txt", "content": "beta\n"}, ctx())
    monkeypatch.undo()
    assert isinstance(out, Executed)
    assert (tree.root / "a.txt").read_text() == "beta\n"
    [record] = store.idempotency_records()
    assert record.status == "succeeded"


@pytest.mark.parametrize("edited", ["[1, 2]", '"rm -rf"', "null", "not json"])
def test_pending_and_show_print_a_card_whose_arguments_were_edited_into_no_object(
    pending_delete: tuple[str, str], cli: Any, edited: str
) -> None:
    """Arguments (and subject) edited in the database into JSON that is no object, or no JSON:
    the card carries the tamper warning so that a reviewer sees it, but `pending` crashed with
    exit 70 (`.items()` of a list) and hid every other pending approval, and `show` exited 70 or
    2 instead of printing the card with its warning."""
    url, approval_id = pending_delete
    with open_store(url) as store, store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE eg_approvals SET args_json = :a, subject_json = :a"), {"a": edited})
    for argv in (["pending"], ["pending", "--json"], ["show", approval_id], ["show", approval_id, "--json"]):
        run = cli(*argv, "--db", url)
        assert run.code == 0, (argv, run.err)
        assert approval_id in run.out
