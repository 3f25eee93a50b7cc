"""`table.allow("support", "refund_order")`: one name given as text was read as its letters: a
confusing "tool '_' ... the table does not have", or, with one-letter rows, an allowlist of
those. It is a TypeError naming the list to give; the allowlist is unchanged."""

from __future__ import annotations

import pytest

from effectgate import Effect, EffectTable, ToolSpec


def test_one_name_given_as_text_is_a_type_error_naming_the_list() -> None:
    table = EffectTable([ToolSpec(name=n, effect=Effect.READ, fn=lambda n=n: n) for n in ("g", "e", "t")])
    with pytest.raises(TypeError, match=r"\['get'\]"):
        table.allow("support", "get")
    assert table.allowlist("support") == frozenset()
    table.allow("support", ["g"])
    assert table.allowlist("support") == frozenset({"g"})
