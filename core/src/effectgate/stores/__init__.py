"""Stores: the SQL ledger and idempotency store (SQLite by default, PostgreSQL for many hosts)."""

from .base import Claimed, IdempotencyRecord, IdempotencyStore, Stored
from .sql import SQLStore, open_store

__all__ = ["Claimed", "IdempotencyRecord", "IdempotencyStore", "SQLStore", "Stored", "open_store"]
