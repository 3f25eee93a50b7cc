"""Round 16: an `on_grant` written as a coroutine function (natural in an ASGI app) is awaited,
on SQLite and PostgreSQL."""

from __future__ import annotations

from starlette.testclient import TestClient

from effectgate import Executed, Grant
from effectgate.web import create_app

from .conftest import Inbox, form, login, propose, registry


def test_an_async_on_grant_is_awaited_and_the_call_runs_once(inbox: Inbox) -> None:
    """`async def on_grant(grant): return await gate.aexecute(grant.token)` was called in a worker
    thread and its coroutine never awaited: the page showed "<coroutine object ...>" as the
    result, the refund never ran, and the grant token (shown only without `on_grant`, stored only
    as a hash) was lost. The coroutine is awaited: the refund runs once and its result is shown."""
    handed: list[Grant] = []

    async def on_grant(grant: Grant) -> Executed:
        handed.append(grant)
        return await inbox.gate.aexecute(grant.token)

    p = propose(inbox)
    app = create_app(inbox.gate, registry(), secret_key="k", on_grant=on_grant)
    c = TestClient(app, base_url="http://127.0.0.1", follow_redirects=False)
    csrf = login(c, "fiona")
    r = c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf))
    assert r.status_code == 200
    assert len(handed) == 1
    assert inbox.store.get_approval(p.approval_id).status == "executed"  # type: ignore[union-attr]
    assert inbox.shop.receiver.count("refund") == 1
    assert "coroutine" not in r.text
    assert "re_1" in r.text  # the refund's result, as the provider answered


def test_an_async_on_grant_that_raises_is_said_not_a_500(inbox: Inbox) -> None:
    """The decision stands and the page says the application could not use the grant."""

    async def on_grant(grant: Grant) -> None:
        raise ConnectionError("the agent is not reachable")

    p = propose(inbox)
    app = create_app(inbox.gate, registry(), secret_key="k", on_grant=on_grant)
    c = TestClient(app, base_url="http://127.0.0.1", follow_redirects=False)
    csrf = login(c, "fiona")
    r = c.post(f"/approvals/{p.approval_id}/approve", data=form(p, csrf))
    assert r.status_code == 200
    assert "the application could not use the grant: ConnectionError" in r.text
    assert inbox.store.get_approval(p.approval_id).status == "approved"  # type: ignore[union-attr]
    assert inbox.shop.receiver.count("refund") == 0
