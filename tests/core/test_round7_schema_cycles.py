"""A schema whose references lead back to themselves without descending into the arguments.

Built, such a row made every call that reached the reference raise a raw RecursionError out of
`gate.call` (nothing ran, but the agent's loop crashed on a model's ordinary call). It is refused
when the row is built (TableError naming the schema); recursive schemas that descend into the
arguments (a tree) stay accepted and validate.
"""

from __future__ import annotations

from typing import Any

import pytest

from effectgate import CallContext, Effect, EffectGate, EffectTable, ToolSpec
from effectgate.errors import TableError
from effectgate.outcomes import Executed
from effectgate.stores import open_store

ENDLESS = {
    "self": {"type": "object", "properties": {"a": {"$ref": "#/properties/a"}}},
    "pair": {
        "type": "object",
        "$defs": {"x": {"$ref": "#/$defs/y"}, "y": {"allOf": [{"$ref": "#/$defs/x"}]}},
        "properties": {"a": {"$ref": "#/$defs/x"}},
    },
    "root": {"type": "object", "allOf": [{"$ref": "#"}]},
    "anyOf": {
        "type": "object",
        "$defs": {"x": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/x"}]}},
        "properties": {"a": {"$ref": "#/$defs/x"}},
    },
    "by_id": {"type": "object", "properties": {"a": {"$id": "https://x.test/a", "$ref": "https://x.test/a"}}},
    "dependent": {
        "type": "object",
        "$defs": {"x": {"dependentSchemas": {"q": {"$ref": "#/$defs/x"}}}},
        "properties": {"a": {"$ref": "#/$defs/x"}},
    },
}


@pytest.mark.parametrize("schema", ENDLESS.values(), ids=ENDLESS.keys())
def test_a_reference_cycle_is_refused_when_the_row_is_built(schema: dict[str, Any]) -> None:
    with pytest.raises(TableError, match=r"schema: the reference .* leads back"):
        ToolSpec(name="look", effect=Effect.READ, fn=lambda a: a, schema=schema)


def test_before_the_fix_a_call_raised_recursion_error_now_the_table_refuses() -> None:
    """The call that used to raise RecursionError: the table cannot be built, so no gate exists
    whose calls crash; the tool never ran."""
    runs: list[object] = []

    def look(a: object) -> object:
        runs.append(a)
        return a

    with pytest.raises(TableError):
        EffectTable([ToolSpec(name="look", effect=Effect.READ, fn=look, schema=ENDLESS["self"])])
    assert runs == []


def test_recursive_schemas_that_descend_still_validate() -> None:
    """A tree (a reference inside `items`/`properties`), a reference to the root under a property,
    a shared definition used twice and the draft's metaschema are no cycles."""
    tree = {
        "type": "object",
        "properties": {"node": {"$ref": "#/$defs/node"}, "again": {"$ref": "#"}},
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            },
            "x": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/y"}]},
            "y": {"type": "string"},
        },
    }
    tree["properties"] |= {"p": {"$ref": "#/$defs/x"}, "q": {"$ref": "#/$defs/x"}}  # type: ignore[operator]
    tree["properties"]["meta"] = {"$ref": "https://json-schema.org/draft/2020-12/schema"}  # type: ignore[index]
    runs: list[dict[str, Any]] = []

    def look(**kw: Any) -> dict[str, Any]:
        runs.append(kw)
        return kw

    table = EffectTable([ToolSpec(name="look", effect=Effect.READ, fn=look, schema=tree)])
    table.allow("agent", ["look"])
    store = open_store("sqlite://")
    store.setup()
    gate = EffectGate(table, store)
    ctx = CallContext(session_id="s1", origin_message_id="m1", user_id="u1", agent_id="agent")
    deep = {"node": {"kids": [{"kids": [{"kids": []}]}]}, "again": {"again": {}}, "p": None, "q": "x"}
    outcome = gate.call("look", deep, ctx)
    assert isinstance(outcome, Executed)
    assert runs == [deep]
    bad = gate.call("look", {"node": {"kids": [{"kids": [5]}]}}, ctx)
    assert not isinstance(bad, Executed)
    assert len(runs) == 1
