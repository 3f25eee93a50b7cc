"""Round 11 review of the built-in tools (`effectgate.tools`), the shop example and the testing
helpers. Effects are checked on disk and on the objects the helpers promise about."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from effectgate.testing import FakeClock, call
from effectgate.tools import file_tools


def write_file(root: Path, path: str, content: str) -> object:
    return {spec.name: spec.fn for spec in file_tools(root)}["write_file"](path, content)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown needs root")
def test_a_rewrite_keeps_the_files_owner_and_group(tmp_path: Path) -> None:
    """An agent run as root (a container over a mounted checkout) rewrites a user's file: the
    write replaces it through a new file, which must keep the old file's owner and group as an
    in-place write would. Otherwise the file becomes root's, and its user (mode 0600) can no
    longer read or edit their own file, nor its group (0640) read it."""
    mine = tmp_path / "notes.txt"
    mine.write_text("old\n")
    os.chown(mine, 4321, 8765)
    os.chmod(mine, 0o640)
    write_file(tmp_path, "notes.txt", "new\n")
    after = mine.stat()
    assert mine.read_text() == "new\n"
    assert (after.st_uid, after.st_gid, stat.S_IMODE(after.st_mode)) == (4321, 8765, 0o640)


@pytest.mark.parametrize("step", [1e308, 10**400], ids=["float", "huge_int"])
def test_a_fake_clock_never_reaches_infinity(step: float) -> None:
    """FakeClock promises never to go to a time no comparison can order: a large advance that
    would overflow to infinity is refused as a ValueError, and the clock keeps its time."""
    clock = FakeClock()
    clock.advance(1.7e308)
    before = clock.now()
    with pytest.raises(ValueError, match="does not go backwards"):
        clock.advance(step)
    assert clock.now() == before


def test_a_text_search_that_skipped_a_file_over_the_read_limit_says_so(tmp_path: Path) -> None:
    """`truncated` means "more may match than was shown" (a file left unlooked at past
    `max_search_files` sets it). A file over `max_read_bytes` is not searched either: a search
    that skipped one must not tell the model that nothing else matches."""
    (tmp_path / "big.txt").write_text("needle " * 10)
    (tmp_path / "small.txt").write_text("needle")
    search = {spec.name: spec.fn for spec in file_tools(tmp_path, max_read_bytes=20)}["search_files"]
    found = search(contains="needle")
    assert [m["path"] for m in found["matches"]] == ["small.txt"]
    assert found["truncated"] is True
    assert search(contains="needle", pattern="small*")["truncated"] is False


@pytest.mark.xfail(
    strict=True,
    reason="design: call(name, *, id=None, **args) takes `id` as the tool-call id, so a tool "
    "argument named `id` (get_user(id)) can only be scripted as Call(name, {'id': ...}); "
    "renaming the keyword (call_id=) changes the public testing API",
)
def test_a_scripted_call_can_pass_a_tool_argument_named_id() -> None:
    """`call("get_user", id="42")` reads as get_user(id="42"), but the script sends get_user with
    no arguments and a tool-call id of "42"."""
    assert call("get_user", id="42").args == {"id": "42"}
