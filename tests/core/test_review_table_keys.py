"""Review of the effect table, keys, tokens and replay: defects found and their reproductions.

Each test counts effects at the receiver (a list the tool appends to) or reads the final record.
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import (
    Approver,
    CallContext,
    Effect,
    EffectGate,
    EffectTable,
    Executed,
    Grant,
    Invalid,
    Keyring,
    Pending,
    ToolSpec,
)
from effectgate.canonical import canonical_text, hash_of_text
from effectgate.errors import TableError
from effectgate.examples.shop import SHOP_POLICY, Shop, context
from effectgate.replay import replay
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from .conftest import MakeGate


def ctx(message: str = "m1") -> CallContext:
    return CallContext(session_id="s1", origin_message_id=message, user_id="u1", agent_id="agent")


def table_of(*specs: ToolSpec) -> EffectTable:
    table = EffectTable(specs)
    table.allow_all("agent")
    return table


# -- the fast validator (draft 7) must not accept what the row's 2020-12 schema refuses


def test_a_tuple_argument_of_the_wrong_types_is_invalid_and_never_runs(make_gate: MakeGate) -> None:
    """A derived schema for `tuple[int, str]` is `prefixItems` (2020-12): ["x", 5] is invalid."""
    ran: list[Any] = []

    def tag(pair: tuple[int, str]) -> str:
        ran.append(pair)
        return "ok"

    gate = make_gate(table_of(ToolSpec(name="tag", effect=Effect.WRITE, fn=tag)))
    out = gate.call("tag", {"pair": ["x", 5]}, ctx())
    assert isinstance(out, Invalid), out
    assert ran == []


@pytest.mark.parametrize(
    ("schema", "args"),
    [
        ({"dependentRequired": {"a": ["b"]}}, {"a": 1}),
        ({"dependentSchemas": {"a": {"required": ["b"]}}}, {"a": 1}),
        ({"allOf": [{"properties": {"a": {}}}], "unevaluatedProperties": False}, {"a": 1, "b": 2}),
        ({"properties": {"a": {"type": "array", "contains": {"const": 1}, "maxContains": 1}}}, {"a": [1, 1]}),
        (
            {"$defs": {"N": {"type": "integer"}}, "properties": {"a": {"$ref": "#/$defs/N", "maximum": 10}}},
            {"a": 99},
        ),
    ],
)
def test_a_2020_12_keyword_is_enforced_before_a_write_runs(
    make_gate: MakeGate, schema: dict[str, Any], args: dict[str, Any]
) -> None:
    ran: list[Any] = []

    def act(**kwargs: Any) -> str:
        ran.append(kwargs)
        return "ok"

    spec = ToolSpec(name="act", effect=Effect.WRITE, fn=act, schema={"type": "object", **schema})
    gate = make_gate(table_of(spec))
    out = gate.call("act", args, ctx())
    assert isinstance(out, Invalid), out
    assert ran == []


# -- replay with the ledger's keyring replays only what verifies

REFUND = {"order_id": "1042", "amount": 1200, "currency": "GBP"}


def test_replay_refuses_an_approval_whose_arguments_and_hash_were_both_rewritten(
    store: SQLStore, clock: FakeClock
) -> None:
    """The args hash is an unkeyed sha256: rewriting the arguments and their hash together keeps
    them consistent; only the seal tells. With the keyring, replay must not replay 9900."""
    shop, ring = Shop(), Keyring.generate()
    with EffectGate(shop.table(), store, policy=SHOP_POLICY, keyring=ring, clock=clock) as gate:
        out = gate.call("refund_order", REFUND, context("m1"))
        assert isinstance(out, Pending)
        grant = gate.approve(out.approval_id, version=1, approver=Approver("fiona", "finance"))
        assert isinstance(grant, Grant)
        assert isinstance(gate.execute(grant.token), Executed)
    text = canonical_text({**REFUND, "amount": 9900})
    with store.transaction() as conn:
        conn.execute(
            sa.text("UPDATE eg_approvals SET args_json = :t, args_hash = :h WHERE id = :i"),
            {"t": text, "h": hash_of_text("refund_order", text), "i": out.approval_id},
        )
    report = replay(store, shop.table(), SHOP_POLICY, keyring=ring)
    assert [(r.verdict, r.detail.split(":")[0]) for r in report.results] == [("refused", "tampered")]
    assert report.calls.get("refund_order", []) == []


def test_replay_does_not_count_a_forged_decision_as_a_recorded_approver(
    store: SQLStore, clock: FakeClock
) -> None:
    """A call nobody approved, its status set to executed and an approve decision inserted
    without a valid seal: replay with the keyring must not say it replays the same."""
    shop, ring = Shop(), Keyring.generate()
    with EffectGate(shop.table(), store, policy=SHOP_POLICY, keyring=ring, clock=clock) as gate:
        out = gate.call("refund_order", REFUND, context("m1"))
        assert isinstance(out, Pending)
    with store.transaction() as conn:
        executed = sa.text("UPDATE eg_approvals SET status = 'executed' WHERE id = :i")
        conn.execute(executed, {"i": out.approval_id})
        store.add_decision(
            conn,
            approval_id=out.approval_id,
            version=1,
            grant_round=0,
            approver_id="fiona",
            role="finance",
            decision="approve",
            reason=None,
            at=clock.now(),
            seal=f"{ring.current}.forged",
        )
    [result] = replay(store, shop.table(), SHOP_POLICY, keyring=ring).results
    assert result.verdict == "refused", result


# -- an escalation limit from TOML is a finite number, or the table is refused at load


def _pay(account: str, amount: int) -> str:
    return account


@pytest.mark.parametrize("limit", ['"100000"', "nan", "inf"])
def test_an_escalation_limit_that_is_not_a_finite_number_is_refused_at_load(limit: str) -> None:
    """`above = "100000"` would raise TypeError on every call (int > str), `above = nan` would
    never escalate (and its fingerprint has no JSON form): refused as a TableError at load."""
    toml = f"""
