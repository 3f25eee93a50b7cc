"""Who is calling, who is approving, and what a tool is told when it runs.

Every field here is set by the application or the adapter from its own state (the session, the
authenticated user, the originating user message). None of it comes from model output.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from ._textcheck import _selector, hidden, reveal
from .canonical import _SURROGATE

#: The fields stored as text columns (the model-written `tool_call_id` is stored as escaped JSON)
_TEXT_FIELDS = ("session_id", "origin_message_id", "user_id", "agent_id", "run_id", "model_id")


def _storable(value: object) -> bool:
    """Whether text can be stored as it is (no NUL, no lone surrogate: no database keeps them)."""
    return not isinstance(value, str) or ("\x00" not in value and not _SURROGATE.search(value))


@dataclass(frozen=True, kw_only=True)
class CallContext:
    """The identity of one call, built by the backend.

    `origin_message_id` is the id of the user message that started this turn; together with the
    session, tool and subject it forms the intent key, so a replay of that message finds the same
    approval. `tool_call_id` is kept for the audit only and never used as a key. `model_id` names
    the model that proposed the call (as the application knows it, e.g. "gpt-4.1-2025-04-14"):
    recorded on approvals and executions for the report and the decision records, never a key
    and never a reason to allow or refuse anything.
    """

    session_id: str
    origin_message_id: str
    user_id: str
    agent_id: str
    run_id: str = ""
    tool_call_id: str | None = None
    model_id: str = ""

    def __post_init__(self) -> None:
        for name in ("session_id", "origin_message_id", "user_id", "agent_id"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"CallContext.{name} must be a non-empty string")
        for name in ("run_id", "model_id"):  # stored as text (an execution's run_id is NOT NULL)
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"CallContext.{name} must be a string")
        if self.tool_call_id is not None and not isinstance(self.tool_call_id, str):
            raise ValueError("CallContext.tool_call_id must be a string or None")
        # every record of the call stores them: text no database stores would fail a batch of
        # other callers' read records too (one join and one scan: a context is built per call)
        text = f"{self.session_id}{self.origin_message_id}{self.user_id}{self.agent_id}"
        text += f"{self.run_id}{self.model_id}"
        if "\x00" in text or (not text.isascii() and _SURROGATE.search(text)):
            name = next(n for n in _TEXT_FIELDS if not _storable(getattr(self, n)))
            raise ValueError(f"CallContext.{name} holds a NUL character or a lone surrogate: not storable")

    def as_record(self) -> dict[str, str | None]:
        return {
            "session_id": self.session_id,
            "origin_message_id": self.origin_message_id,
            "user_id": self.user_id,
            "agent_id": self.agent_id,
            "run_id": self.run_id,
            "tool_call_id": self.tool_call_id,
            "model_id": self.model_id,
        }


@dataclass(frozen=True)
class Approver:
    """A person deciding; the application authenticates them and vouches for the role."""

    id: str
    role: str

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not isinstance(self.role, str):
            # a decision is sealed over what is stored (text): a number would not verify later
            raise TypeError(f"Approver id and role must be text (got {self.id!r}, {self.role!r})")
        if not self.id or not self.role:
            raise ValueError("Approver needs a non-empty id and role")
        if not (_storable(self.id) and _storable(self.role)):  # it is stored with every decision
            raise ValueError("Approver id and role cannot hold NUL or a lone surrogate (never stored)")
        for name, text in (("id", self.id), ("role", self.role)):
            if all(c.isspace() or hidden(c) or _selector(c) for c in text):
                # blank, spaces or invisible characters only: a decision recorded by nobody
                raise ValueError(f"Approver {name} {reveal(text)!r} shows no character: give who decides")


@dataclass(frozen=True, kw_only=True)
class ToolContext:
    """Handed to a tool that declares a parameter of this type.

    `idempotency_key` is derived from the approval (id + version) for gated calls and from the
    write's dedupe key for writes; pass it downstream (`idempotency_headers`) so that the provider
    itself refuses a second effect for the same intent.
    """

    idempotency_key: str
    call: CallContext
    approval_id: str | None = None
    version: int | None = None
    attempt: int = 1
    _on_provider_ref: Callable[[str], None] | None = field(default=None, repr=False, compare=False)

    def set_provider_ref(self, provider_ref: str) -> None:
        """Record the provider's own id for this effect (e.g. the processing id of a 202) as soon
        as the provider gives it, before the call returns: it is committed at once, so if the
        outcome is then lost the reconciliation (and a reviewer deciding whether to approve it
        again) sees it, and the decision record carries it. Raises `LeaseLost` if this call no
        longer holds its lease; ValueError for an empty reference."""
        if not isinstance(provider_ref, str) or not provider_ref:
            raise ValueError("provider_ref must be a non-empty string")
        if _SURROGATE.search(provider_ref):
            raise ValueError("provider_ref must be UTF-8 text: it holds a lone surrogate")
        if self._on_provider_ref is None:
            raise RuntimeError("this ToolContext is not running a call: nothing to record against")
        self._on_provider_ref(provider_ref)


class _HasHeaders(Protocol):
    @property
    def headers(self) -> MutableMapping[str, str]: ...


def idempotency_headers(tool_context: ToolContext) -> dict[str, str]:
    """The `Idempotency-Key` header for a downstream request."""
    return {"Idempotency-Key": tool_context.idempotency_key}


R = TypeVar("R", bound=_HasHeaders)


def set_idempotency_key(request: R, tool_context: ToolContext) -> R:
    """Set `Idempotency-Key` on an httpx (or any headers-bearing) request and return it."""
    request.headers["Idempotency-Key"] = tool_context.idempotency_key
    return request


@dataclass(frozen=True, kw_only=True)
class SubjectEntry:
    """Another approval of the same tool on the same subject, for business checks and cards.
    `intact` is False for one whose record no longer verifies (edited in the database): listed
    while it may be in effect, its arguments untrusted (a `confirm` check is not asked)."""

    approval_id: str
    status: str
    version: int
    args: Mapping[str, Any]
    created_at: float
    in_effect: bool = False
    intact: bool = True


@dataclass(frozen=True, kw_only=True)
class Confirmation:
    """What a `confirm` check sees: the caller, and the subject's other approvals of this tool."""

    call: CallContext
    history: Sequence[SubjectEntry] = field(default_factory=tuple[SubjectEntry, ...])

    def committed(self) -> list[SubjectEntry]:
        """Approvals of this tool on this subject that executed, or were approved with a grant
        that is still usable (or was presented); a grant that expired unused commits nothing."""
        return [e for e in self.history if e.in_effect]
