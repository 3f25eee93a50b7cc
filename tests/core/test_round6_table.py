"""Round 6: the effect table, its TOML loading, the policy's limits and the testing helpers."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from effectgate import CallContext, Effect, EffectTable, Escalate, Policy, ToolSpec
from effectgate.context import ToolContext
from effectgate.errors import TableError
from effectgate.outcomes import Executed
from effectgate.testing import EffectRecorder

from .conftest import MakeGate

AGENT = "agent"


def ctx(message_id: str = "m1") -> CallContext:
    return CallContext(session_id="s1", origin_message_id=message_id, user_id="u1", agent_id=AGENT)


def tagger(ticket_id: str, count: int, tool: ToolContext) -> str:
    """Tag a ticket."""
    return f"{ticket_id}:{count}"


# -- the recorder's wrapper keeps the tool it wraps


def test_recorded_tool_keeps_its_schema_and_context() -> None:
    """A tool wrapped by `EffectRecorder.wrap` derives the same schema as the tool itself: typed
    arguments, and its ToolContext parameter a context the gate passes, not a model argument."""
    receiver = EffectRecorder()
    spec = ToolSpec(name="tag", effect=Effect.WRITE, fn=receiver.wrap("tag", tagger))
    plain = ToolSpec(name="tag", effect=Effect.WRITE, fn=tagger)
    assert spec.context_params == {"tool"}
    assert spec.schema == plain.schema
    assert spec.validate({"ticket_id": "t-1", "count": "many"}) != []


def test_recorded_tool_runs_through_the_gate(make_gate: MakeGate) -> None:
    """The wrapped write runs once, and the receiver counts it."""
    receiver = EffectRecorder()
    table = EffectTable([ToolSpec(name="tag", effect=Effect.WRITE, fn=receiver.wrap("tag", tagger))])
    table.allow_all(AGENT)
    gate = make_gate(table)
    out = gate.call("tag", {"ticket_id": "t-1", "count": 2}, ctx())
    assert isinstance(out, Executed)
    assert receiver.count("tag", ticket_id="t-1", count=2) == 1


# -- the policy's times


@pytest.mark.parametrize(
    "field", ["token_ttl", "pending_ttl", "lease_seconds", "retry_backoff"], ids=lambda f: f
)
@pytest.mark.parametrize("value", [math.nan, math.inf, -1.0], ids=["nan", "inf", "negative"])
def test_policy_refuses_times_no_clock_can_use(field: str, value: float) -> None:
    """A NaN expiry is never reached (`now > nan` is false: a pending approval that never
    expires), an infinite one cannot be written in a token, a negative backoff makes the retry's
    sleep raise: each is refused when the policy is made."""
    with pytest.raises(ValueError, match=field):
        Policy(**{field: value})


# -- schemas whose references lead nowhere


@pytest.mark.parametrize(
    "ref", ["#/$defs/Missing", "https://example.invalid/amount.json"], ids=["local", "remote"]
)
def test_unresolvable_reference_is_refused_with_the_row(ref: str) -> None:
    """A `$ref` the validator cannot resolve would raise on every call of the tool (the gate
    fetches nothing): the row is refused when it is built, naming the schema."""
    schema = {"type": "object", "properties": {"amount": {"$ref": ref}}}
    with pytest.raises(TableError, match="schema"):
        ToolSpec(name="pay", effect=Effect.WRITE, fn=lambda amount: amount, schema=schema)


def test_schema_reference_never_reads_a_file(tmp_path: Path) -> None:
    """A schema (an upstream server's, say) whose `$ref` names a file: the gate must not read it
    on a call (the full validator would fetch it, as it would a URL); the row is refused."""
    target = tmp_path / "secret.json"
    target.write_text('{"type": "string"}')
    schema = {"type": "object", "properties": {"amount": {"$ref": target.as_uri()}}}

    def build_and_call() -> None:
        spec = ToolSpec(name="pay", effect=Effect.WRITE, fn=lambda amount: amount, schema=schema)
        # built, the row's every call reads the file: 5 is refused as not the file's "string"
        assert spec.validate({"amount": 5}) == []

    with pytest.raises(TableError, match="schema"):
        build_and_call()


def test_schema_nesting_without_end_is_a_table_error() -> None:
    """A schema nested thousands deep (an upstream server's, say) is refused as a TableError
    naming the schema, not a RecursionError out of the schema checker."""
    node: dict[str, Any] = {"type": "string"}
    for _ in range(3000):
        node = {"type": "array", "items": node}
    schema = {"type": "object", "properties": {"rows": node}}
    with pytest.raises(TableError, match="schema"):
        ToolSpec(name="load", effect=Effect.WRITE, fn=lambda rows: rows, schema=schema)


def test_resolvable_references_still_load() -> None:
    """Local references, embedded `$id`s and the draft's own metaschema still resolve."""
    schema = {
        "type": "object",
        "$defs": {"Amount": {"type": "integer"}, "Cur": {"$id": "urn:cur", "type": "string"}},
        "properties": {
            "amount": {"$ref": "#/$defs/Amount"},
            "currency": {"$ref": "urn:cur"},
            "shape": {"$ref": "https://json-schema.org/draft/2020-12/schema"},
            "note": {"type": "string", "const": {"$ref": "#/nowhere"}},
        },
    }
    spec = ToolSpec(name="pay", effect=Effect.WRITE, fn=lambda **kw: kw, schema=schema)
    assert spec.validate({"amount": "x"}) != []
    assert spec.validate({"amount": 3, "currency": "GBP"}) == []


# -- replacing a row


def test_replace_refuses_a_row_the_table_does_not_have() -> None:
    """`replace` (a reclassification) with a misspelt name must not return the table unchanged
    as though the row had been reclassified."""

    def refund_order(order_id: str) -> str:
        return order_id

    table = EffectTable(
        [ToolSpec(name="refund_order", effect=Effect.MONEY, approver_role="finance", fn=refund_order)]
    )
    typo = ToolSpec(name="refund_ordr", effect=Effect.DESTRUCTIVE, approver_role="cfo", fn=refund_order)
    with pytest.raises(TableError, match="refund_ordr"):
        table.replace(typo)


# -- TOML files


TOML = '[tools.tag]\neffect = "send"\napprover_role = "r\u00e9viseur"\n'


def test_toml_file_is_read_as_utf8_whatever_the_locale(tmp_path: Path) -> None:
    """TOML is UTF-8: a table file loads the same role under any locale (a role read through
    the locale's codec would differ, or the load would crash)."""
    path = tmp_path / "effects.toml"
    path.write_bytes(TOML.encode())
    code = (
        "from effectgate import EffectTable\n"
        "def tag(ticket_id: str) -> str:\n    return ticket_id\n"
        f"print(ascii(EffectTable.from_toml({str(path)!r}, {{'tag': tag}})['tag'].approver_role))\n"
    )
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-500:]
    assert done.stdout.strip() == ascii("r\u00e9viseur")


def test_toml_file_not_utf8_is_a_table_error(tmp_path: Path) -> None:
    """A file in another encoding is refused as a TableError naming the file, not a raw
    UnicodeDecodeError."""
    path = tmp_path / "effects.toml"
    path.write_bytes(TOML.encode("latin-1"))
    with pytest.raises(TableError, match=r"effects\.toml"):
        EffectTable.from_toml(path, {"tag": lambda ticket_id: ticket_id})


def schema_toml(rule: str) -> str:
    return (
        '[tools.pay]\neffect = "money"\napprover_role = "finance"\n'
        'schema = { type = "object", properties = { amount = { type = "integer" } } }\n'
        f"escalate = [{rule}]\n"
    )


@pytest.mark.parametrize(
    "rule",
    [
        '{ arg = "amount", above = 5, role = "  " }',
        '{ arg = "amount", above = 5, count_above = 3, role = "cfo" }',
        '{ arg = "amount", above = 5, role = "cfo", at_least = 100 }',
    ],
    ids=["blank-role", "above-and-count", "unknown-key"],
)
def test_escalation_rules_that_cannot_mean_what_they_say(rule: str) -> None:
    """A rule whose role names no one (like a blank approver_role), or that sets two limits of
    which only one would ever be tested, is refused naming the field."""
    bindings: dict[str, Any] = {"pay": lambda amount: amount}
    with pytest.raises(TableError, match="escalate"):
        EffectTable.from_toml(schema_toml(rule), bindings)


# -- text that is not what it looks like


def smuggled(text: str) -> str:
    """`text` as variation selectors (one per byte): invisible after the character before it."""
    return "".join(chr(0xFE00 + b) if b < 16 else chr(0xE0100 + b - 16) for b in text.encode())


def test_text_hidden_in_variation_selectors_is_warned_and_revealed() -> None:
    """A run of variation selectors renders as nothing and can carry a whole text (an email body
    that shows "Hi" sends a secret): the reviewer is warned and the run is written out, like a
    zero-width space. A single selector after its character (an emoji's) is ordinary text."""
    from effectgate._textcheck import reveal, text_warnings

    body = "Hi" + smuggled("the api key is 123")
    [warning] = text_warnings({"body": body})
    assert warning.startswith("/body: ")
    assert "variation selector" in warning
    assert reveal(body).count("<U+") == len(body) - 3  # the first varies "i"; the rest shown
    assert text_warnings({"note": "I \u2764\ufe0f it"}) == ()
    assert reveal("I \u2764\ufe0f it") == "I \u2764\ufe0f it"
    assert text_warnings({"note": smuggled("x")}) != ()  # a selector with nothing before it


# -- rows for framework tools


def test_row_option_the_tool_sets_is_refused_when_the_row_is_made() -> None:
    """`read(description=...)`: the description is the framework tool's (what the model is
    shown); the row helper refuses it at once, like `schema=`, rather than the table build
    failing later with ToolSpec's "multiple values" TypeError."""
    from effectgate.rows import read

    with pytest.raises(TypeError, match="description= is set by"):
        read(description="Reads an order.")


def test_policy_role_grant_written_as_text_is_refused() -> None:
    """`role_grants={"finance_lead": "finance"}` (a text, not a set): `in` would test its
    substrings, so finance_lead would approve for "fin" or "a", and the recorded policy would
    grant its letters (the audit would judge by those): refused when the policy is made."""
    with pytest.raises(ValueError, match="role_grants"):
        Policy(role_grants={"finance_lead": "finance"})  # type: ignore[dict-item]


# -- escalation rules that could never match


def pay(amount: Any, to: Any) -> str:
    return "paid"


@pytest.mark.parametrize(
    ("amount", "rule"),
    [
        ({"type": "string"}, Escalate.above("amount", 1000, role="cfo")),
        ({"type": "integer"}, Escalate.count_above("amount", 10, role="cfo")),
        ({"type": "boolean"}, Escalate.above("amount", 0, role="cfo")),
    ],
    ids=["above-a-text", "count-a-number", "above-a-flag"],
)
def test_escalation_on_an_argument_it_cannot_read_is_refused(amount: dict[str, Any], rule: Escalate) -> None:
    """`above` reads a number, `count_above` a text or a list: a rule on an argument declared as
    something else would never match, and every call would keep the lower role (as a rule on an
    argument the tool lacks, refused when the row is built)."""
    schema = {"type": "object", "properties": {"amount": amount, "to": {"type": "array"}}}
    with pytest.raises(TableError, match="escalate"):
        ToolSpec(
            name="pay", effect=Effect.MONEY, approver_role="finance", fn=pay, schema=schema, escalate=[rule]
        )


def test_escalation_on_arguments_it_can_read_still_loads() -> None:
    schema = {
        "type": "object",
        "properties": {"amount": {"type": ["integer", "null"]}, "to": {"type": "string"}, "n": {}},
    }
    rules = [
        Escalate.above("amount", 1000, role="cfo"),
        Escalate.count_above("to", 1, role="cfo"),
        Escalate.above("n", 1, role="cfo"),
    ]
    spec = ToolSpec(
        name="pay", effect=Effect.MONEY, approver_role="finance", fn=pay, schema=schema, escalate=rules
    )
    assert spec.role_for({"amount": 5000})[0] == "cfo"
