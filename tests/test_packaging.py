"""What each distribution ships: its own package, the licence and index-ready metadata, no local state.

These tests run `uv build --all-packages --sdist --wheel` once for the module (a few seconds, and
hatchling from the package index the first time) and read the archives it writes to a temporary
directory.
"""

from __future__ import annotations

import email
import email.message
import os
import re
import shutil
import subprocess
import tarfile
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parent.parent
ROOT_PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# Distribution roots: the meta-package at the top, then every workspace member.
DIST_DIRS = [ROOT, *(ROOT / m for m in ROOT_PYPROJECT["tool"]["uv"]["workspace"]["members"])]
# Local state that the working tree may hold and no archive may carry.
DUMMIES = ["approvers.toml", "x.db", "x.db.keys", "x.db.checkpoints"]
DUMMY_TEXT = "# test_packaging dummy: must not ship\n"
FORBIDDEN_PARTS = {"tests", "notebooks", "benchmarks", ".venv", "__pycache__"}
FORBIDDEN_SUFFIXES = (".db", ".keys", ".checkpoints", ".db-wal", ".db-shm", ".pyc")
CLASSIFIERS = {
    "Development Status :: 3 - Alpha",
    "Intended Audience :: Developers",
    "Programming Language :: Python :: 3.11",
    "Programming Language :: Python :: 3.12",
    "Programming Language :: Python :: 3.13",
    "Topic :: Software Development :: Libraries",
    "Typing :: Typed",
}
URLS = {"Homepage", "Repository", "Issues", "Documentation"}
# A markdown link or image whose target is not absolute: broken once the readme is on the index.
RELATIVE_LINK = re.compile(r"\]\((?!https?://|#)([^)]*)\)|<img[^>]+src=\"(?!https?://)")


@dataclass(frozen=True)
class Dist:
    name: str
    directory: Path
    packages: tuple[str, ...]  # the import packages under src/, empty for the meta-package
    sdist: Path
    wheel: Path


def _uv() -> list[str]:
    # `uv run` exports $UV; otherwise the uv on PATH, else the module that `make uv` installs.
    found = os.environ.get("UV") or shutil.which("uv")
    if found:
        return [found]
    probe = subprocess.run(["python3", "-m", "uv", "--version"], capture_output=True, check=False)
    if probe.returncode == 0:
        return ["python3", "-m", "uv"]
    pytest.fail("uv is not installed: run `make uv` (python3 -m pip install uv)")


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Dist]:
    out = tmp_path_factory.mktemp("dist")
    created: list[Path] = []
    try:
        for directory in DIST_DIRS:
            for name in DUMMIES:
                path = directory / name
                try:
                    with path.open("x") as f:  # never touch a real file of that name
                        f.write(DUMMY_TEXT)
                except FileExistsError:
                    continue
                created.append(path)
        build = [*_uv(), "build", "--all-packages", "--sdist", "--wheel", "--out-dir", str(out)]
        done = subprocess.run(build, cwd=ROOT, capture_output=True, text=True, timeout=240, check=False)
        if done.returncode != 0:
            pytest.fail(f"uv build failed ({done.returncode}):\n{done.stderr[-4000:]}")
    finally:
        for path in created:
            path.unlink(missing_ok=True)
    result: dict[str, Dist] = {}
    for directory in DIST_DIRS:
        pyproject = tomllib.loads((directory / "pyproject.toml").read_text())
        project = pyproject["project"]
        stem = f"{project['name'].replace('-', '_')}-{project['version']}"
        wheel_target = pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]
        packages = tuple(PurePosixPath(p).name for p in wheel_target.get("packages", []))
        result[project["name"]] = Dist(
            project["name"], directory, packages, out / f"{stem}.tar.gz", out / f"{stem}-py3-none-any.whl"
        )
    return result


def _sdist_files(dist: Dist) -> dict[str, bytes]:
    with tarfile.open(dist.sdist) as tar:
        members = [m for m in tar.getmembers() if m.isfile()]
        # Strip the "<name>-<version>/" prefix every sdist entry carries.
        return {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in members}  # type: ignore[union-attr]


def _wheel_files(dist: Dist) -> list[str]:
    with zipfile.ZipFile(dist.wheel) as whl:
        return whl.namelist()


def _metadata(dist: Dist) -> email.message.Message:
    with zipfile.ZipFile(dist.wheel) as whl:
        name = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
        return email.message_from_bytes(whl.read(name))


def _names() -> list[str]:
    return [tomllib.loads((d / "pyproject.toml").read_text())["project"]["name"] for d in DIST_DIRS]


