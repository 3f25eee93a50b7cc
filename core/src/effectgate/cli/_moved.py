"""Module names that are not what the reader thinks: `approve` finds an approval's table row
changed when nobody edited it, because the script that proposed the call ran under another module
name than the one `--app` imports (`python sub/shop.py` records `shop.refund`; `--app
sub.shop:app` names it `sub.shop.refund`); or `--app test:factory` imports the installed `test`
package, not ./test.py (the working directory comes last, never shadowing an installed module)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..gate import EffectGate

_NAMED = ("fn", "scope", "confirm", "snapshot")  # the row's fields that name a function


def moved(gate: EffectGate, approval_id: str) -> str | None:
    """A hint for a `reclassified` refusal whose row differs from the recorded one only in the
    module its functions are named under; None otherwise. Text for the reader: it decides nothing
    (the refusal stands, and the recorded row is only compared, never used)."""
    try:
        row = gate.store.get_approval(approval_id)
        spec = gate.table.get(row.tool) if row is not None else None
        rule = gate.store.rules().get(row.row_fingerprint) if row is not None else None
        recorded = json.loads(rule.body_json) if rule is not None and rule.kind == "row" else None
    except Exception:  # the hint is a courtesy: the refusal is reported as it is
        return None
    if spec is None or not isinstance(recorded, dict):
        return None
    current = spec.canonical()
    differ = sorted(k for k in {*recorded, *current} if recorded.get(k) != current.get(k))
    if not differ or any(k not in _NAMED for k in differ):
        return None
    pairs = [(str(recorded.get(k)), str(current.get(k))) for k in differ]
    if not all(was.endswith(f".{now}") or now.endswith(f".{was}") for was, now in pairs):
        return None
    was, now = pairs[0]
    return (
        f"its function was recorded as {was} and --app names it {now}: the same code imported under "
        "another module name. Give --app the module name the script ran as (from the directory it "
        "was started in), or start the script with `python -m package.module`"
    )


def shadowed(module: str) -> str:
    """A note for an `--app` module that has no such factory when the working directory holds a
    file of that name that an installed module was imported in place of; "" otherwise."""
    top = module.partition(".")[0]
    mine = [p for p in (Path(f"{top}.py"), Path(top, "__init__.py")) if p.is_file()]
    where = getattr(sys.modules.get(top), "__file__", None)
    if not mine or not where or Path(where).resolve() == mine[0].resolve():
        return ""
    return f" (the installed module {top!r}, {where}, is imported, not ./{mine[0]}: rename your file)"
