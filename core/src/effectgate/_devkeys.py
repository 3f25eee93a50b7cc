"""The gate's keyring when none is given: `tokens.keyring_for`, except that a SQLite file whose
ledger holds records never gets a new development key file. A new key would verify nothing sealed
under the lost one and seal new records under another keyring (restoring the old file would then
break those): `MissingKeyring`, naming $EFFECTGATE_KEYRING and the key file, as the CLI refuses."""

from __future__ import annotations

from typing import Any

from .errors import MissingKeyring
from .tokens import Keyring, keyring_for

_SEALED = ("eg_approvals", "eg_decisions", "eg_executions", "eg_idempotency", "eg_events", "eg_chain")


def holds_records(store: Any) -> bool:
    """Whether the ledger holds any record sealed or chained under its keyring."""
    import sqlalchemy as sa

    with store.engine.connect() as conn:
        return any(conn.execute(sa.text(f"SELECT 1 FROM {t} LIMIT 1")).first() for t in _SEALED)


def _holds(store: Any) -> bool:
    try:
        return getattr(store, "engine", None) is not None and holds_records(store)
    except Exception:  # no schema yet (`store.check` says so next), or the store cannot say
        return False


def gate_keyring(store: Any) -> Keyring:
    """$EFFECTGATE_KEYRING, else the key file beside a SQLite file (made when missing only for a
    ledger that holds no record yet), else MissingKeyring saying how to configure one."""
    try:
        return keyring_for(store.url, create=False)
    except MissingKeyring:
        if _holds(store):
            raise
    return keyring_for(store.url)
