"""Round 23 review of governance: shadow mode, the tamper-evident export and retention by age
(SQLite and PostgreSQL).

- The export's decision record named every sealed approver of the run's version, of any round:
  a refund whose first grant lapsed unpresented and was granted again by another approver listed
  both as having authorised it, though a lapsed round vouches for no run (execute and the audit
  count only the round that minted the grant that ran). It names that round's approvers now.
- A notifier's own event whose detail's first key is `$redacted` is stored as text that starts
  like an erasure marker that no redaction wrote: the audit reports it (`redaction_forged`) for
  ever, so every export is refused, and `redact` never erases the personal values beside it
  (fixed where events are written: such a detail is stored after a space, as a result is). One
  with a `$redacted` key further on kept its other values through an erasure, read as a marker's
  facts (`redact.facts_of` now takes facts only from text that starts like a marker).
- `retain` given rules that are not a mapping (a list of pairs, None), `redact` given a subject
  that is not one, and either given `keep=None` (or a number) raised a raw AttributeError or
  TypeError; each is a `RedactionError` now, nothing erased or recorded.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from effectgate import Approver, Executed, Grant, Keyring, Pending
from effectgate.audit import audit
from effectgate.examples.shop import SHOP_POLICY, Shop, app, context
from effectgate.export import export_chain, verify_export
from effectgate.notify import Notification
from effectgate.redact import RedactionError, is_redacted, redact, retain
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from .conftest import ShopGate

FIONA, GINA = Approver("fiona", "finance"), Approver("gina", "finance")
REFUND = {"order_id": "1042", "amount": 500, "currency": "GBP"}


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(text)["record"] for text in path.read_text().splitlines()]


def test_an_export_names_only_the_approvers_of_the_round_whose_grant_ran(
    shop_gate: ShopGate, clock: FakeClock, tmp_path: Path
) -> None:
    shop, gate = shop_gate
    out = gate.call("refund_order", dict(REFUND), context("m1"))
    assert isinstance(out, Pending)
    assert isinstance(gate.approve(out.approval_id, version=1, approver=FIONA), Grant)
    clock.advance(SHOP_POLICY.token_ttl + 1)  # fiona's grant lapses unpresented
    grant = gate.approve(out.approval_id, version=1, approver=GINA)
    assert isinstance(grant, Grant)
    assert isinstance(gate.execute(grant.token), Executed)
    assert shop.receiver.count("refund") == 1
    path = tmp_path / "x.jsonl"
    export_chain(gate.store, gate.keyring, path, now=clock.now() + 61)
    [record] = _records(path)
    assert [(a["id"], a["round"]) for a in record["approvers"]] == [("gina", 1)]
    assert verify_export(path, gate.keyring).ok


def test_an_export_of_a_run_granted_at_once_still_names_its_approver(
    shop_gate: ShopGate, clock: FakeClock, tmp_path: Path
) -> None:
    _, gate = shop_gate
    out = gate.call("refund_order", dict(REFUND), context("m1"))
    assert isinstance(out, Pending)
    grant = gate.approve(out.approval_id, version=1, approver=FIONA)
    assert isinstance(grant, Grant)
    assert isinstance(gate.execute(grant.token), Executed)
    path = tmp_path / "x.jsonl"
    export_chain(gate.store, gate.keyring, path, now=clock.now() + 61)
    [record] = _records(path)
    assert [(a["id"], a["round"]) for a in record["approvers"]] == [("fiona", 0)]


@pytest.mark.parametrize(
    "detail",
    [{"$redacted": "x", "quoted": "Ada Lovelace"}, {"quoted": "Ada Lovelace", "$redacted": "x"}],
    ids=["marker first", "marker later"],  # later: its values were kept as a marker's facts
)
def test_a_notifier_detail_keyed_like_a_marker_never_blocks_the_audit_or_the_erasure(
    store: SQLStore, clock: FakeClock, detail: dict[str, str]
) -> None:
    def hook(n: Notification) -> None:
        n.record("notify_paged", detail)

    keyring = Keyring.generate()
    with app(store, keyring=keyring, clock=clock, shop=Shop(), notify=[hook]) as gate:
        out = gate.call("refund_order", dict(REFUND), context("m1"))
        assert isinstance(out, Pending)
        grant = gate.approve(out.approval_id, version=1, approver=FIONA)
        assert isinstance(grant, Grant)
        assert isinstance(gate.execute(grant.token), Executed)
    clock.advance(10)
    redact(store, keyring, user_id="u1", by="dpo", reason="request 1")
    assert "Ada Lovelace" not in "".join(e.detail_json or "" for e in store.events())
    assert audit(store, keyring=keyring, chain=True).findings == []


BAD_INPUT = {
    "rules as pairs": lambda s, k: retain(s, k, [("money", 0)], by="nightly"),  # type: ignore[arg-type]
    "no rules": lambda s, k: retain(s, k, None, by="nightly"),  # type: ignore[arg-type]
    "retain keep None": lambda s, k: retain(s, k, {"money": 0}, by="nightly", keep=None),  # type: ignore[arg-type]
    "redact keep 5": lambda s, k: redact(s, k, user_id="u1", by="dpo", reason="r", keep=5),  # type: ignore[arg-type]
    "subject as pairs": lambda s, k: redact(
        s,
        k,
        user_id="u1",
        by="dpo",
        reason="r",
        subject=[("order_id", "1042")],  # type: ignore[arg-type]
    ),
}


@pytest.mark.parametrize("call", BAD_INPUT.values(), ids=BAD_INPUT.keys())
def test_bad_erasure_input_is_refused_with_nothing_erased(
    shop_gate: ShopGate, clock: FakeClock, call: Callable[[SQLStore, Keyring], object]
) -> None:
    _, gate = shop_gate
    out = gate.call("refund_order", dict(REFUND), context("m1"))
    assert isinstance(out, Pending)
    grant = gate.approve(out.approval_id, version=1, approver=FIONA)
    assert isinstance(grant, Grant)
    assert isinstance(gate.execute(grant.token), Executed)
    clock.advance(86400)
    events = len(gate.store.events())
    assert isinstance(gate.store, SQLStore)
    with pytest.raises(RedactionError):
        call(gate.store, gate.keyring)
    assert len(gate.store.events()) == events
    assert not any(is_redacted(x.args_json) for x in gate.store.executions())
