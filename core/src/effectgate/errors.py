"""Every public error of effectgate, under one root, split by who is at fault.

- `TableError`: the developer who wrote the effect table (a row is missing a field).
- `ArgumentError`: the arguments themselves (NaN, an integer out of range); the gate turns these
  into an `Invalid` outcome for the model, so they only escape from the low-level helpers.
- `ApprovalError`: the approver or the approving application (stale version, wrong role, expired).
- `TokenError`: whoever presents a grant token (expired, used, forged, mismatched arguments).
- `IdempotencyError`: the state of an operation key (conflict, in progress, needs reconciliation).
- `StoreError`: the database (schema version, missing driver).
- `WebhookSignatureError`: whoever sent a webhook request that does not verify.

Control-flow outcomes (a call waiting for approval, a refusal) are values, not errors.
"""

from __future__ import annotations

from typing import Any, Literal


class EffectGateError(Exception):
    """The root of every error effectgate raises on purpose."""

    def __reduce__(self) -> tuple[Any, ...]:
        # pickle and copy rebuild an exception by calling its class with `args` (one message),
        # which most of these refuse (TypeError): a process pool could not return one at all
        return (_restore, (type(self), self.args, self.__dict__))


def _restore(cls: type[EffectGateError], args: tuple[Any, ...], state: dict[str, Any]) -> EffectGateError:
    exc = cls.__new__(cls)
    exc.args = args
    exc.__dict__.update(state)
    return exc


class TableError(EffectGateError, ValueError):
    """An effect-table row is incomplete or inconsistent; names the tool and the field."""

    def __init__(self, tool: str, field: str, message: str) -> None:
        self.tool = tool
        self.field = field
        super().__init__(f"tool {tool!r}: {field}: {message}")


class ArgumentError(EffectGateError, ValueError):
    """Arguments cannot be frozen (NaN, Infinity, an integer JSON cannot carry exactly)."""

    def __init__(self, pointer: str, message: str) -> None:
        self.pointer = pointer
        self.detail = message
        super().__init__(f"{pointer or '/'}: {message}")


class PolicyViolation(EffectGateError):
    """A request breaks the deployment's policy or a business check; nothing changed."""

    def __init__(self, message: str, *, code: str = "policy") -> None:
        self.code = code
        super().__init__(message)


class ConfirmFailed(PolicyViolation):
    """A tool's `confirm` check refused the approval (e.g. the refund exceeds the balance)."""

    def __init__(self, tool: str, reason: str) -> None:
        self.tool = tool
        self.reason = reason
        super().__init__(f"{tool}: confirm check failed: {reason}", code="confirm_failed")


class ApprovalError(EffectGateError):
    """Root of the errors an approver can cause. Nothing changed when one is raised."""

    def __init__(self, approval_id: str, message: str) -> None:
        self.approval_id = approval_id
        super().__init__(message)


class UnknownApproval(ApprovalError, LookupError):
    """No approval has this id."""

    def __init__(self, approval_id: str) -> None:
        super().__init__(approval_id, f"no approval {approval_id!r}")


class StaleApproval(ApprovalError):
    """The decision names a version other than the current one: an older one, or one not made yet."""

    def __init__(self, approval_id: str, given: int, current: int) -> None:
        self.given = given
        self.current = current
        if type(given) is not int:  # from a form or a command line: say so, not a TypeError
            why = f"version {given!r} is not a version number"
        else:
            why = f"version {given} " + (
                "is stale" if given < current else "does not exist yet (review the current version)"
            )
        super().__init__(approval_id, f"approval {approval_id} is at version {current}; {why}")


class WrongApprover(ApprovalError):
    """The approver's role does not match the required role, or they already approved."""

    def __init__(self, approval_id: str, message: str) -> None:
        super().__init__(approval_id, message)


class ApprovalExpired(ApprovalError):
    """The approval's deadline passed; it is never auto-approved."""

    def __init__(self, approval_id: str) -> None:
        super().__init__(approval_id, f"approval {approval_id} has expired")


class AlreadyDecided(ApprovalError):
    """The approval is no longer pending (approved, denied, executed or rejected)."""

    def __init__(self, approval_id: str, status: str) -> None:
        self.status = status
        super().__init__(approval_id, f"approval {approval_id} is {status}, not pending")


class ForeignSeal(str):
    """A `TamperedRecord` reason that is most likely a keyring mismatch: the record is sealed
    under `key_id`, a key the keyring in use does not hold (an edited key id looks the same;
    the audit, with the ledger's keyring, tells them apart)."""

    key_id: str

    def __new__(cls, key_id: str, text: str) -> ForeignSeal:
        reason = super().__new__(cls, text)
        reason.key_id = key_id
        return reason

    def __reduce__(self) -> tuple[type[ForeignSeal], tuple[str, str]]:  # copy and pickle (in a Card)
        return (ForeignSeal, (self.key_id, str(self)))


