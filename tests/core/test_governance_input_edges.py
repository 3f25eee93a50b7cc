"""Edges of today's governance fixes, each a regression a review found (the test failed before its
fix): `keep` given as a generator, a lookalike domain after an ordinary mixed-script URL in one
value, an incremental export written over the manifest it continues."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from effectgate import Executed
from effectgate.examples.shop import context
from effectgate.export import ExportError, export_chain, manifest_path, verify_export
from effectgate.redact import redact
from effectgate.testing import FakeClock

from .conftest import ShopGate
from .test_redact import refund


def test_keep_given_as_a_generator_keeps_the_named_facts(shop_gate: ShopGate) -> None:
    """`_keep` checks the names with `all(...)` and then takes `tuple(keep)`: an iterator (a
    generator of names) is used up by the check, so the redaction kept no fact at all and erased
    the refund's amount and currency with the rest (the defect `_keep` was added to stop). Before
    today `tuple(keep)` was taken once and the facts were kept."""
    gate = shop_gate.gate
    refund(gate, "m1", "1042", 1200)
    done = redact(
        gate.store, gate.keyring, user_id="u1", by="dpo", reason="r", keep=(k for k in ("amount", "currency"))
    )
    assert tuple(done.keep) == ("amount", "currency")
    [row] = gate.store.approvals()
    kept = json.loads(row.args_json)
    assert kept.get("amount") == 1200, kept
    assert kept.get("currency") == "GBP", kept


def test_a_lookalike_domain_is_named_even_after_an_ordinary_mixed_url() -> None:
    """Scripts are now compared per run of text without spaces, and only the first mixed run of a
    value is reported (`break`). An ordinary link to a Cyrillic page (Latin host, Cyrillic path)
    is such a run, so the lookalike "pаypal.com" later in the same text (a Cyrillic "а") is never
    named: the one warning quotes the harmless URL, which the reviewer rightly dismisses. Before
    today (per word) the warning named "pаypal"."""
    from effectgate._textcheck import text_warnings

    body = "Details: https://ru.wikipedia.org/wiki/Москва then pay at p\u0430ypal.com/refund"
    warnings = text_warnings({"body": body})
    assert any("p\u0430ypal" in w for w in warnings), warnings


def test_an_incremental_export_into_the_manifest_it_continues_is_refused(
    shop_gate: ShopGate, clock: FakeClock, tmp_path: Path
) -> None:
    """`_holds_export` only asks whether `path`'s own manifest is `after`: an export continuing
    one.jsonl written to one.jsonl.manifest.json (the manifest it continues, one tab-completion
    away) overwrote that signed manifest with records, so the earlier export no longer verifies
    (its pins are gone) - the loss today's check was added to prevent. Refused, nothing written."""
    gate = shop_gate.gate
    tags = {"ticket_id": "t-17", "tags": ["billing", "urgent"]}
    assert isinstance(gate.call("update_ticket_tags", tags, context("m1")), Executed)
    path = tmp_path / "one.jsonl"
    first = export_chain(gate.store, gate.keyring, path, now=clock.now() + 61)
    before = manifest_path(path).read_bytes()
    refund(gate, "m2", "1042", 1200)
    with pytest.raises(ExportError):
        export_chain(gate.store, gate.keyring, manifest_path(path), after=first, now=clock.now() + 61)
    assert manifest_path(path).read_bytes() == before
    assert verify_export(path, gate.keyring).ok
