"""Round 4 review of the file tools (`effectgate.tools`): defects found by an attacker who controls
the model's arguments or another process in the tree. Effects are counted on disk.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
from pathlib import Path
from typing import Any

import pytest

from effectgate import Approver, CallContext, Effect, EffectTable, Grant, Pending, Policy
from effectgate.stores import SQLStore
from effectgate.tools import PathRefused, file_tools

from ._files_tree import Tree, make_tree, specs, tools
from .conftest import MakeGate

AGENT = "coder"
OLGA = Approver("olga", "ops")


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    return make_tree(tmp_path / "files")


def ctx(message_id: str = "m1") -> CallContext:
    return CallContext(session_id="s1", origin_message_id=message_id, user_id="u1", agent_id=AGENT)


def leftovers(directory: Path) -> list[str]:
    return [p.name for p in directory.rglob(".effectgate-*")]


@pytest.mark.parametrize(
    ("path", "call", "code"),
    [
        ("a.txt", "write", errno.ENOSPC),  # a full disk while the new text is written
        ("a.txt", "open", errno.EROFS),  # a read-only mount: no temporary file can be made
        ("a.txt", "rename", errno.EACCES),
        ("new/b.txt", "mkdir", errno.EDQUOT),  # a missing directory that cannot be made
    ],
)
def test_an_approved_write_the_file_system_refuses_fails_definitely(
    make_gate: MakeGate,
    tree: Tree,
    store: SQLStore,
    monkeypatch: pytest.MonkeyPatch,
    path: str,
    call: str,
    code: int,
) -> None:
    """Under a policy that gates writes, an approved write_file that the file system refuses
    changed nothing: the old content stays and no temporary file is left, so the approval ends
    `failed` with PathRefused `denied`, as an approved delete the file system refuses does, not
    `needs_reconciliation` (an unknown outcome for someone to chase)."""
    table = EffectTable(file_tools(tree.root, approver_role="ops"))
    table.allow_all(AGENT)
    gate = make_gate(table, policy=Policy(autonomous=frozenset({Effect.READ})))
    pending = gate.call("write_file", {"path": path, "content": "beta\n"}, ctx())
    assert isinstance(pending, Pending)
    grant = gate.approve(pending.approval_id, version=1, approver=OLGA)
    assert isinstance(grant, Grant)
    real = getattr(os, call)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        if call == "open" and not str(args[0]).startswith(".effectgate-"):
            return real(*args, **kwargs)
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, call, refuse)
    with pytest.raises(PathRefused) as refused:
        gate.execute(grant.token)
    monkeypatch.undo()
    assert refused.value.code == "denied"
    assert (tree.root / "a.txt").read_text() == "alpha\n"
    assert not (tree.root / "new").exists()
    assert leftovers(tree.root) == []
    row = store.get_approval(pending.approval_id)
    assert row is not None
    assert row.status == "failed"


def test_new_content_is_never_readable_beyond_the_old_files_mode(
    tree: Tree, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rewriting a private (0600) file: the temporary file holding the new content is private from
    its creation, so another user of the directory cannot open it while it is written (a
    descriptor opened then keeps reading whatever is written later)."""
    secret = tree.root / "key.txt"
    secret.write_text("old private\n")
    os.chmod(secret, 0o600)
    modes: list[int] = []
    real_write = os.write

    def spy(fd: int, data: Any) -> int:
        modes.append(stat.S_IMODE(os.fstat(fd).st_mode))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", spy)
    old_umask = os.umask(0o022)
    try:
        tools(tree.root)["write_file"]("key.txt", "new private\n")
    finally:
        os.umask(old_umask)
    monkeypatch.undo()
    assert secret.read_text() == "new private\n"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert modes
    assert all(mode & 0o077 == 0 for mode in modes), [oct(m) for m in modes]


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("read_file", "dir"),  # not a regular file: <path> is a directory
        ("read_file", "binary"),  # <path> is not UTF-8 text
        ("read_file", "large"),  # <path> is larger than the limit
        ("write_file", "dir"),
        ("delete_file", "dir"),
    ],
)
def test_a_refusal_never_carries_a_terminal_escape_from_a_file_name(tree: Tree, name: str, make: str) -> None:
    """A name the model chose (write_file makes directories on the way) may hold terminal escapes
    or a right-to-left override; the refusal's message, which reaches the model, logs and
    terminals, shows them escaped, as it already does for the path it quotes."""
    hostile = "\x1b]0;pwned\x07\x1b[2J\u202eevil"
    target = tree.root / hostile
    if make == "dir":
        target.mkdir()
    elif make == "binary":
        target.write_bytes(b"\xff\xfe")
    else:
        target.write_text("x" * 20)
    tool = tools(tree.root, max_read_bytes=10)[name]
    with pytest.raises(PathRefused) as caught:
        tool(hostile, "x") if name == "write_file" else tool(hostile)
    for text in (str(caught.value), caught.value.reason):
        assert not any(ch in text for ch in "\x1b\x07\u202e"), text
    assert target.exists()


