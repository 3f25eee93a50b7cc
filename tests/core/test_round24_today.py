"""Round 24: an adversarial review of today's changes (people, the bar, markers, unrun work,
rows refused at load, keys, read logs, the export, text warnings, cards)."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import pytest

from effectgate import Approver, Effect, EffectTable, PartialApproval, Pending, Refused, ToolSpec
from effectgate._person import person
from effectgate._textcheck import text_warnings
from effectgate.errors import NeedsReconciliation, WrongApprover
from effectgate.examples.shop import context
from effectgate.stores import SQLStore
from effectgate.testing import EffectRecorder

from .conftest import MakeGate, ShopGate

# -- text warnings: marks stacked on one character


def test_marks_stacked_with_a_variation_selector_after_each_are_warned() -> None:
    """Ten acute accents on a "1", a variation selector (drawn as nothing) after each: the stack
    is drawn over the amount around it as ten marks are, but each selector ended the run of
    marks, and is no stray one (it follows a mark): the card carried no warning at all."""
    value = {"amount": "1" + "\u0301\ufe00" * 10 + "000 EUR"}
    assert any("10 combining marks stacked" in w for w in text_warnings(value))
    assert text_warnings({"note": "Tiếng Việt ✌️ 👍🏽 e\u0301\ufe0f"}) == ()  # ordinary text: none


# -- one person under two spellings: invisible characters that are not format characters


@pytest.mark.parametrize("hidden", ["\u034f", "\u3164", "\ufe0f", "\u180b", "\u2800"])
def test_an_id_with_an_invisible_character_names_the_same_person(hidden: str) -> None:
    assert person("pia" + hidden) == person("PIA")
    assert person("pi" + hidden + "a") == person("pia")
    assert person("pia" + hidden) != person("pia" + hidden + "x")


def test_an_approver_id_with_an_invisible_character_is_not_a_second_approver(
    shop_gate: ShopGate, store: SQLStore
) -> None:
    """A combining grapheme joiner, a Hangul filler, a variation selector, a Mongolian free
    variation selector or a blank Braille pattern renders as nothing (the card's text check
    calls each invisible), but is no format character (Cf): "pia" and "pia" + one of them were
    two distinct approvers, and a destructive call ran on one person's word."""
    shop, gate = shop_gate
    out = gate.call("delete_customer_data", {"customer_id": "u1"}, context("m9"))
    assert isinstance(out, Pending)
    first = gate.approve(out.approval_id, version=1, approver=Approver("pia", "privacy"))
    assert isinstance(first, PartialApproval)
    with pytest.raises(WrongApprover, match="already approved"):
        gate.approve(out.approval_id, version=1, approver=Approver("pia\u034f", "privacy"))
    assert [d.approver_id for d in store.all_decisions()] == ["pia"]
    assert shop.receiver.count("delete") == 0


# -- work a tool returned: a Future that ended without running its job


@pytest.mark.parametrize("ending", ["cancelled", "raised"])
def test_a_write_returning_a_future_whose_job_never_ran_or_failed_is_not_recorded_run(
    make_gate: MakeGate, store: SQLStore, ending: str
) -> None:
    """A tool handed its work to a pool and returned the job's Future: pending, it is an unknown
    outcome; but one the pool cancelled (shut down with `cancel_futures`: the job never ran) or
    whose job raised was "done", so the call was recorded executed, `{"unserializable":
    "Future"}`, and its replay answered from that: a payment reported made that never was."""
    receiver = EffectRecorder()

    def pay(account: str) -> Any:
        job: concurrent.futures.Future[None] = concurrent.futures.Future()
        if ending == "cancelled":
            job.cancel()
        else:
            job.set_exception(ConnectionResetError("the provider hung up"))
        return job

    table = EffectTable([ToolSpec(name="pay", effect=Effect.WRITE, fn=pay)])
    table.allow("support", ["pay"])
    gate = make_gate(table)
    with pytest.raises(NeedsReconciliation) as info:
        gate.call("pay", {"account": "acct-1"}, context("m1"))
    replay = gate.call("pay", {"account": "acct-1"}, context("m1"))
    assert isinstance(replay, Refused)
    assert replay.code == "needs_reconciliation"
    record = store.get(info.value.key)
    assert record is not None
    assert (record.status, record.result) == ("needs_reconciliation", None)
    assert [ex.status for ex in store.executions()] == ["needs_reconciliation"]
    assert receiver.count("pay") == 0
