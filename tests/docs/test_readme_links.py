"""Links from the READMEs into this repository name files that exist.

The READMEs are also the package index's project pages, so their links are absolute (see
tests/test_packaging.py); an absolute link does not break when its file moves, it just 404s.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
READMES = sorted([ROOT / "README.md", *ROOT.glob("core/README.md"), *ROOT.glob("integrations/*/README.md")])
REPO_LINK = re.compile(
    r"https://(?:github\.com/effectgate/effectgate/blob/main|raw\.githubusercontent\.com/effectgate/effectgate/main)"
    r"/([^)\s\"'<>#?]+)"
)


@pytest.mark.parametrize("readme", READMES, ids=[str(p.relative_to(ROOT)) for p in READMES])
def test_repository_links_name_existing_files(readme: Path) -> None:
    """Every link or image into github.com/effectgate/effectgate names a file in the working tree."""
    missing = [path for path in REPO_LINK.findall(readme.read_text()) if not (ROOT / path).exists()]
    assert not missing


def test_the_main_readme_links_into_the_repository() -> None:
    """The link check has something to check: the README's adapter pages and image are linked."""
    found = set(REPO_LINK.findall((ROOT / "README.md").read_text()))
    assert {"docs/inbox.png", "integrations/langgraph/README.md"} <= found
