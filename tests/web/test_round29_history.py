"""The history page reads the approvals it lists and their decisions and runs, never a whole
table of the ledger (it read every decision, approval and execution on each render)."""

from __future__ import annotations

import re
from typing import Any

import sqlalchemy as sa

from .conftest import Inbox, form, login, propose

LEDGER = re.compile(r"\bFROM (eg_approvals|eg_decisions|eg_executions)\b", re.IGNORECASE)


def _reads(inbox: Inbox, fn: Any) -> list[str]:
    """The statements `fn` runs on the store's engine that read an approval, decision or execution."""
    seen: list[str] = []

    def on_execute(*args: Any) -> None:
        statement = " ".join(str(args[2]).split())
        if LEDGER.search(statement):
            seen.append(statement)

    sa.event.listen(inbox.store.engine, "before_cursor_execute", on_execute)
    try:
        fn()
    finally:
        sa.event.remove(inbox.store.engine, "before_cursor_execute", on_execute)
    return seen


def test_the_history_page_reads_only_what_it_lists(inbox: Inbox) -> None:
    """A refund approved and run, one denied, one pending, and an execution and a decision of a
    call the page does not list (a 201st decided call is out of its 200): every read of the
    ledger's three tables is bounded (by the listed approvals' ids, a status or a limit), and the
    page still shows each listed call's decision and result."""
    c = inbox.client()
    csrf = login(c, "fiona")
    approved = propose(inbox, {"order_id": "1042", "amount": 6000, "currency": "GBP"}, message="m1")
    assert c.post(f"/approvals/{approved.approval_id}/approve", data=form(approved, csrf)).status_code == 200
    denied = propose(inbox, {"order_id": "1043", "amount": 500, "currency": "GBP"}, message="m2")
    r = c.post(f"/approvals/{denied.approval_id}/deny", data=form(denied, csrf, reason="not this one"))
    assert r.status_code == 200
    propose(inbox, {"order_id": "1042", "amount": 100, "currency": "GBP"}, message="m3")
    assert inbox.shop.receiver.count("refund") == 1

    pages: list[str] = []
    reads = _reads(inbox, lambda: pages.append(c.get("/history").text))
    [page] = pages
    assert reads, "the page read nothing from the ledger"
    unbounded = [s for s in reads if not re.search(r"\b(WHERE|LIMIT)\b", s, re.IGNORECASE)]
    assert unbounded == []
    by_ids = [s for s in reads if re.search(r"FROM (eg_decisions|eg_executions)", s, re.IGNORECASE)]
    assert by_ids
    assert all(re.search(r"approval_id IN", s, re.IGNORECASE) for s in by_ids)
    # what the page shows is unchanged: both decided calls, the decision's reason, the run's status
    assert approved.approval_id in page
    assert denied.approval_id in page
    assert "not this one" in page
    assert "data-status-edited" not in page
