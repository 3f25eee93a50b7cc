"""Run the notebooks and keep their outputs: `python -m tests.notebooks [--check] [NAME ...]`.

Without `--check` every notebook under notebooks/ is executed top to bottom (in a temporary
directory, on scripted models) and written back with its outputs, so GitHub shows them; `make
notebooks` runs this. With `--check` nothing is written: the stored outputs must equal a fresh
run's, after masking what changes from run to run (approval ids, tokens, hashes, times, widget
model ids, memory addresses), so CI fails when a notebook's stored outputs are stale.
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import nbformat
from nbclient import NotebookClient

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"

_MASKS = [
    (re.compile(r"eg1\.[A-Za-z0-9_.-]+"), "<token>"),
    (re.compile(r"\b[0-9a-f]{64}\b"), "<sha256>"),
    (re.compile(r"\b[0-9a-f]{32}\b"), "<id>"),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"), "<uuid>"),
    (re.compile(r"\bk[0-9a-f]{8}\b"), "<kid>"),
    (re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(\.\d+)?( UTC)?"), "<time>"),
    (re.compile(r"\b1[6-9]\d{8}(\.\d+)?\b"), "<epoch>"),
    (re.compile(r"in (\d+d )?(\d+h )?\d+m( \d+s)?"), "in <countdown>"),
    (re.compile(r"0x[0-9a-f]{6,}"), "<addr>"),
    (re.compile(r"/tmp/[^\s'\"]+"), "<tmp>"),
    (re.compile(r"\b\d+\.\d{5,}(e-?\d+)?\b"), "<measured>"),  # wall-clock latencies and durations
]


def notebooks(names: Sequence[str] = ()) -> list[Path]:
    found = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
    return [p for p in found if not names or p.stem in names or p.name in names]


def execute(path: Path) -> Any:
    """The notebook executed top to bottom in a fresh temporary directory."""
    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory(prefix="effectgate-nb-") as tmp:
        NotebookClient(
            nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": tmp}}
        ).execute()
    for cell in nb.cells:
        cell.get("metadata", {}).pop("execution", None)
    return nb


def errors(nb: Any) -> list[Any]:
    return [
        o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"
    ]


def _mask(text: str) -> str:
    for pattern, replacement in _MASKS:
        text = pattern.sub(replacement, text)
    return text


def _normal(value: Any) -> Any:
    if isinstance(value, str):
        return _mask(value)
    if isinstance(value, list):
        return [_normal(v) for v in value]
    if isinstance(value, dict):
        return {k: _normal(v) for k, v in value.items() if k not in ("execution_count", "model_id")}
    return value


def outputs(nb: Any) -> list[Any]:
    """Each code cell's outputs, masked (what must match between a stored and a fresh run)."""
    out = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        merged: list[Any] = []
        for o in copy.deepcopy(cell.get("outputs", [])):
            if isinstance(o.get("text"), list):
                o["text"] = "".join(o["text"])
            for mime, data in list(o.get("data", {}).items()):
                if isinstance(data, list):
                    o["data"][mime] = "".join(data)
            last = merged[-1] if merged else None
            if (
                last is not None
                and o["output_type"] == "stream" == last["output_type"]
                and o["name"] == last["name"]
            ):
                last["text"] += o["text"]  # how a stream is cut into chunks depends on flush timing
                continue
            merged.append(o)
        out.append(_normal(merged))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.notebooks", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the stored outputs; write nothing")
    parser.add_argument("names", nargs="*", help="notebooks to run (default: all)")
    args = parser.parse_args(argv)
    stale = []
    for path in notebooks(args.names):
        fresh = execute(path)
        if errors(fresh):
            print(f"{path.name}: a cell raised", file=sys.stderr)
            return 1
        if args.check:
            stored = nbformat.read(path, as_version=4)
            if outputs(stored) != outputs(fresh):
                stale.append(path.name)
            continue
        nbformat.write(fresh, path)
        print(f"wrote {path.relative_to(NOTEBOOK_DIR.parent)} with its outputs")
    if stale:
        print(f"stale outputs in {', '.join(stale)}: run `make notebooks`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
