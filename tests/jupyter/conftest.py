"""The card tests use the core suite's gates (on SQLite and PostgreSQL)."""

from ..core.conftest import make_gate, shop_gate

__all__ = ["make_gate", "shop_gate"]