@pytest.mark.parametrize("name", ["read_file", "write_file", "delete_file"])
def test_a_socket_is_refused_as_not_a_regular_file(tree: Tree, name: str) -> None:
    """A Unix socket another process bound in the tree (an agent's or a daemon's) is refused with
    PathRefused `not_regular`, like a FIFO or a device, not a raw OSError (ENXIO) from the open;
    the write's snapshot refuses it the same way, and the socket stays."""
    with socket.socket(socket.AF_UNIX) as sock:
        old = os.getcwd()
        os.chdir(tree.root)  # a socket path is limited to ~100 bytes: bind it by a relative name
        try:
            sock.bind("sock")
        finally:
            os.chdir(old)
        by_name = specs(tree.root)
        calls: list[Any] = [
            lambda: by_name[name].fn("sock", "x") if name == "write_file" else by_name[name].fn("sock")
        ]
        snapshot = by_name[name].snapshot
        if snapshot is not None:
            calls.append(lambda: snapshot({"path": "sock"}))
        for call in calls:
            with pytest.raises(PathRefused, match="a socket") as caught:
                call()
            assert caught.value.code == "not_regular"
        assert stat.S_ISSOCK((tree.root / "sock").lstat().st_mode)


def test_a_snapshot_of_a_file_that_keeps_growing_ends(tree: Tree, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process appends to a file as fast as the snapshot reads it (a busy log): the
    snapshot of a write or delete hashes the size it found and ends, instead of reading until an
    end of file that never comes (the call, holding its lease, would never run)."""
    log = tree.root / "app.log"
    log.write_text("start\n")
    state = specs(tree.root)["delete_file"].snapshot
    assert state is not None
    real_read = os.read
    reads = 0

    def appended_meanwhile(fd: int, n: int) -> bytes:
        nonlocal reads
        reads += 1
        if reads > 100:
            raise AssertionError("the snapshot reads the growing file forever")
        with log.open("a") as other:  # the other process, one step ahead of the reader
            other.write("x" * 65536)
        return real_read(fd, n)

    monkeypatch.setattr(os, "read", appended_meanwhile)
    snap = state({"path": "app.log"})
    monkeypatch.undo()
    assert snap["size"] == 6
    assert snap["text"] == "start\n"
    assert reads <= 2


@pytest.mark.parametrize("name", ["read_file", "write_file", "delete_file"])
def test_a_fifo_is_refused_without_being_opened(
    tree: Tree, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """A read (or a write's or delete's snapshot) of a FIFO never opens it: opening it as a reader,
    even without blocking, releases a process blocked opening it for writing, whose write then
    fails (EPIPE, or SIGPIPE kills it) once the tool closes it: a read with an effect. Probed at
    the receiver: while the tool runs, a writer's non-blocking open succeeds only if a reader is
    there."""
    fifo = tree.root / "fifo"
    connected: list[bool] = []
    real_fstat = os.fstat

    def probe(fd: int) -> os.stat_result:
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            connected.append(True)
        except OSError as exc:
            connected.append(exc.errno != errno.ENXIO)  # ENXIO: no reader, no writer can connect
        return real_fstat(fd)

    monkeypatch.setattr(os, "fstat", probe)
    spec = specs(tree.root)[name]
    for call in [
        lambda: spec.fn("fifo", "x") if name == "write_file" else spec.fn("fifo"),
        *([lambda: spec.snapshot({"path": "fifo"})] if spec.snapshot else []),
    ]:
        with pytest.raises(PathRefused, match="a FIFO"):
            call()
    monkeypatch.undo()
    assert True not in connected
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
