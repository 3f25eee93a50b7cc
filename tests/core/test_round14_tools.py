"""Round 14 review of the file tools (`effectgate.tools`) and the testing helpers: what an agent
running as an ordinary user may not do to a file in place, it may not do through the tools either,
a search says when it could not look everywhere, and a recorder counts an effect under the key it
landed with. Effects are checked on disk and at the receiver."""

from __future__ import annotations

import ast
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
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
    Pending,
    ToolContext,
    ToolSpec,
)
from effectgate.testing import EffectRecorder

from ._files_tree import tools
from .conftest import MakeGate

NOBODY = 65534
as_root = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="runs the tools as another user: needs root"
)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A work directory anyone may create files in (0777, no sticky bit), under /tmp (pytest's
    own temporary directories are private to root, so another user could not reach them)."""
    root = Path(tempfile.mkdtemp(prefix="eg-round14-"))
    root.chmod(0o777)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def as_nobody(fn: Callable[[], Any]) -> str:
    """Run `fn` in a forked child as the user nobody; its result (or its error's type and code)
    as text. The tools are built by the parent: the child only calls them."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            try:
                out = repr(fn())
            except Exception as exc:
                out = f"{type(exc).__name__}:{getattr(exc, 'code', '')}"
            os.write(write, out.encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        out = pipe.read().decode()
    os.waitpid(pid, 0)
    return out


@as_root
@pytest.mark.parametrize(("owner", "mode"), [(0, 0o644), (NOBODY, 0o444)], ids=["others", "read_only"])
def test_a_write_never_replaces_a_file_its_user_may_not_write(shared: Path, owner: int, mode: int) -> None:
    """The write replaces the file through a new one (rename), which needs only the directory's
    permission: an agent run as an ordinary user replaced a file it may not write (another
    user's 0644 file, or its own file made read-only), and took its ownership. A write must be
    refused as the file system would refuse it in place (`denied`), and change nothing."""
    target = shared / "config.txt"
    target.write_text("the owner's\n")
    os.chown(target, owner, owner)
    target.chmod(mode)
    write = tools(shared)["write_file"]

    out = as_nobody(lambda: write("config.txt", "the agent's\n"))

    after = target.stat()
    assert (target.read_text(), after.st_uid, after.st_mode & 0o777) == ("the owner's\n", owner, mode)
    assert out == "PathRefused:denied"
    assert [p.name for p in shared.iterdir()] == ["config.txt"]  # no temporary file left


@as_root
def test_a_write_a_user_may_make_in_place_still_runs(shared: Path) -> None:
    """The other side: a file its user may write (its own, 0600) is still replaced."""
    target = shared / "notes.txt"
    target.write_text("old\n")
    os.chown(target, NOBODY, NOBODY)
    target.chmod(0o600)
    write = tools(shared)["write_file"]

    out = as_nobody(lambda: write("notes.txt", "new\n"))

    assert "'created': False" in out
    assert target.read_text() == "new\n"


@as_root
@pytest.mark.parametrize(
    ("make", "expected"),
    [
        ("locked_dir", ["open.txt"]),  # a directory its user may not open
        ("listed_only_dir", ["open.txt"]),  # one it may list but not look into (r, no x)
        ("unreadable_file", ["open.txt"]),  # a file it may not read
    ],
)
def test_a_search_that_could_not_look_everywhere_says_so(
    shared: Path, make: str, expected: list[str]
) -> None:
    """`truncated` means "more may match than was shown". A search run as an ordinary user
    silently left out a directory or a file it may not read, and told the model nothing else
    matched (truncated False): the model concludes the text is nowhere else."""
    (shared / "open.txt").write_text("needle\n")
    (shared / "open.txt").chmod(0o644)
    if make == "unreadable_file":
        (shared / "secret.txt").write_text("needle\n")
        (shared / "secret.txt").chmod(0o600)
    else:
        (shared / "sub").mkdir()
        (shared / "sub" / "a.txt").write_text("needle\n")
        (shared / "sub").chmod(0o700 if make == "locked_dir" else 0o744)
    search = tools(shared)["search_files"]

    out = as_nobody(lambda: search(contains="needle"))

    found = ast.literal_eval(out)  # the child's repr of the result
    assert [m["path"] for m in found["matches"]] == expected
    assert found["truncated"] is True


@as_root
def test_a_search_that_looked_everywhere_is_not_truncated(shared: Path) -> None:
    (shared / "open.txt").write_text("needle\n")
    (shared / "open.txt").chmod(0o644)
    (shared / "sub").mkdir()
    (shared / "sub" / "a.txt").write_text("needle\n")
    (shared / "sub" / "a.txt").chmod(0o644)
    (shared / "sub").chmod(0o755)
    search = tools(shared)["search_files"]

    found = ast.literal_eval(as_nobody(lambda: search(contains="needle")))

    assert [m["path"] for m in found["matches"]] == ["open.txt", "sub/a.txt"]
    assert found["truncated"] is False


def test_a_wrapped_tool_records_the_key_its_effect_landed_with(make_gate: MakeGate) -> None:
    """`EffectRecorder.wrap` of a tool that takes a ToolContext (as a money tool does, to pass
    its idempotency key to the provider) recorded the context object among the effect's fields
    and no key: `count(idempotency_key=...)`, the way to check that the provider got the key,
    found nothing for an effect that landed with it."""
    receiver = EffectRecorder()

    def pay(order_id: str, amount: int, tool_context: ToolContext) -> str:
        """Pay out."""
        return "paid"

    table = EffectTable(
        [ToolSpec(name="pay", effect=Effect.MONEY, fn=receiver.wrap("pay", pay), approver_role="finance")]
    )
    table.allow_all("agent")
    gate = make_gate(table)
    ctx = CallContext(session_id="s1", origin_message_id="m1", user_id="u1", agent_id="agent")
    pending = gate.call("pay", {"order_id": "1", "amount": 5}, ctx)
    assert isinstance(pending, Pending)
    grant = gate.approve(pending.approval_id, version=pending.version, approver=Approver("fiona", "finance"))
    assert isinstance(grant, Grant)
    out = gate.execute(grant.token)
    assert isinstance(out, Executed)

    [effect] = receiver.effects
    assert (effect.kind, dict(effect.payload), effect.idempotency_key) == (
        "pay",
        {"order_id": "1", "amount": 5},
        out.idempotency_key,
    )
    assert receiver.count("pay", idempotency_key=out.idempotency_key, order_id="1") == 1


def test_a_text_search_for_more_than_one_line_is_refused_not_answered_empty(tmp_path: Path) -> None:
    """`contains` is matched line by line, so text with a line break in it can never match: the
    search answered "no matches, nothing left out" for a snippet that is in the file, and the
    model concludes the code is not there. It is refused, saying why."""
    (tmp_path / "a.py").write_text("def f():\n    return 1\n")
    search = tools(tmp_path)["search_files"]
    assert search(contains="    return 1")["matches"] == [{"path": "a.py", "line": 2, "text": "return 1"}]
    with pytest.raises(ValueError, match="one line"):
        search(contains="def f():\n    return 1")