[tools.pay]
effect = "money"
approver_role = "finance"
escalate = [{{ arg = "amount", above = {limit}, role = "finance_lead" }}]
"""
    with pytest.raises(TableError) as raised:
        EffectTable.from_toml(toml, {"pay": _pay})
    assert (raised.value.tool, raised.value.field) == ("pay", "escalate")


# -- an identity no database can store is refused when the context is built, before a read runs


@pytest.mark.parametrize("bad", ["s\ud800", "s\x00"])
def test_an_unstorable_session_id_never_blocks_other_callers_read_records(
    make_gate: MakeGate, store: SQLStore, bad: str
) -> None:
    """A read's record is buffered and written in batches: a session id the database refuses
    (a lone surrogate, parsed from a JSON escape; NUL, refused by PostgreSQL) made every batch
    fail, so no read of any caller was recorded again. It is refused at CallContext instead."""
    ran: list[str] = []

    def look(q: str) -> str:
        ran.append(q)
        return q

    gate = make_gate(table_of(ToolSpec(name="look", effect=Effect.READ, fn=look)))
    with pytest.raises(ValueError, match="session_id"):
        gate.call(
            "look",
            {"q": "x"},
            CallContext(session_id=bad, origin_message_id="m", user_id="u", agent_id="agent"),
        )
    gate.call("look", {"q": "y"}, ctx())
    gate.flush()
    with store.transaction() as conn:
        kinds = conn.execute(sa.text("SELECT session_id FROM eg_events WHERE kind = 'read'")).scalars().all()
    assert (ran, kinds) == (["y"], ["s1"])


@pytest.mark.parametrize("field", ["origin_message_id", "user_id", "agent_id", "run_id", "model_id"])
def test_every_identity_field_refuses_text_no_database_stores(field: str) -> None:
    values = {"session_id": "s", "origin_message_id": "m", "user_id": "u", "agent_id": "a", field: "x\ud800"}
    with pytest.raises(ValueError, match=field):
        CallContext(**values)


# -- a row with no JSON form is refused when it is built, not at every call of every tool


def _look(q: str) -> str:
    return q


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ({"name": "look\ud800"}, "name"),
        ({"description": "an upstream's text \ud800", "pin_description": True}, "description"),
        (
            {"schema": {"type": "object", "properties": {"q": {"type": "string", "title": "\udfff"}}}},
            "schema",
        ),
    ],
)
def test_a_row_without_a_json_form_is_refused_when_built(row: dict[str, Any], field: str) -> None:
    """Its fingerprint, and the table's (recorded with every call of every tool), has no
    canonical JSON: such a row made every call of every tool raise ArgumentError."""
    with pytest.raises(TableError) as raised:
        ToolSpec(**{"name": "other", "effect": Effect.READ, "fn": _look, **row})
    assert raised.value.field == field


def test_a_model_written_tool_call_id_is_still_accepted_and_recorded_escaped(
    make_gate: MakeGate, store: SQLStore
) -> None:
    """The tool-call id is the model's text, stored only inside escaped JSON: no refusal there."""

    def look(q: str) -> str:
        return q

    gate = make_gate(table_of(ToolSpec(name="look", effect=Effect.READ, fn=look)))
    [out] = gate.call_step([("look", {"q": "y"}, "call\ud800\x00")], ctx())
    assert isinstance(out, Executed)
    gate.flush()
    with store.transaction() as conn:
        details = (
            conn.execute(sa.text("SELECT detail_json FROM eg_events WHERE kind = 'read'")).scalars().all()
        )
    assert len(details) == 1


# -- an integral float where the schema says integer arrives as an int, by pattern too


def test_an_integral_float_under_a_pattern_property_integer_arrives_as_an_int(make_gate: MakeGate) -> None:
    ran: list[dict[str, Any]] = []

    def count(**kwargs: Any) -> str:
        ran.append(kwargs)
        return "ok"

    schema = {
        "type": "object",
        "patternProperties": {"^n_": {"type": "integer"}},
        "additionalProperties": {"type": "string"},
    }
    gate = make_gate(table_of(ToolSpec(name="count", effect=Effect.WRITE, fn=count, schema=schema)))
    out = gate.call("count", {"n_items": 12000.0}, ctx())
    assert isinstance(out, Executed), out
    assert ran == [{"n_items": 12000}]
    assert type(ran[0]["n_items"]) is int
