"""`effectgate.notify` and `effectgate.jupyter` surfaces, and the install hint without httpx."""

from __future__ import annotations

import importlib
import sys

import pytest

from effectgate.errors import MissingDependency


def test_notify_all_is_pinned() -> None:
    """`effectgate.notify.__all__` is exactly the curated list."""
    import effectgate.notify

    assert effectgate.notify.__all__ == [
        "ALL_KINDS",
        "DELIVERY",
        "EVENT",
        "KEY_ID",
        "SIGNATURE",
        "TIMESTAMP",
        "Delivery",
        "Notification",
        "NotificationKind",
        "SeenDeliveries",
        "WebhookNotifier",
        "message",
        "verify_webhook",
    ]


def test_jupyter_all_is_pinned() -> None:
    """`effectgate.jupyter.__all__` is exactly the curated list."""
    import effectgate.jupyter

    assert effectgate.jupyter.__all__ == ["ApprovalCard", "approval_card", "widgets_available"]


def test_notify_without_httpx_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """Importing the notifier without httpx raises MissingDependency with the install command."""
    for name in [m for m in sys.modules if m == "effectgate.notify" or m.startswith("effectgate.notify.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "httpx", None)
    with pytest.raises(MissingDependency) as caught:
        importlib.import_module("effectgate.notify")
    assert 'pip install "effectgate[notify]"' in str(caught.value)
