"""Review round 6 of the inbox: what the application's `on_grant` hands back is shown whatever
it is (the decision stands and is never followed by a bare 500), an approvers file naming an id
or role no database stores, and JSON columns edited into values nested deeper than Python
parses (the inbox, card, history and reconciliation pages stay up)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from starlette.testclient import TestClient

from effectgate import Grant
from effectgate.stores.records import ExecutionRow
from effectgate.web import ApproverRegistry, RegisteredApprover, create_app, hash_secret

from .conftest import Inbox, form, login, propose, registry, snapshot


def _loop() -> list[Any]:
    looped: list[Any] = []
    looped.append(looped)
    return looped


@pytest.mark.parametrize(
    "returned",
    [
        {("order", "1042"): "refunded"},  # a dict keyed by tuples (an agent's state, say)
        {1: "one", "two": 2},  # keys that do not sort together
        _loop(),  # a structure that contains itself
    ],
    ids=["tuple-keys", "mixed-keys", "circular"],
)
def test_what_on_grant_returns_is_shown_whatever_it_is(inbox: Inbox, returned: Any) -> None:
    """`on_grant` runs the approved refund and returns a value JSON cannot encode as it is: the
    page answers 200 (the grant was minted and the refund ran once) instead of a bare 500 after
    the decision, which would leave the reviewer pressing approve again."""

    def run(grant: Grant) -> Any:
        inbox.gate.execute(grant.token)
        return returned

    app = create_app(inbox.gate, registry(), secret_key="k", on_grant=run)
    c = TestClient(app, base_url="http://127.0.0.1", follow_redirects=False, raise_server_exceptions=False)
    p = propose(inbox)
    csrf = login(c, "fiona")
    r = c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf))
    assert r.status_code == 200
    assert inbox.shop.receiver.count("refund") == 1
    assert [d.decision for d in inbox.store.all_decisions()] == ["approve"]


@pytest.mark.parametrize("key", ["id", "role"])
def test_an_approver_the_gate_cannot_record_is_refused_at_load(tmp_path: Path, key: str) -> None:
    """An approvers file whose id or role holds a NUL (a TOML escape): no database stores one, so
    every decision of that approver would answer a bare 500 after sign-in. The file is refused
    when it is loaded, naming its line, and a registry built in code refuses the entry too."""
    values = {"id": "fiona", "role": "finance", key: "fi\\u0000nance"}
    path = tmp_path / "approvers.toml"
    path.write_text(
        f'[[approver]]\nid = "{values["id"]}"\nrole = "{values["role"]}"\nsecret = "{hash_secret("pw")}"\n'
    )
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}:1: .*NUL"):
        ApproverRegistry.from_toml(path)
    entry = {"id": "fiona", "role": "finance", key: "fi\x00nance"}
    with pytest.raises(ValueError, match="NUL"):
        ApproverRegistry([RegisteredApprover(entry["id"], entry["role"], hash_secret("pw"))])


def test_an_inserted_result_nested_too_deep_leaves_the_history_working(inbox: Inbox) -> None:
    """A refund approved and run, and an execution row inserted in the database for it with a
    result nested deeper than Python parses (valid JSON): the History page still lists the
    decided approvals, the inserted text shown as text, instead of a bare 500."""
    p = propose(inbox)
    c = inbox.client(raise_server_exceptions=False)
    csrf = login(c, "fiona")
    assert c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf)).status_code == 200
    deep = "[" * 100_000 + "]" * 100_000
    with inbox.store.engine.begin() as conn:
        columns = ", ".join(c for c in ExecutionRow.model_fields if c not in ("id", "result_json"))
        conn.execute(
            sa.text(
                f"INSERT INTO eg_executions ({columns}, result_json) "
                f"SELECT {columns}, :r FROM eg_executions WHERE approval_id = :i"
            ),
            {"r": deep, "i": p.approval_id},
        )
    before = snapshot(inbox)
    r = c.get("/history")
    assert r.status_code == 200
    assert f'href="/approvals/{p.approval_id}"' in r.text
    assert c.get(f"/approvals/{p.approval_id}").status_code == 200
    assert snapshot(inbox) == before


@pytest.mark.parametrize("column", ["args_json", "subject_json", "notes_json"])
def test_a_column_edited_into_json_too_deep_leaves_the_inbox_working(inbox: Inbox, column: str) -> None:
    """A pending refund whose arguments, subject or notes are edited in the database into JSON
    nested deeper than Python parses: the inbox, the card and the history are still shown (that
    card as its stored text) instead of a bare 500 for every reviewer; an approval of a card
    with arguments that do not hash to the sealed hash changes nothing."""
    p = propose(inbox)
    other = propose(inbox, {"order_id": "1043", "amount": 100, "currency": "GBP"}, "m4")
    with inbox.store.engine.begin() as conn:
        conn.execute(
            sa.text(f"UPDATE eg_approvals SET {column} = :v WHERE id = :i"),
            {"v": "[" * 100_000 + "]" * 100_000, "i": p.approval_id},
        )
    c = inbox.client(raise_server_exceptions=False)
    csrf = login(c, "fiona")
    before = snapshot(inbox)
    page = c.get("/")
    assert page.status_code == 200
    assert f'data-approval="{other.approval_id}"' in page.text
    assert c.get(f"/approvals/{p.approval_id}").status_code == 200
    assert c.get("/history").status_code == 200
    assert snapshot(inbox) == before
    if column == "args_json":  # sealed by its hash: refused (the subject and notes are derived)
        assert c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf)).status_code == 409
        assert snapshot(inbox) == before
        assert inbox.shop.receiver.count("refund") == 0


def test_a_queued_record_whose_result_is_nested_too_deep_is_named_not_a_bare_500(inbox: Inbox) -> None:
    """A refund whose reply was lost (it needs reconciliation), whose idempotency record's result
    is edited in the database into JSON nested deeper than Python parses: the reconciliation page
    and a press of Reconcile name the record (the store's error) with a 4xx instead of a bare
    500 or a 502, and nothing changes (the provider is not asked, nothing runs again)."""
    p = propose(inbox)
    inbox.shop.provider.timeouts_to_inject = 1
    c = inbox.client(raise_server_exceptions=False)
    csrf = login(c, "fiona")
    assert c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf)).status_code == 200
    with inbox.store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE eg_idempotency SET result_json = :r"), {"r": "[" * 100_000 + "]" * 100_000}
        )
    before = snapshot(inbox)
    assert c.get("/reconciliation").status_code == 409
    assert c.post(f"/reconciliation/{p.approval_id}", data={"csrf": csrf}).status_code == 409
    assert snapshot(inbox) == before
    with inbox.store.engine.connect() as conn:
        statuses = [s for (s,) in conn.execute(sa.text("SELECT status FROM eg_idempotency"))]
    assert statuses == ["needs_reconciliation"]
