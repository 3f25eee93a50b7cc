"""The protocols of the ledger's upkeep: redaction, retention and legal holds (`effectgate.redact`
composes them) and the ledger's own hash chain (`effectgate.chain`). Each method runs in the
caller's transaction; `protocol.Store` composes these with the approval ledger and the idempotency
store, and `protocol` (where to import them from) states what a method may raise.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

from ._redaction import Target
from .records import ApprovalRow, ChainRow, DecisionRow, HoldRow, RedactedRow, RuleRow


class RedactionLedger(Protocol):
    """Redaction, retention and legal holds (`effectgate.redact` composes them). Each method runs
    in the caller's transaction (`conn` from `transaction()`)."""

    def redaction_targets(
        self,
        conn: Any,
        *,
        user_id: str | None = None,
        subject_keys: Sequence[str] = (),
        effect: str | None = None,
        before: float | None = None,
        held: Sequence[str] = (),
    ) -> Sequence[Target]:
        """The rows with personal values a redaction of `user_id` (narrowed to approvals whose
        subject key is one of `subject_keys`, when given) or a retention rule (records of `effect`
        older than `before`; `_redaction.UNCLASSIFIED`: events that name no effect class)
        reaches, with the decisions and idempotency records of the approvals and executions
        selected; rows of `held` users left out. Reads only."""

    def overwrite_personal(self, conn: Any, table: str, key: str, values: Mapping[str, str]) -> None:
        """Write redaction markers into personal columns (`records.PERSONAL`) of one row. Raises
        ValueError for a column that is not personal; the database refuses anything but a marker."""

    def append_redacted(self, conn: Any, entries: Sequence[Mapping[str, Any]]) -> None:
        """Append `eg_redacted` entries (columns of `records.RedactedRow`)."""

    def redacted(self, conn: Any) -> Sequence[RedactedRow]:
        """Every `eg_redacted` entry, in order."""

    def add_hold(self, conn: Any, hold: HoldRow) -> None:
        """Place a legal hold."""

    def release_hold(self, conn: Any, hold_id: str, *, by: str, at: float) -> bool:
        """Mark a hold released (its row; the caller appends its `hold_released` event); False when
        no row has that id."""

    def holds(self, conn: Any, *, active: bool = True) -> Sequence[HoldRow]:
        """The holds, oldest first; by default those that stand: a row not released, and a hold
        its `hold` event placed with no `hold_released` event (the row is unsealed)."""

    def sealed_sample(
        self, conn: Any, *, limit: int = 3
    ) -> tuple[Sequence[ApprovalRow], Sequence[DecisionRow]]:
        """The `limit` most recently written approvals and decisions (newest first). Reads only."""


class ChainLedger(Protocol):
    """The ledger's own hash chain (`effectgate.chain` composes it), in the caller's transaction."""

    def checkpoints(self, conn: Any) -> Sequence[ChainRow]:
        """Every `eg_chain` checkpoint, in order."""

    def append_checkpoint(self, conn: Any, row: Mapping[str, Any]) -> None:
        """Append one checkpoint (columns of `records.ChainRow`)."""

    def rule_rows(self, conn: Any) -> Sequence[RuleRow]:
        """Every recorded rule and rule seal row (`rules()`, in the caller's transaction)."""

    def chain_rows(
        self, conn: Any, table: str, *, after_id: int | None, upto_id: int | None = None
    ) -> Iterator[tuple[Any, ...]]:
        """The rows of a chained table (`stores._chain.CHAINED`) with after_id < id <= upto_id
        (after_id None: from the first row, whatever its id), in id order, as tuples in
        `_chain.columns(table)` order. ValueError for another table."""
