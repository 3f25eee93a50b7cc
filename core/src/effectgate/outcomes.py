"""What a call, an approval or an execution returns: values, not exceptions.

`gate.call` returns one of `Executed`, `Pending`, `Refused`, `Invalid`; each has a `for_model()`
sentence an adapter can hand back to the model, and none of them is built from model text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pydantic_core

from ._json import parse
from ._textcheck import card_line, text_warnings
from .context import SubjectEntry
from .stores._dialect import REDACTED_PREFIX
from .stores.records import ApprovalRow
from .table import SchemaError

#: The warning a card carries when its stored record does not verify.
TAMPERED_WARNING = "the stored record does not verify (edited outside effectgate): do not approve"
REDACTED_NOTE = "personal data erased by a redaction: the arguments show only the facts kept"
UNSEALED_WARNING = (
    "the stored subject, notes, reversibility or owner were changed outside effectgate: the card "
    "shows them as the table derives them from the verified arguments"
)

RefusalCode = Literal[
    "unknown_tool",
    "not_allowed",
    "out_of_scope",
    "parallel_calls",
    "subject_busy",
    "too_many_pending",
    "confirm_failed",
    "denied",
    "expired",
    "needs_reconciliation",
    "in_progress",
    "failed",
    "mismatch",
    "shadow",
    "tampered",
]


@dataclass(frozen=True, kw_only=True)
class Card:
    """What an approver sees, built only from the stored approval record."""

    approval_id: str
    version: int
    status: str
    tool: str
    effect: str
    reversibility: str
    args: Mapping[str, Any]
    args_hash: str
    subject: Mapping[str, Any] | None
    approver_role: str
    notes: Sequence[str]
    approvals_required: int
    approvals_given: int
    owner: str | None
    session_id: str
    user_id: str
    created_at: float
    expires_at: float
    reason: str | None = None
    warnings: Sequence[str] = ()

    @classmethod
    def from_record(
        cls, row: ApprovalRow, *, approvals_given: int = 0, intact: bool = True, extra: Sequence[str] = ()
    ) -> Card:
        """The card of a stored row. `warnings` flags text that is not what it looks like
        (bidirectional controls, invisible characters, mixed-script words) in the arguments and
        subject, and a record that does not verify (`intact=False`)."""
        args = _stored(row.args_json)
        subject = _stored(row.subject_json) if row.subject_json else None
        notes = _stored(row.notes_json)
        stored = row.args_json + (row.subject_json or "")
        # JSON text of printable ASCII with no escape decodes to printable ASCII strings only,
        # which `text_warnings` passes: the common case skips the walk over the values
        plain = stored.isascii() and stored.isprintable() and "\\" not in stored
        warnings = ((TAMPERED_WARNING,) if not intact else ()) + (
            () if plain else text_warnings({"args": args, "subject": subject})
        )
        if row.args_json.startswith(REDACTED_PREFIX):
            warnings += (REDACTED_NOTE,)
        warnings += tuple(extra)
        fields = {
            "approval_id": row.id,
            "version": row.version,
            "status": row.status,
            "tool": row.tool,
            "effect": row.effect,
            "reversibility": row.reversibility,
            "args": args,
            "args_hash": row.args_hash,
            "subject": subject,
            "approver_role": row.approver_role,
            "notes": tuple(notes) if isinstance(notes, list) else (),
            "approvals_required": row.approvals_required,
            "approvals_given": approvals_given,
            "owner": row.owner,
            "session_id": row.session_id,
            "user_id": row.user_id,
            "created_at": row.created_at,
            "expires_at": row.expires_at,
            "reason": row.reason,
            "warnings": warnings,
        }
        if cls is not Card:
            return cls(**fields)
        # Every proposal returns one: the frozen dataclass's __init__ sets the twenty fields one
        # object.__setattr__ at a time (about 2 us); as `Executed`, one update of its dict
        card = object.__new__(cls)
        card.__dict__.update(fields)
        return card

    def to_dict(self) -> dict[str, Any]:
        return {
            "approval_id": self.approval_id,
            "version": self.version,
            "status": self.status,
            "tool": self.tool,
            "effect": self.effect,
            "reversibility": self.reversibility,
            "args": json_value(self.args),  # a row edited in the database may hold any JSON
            "args_hash": self.args_hash,
            "subject": json_value(self.subject),
            "approver_role": self.approver_role,
            "notes": list(self.notes),
            "approvals_required": self.approvals_required,
            "approvals_given": self.approvals_given,
            "owner": self.owner,
            "session_id": self.session_id,
            "user_id": self.user_id,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "reason": self.reason,
            "warnings": list(self.warnings),
        }

    def render(self) -> str:
        """A plain-text card (used where no richer surface is available): each stored text on one
        line, its controls, line breaks and hidden characters written out (`card_line`)."""
        t = card_line
        lines = [
            *(f"WARNING: {t(w)}" for w in self.warnings),
            f"{t(self.tool)}  [{t(self.effect)}, {t(self.reversibility)}]"
            f"  approval {t(self.approval_id)} v{t(self.version)}",
            f"status: {t(self.status)}   approver role: {t(self.approver_role)}"
            f"   approvals: {t(self.approvals_given)} of {t(self.approvals_required)}",
            f"subject: {json.dumps(self.subject, sort_keys=True) if self.subject else '-'}",
            "arguments:",
            *("  " + ln for ln in json.dumps(json_value(self.args), indent=2, sort_keys=True).splitlines()),
            f"args sha256: {t(self.args_hash)}",
            *(f"note: {t(n)}" for n in self.notes),
            *([f"reason: {t(self.reason)}"] if self.reason else []),
        ]
        return "\n".join(lines)


def json_value(value: Any) -> Any:
    """A card's arguments or subject as JSON writes them: a mapping as a dict, anything else (what
    an edit in the database left) as it is."""
    return dict(value) if isinstance(value, Mapping) else value


def _stored(text: str) -> Any:
    """A JSON column's value; its text as it is when it was edited into text that is not JSON (a
    row that no longer verifies: its card is flagged, and it still shows what is stored), or into
    JSON nested deeper than Python parses."""
    try:
        return parse(text)
    except (ValueError, RecursionError):
        return text


@dataclass(frozen=True, kw_only=True, init=False)
class Executed:
    """The tool ran (or, with `replay=True`, had already run and this is its stored result)."""

    tool: str
    result: Any
    replay: bool = False
    approval_id: str | None = None
    version: int | None = None
    idempotency_key: str | None = None
    before: Any = None
    after: Any = None

    def __init__(
        self,
        *,
        tool: str,
        result: Any,
        replay: bool = False,
        approval_id: str | None = None,
        version: int | None = None,
        idempotency_key: str | None = None,
        before: Any = None,
        after: Any = None,
    ) -> None:
        # Every read returns one: a frozen dataclass's own __init__ sets the eight fields one
        # object.__setattr__ at a time (about 1 us); one update of the instance dict is a third.
        self.__dict__.update(
            tool=tool,
            result=result,
            replay=replay,
            approval_id=approval_id,
            version=version,
            idempotency_key=idempotency_key,
            before=before,
            after=after,
        )

    def for_model(self) -> str:
        return model_text(self.result)


def model_text(result: Any) -> str:
    """What the model is told of a result: the text itself, else its JSON (values with no JSON
    form as their str). One json.dumps refuses (keys that are not text, such as dates; a value
    holding itself) is written as the store writes it, else as its repr: telling the model never
    fails after the tool ran."""
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result, default=str)
    except (TypeError, ValueError):
        pass
    try:
        return pydantic_core.to_json(result, fallback=str).decode()
    except (TypeError, ValueError):  # a circular value (PydanticSerializationError)
        return repr(result)


_EXECUTED_DEFAULTS: dict[str, Any] = {
    "replay": False,
    "approval_id": None,
    "version": None,
    "idempotency_key": None,
    "before": None,
    "after": None,
}


def executed(tool: str, result: Any) -> Executed:
    """`Executed(tool=tool, result=result)` for the read hot path: the same object, built without
    the keyword arguments' parsing (about a third of a microsecond less)."""
    out = object.__new__(Executed)
    fields = out.__dict__
    fields["tool"] = tool
    fields["result"] = result
    fields.update(_EXECUTED_DEFAULTS)
    return out


