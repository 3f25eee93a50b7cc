"""The approval card for notebooks.

    from effectgate.jupyter import approval_card
    card = approval_card(gate, pending, approver=Approver("fiona", "finance"), on_grant=resume)
    card            # as a cell's value: the stored fields with Approve / Deny buttons

With ipywidgets (pip install "effectgate[jupyter]") the card has buttons; without them it is a
plain-text card, and `card.approve()` / `card.deny(reason)` decide the same way.
"""

from __future__ import annotations

from ._card import ApprovalCard, approval_card, widgets_available

__all__ = ["ApprovalCard", "approval_card", "widgets_available"]