class TamperedRecord(ApprovalError):
    """A stored approval or decision does not verify: its seal or its arguments hash no longer
    match (the row was edited outside effectgate). Nothing is decided or run on it; the audit
    reports it."""

    def __init__(self, approval_id: str, what: str) -> None:
        self.what = what
        #: The key id the record names when this keyring does not hold it (`ForeignSeal`): most
        #: likely a keyring mismatch (refused all the same: nothing runs on a record not checked).
        self.foreign_key = what.key_id if isinstance(what, ForeignSeal) else None
        if self.foreign_key is not None:
            message = f"approval {approval_id}: {what}. Nothing was changed or run"
        else:
            message = (
                f"approval {approval_id}: {what}; the row was changed outside effectgate. "
                "Nothing was changed or run: run `effectgate audit` and propose the call again"
            )
        super().__init__(approval_id, message)


TokenReason = Literal[
    "malformed",
    "forged",
    "unknown_key",
    "keyring_mismatch",
    "expired",
    "used",
    "mismatch",
    "revoked",
    "tampered",
]


class TokenError(EffectGateError):
    """A grant token was refused; `reason` says why. Nothing ran."""

    def __init__(self, reason: TokenReason, message: str) -> None:
        self.reason: TokenReason = reason
        super().__init__(f"{reason}: {message}")


class WebhookSignatureError(EffectGateError):
    """A webhook request's signature did not verify; `reason` says why. Do not act on it."""

    def __init__(
        self, reason: Literal["missing", "stale", "unknown_key", "forged", "replayed"], message: str
    ) -> None:
        self.reason = reason
        super().__init__(f"{reason}: {message}")


class IdempotencyError(EffectGateError):
    """Root of the errors about one operation key."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(message)


class IdempotencyConflict(IdempotencyError):
    """The key was used before with a different payload."""

    def __init__(self, key: str) -> None:
        super().__init__(key, f"key {key} was used with a different payload")


class InProgress(IdempotencyError):
    """Another worker holds a live lease on this key."""

    def __init__(self, key: str, owner: str | None) -> None:
        self.owner = owner
        super().__init__(key, f"key {key} is in progress (lease held by {owner})")


class NeedsReconciliation(IdempotencyError):
    """The outcome is unknown; a person or a `reconcile` hook must settle it. Never re-run blindly.
    `expired`: the claim that raised it found the lease run out in flight, and made it so."""

    def __init__(
        self, key: str, reason: str, *, provider_ref: str | None = None, expired: bool = False
    ) -> None:
        self.reason = reason
        self.provider_ref = provider_ref
        self.expired = expired
        super().__init__(key, f"key {key} needs reconciliation: {reason}")


class LeaseLost(IdempotencyError):
    """A worker tried to complete a key whose lease it no longer holds (fencing)."""

    def __init__(self, key: str, owner: str) -> None:
        super().__init__(key, f"key {key}: lease is not held by {owner}")


class MissingKeyring(EffectGateError, LookupError):
    """No keyring could be resolved for a store (a server database with no EFFECTGATE_KEYRING):
    every process that approves or executes against one database must share its keys."""


class StoreError(EffectGateError):
    """The database is unreachable, of the wrong schema version, or not set up."""


class MissingDependency(EffectGateError, ImportError):
    """An optional dependency is not installed; the message carries the install command."""

    def __init__(self, package: str, extra: str) -> None:
        self.package = package
        self.extra = extra
        super().__init__(f'{package} is not installed: pip install "effectgate[{extra}]"')


class OutcomeUnknown(EffectGateError):
    """Raised by a tool when it cannot tell whether its effect happened (timeout, lost reply).

    The gate records `needs_reconciliation` instead of `failed` and never re-runs on its own.
    """

    def __init__(self, message: str, *, provider_ref: str | None = None) -> None:
        self.provider_ref = provider_ref
        super().__init__(message)


def describe(exc: BaseException) -> str:
    """`Type: text` of an exception, its type alone when its `str()` raises, a lone surrogate in it
    escaped (`\\udcff`: no database stores one): an exception a tool or a hook raised must not
    keep the record it ran under from being settled."""
    try:
        text = f"{type(exc).__name__}: {exc}"
    except Exception:
        return f"{type(exc).__name__}: (no text)"
    return storable_text(text)


def storable_text(text: str) -> str:
    """`text` with a lone surrogate escaped (`\\udcff`), as a database stores it: text decoded
    with surrogateescape (a provider's raw bytes) cannot be encoded as UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


__all__ = [
    "AlreadyDecided",
    "ApprovalError",
    "ApprovalExpired",
    "ArgumentError",
    "ConfirmFailed",
    "EffectGateError",
    "IdempotencyConflict",
    "IdempotencyError",
    "InProgress",
    "LeaseLost",
    "MissingDependency",
    "MissingKeyring",
    "NeedsReconciliation",
    "OutcomeUnknown",
    "PolicyViolation",
    "StaleApproval",
    "StoreError",
    "TableError",
    "TamperedRecord",
    "TokenError",
    "TokenReason",
    "UnknownApproval",
    "WebhookSignatureError",
    "WrongApprover",
]