@dataclass(frozen=True, kw_only=True)
class Pending:
    """The call waits for a person. `status` is "approved" when a grant exists but it has not run."""

    approval_id: str
    version: int
    card: Card
    status: str = "pending"
    replay: bool = False

    def for_model(self) -> str:
        return (
            f"{self.card.tool} needs approval by {self.card.approver_role} "
            f"(approval {self.approval_id}, version {self.version}); it has not run."
        )


@dataclass(frozen=True, kw_only=True)
class Refused:
    """The call does not run. `code` is for programs, `message` for the model and people."""

    code: RefusalCode
    message: str
    tool: str
    approval_id: str | None = None

    def for_model(self) -> str:
        if self.code == "needs_reconciliation":  # nothing refused it: it may have happened
            return f"Outcome unknown (needs_reconciliation): {self.message}"
        return f"Refused ({self.code}): {self.message}"


@dataclass(frozen=True, kw_only=True)
class Invalid:
    """The arguments do not fit the tool's schema; nothing ran. The model can correct the call."""

    tool: str
    errors: Sequence[SchemaError] = field(default_factory=tuple[SchemaError, ...])

    @property
    def message(self) -> str:
        return "; ".join(f"{e.pointer or '/'}: {e.message}" for e in self.errors)

    def for_model(self) -> str:
        return f"Invalid arguments for {self.tool}: {self.message}. Correct them and call again."


