"""Pins: an export's signed manifest names the ledger's own chain heads, so the chain cannot be
cut back below them unseen.

The ledger's hash chain (`effectgate.chain`) proves every checkpointed row is as it was, from the
first checkpoint to the last one in `eg_chain`. Nothing in the database can prove which
checkpoint is the last: with the append-only triggers dropped, deleting a table's newest
checkpoints and editing the rows they covered leaves a shorter chain that verifies (the next
seal covers the edited rows afresh). An export's manifest is kept outside the database and signed,
so it records, per chained table, the last checkpoint at export time (`heads`: its last id and
head). `breaks` checks that each pinned checkpoint is still in `eg_chain`, exactly: with the
chain verified up to it (`verify_chain`: signatures and continuity), every row up to the pinned id
is as it was when that export was made. An incremental export (`export_chain(after=...)`) and
`effectgate audit --pinned MANIFEST` check the pins of the manifest they are given.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .chain import ChainBreak
from .stores.protocol import Store

#: table -> {"last_id": int, "head": str}: the last checkpoint of each chained table
Heads = dict[str, dict[str, Any]]


def heads(store: Store) -> Heads:
    """The last checkpoint of each chained table that has one (read after a seal)."""
    with store.reading() as conn:  # in order: the last of each table wins (a seal verified it;
        last = {c.table_name: c for c in store.checkpoints(conn)}  # an older one edited is the audit's)
    return {table: {"last_id": int(c.last_id), "head": str(c.head)} for table, c in last.items()}


def breaks(store: Store, pinned: Mapping[str, Any] | None) -> list[ChainBreak]:
    """A `ChainBreak` for each pinned checkpoint (`heads`) that is not in the ledger's chain as it
    was pinned: the chain was cut back or rebuilt since the export that pinned it."""
    if not pinned:
        return []
    with store.reading() as conn:
        # as stored: an edited checkpoint (text in its id, on SQLite) matches no pin, never raises
        held = {(c.table_name, c.last_id, c.head) for c in store.checkpoints(conn)}
    out: list[ChainBreak] = []
    for table, pin in sorted(pinned.items()):
        last_id = pin.get("last_id") if isinstance(pin, Mapping) else None
        head = pin.get("head") if isinstance(pin, Mapping) else None
        if not isinstance(last_id, int) or not isinstance(head, str):
            out.append(ChainBreak(str(table), None, None, "the manifest's pin is not a checkpoint"))
        elif (table, last_id, head) not in held:
            out.append(
                ChainBreak(
                    str(table),
                    None,
                    last_id,
                    "the checkpoint an export pinned is gone or changed: the ledger's chain was cut "
                    "back or rebuilt since that export (rows up to this id may have been edited)",
                )
            )
    return out
