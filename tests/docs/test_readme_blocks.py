"""Every ```python block of README.md, core's and the adapters' READMEs runs and type-checks (issue 17).

Each block is written to a fresh directory and run there with this interpreter, without the
EFFECTGATE_KEYRING and EFFECTGATE_DB variables, as a reader who copies it would run it; every block
runs twice in one directory, since what it stores persists. Each block also passes
`mypy --strict` with the repository's configuration.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "pyproject.toml"
# Every README a package ships (the main one, core's, each adapter's), by a short label.
DOCS = {
    "README": ROOT / "README.md",
    **{p.parent.name: p for p in sorted(ROOT.glob("core/README.md"))},
    **{p.parent.name: p for p in sorted(ROOT.glob("integrations/*/README.md"))},
}
WITH_EXAMPLES = {"README", "langgraph", "openai_agents", "smolagents"}  # each must show code
QUICK_START = ("README", "quick-start")
TIMEOUT = 180  # seconds per run; mypy's first, uncached look at a framework is the slowest

_FENCE = re.compile(r"^```(?:python3?|py)[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_ANY_FENCE = re.compile(r"^```.*?^```[ \t]*$", re.MULTILINE | re.DOTALL)  # a `# comment` is no heading
_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*$", re.MULTILINE)


@dataclass(frozen=True)
class Block:
    doc: str
    index: int
    section: str  # the slug of the heading the block sits under
    code: str

    @property
    def id(self) -> str:
        return f"{self.doc}-{self.index}-{self.section}"


def _slug(heading: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", heading.lower()).strip("-") or "top"


def blocks_of(doc: str, text: str) -> list[Block]:
    """The ```python blocks of one Markdown text, in order, with the heading each sits under."""
    fenced = [m.span() for m in _ANY_FENCE.finditer(text)]
    headings = [
        (m.start(), _slug(m.group(1)))
        for m in _HEADING.finditer(text)
        if not any(start < m.start() < end for start, end in fenced)
    ]
    found = []
    for index, fence in enumerate(_FENCE.finditer(text)):
        above = [slug for start, slug in headings if start < fence.start()]
        found.append(Block(doc, index, above[-1] if above else "top", fence.group(1)))
    return found


BLOCKS = [block for doc, path in DOCS.items() for block in blocks_of(doc, path.read_text())]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("EFFECTGATE_KEYRING", "EFFECTGATE_DB")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=TIMEOUT, check=False
    )


def _explain(what: str, done: subprocess.CompletedProcess[str]) -> str:
    return f"{what} exited {done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"


@pytest.fixture(scope="session")
def mypy_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One mypy cache for every block: the libraries are analysed once, not once per block."""
    return tmp_path_factory.mktemp("mypy_cache")


def _write(block: Block, directory: Path) -> Path:
    # not named after a module a block imports (agents.py would shadow the SDK)
    path = directory / "readme_block.py"
    path.write_text(block.code)
    return path


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_block_runs(block: Block, tmp_path: Path) -> None:
    """The block runs to the end in a fresh directory, and then again there: a newcomer runs a
    block twice, in the directory it ran in (the quick start says to), and finds what the first
    run left: its database file, a decided approval, a call that now replays (the shadow-mode
    block stopped on AlreadyDecided the second time, an adapter block on the replayed call)."""
    path = _write(block, tmp_path)
    runs = 2
    for run in range(1, runs + 1):
        done = _run([sys.executable, path.name], tmp_path)
        assert done.returncode == 0, _explain(f"run {run} of {block.id}", done)


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_block_type_checks(block: Block, tmp_path: Path, mypy_cache: Path) -> None:
    """The block is clean under `mypy --strict` with the repository's configuration."""
    path = _write(block, tmp_path)
    args = ["--strict", "--config-file", str(CONFIG), "--cache-dir", str(mypy_cache), path.name]
    done = _run([sys.executable, "-m", "mypy", *args], tmp_path)
    assert done.returncode == 0, _explain(f"mypy on {block.id}", done)


def test_every_readme_has_a_block_and_one_is_the_quick_start() -> None:
    """The main and adapter READMEs each hold a Python block; exactly one is the quick start."""
    assert {b.doc for b in BLOCKS} >= WITH_EXAMPLES
    assert [b.id for b in BLOCKS if (b.doc, b.section) == QUICK_START] == ["README-0-quick-start"]


def test_blocks_are_found_with_their_headings() -> None:
    """The extractor finds each fenced python block, under its nearest heading, and nothing else."""
    text = (
        "# Title\n\n```python\na = 1\n```\n\n## Two words\n\n```sh\n# not a heading\nls\n```\n\n"
        "```python\n# a comment\nb = 2\n```\n"
    )
    assert [(b.id, b.code) for b in blocks_of("doc", text)] == [
        ("doc-0-title", "a = 1\n"),
        ("doc-1-two-words", "# a comment\nb = 2\n"),
    ]