def _forbidden(path: str) -> bool:
    parts = PurePosixPath(path).parts
    return (
        parts[-1] == "approvers.toml"
        or parts[-1].endswith(FORBIDDEN_SUFFIXES)
        or bool(FORBIDDEN_PARTS.intersection(parts[:-1]))
    )


@pytest.fixture(params=_names())
def dist(request: pytest.FixtureRequest, dists: dict[str, Dist]) -> Dist:
    return dists[request.param]


def test_sdist_ships_the_licence_and_readme(dist: Dist) -> None:
    """Every sdist carries the workspace's LICENSE, byte for byte, and its own README.md."""
    files = _sdist_files(dist)
    assert {"LICENSE", "README.md"} <= set(files), sorted(files)
    assert files["LICENSE"] == (ROOT / "LICENSE").read_bytes()
    # Its own readme, not the workspace's: the title line is enough (the text may be mid-edit).
    title = (dist.directory / "README.md").read_text().splitlines()[0]
    assert files["README.md"].decode().splitlines()[0] == title
    assert "Copyright (c) 2026 the effectgate authors" in files["LICENSE"].decode()


def test_sdist_holds_only_its_own_package(dist: Dist) -> None:
    """An sdist holds its metadata files and its own src/ package, nothing else from the workspace."""
    files = set(_sdist_files(dist))
    metadata_files = {"PKG-INFO", "pyproject.toml", "README.md", "LICENSE", ".gitignore"}
    if not dist.packages:  # the meta-package: metadata only
        assert files <= metadata_files, sorted(files - metadata_files)
        assert files >= metadata_files - {".gitignore"}
        return
    code = files - metadata_files
    prefixes = tuple(f"src/{package}/" for package in dist.packages)
    assert code, dist.name
    assert all(path.startswith(prefixes) for path in code), sorted(code)


def test_no_archive_carries_local_state_or_workspace_files(dist: Dist) -> None:
    """No sdist or wheel holds approvers.toml, databases, key files, checkpoints, tests or notebooks."""
    shipped = [*_sdist_files(dist), *_wheel_files(dist)]
    assert [path for path in shipped if _forbidden(path)] == []


def test_wheel_ships_the_licence_and_types(dist: Dist) -> None:
    """Every wheel has the licence under dist-info/licenses; each package with code has py.typed."""
    files = _wheel_files(dist)
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in files)
    for package in dist.packages:
        assert f"{package}/py.typed" in files
    # A wheel's code lives under its own import packages (the meta-package has none).
    code = [n for n in files if ".dist-info/" not in n]
    assert all(n.split("/", 1)[0] in dist.packages for n in code), code


def test_wheel_metadata_is_ready_for_the_index(dist: Dist) -> None:
    """A wheel's METADATA has the licence, the classifiers, authors, keywords, the URLs and a readme."""
    meta = _metadata(dist)
    assert meta["License-Expression"] == "MIT" or meta["License"]
    assert meta["License-File"] == "LICENSE"
    classifiers = set(meta.get_all("Classifier") or [])
    assert classifiers >= CLASSIFIERS, CLASSIFIERS - classifiers
    # PEP 639 deprecates licence classifiers beside a License-Expression: the expression says it.
    assert not [c for c in classifiers if c.startswith("License ::")]
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or [])
    assert set(urls) >= URLS
    assert all(u.startswith("https://github.com/effectgate/effectgate") for u in urls.values())
    assert meta["Author"] == "effectgate authors"
    assert meta["Keywords"]
    assert meta["Description-Content-Type"] == "text/markdown"
    assert str(meta.get_payload()).strip()


def test_readme_on_the_index_has_only_absolute_links(dist: Dist) -> None:
    """The description the index renders links and embeds only absolute URLs."""
    description = str(_metadata(dist).get_payload())
    assert [m.group(0) for m in RELATIVE_LINK.finditer(description)] == []


def test_dummies_are_removed_after_the_build(dists: dict[str, Dist]) -> None:
    """The dummy local-state files the build ran beside are gone from the working tree afterwards."""
    paths = [d / n for d in DIST_DIRS for n in DUMMIES]
    assert [p for p in paths if p.exists() and p.read_text(errors="replace") == DUMMY_TEXT] == []


def test_license_copies_match_the_root() -> None:
    """Each distribution's LICENSE (hatchling reads one beside its pyproject) equals the root's."""
    root = (ROOT / "LICENSE").read_bytes()
    assert [d for d in DIST_DIRS if (d / "LICENSE").read_bytes() != root] == []
