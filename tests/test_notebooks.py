"""Every notebook under notebooks/ runs top to bottom on scripted models, and its stored outputs
are current (`make notebooks` regenerates them; see tests/notebooks.py)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from . import notebooks as nb_tool

NOTEBOOKS = nb_tool.notebooks()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_and_its_stored_outputs_are_current(path: Path) -> None:
    """The notebook executes without an error in any cell, and the outputs stored in the file
    (what GitHub shows) equal a fresh run's, run-to-run values masked: run `make notebooks`."""
    fresh = nb_tool.execute(path)
    assert not nb_tool.errors(fresh)
    stored = nbformat.read(path, as_version=4)
    assert any(c.get("outputs") for c in stored.cells if c.cell_type == "code"), "no stored outputs"
    assert nb_tool.outputs(stored) == nb_tool.outputs(fresh), (
        f"stale outputs: run `make notebooks` ({path.name})"
    )


def test_there_are_notebooks() -> None:
    """The notebook suite is not silently empty."""
    assert NOTEBOOKS
