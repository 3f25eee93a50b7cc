"""Hostile paths for the file tools: every one is refused with the reason, nothing outside the work
directory is read, changed or created, also when a symlink is swapped in between a check and the
use (done deterministically, by running the swap inside the very os call that follows the check),
and for any path string at all (hypothesis).
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from effectgate.tools import PathRefused

from ._files_tree import SECRET, Tree, make_tree, tools

OPS = ("read_file", "write_file", "delete_file", "list_dir", "search_files")

HOSTILE: list[tuple[str, str]] = [
    ("/etc/passwd", "absolute"),
    ("/", "absolute"),
    ("//work/a.txt", "absolute"),
    ("../outside/secret.txt", "escapes"),
    ("..", "escapes"),
    ("./a/../../outside/secret.txt", "escapes"),
    ("a/../../x", "escapes"),
    ("docs/../../outside/secret.txt", "escapes"),
    ("docs/./../.././x", "escapes"),
    ("a.txt\x00.png", "nul"),
    ("\x00", "nul"),
    ("", "empty"),
    ("\udc80", "encoding"),
    ("lo/secret.txt", "symlink"),
    ("lo/../a.txt", "symlink"),  # `..` after a symlinked directory: not collapsed, refused
    ("lo/docs/readme.md", "symlink"),
    ("ls", "symlink"),
    ("li/readme.md", "symlink"),  # inside -> inside: refused all the same
    ("z", "symlink"),  # -> /dev/zero
    ("x" * 256, "too_long"),
    ("a/" * 2100, "too_long"),
    ("a/" * 129 + "f", "too_deep"),
    ("a.txt/x", "not_a_directory"),
]


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    return make_tree(tmp_path)


def run(tool: Callable[..., Any], name: str, path: str) -> Any:
    if name == "write_file":
        return tool(path, "pwned")
    if name == "search_files":
        return tool("*", contains="", path=path)  # every line of every file it reaches
    return tool(path)


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize(("path", "code"), HOSTILE, ids=lambda v: repr(v)[:30])
def test_hostile_paths_are_refused_with_the_reason(tree: Tree, name: str, path: str, code: str) -> None:
    """Each tool refuses each hostile path with its code; nothing outside changes, nothing is made."""
    before = tree.outside_state()
    listing = sorted(p.name for p in tree.root.rglob("*"))
    with pytest.raises(PathRefused) as caught:
        run(tools(tree.root)[name], name, path)
    assert caught.value.code == code, str(caught.value)
    assert str(caught.value).startswith("refused ")
    assert tree.outside_state() == before
    assert sorted(p.name for p in tree.root.rglob("*")) == listing


@pytest.mark.parametrize("name", ["read_file", "write_file", "delete_file"])
def test_fifos_and_devices_are_not_regular_files(tree: Tree, name: str) -> None:
    """A FIFO is refused without blocking (O_NONBLOCK); a real device node too (made when root)."""
    with pytest.raises(PathRefused, match="a FIFO"):
        run(tools(tree.root)[name], name, "fifo")
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    try:
        os.mknod(tree.root / "zero", stat.S_IFCHR | 0o666, os.makedev(1, 5))
    except PermissionError:  # a container without CAP_MKNOD
        pytest.skip("this machine does not allow making device nodes")
    with pytest.raises(PathRefused, match="a character device"):
        run(tools(tree.root)[name], name, "zero")


def test_unicode_and_long_paths_inside_work(tree: Tree) -> None:
    """Unicode names, names of 255 bytes and 128 components are ordinary paths inside the directory."""
    t = tools(tree.root)
    for path in ["données/é.txt", "日本/ファイル.md", "x" * 255, "/".join(["d"] * 127 + ["f"])]:
        assert t["write_file"](path, "ok")["path"] == path
        assert t["read_file"](path) == "ok"
        assert (tree.root / path).resolve().is_relative_to(tree.root.resolve())


# -- a symlink swapped in between the check and the use


@pytest.fixture
def swap_at(monkeypatch: pytest.MonkeyPatch) -> Callable[[str, str, Callable[[], None]], list[str]]:
    """`swap_at(call, name, swap)`: the first `os.<call>` whose path ends in `name` runs `swap`
    first, the worst moment for it (after every check the tool made, before its use)."""

    def install(call: str, name: str, swap: Callable[[], None]) -> list[str]:
        real = getattr(os, call)
        done: list[str] = []

        def hooked(path: Any, *args: Any, **kwargs: Any) -> Any:
            if not done and os.fspath(path).endswith(name):
                done.append(os.fspath(path))
                swap()
            return real(path, *args, **kwargs)

        monkeypatch.setattr(os, call, hooked)
        return done

    return install


def to_link(path: Path, target: Path) -> Callable[[], None]:
    def swap() -> None:
        if path.is_dir() and not path.is_symlink():
            path.rename(path.with_name(path.name + ".orig"))
        else:
            path.unlink()
        path.symlink_to(target)

    return swap


def naive_read(root: Path, path: str) -> str:
    """What the file tools must not be: resolve, check the resolved path, then open it."""
    full = (root / path).resolve()
    if not full.is_relative_to(root.resolve()):
        raise PathRefused(path, "escapes", "outside")
    fd = os.open(full, os.O_RDONLY)
    try:
        return os.read(fd, 100).decode()
    finally:
        os.close(fd)


def test_the_swap_defeats_a_resolve_then_open_check(tree: Tree, swap_at: Any) -> None:
    """The control: with the same swap, a check on the resolved path followed by open() reads the
    secret, so the tests below would catch that implementation."""
    (tree.root / "safe.txt").write_text("safe")
    done = swap_at("open", "safe.txt", to_link(tree.root / "safe.txt", tree.outside / "secret.txt"))
    assert naive_read(tree.root, "safe.txt") == SECRET
    assert done


def test_a_file_swapped_for_a_symlink_before_the_open_is_refused(tree: Tree, swap_at: Any) -> None:
    """read_file: the file becomes a symlink out after every check; the O_NOFOLLOW open refuses it."""
    (tree.root / "safe.txt").write_text("safe")
    done = swap_at("open", "safe.txt", to_link(tree.root / "safe.txt", tree.outside / "secret.txt"))
    with pytest.raises(PathRefused, match="symlink"):
        tools(tree.root)["read_file"]("safe.txt")
    assert done == ["safe.txt"]


@pytest.mark.parametrize("name", OPS)
def test_a_directory_swapped_for_a_symlink_on_the_way_is_refused(tree: Tree, swap_at: Any, name: str) -> None:
    """Every tool: `docs` becomes a symlink to outside/docs just before it is opened; refused, and
    outside/ is neither read nor changed."""
    before = tree.outside_state()
    done = swap_at("open", "docs", to_link(tree.root / "docs", tree.outside / "docs"))
    path = "docs" if name in ("list_dir", "search_files") else "docs/readme.md"
    with pytest.raises(PathRefused, match="symlink"):
        run(tools(tree.root)[name], name, path)
    assert done == ["docs"]
    assert tree.outside_state() == before


def test_a_search_skips_a_directory_swapped_for_a_symlink(tree: Tree, swap_at: Any) -> None:
    """search_files: a subdirectory swapped for a symlink out while the walk runs is not entered."""
    done = swap_at("open", "docs", to_link(tree.root / "docs", tree.outside / "docs"))
    found = tools(tree.root)["search_files"](contains="docs")
    assert done == ["docs"]
    assert found["matches"] == []  # outside/docs/readme.md says "SECRET docs"


def test_a_write_never_writes_through_a_symlink_swapped_in_before_the_rename(
    tree: Tree, swap_at: Any
) -> None:
    """write_file: the target becomes a symlink out just before the rename; the rename replaces
    the link itself, so the secret is untouched and the new file is inside."""
    done = swap_at("rename", ".tmp", to_link(tree.root / "a.txt", tree.outside / "secret.txt"))
    tools(tree.root)["write_file"]("a.txt", "new")
    assert done
    assert (tree.outside / "secret.txt").read_text() == SECRET
    assert not (tree.root / "a.txt").is_symlink()
    assert (tree.root / "a.txt").read_text() == "new"


def test_a_write_refuses_a_directory_swapped_in_before_the_rename(tree: Tree, swap_at: Any) -> None:
    """write_file: the target becomes a directory before the rename: refused, no temporary file left."""

    def to_dir() -> None:
        (tree.root / "a.txt").unlink()
        (tree.root / "a.txt").mkdir()

    swap_at("rename", ".tmp", to_dir)
    with pytest.raises(PathRefused, match="a directory"):
        tools(tree.root)["write_file"]("a.txt", "new")
    assert not list(tree.root.glob(".effectgate-*"))


def test_a_delete_removes_only_a_symlink_swapped_in_before_the_unlink(tree: Tree, swap_at: Any) -> None:
    """delete_file: the file becomes a symlink out just before the unlink; the link goes, the secret stays."""
    done = swap_at("unlink", "a.txt", to_link(tree.root / "a.txt", tree.outside / "secret.txt"))
    tools(tree.root)["delete_file"]("a.txt")
    assert done == ["a.txt"]
    assert (tree.outside / "secret.txt").read_text() == SECRET
    assert not (tree.root / "a.txt").exists()
    assert not (tree.root / "a.txt").is_symlink()


def test_a_fifo_swapped_in_before_the_open_is_refused_without_blocking(tree: Tree, swap_at: Any) -> None:
    """read_file: the file becomes a FIFO after the checks; the open does not block, fstat refuses."""

    def to_fifo() -> None:
        (tree.root / "a.txt").unlink()
        os.mkfifo(tree.root / "a.txt")

    swap_at("open", "a.txt", to_fifo)
    with pytest.raises(PathRefused, match="a FIFO"):
        tools(tree.root)["read_file"]("a.txt")


# -- any path string


NAMES = [
    *("a.txt", "docs", "readme.md", "new", "secret.txt", "outside", "é"),
    *("..", ".", ""),
    *("lo", "ls", "li", "z", "fifo"),
]
STRUCTURED = st.lists(st.sampled_from(NAMES), min_size=1, max_size=6).map("/".join)
PATHS = st.one_of(
    STRUCTURED,
    STRUCTURED.map(lambda p: "./" + p),
    STRUCTURED.map(lambda p: "/" + p),
    st.lists(st.sampled_from([*"./ab\x00é", "..", "lo", "/"]), max_size=20).map("".join),
    st.text(max_size=30),
)


def inside(root: Path, rel: str) -> bool:
    real = os.path.realpath(root / rel)
    return real == os.path.realpath(root) or real.startswith(os.path.realpath(root) + os.sep)


@pytest.fixture(scope="module")
def fixed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Callable[..., Any]]]:
    """One base directory for the property, and tools built once over its work directory (each
    example rebuilds the tree in place: building rows compiles their schemas, the slow part)."""
    base = tmp_path_factory.mktemp("property")
    return base, tools(make_tree(base).root)


def fresh_tree(base: Path) -> Tree:
    for child in base.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    return make_tree(base)


def check_one(base: Path, tool: Callable[..., Any], name: str, path: str) -> None:
    """Run one tool on `path` in a fresh tree; see the property below."""
    tree = fresh_tree(base)
    before = tree.outside_state()
    try:
        out = run(tool, name, path)
    except (PathRefused, FileNotFoundError):
        out = None
    assert tree.outside_state() == before
    if out is None:
        return
    if name == "read_file":
        assert out in ("alpha\n", "hello docs\n")
    elif name == "write_file":
        assert inside(tree.root, out["path"])
        assert not (tree.root / out["path"]).is_symlink()
        assert (tree.root / out["path"]).read_text() == "pwned"
    elif name == "delete_file":
        assert inside(tree.root, out["path"])
        assert not os.path.lexists(tree.root / out["path"])
    elif name == "list_dir":
        assert inside(tree.root, out["path"])
        assert [e["name"] for e in out["entries"]] == sorted(os.listdir(tree.root / out["path"]))
    else:
        assert all(inside(tree.root, m["path"]) for m in out["matches"])
        assert all(SECRET not in m["text"] for m in out["matches"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=PATHS)
def test_any_path_is_refused_or_touches_only_the_work_directory(
    fixed: tuple[Path, dict[str, Callable[..., Any]]], path: str
) -> None:
    """For any path string, each tool refuses (PathRefused, or FileNotFoundError for a missing
    file) or what it read, wrote, deleted or listed is inside the work directory (by realpath),
    no text from outside reaches it, and nothing outside changed."""
    base, by_name = fixed
    for name in OPS:
        check_one(base, by_name[name], name, path)


@pytest.mark.parametrize("name", ["read_file", "write_file", "delete_file"])
@pytest.mark.parametrize("path", ["a.txt/", "new/", "docs/.", "docs/readme.md/..", "./"])
def test_a_path_that_names_a_directory_is_no_file(tree: Tree, name: str, path: str) -> None:
    """A path ending in /, . or .. names a directory: the file tools refuse it and make nothing."""
    listing = sorted(p.name for p in tree.root.rglob("*"))
    with pytest.raises(PathRefused) as caught:
        run(tools(tree.root)[name], name, path)
    assert caught.value.code in ("not_regular", "work_directory")
    assert sorted(p.name for p in tree.root.rglob("*")) == listing
