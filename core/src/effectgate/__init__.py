"""effectgate: one effect table between an agent's model and its tools, enforced in code.

The names below are imported when first used (PEP 562): `import effectgate` alone, or a
command that needs only the store (`effectgate audit`), does not load the gate and its parts.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from .outcomes import (
        Card,
        Executed,
        Grant,
        Invalid,
        Outcome,
        PartialApproval,
        Pending,
        Recorded,
        Refused,
    )
    from .rows import Row, destructive, money, read, send, write
    from .stores import open_store
    from .table import EffectTable, Escalate, Reconciled, SchemaError, ToolSpec
    from .tokens import Keyring

__version__ = "0.1.0"

#: Each public name and the module that defines it (imported on first use).
_EXPORTS = {
    **dict.fromkeys(
        (
            "Approver",
            "CallContext",
            "Confirmation",
            "SubjectEntry",
            "ToolContext",
            "idempotency_headers",
            "set_idempotency_key",
        ),
        "context",
    ),
    **dict.fromkeys(("Effect", "Policy", "Reversibility"), "effects"),
    **dict.fromkeys(("EffectGate", "ReconciliationNotice"), "gate"),
    **dict.fromkeys(
        (
            "Card",
            "Executed",
            "Grant",
            "Invalid",
            "Outcome",
            "PartialApproval",
            "Pending",
            "Recorded",
            "Refused",
        ),
        "outcomes",
    ),
    **dict.fromkeys(("Row", "destructive", "money", "read", "send", "write"), "rows"),
    "open_store": "stores",
    **dict.fromkeys(("EffectTable", "Escalate", "Reconciled", "SchemaError", "ToolSpec"), "table"),
    "Keyring": "tokens",
}

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


if not TYPE_CHECKING:  # for the type checker every name is imported above

    def __getattr__(name: str) -> Any:
        module = _EXPORTS.get(name)
        if module is None and not name.startswith("__") and importlib.util.find_spec(f"{__name__}.{name}"):
            # A submodule (`effectgate.errors`), imported on first use too: `import effectgate`
            # alone bound them when it imported every public name.
            return importlib.import_module(f".{name}", __name__)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", __name__), name)
        globals()[name] = value  # once: later lookups find it without this function
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *_EXPORTS})
