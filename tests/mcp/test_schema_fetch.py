"""No schema makes the gate fetch anything: fastjsonschema resolves a "#..." reference against the
current `id`, and a draft-4 `id` with a fragment sent it to urllib for the document (the proxy's
check of upstream schemas lets "#..." through). The compiler's remote handlers now refuse every
scheme (`table._NoFetch`), so such a schema is validated by jsonschema alone, which fetches nothing."""

from __future__ import annotations

import contextlib
import json

import mcp.types as types
import pytest

from effectgate.effects import Effect, Policy
from effectgate.errors import TableError
from effectgate.mcp._config import Row, Upstream
from effectgate.mcp._upstream import Connection, spec_for

from .test_proxy_boundaries import fetched  # noqa: F401  (the local HTTP server fixture)


@pytest.mark.parametrize(
    "schema",
    [
        # the root's $id carries a fragment: "#/..." resolves against its document, which the
        # resolver's store holds only under the id *with* the fragment, so it is fetched
        {
            "id": "{base}/root.json#x",
            "type": "object",
            "definitions": {"c": {"type": "string"}},
            "properties": {"a": {"$ref": "#/definitions/c"}},
        },
        # the same in a nested subschema
        {
            "type": "object",
            "properties": {
                "a": {
                    "id": "{base}/nested.json#x",
                    "definitions": {"c": {"type": "string"}},
                    "properties": {"b": {"$ref": "#/definitions/c"}},
                }
            },
        },
    ],
    ids=["root-draft4-id-with-fragment", "nested-draft4-id-with-fragment"],
)
def test_a_hash_ref_under_an_id_with_a_fragment_is_not_fetched(
    fetched: tuple[str, list[str]],  # noqa: F811
    schema: dict[str, object],
) -> None:
    """With a draft-4 `id` such as "http://host/x.json#frag", the document "http://host/x.json"
    is not in fastjsonschema's store (kept under the id with its fragment) and was fetched when
    the row was built: the proxy requested the upstream's address. Served or refused, nothing is
    fetched now."""
    base, hits = fetched
    tool = types.Tool(name="peek", input_schema=json.loads(json.dumps(schema).replace("{base}", base)))
    upstream = Upstream(name="up", target=None, prefix="up", tools={"peek": Row(effect=Effect.READ)})
    with contextlib.suppress(TableError):
        spec_for(upstream, Connection(upstream), tool, Policy())
    assert hits == []
