"""effectgate: one effect table between an agent's model and its tools, enforced in code."""

from .context import (
    Approver,
    CallContext,
    Confirmation,
    SubjectEntry,
    ToolContext,
    idempotency_headers,
    set_idempotency_key,
)
from .effects import Effect, Policy, Reversibility
from .gate import EffectGate, ReconciliationNotice
from .outcomes import Card, Executed, Grant, Invalid, Outcome, PartialApproval, Pending, Recorded, Refused
from .rows import Row, destructive, money, read, send, write
from .stores import open_store
from .table import EffectTable, Escalate, Reconciled, SchemaError, ToolSpec
from .tokens import Keyring

__version__ = "0.1.0"

__all__ = [
    "Approver",
    "CallContext",
    "Card",
    "Confirmation",
    "Effect",
    "EffectGate",
    "EffectTable",
    "Escalate",
    "Executed",
    "Grant",
    "Invalid",
    "Keyring",
    "Outcome",
    "PartialApproval",
    "Pending",
    "Policy",
    "Reconciled",
    "ReconciliationNotice",
    "Recorded",
    "Refused",
    "Reversibility",
    "Row",
    "SchemaError",
    "SubjectEntry",
    "ToolContext",
    "ToolSpec",
    "__version__",
    "destructive",
    "idempotency_headers",
    "money",
    "open_store",
    "read",
    "send",
    "set_idempotency_key",
    "write",
]
