"""The card tests use the core suite's shop gate (on SQLite and PostgreSQL)."""

from ..core.conftest import shop_gate

__all__ = ["shop_gate"]
