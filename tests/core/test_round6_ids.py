"""Names the caller hands the gate that name nothing: an approval id holding a lone surrogate
(text no database stores) and a tool name that is not text (a list or a dict an agent loop passed
through). Each is answered as an unknown approval or an unknown tool, never with the store's or
the dict's raw error, and nothing else is recorded."""

from __future__ import annotations

from typing import Any

import pytest

from effectgate import Approver, Refused
from effectgate.errors import MissingKeyring, UnknownApproval
from effectgate.examples.shop import context
from effectgate.stores import SQLStore
from effectgate.tokens import keyring_for

from .conftest import ShopGate

FINANCE = Approver("fiona", "finance")
LONE = "a\udcff"


def test_an_approval_id_with_a_lone_surrogate_names_no_approval(shop_gate: ShopGate, store: SQLStore) -> None:
    gate = shop_gate.gate
    with pytest.raises(UnknownApproval):
        gate.approve(LONE, version=1, approver=FINANCE)
    with pytest.raises(UnknownApproval):
        gate.deny(LONE, version=1, approver=FINANCE, reason="no")
    assert store.approvals() == []


@pytest.mark.parametrize("name", [["get_order"], {"tool": "get_order"}])
def test_a_tool_name_that_is_not_text_is_an_unknown_tool(
    shop_gate: ShopGate, store: SQLStore, name: Any
) -> None:
    gate = shop_gate.gate
    out = gate.call(name, {"order_id": "1042"}, context("m1"))
    assert isinstance(out, Refused)
    assert out.code == "unknown_tool"
    (step,) = gate.call_step([(name, {"order_id": "1042"})], context("m1"))
    assert isinstance(step, Refused)
    assert step.code == "unknown_tool"
    assert store.approvals() == []


def test_an_unparseable_url_never_quotes_its_password_in_the_keyring_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("EFFECTGATE_KEYRING", raising=False)
    for url in ("postgresql+psycopg://eve:s3cret@db:notaport/x", "eve:s3cret@nowhere"):
        with pytest.raises(MissingKeyring) as caught:
            keyring_for(url)
        assert "s3cret" not in str(caught.value)
