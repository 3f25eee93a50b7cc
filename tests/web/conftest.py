"""The inbox over the shop's gate, with registered approvers, for the ASGI client and the browser."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from effectgate import EffectGate, Grant, Keyring, open_store
from effectgate.examples.shop import Shop, app
from effectgate.outcomes import Executed
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock
from effectgate.web import ApproverRegistry, RegisteredApprover, create_app, hash_secret

SECRETS = {"fiona": "fiona-pw", "frank": "frank-pw", "sam": "sam-pw", "pia": "pia-pw", "pete": "pete-pw"}
ROLES = {"fiona": "finance", "frank": "finance", "sam": "support_lead", "pia": "privacy", "pete": "privacy"}
CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def registry() -> ApproverRegistry:
    return ApproverRegistry(
        RegisteredApprover(i, ROLES[i], hash_secret(SECRETS[i]), name=i.title()) for i in SECRETS
    )


@dataclass
class Inbox:
    shop: Shop
    gate: EffectGate
    store: SQLStore
    clock: FakeClock
    app: Starlette
    executed: list[Executed] = field(default_factory=list)

    def client(self, **kwargs: Any) -> TestClient:
        return TestClient(self.app, base_url="http://127.0.0.1", follow_redirects=False, **kwargs)


def csrf_of(html: str) -> str:
    match = CSRF.search(html)
    assert match, "no CSRF token in the page"
    return match.group(1)


def login(client: TestClient, approver: str) -> str:
    """Sign `approver` in; returns the CSRF token of the signed-in session."""
    token = csrf_of(client.get("/login").text)
    r = client.post("/login", data={"csrf": token, "approver": approver, "secret": SECRETS[approver]})
    assert r.status_code == 303, r.text
    return csrf_of(client.get("/").text)


@pytest.fixture
def inbox(sqlite_url: str, clock: FakeClock) -> Iterator[Inbox]:
    store = open_store(sqlite_url, clock=clock)
    store.setup()
    shop = Shop()
    gate = app(store, keyring=Keyring.generate(), clock=clock, shop=shop)
    parts = Inbox(shop, gate, store, clock, app=None)  # type: ignore[arg-type]

    def execute(grant: Grant) -> Executed:
        done = gate.execute(grant.token)
        parts.executed.append(done)
        return done

    parts.app = create_app(gate, registry(), secret_key="test-secret", on_grant=execute)
    try:
        yield parts
    finally:
        gate.close()
        store.close()
