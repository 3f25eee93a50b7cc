"""Round 17 review of the effect table and its arguments: each test's docstring tells the defect
it was written against (it failed before its fix), on SQLite and PostgreSQL where a store is
involved."""

from __future__ import annotations

from typing import Any

import pytest

from effectgate import EffectGate, EffectTable, Invalid, Pending, Policy, Refused, ToolSpec
from effectgate.effects import Effect
from effectgate.errors import TableError
from effectgate.examples.shop import SUPPORT_AGENT, context
from effectgate.stores import SQLStore
from effectgate.testing import EffectRecorder

from .conftest import MakeGate

ORDER_ID = {"type": "string", "pattern": "^[0-9]+$"}
DIGITS = {"type": "string", "pattern": "^\\d+$"}


def refund_table(receiver: EffectRecorder, order_id: dict[str, Any]) -> EffectTable:
    def refund(order_id: str) -> str:
        receiver.record("refund", order_id=order_id)
        return "refunded"

    schema = {"type": "object", "properties": {"order_id": order_id}, "required": ["order_id"]}
    spec = ToolSpec(
        name="refund",
        effect=Effect.MONEY,
        fn=refund,
        schema=schema,
        approver_role="finance",
        subject="order_id",
    )
    table = EffectTable([spec])
    table.allow_all(SUPPORT_AGENT)
    return table


@pytest.mark.parametrize(
    ("declared", "written"),
    [(ORDER_ID, "1042\n"), (DIGITS, "\u0661\u0660\u0664\u0662"), (DIGITS, "1042\n")],
    ids=["final-newline", "arabic-indic-digits", "digits-final-newline"],
)
def test_a_pattern_matches_as_json_schema_reads_it(
    store: SQLStore, make_gate: MakeGate, declared: dict[str, Any], written: str
) -> None:
    """A schema's `pattern` is an ECMA-262 regex: `$` is the end of the text and `\\d` is 0-9.
    Both validators matched it as a Python regex: "1042\\n" passed `^[0-9]+$` (Python's `$` also
    matches before a final newline) and "١٠٤٢" passed `^\\d+$` (Python's `\\d` takes any script's
    digits; `int()` reads it as 1042). The refund of order 1042 was proposed under another
    subject ("1042\\n"): its subject lock, history and `confirm` check never saw the first. Now
    Invalid at /order_id, and nothing is recorded but the invalid event."""
    receiver = EffectRecorder()
    gate = make_gate(refund_table(receiver, declared))
    out = gate.call("refund", {"order_id": written}, context("m1"))
    assert isinstance(out, Invalid), out
    assert [e.pointer for e in out.errors] == ["/order_id"]
    gate.flush()
    assert store.approvals() == []
    assert receiver.count("refund") == 0
    assert isinstance(gate.call("refund", {"order_id": "1042"}, context("m2")), Pending)


def test_a_pattern_error_names_the_schemas_own_pattern() -> None:
    """What the model is told quotes the pattern it was shown, not the translation."""
    spec = refund_table(EffectRecorder(), DIGITS)["refund"]
    [error] = spec.validate({"order_id": "12a"})
    assert error.pointer == "/order_id"
    assert "'^\\\\d+$'" in error.message
    assert spec.validate({"order_id": "1042"}) == []


@pytest.mark.parametrize(
    ("pattern", "good", "bad"),
    [
        ("^a\\$$", "a$", "a"),  # an escaped dollar is a dollar
        ("^[$]+$", "$$", "a"),  # so is one in a class
        ("^[]a]$", "]", "b"),  # a "]" first in a class is a member (Python's reading)
        ("^\\w+$", "ab_9", "é"),  # \w is ASCII
        ("^\\D+$", "\u0661", "a1"),  # \D: anything but 0-9 (a non-ASCII digit is no 0-9)
        ("^[\\d.]+$", "1.5", "\u0661"),  # \d in a class
        ("^.+$", "a b", "a\rb"),  # "." matches no line terminator
        ("^a.b$", "a.b", "a\u2028b"),
        ("^a\\.b$", "a.b", "axb"),  # an escaped dot is a dot
        ("(?i)^x$", "X", "x\n"),  # Python's inline flags stay
    ],
)
def test_patterns_edge_cases(pattern: str, good: str, bad: str) -> None:
    """Escapes, classes and anchors of the translation, under both validators."""
    schema = {"type": "object", "properties": {"order_id": {"type": "string", "pattern": pattern}}}
    spec = ToolSpec(name="refund", effect=Effect.READ, fn=lambda order_id="": order_id, schema=schema)
    assert spec.validate({"order_id": good}) == []
    assert [e.pointer for e in spec.validate({"order_id": bad})] == ["/order_id"]


def test_an_empty_set_names_no_subject(store: SQLStore, make_gate: MakeGate) -> None:
    """A subject argument that is a list names a set; an empty list names no item. It was taken
    as one subject {"orders": []} that every such call of every session shared: a second
    session's call was refused as `subject_busy` by a stranger's. It names no subject now (the
    call is keyed by its arguments), as a call that gives none of its subject arguments."""
    receiver = EffectRecorder()

    def refund_all(orders: list[str], note: str) -> str:
        receiver.record("refund_all", orders=orders)
        return "ok"

    spec = ToolSpec(
        name="refund_all", effect=Effect.MONEY, fn=refund_all, approver_role="finance", subject="orders"
    )
    assert spec.subject_of({"orders": [], "note": "a"}) is None
    assert spec.subject_of({"orders": ["2", "1", "2"], "note": "a"}) == {"orders": ["1", "2"]}
    table = EffectTable([spec])
    table.allow_all(SUPPORT_AGENT)
    gate: EffectGate = make_gate(table)
    first = gate.call("refund_all", {"orders": [], "note": "a"}, context("m1"))
    second = gate.call("refund_all", {"orders": [], "note": "b"}, context("m1", session_id="s-other"))
    assert isinstance(first, Pending), first
    assert not isinstance(second, Refused), second
    assert receiver.count("refund_all") == 0


