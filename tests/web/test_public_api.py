"""`effectgate.web`'s surface, and the install hint when the web extra is missing."""

from __future__ import annotations

import importlib
import sys

import pytest

from effectgate.errors import MissingDependency


def test_web_all_is_pinned() -> None:
    """`effectgate.web.__all__` is exactly the curated list."""
    import effectgate.web

    assert effectgate.web.__all__ == [
        "ApproverRegistry",
        "RegisteredApprover",
        "create_app",
        "hash_secret",
        "verify_secret",
    ]


def test_web_without_starlette_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """Importing the inbox without starlette raises MissingDependency with the install command."""
    for name in [m for m in sys.modules if m == "effectgate.web" or m.startswith("effectgate.web.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "starlette", None)
    with pytest.raises(MissingDependency) as caught:
        importlib.import_module("effectgate.web")
    assert 'pip install "effectgate[web]"' in str(caught.value)