Outcome = Executed | Pending | Refused | Invalid


@dataclass(frozen=True, kw_only=True)
class Recorded:
    """A reviewer's approval of a call proposed in shadow mode, recorded: `approvals` of
    `required` distinct approvers have approved. Nothing runs, ever (no grant is minted)."""

    approval_id: str
    version: int
    approvals: int
    required: int

    @property
    def complete(self) -> bool:
        return self.approvals >= self.required

    @property
    def message(self) -> str:
        return (
            f"{self.approvals} of {self.required} approvals recorded; the call was proposed in shadow "
            "mode and never runs"
        )


@dataclass(frozen=True, kw_only=True)
class Grant:
    """A single-use token for one approval version; present it to `gate.execute`."""

    approval_id: str
    version: int
    token: str = field(repr=False)  # a live credential: never in a repr (a notebook cell's output)
    expires_at: float


@dataclass(frozen=True, kw_only=True)
class PartialApproval:
    """Recorded, but not enough: a destructive call needs another, distinct approver."""

    approval_id: str
    version: int
    approvals: int
    required: int

    @property
    def message(self) -> str:
        return f"{self.approvals} of {self.required} approvals; a second, distinct approver is needed"


#: What `approve` returns.
Decision = Grant | PartialApproval | Recorded


@dataclass(frozen=True, kw_only=True)
class ReconciliationNotice:
    """Sent to `on_needs_reconciliation`: who must look at which operation, and why. `intact`:
    whether the approval record it names verifies (its seal and arguments); False means what it
    says came from a record edited outside effectgate; None: a write, which has no approval."""

    key: str
    tool: str
    reason: str
    approval_id: str | None = None
    approver_role: str | None = None
    provider_ref: str | None = None
    intact: bool | None = None


@dataclass(frozen=True)
class VersionEntry:
    """One version of an approval: its number, args hash and the proposing user message."""

    version: int
    args_hash: str
    origin_message_id: str
    edited_by: str | None = None


@dataclass(frozen=True)
class SubjectView:
    """The subject's other approvals of the same tool, newest first, and its balance if known."""

    history: tuple[SubjectEntry, ...]
    balance: Any = None