NASTY = ["\x00", "a\u2028b", "\U0001f600", "e\u0301", "\ufeff", "\\u0000"]


def test_text_the_model_can_write_is_stored_and_keyed_as_written(
    store: SQLStore, make_gate: MakeGate
) -> None:
    """NUL, line separators, characters outside the BMP, combining marks and a BOM in a subject
    and in a key: each call is proposed under its own subject (text is compared as written), and
    a replay of each finds its own approval."""
    receiver = EffectRecorder()

    def note(to: str, body: dict[str, str]) -> str:
        receiver.record("note", to=to)
        return "sent"

    spec = ToolSpec(name="note", effect=Effect.SEND, fn=note, approver_role="finance", subject="to")
    table = EffectTable([spec])
    table.allow_all(SUPPORT_AGENT)
    gate = make_gate(table)
    ids = []
    for i, text in enumerate(NASTY):
        args = {"to": text, "body": {text: text}}
        out = gate.call("note", args, context(f"m{i}"))
        assert isinstance(out, Pending), (text, out)
        again = gate.call("note", args, context(f"m{i}"))
        assert isinstance(again, Pending)
        assert again.approval_id == out.approval_id
        ids.append(out.approval_id)
    assert len(set(ids)) == len(NASTY)
    assert sorted(card.subject["to"] for card in gate.pending()) == sorted(NASTY)
    assert receiver.count("note") == 0


@pytest.mark.parametrize("name", ["read_retries", "max_pending_per_session"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), 2.5, "3", True, -1])
def test_a_policy_limit_is_a_whole_number(name: str, value: object) -> None:
    """`Policy(read_retries=float("nan"))` (a limit read from configuration as a float) was
    accepted: NaN compares false, so `attempt > read_retries` never held and a failing read was
    retried without end, and `max_pending_per_session=nan` let a session hold any number of
    pending approvals. A limit is a finite whole number now (3.0 is 3)."""
    with pytest.raises(ValueError, match=name):
        Policy(**{name: value})  # type: ignore[arg-type]
    assert Policy(**{name: 3.0}).approvals_needed(Effect.READ) == 0  # type: ignore[arg-type]


@pytest.mark.parametrize("name", [None, ["refund"], "\ud800", "refund\n"])
def test_an_unknown_tool_name_is_refused_and_recorded(
    store: SQLStore, make_gate: MakeGate, name: Any
) -> None:
    """Whatever the model writes as a tool's name (no text, NUL, a lone surrogate, a long text, a
    known name with a newline) is refused as unknown, recorded, and runs nothing."""
    receiver = EffectRecorder()
    gate = make_gate(refund_table(receiver, ORDER_ID))
    out = gate.call(name, {"order_id": "1"}, context("m1"))
    assert isinstance(out, Refused), out
    assert out.code == "unknown_tool"
    [step] = gate.call_step([(name, {"order_id": "1"})], context("m2"))
    assert isinstance(step, Refused)
    gate.flush()
    assert len(store.events(kind="refused")) == 2
    assert store.approvals() == []
    assert receiver.count("refund") == 0


DEPENDS = {
    "type": "object",
    "properties": {"order_id": {"type": "string"}, "all": {"type": "boolean"}, "reason": {"type": "string"}},
    "dependencies": {"all": ["reason"], "reason": {"properties": {"reason": {"minLength": 3}}}},
}


def test_a_draft_7_dependency_is_enforced(store: SQLStore, make_gate: MakeGate) -> None:
    """`dependencies` (draft 7, what many published tool schemas are written in) was dropped by
    JSON Schema 2020-12: the fast validator refused a call that broke it, and the full one, which
    decides every refusal, let it through. `{"all": true}` without its `reason` ran. Now Invalid,
    and nothing runs."""
    receiver = EffectRecorder()

    def cancel(order_id: str = "", all: bool = False, reason: str = "") -> str:
        receiver.record("cancel", all=all)
        return "cancelled"

    spec = ToolSpec(name="cancel", effect=Effect.WRITE, fn=cancel, schema=DEPENDS)
    assert [e.pointer for e in spec.validate({"all": True})] == [""]
    assert [e.pointer for e in spec.validate({"reason": "no"})] == ["/reason"]
    assert spec.validate({"all": True, "reason": "asked"}) == []
    table = EffectTable([spec])
    table.allow_all(SUPPORT_AGENT)
    gate = make_gate(table)
    assert isinstance(gate.call("cancel", {"order_id": "1", "all": True}, context("m1")), Invalid)
    assert receiver.count("cancel") == 0
    gate.flush()
    assert store.executions() == []


def test_a_dependency_that_leads_back_to_itself_is_a_table_error() -> None:
    """A `dependencies` schema applies to the instance itself: one that names its own schema
    would recurse on every call that has the property, so the row is refused when built."""
    looped = {
        "type": "object",
        "$defs": {"a": {"dependencies": {"x": {"$ref": "#/$defs/a"}}}},
        "$ref": "#/$defs/a",
    }
    with pytest.raises(TableError, match="leads back"):
        ToolSpec(name="loop", effect=Effect.READ, fn=lambda x=None: x, schema=looped)
