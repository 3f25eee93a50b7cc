"""The effect table: row registration, effect labels, derived schemas, TOML loading, fingerprints."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from effectgate import Effect, EffectTable, Escalate, Policy, Reversibility, ToolContext, ToolSpec
from effectgate.errors import TableError
from effectgate.examples.shop import SUMMARY_AGENT, SUPPORT_AGENT, Shop


def lookup(item: str, limit: int = 10) -> list[str]:
    """Look items up."""
    return [item][:limit]


def pay(account: str, amount: int, tool_context: ToolContext) -> dict[str, Any]:
    """Pay an account."""
    return {"account": account, "amount": amount, "key": tool_context.idempotency_key}


def table_error(**row: Any) -> TableError:
    with pytest.raises(TableError) as raised:
        ToolSpec(**row)
    return raised.value


# -- registration refuses incomplete rows, naming the tool and the field


def test_row_whose_schema_cannot_be_derived_is_refused() -> None:
    """A **kwargs tool without schema= is refused, naming the tool and the field schema."""

    def anything(**kwargs: Any) -> None:
        return None

    error = table_error(name="anything", effect=Effect.WRITE, fn=anything)
    assert (error.tool, error.field) == ("anything", "schema")


def test_row_with_var_positional_arguments_is_refused() -> None:
    """A *args tool without schema= is refused at the schema field."""

    def many(*items: str) -> None:
        return None

    error = table_error(name="many", effect=Effect.WRITE, fn=many)
    assert (error.tool, error.field) == ("many", "schema")


def test_row_with_an_explicit_schema_needs_no_type_hints() -> None:
    """With schema= given, even a **kwargs tool registers."""

    def anything(**kwargs: Any) -> None:
        return None

    schema = {"type": "object", "properties": {"x": {"type": "string"}}, "additionalProperties": False}
    spec = ToolSpec(name="anything", effect=Effect.WRITE, fn=anything, schema=schema)
    assert spec.validate({"x": "a"}) == []


def test_row_without_an_effect_is_refused() -> None:
    """A row whose effect is missing is refused at the field effect."""
    error = table_error(name="lookup", effect=None, fn=lookup)
    assert (error.tool, error.field) == ("lookup", "effect")


def test_row_with_an_unknown_effect_label_is_refused() -> None:
    """A foreign label the table cannot map is refused at the field effect."""
    error = table_error(name="lookup", effect="catastrophic", fn=lookup)
    assert (error.tool, error.field) == ("lookup", "effect")
    assert "catastrophic" in str(error)


@pytest.mark.parametrize("effect", [Effect.SEND, Effect.MONEY, Effect.DESTRUCTIVE])
def test_gated_row_without_an_approver_role_is_refused(effect: Effect) -> None:
    """A send, money or destructive row without approver_role is refused, naming tool and field."""
    error = table_error(name="pay", effect=effect, fn=pay)
    assert (error.tool, error.field) == ("pay", "approver_role")


@pytest.mark.parametrize("effect", [Effect.READ, Effect.WRITE])
def test_autonomous_row_needs_no_approver_role(effect: Effect) -> None:
    """Read and write rows register without an approver role."""
    assert ToolSpec(name="lookup", effect=effect, fn=lookup).approver_role is None


def test_policy_that_gates_writes_refuses_a_write_row_without_a_role() -> None:
    """Under a policy that gates writes, a write row without approver_role is refused."""
    spec = ToolSpec(name="lookup", effect=Effect.WRITE, fn=lookup)
    with pytest.raises(TableError) as raised:
        spec.check_policy(Policy(autonomous=frozenset({Effect.READ})))
    assert (raised.value.tool, raised.value.field) == ("lookup", "approver_role")


def test_row_with_an_empty_name_is_refused() -> None:
    """A tool needs a non-empty name."""
    error = table_error(name="  ", effect=Effect.READ, fn=lookup)
    assert error.field == "name"


def test_row_whose_subject_is_not_an_argument_is_refused() -> None:
    """subject must name an argument of the tool."""
    error = table_error(name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance", subject="order_id")
    assert (error.tool, error.field) == ("pay", "subject")


def test_row_whose_schema_is_not_an_object_schema_is_refused() -> None:
    """A schema that does not describe a JSON object is refused."""
    error = table_error(name="lookup", effect=Effect.READ, fn=lookup, schema={"type": "array"})
    assert (error.tool, error.field) == ("lookup", "schema")


def test_row_whose_schema_is_not_valid_json_schema_is_refused() -> None:
    """A malformed JSON schema is refused at registration, not at the first call."""
    error = table_error(
        name="lookup", effect=Effect.READ, fn=lookup, schema={"type": "object", "properties": 5}
    )
    assert (error.tool, error.field) == ("lookup", "schema")


def test_registering_a_name_twice_is_refused() -> None:
    """Two rows cannot share a tool name."""
    table = EffectTable([ToolSpec(name="lookup", effect=Effect.READ, fn=lookup)])
    with pytest.raises(TableError) as raised:
        table.register(ToolSpec(name="lookup", effect=Effect.WRITE, fn=lookup))
    assert (raised.value.tool, raised.value.field) == ("lookup", "name")


def test_allowlist_naming_a_missing_tool_is_refused() -> None:
    """An agent cannot be allowed a tool the table does not have."""
    table = EffectTable([ToolSpec(name="lookup", effect=Effect.READ, fn=lookup)])
    with pytest.raises(TableError) as raised:
        table.allow("agent", ["lookup", "wire_money"])
    assert (raised.value.tool, raised.value.field) == ("wire_money", "allowlist")


def test_table_denies_by_default() -> None:
    """An agent without an allowlist may call nothing; an allowlisted agent only its tools."""
    table = Shop().table()
    assert not table.allowed("stranger", "get_order")
    assert table.allowed(SUMMARY_AGENT, "get_order")
    assert not table.allowed(SUMMARY_AGENT, "refund_order")
    assert not table.allowed(SUMMARY_AGENT, "send_email")
    assert table.allowed(SUPPORT_AGENT, "refund_order")


# -- effect labels from other taxonomies


@pytest.mark.parametrize(
    ("label", "effect"),
    [
        ("draft", Effect.WRITE),
        ("high", Effect.MONEY),
        ("bulk", Effect.SEND),
        ("read_only", Effect.READ),
        ("critical", Effect.DESTRUCTIVE),
        ("Read-Only", Effect.READ),
        (" Payment ", Effect.MONEY),
    ],
)
def test_foreign_labels_map_onto_effect_classes(label: str, effect: Effect) -> None:
    """Effect.from_label maps another taxonomy's word (case, hyphens and spaces aside) to our class."""
    assert Effect.from_label(label) is effect


def test_unknown_label_is_an_error_listing_the_known_ones() -> None:
    """An unknown label raises ValueError naming it and the labels that exist."""
    with pytest.raises(ValueError, match="unknown effect label 'yolo'") as raised:
        Effect.from_label("yolo")
    assert "draft" in str(raised.value)


def test_row_accepts_a_foreign_label() -> None:
    """A row given effect='high' is a money row, and so needs an approver role."""
    spec = ToolSpec(name="pay", effect="high", fn=pay, approver_role="finance")  # type: ignore[arg-type]
    assert spec.effect is Effect.MONEY
    assert table_error(name="pay", effect="high", fn=pay).field == "approver_role"


# -- schemas derived from type hints


def test_derived_schema_excludes_tool_context_parameters() -> None:
    """The ToolContext parameter is not an argument the model sees or may pass."""
    spec = ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance")
    assert spec.schema is not None
    assert set(spec.schema["properties"]) == {"account", "amount"}
    assert sorted(spec.schema["required"]) == ["account", "amount"]
    assert spec.context_params == frozenset({"tool_context"})


def test_derived_schema_forbids_extra_arguments() -> None:
    """An argument the function does not take is a schema error."""
    spec = ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance")
    assert spec.schema is not None
    assert spec.schema["additionalProperties"] is False
    assert spec.validate({"account": "a", "amount": 1, "memo": "x"}) != []


def test_derived_schema_refuses_the_tool_context_as_an_argument() -> None:
    """The model cannot smuggle a tool_context argument in."""
    spec = ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance")
    assert spec.validate({"account": "a", "amount": 1, "tool_context": {"idempotency_key": "x"}}) != []


def test_derived_schema_follows_the_type_hints() -> None:
    """Types and defaults come from the hints: a str item, an optional int limit."""
    spec = ToolSpec(name="lookup", effect=Effect.READ, fn=lookup)
    assert spec.validate({"item": "tea"}) == []
    assert spec.validate({"item": "tea", "limit": 3}) == []
    assert [e.pointer for e in spec.validate({"item": "tea", "limit": "3"})] == ["/limit"]
    assert [e.pointer for e in spec.validate({"item": 7})] == ["/item"]
    assert spec.validate({}) != []


def test_shop_refund_schema_takes_order_amount_currency() -> None:
    """The shop's refund_order row exposes exactly order_id, amount and currency."""
    spec = Shop().table()["refund_order"]
    assert spec.schema is not None
    assert set(spec.schema["properties"]) == {"order_id", "amount", "currency"}
    assert spec.schema["properties"]["amount"]["type"] == "integer"


def test_description_defaults_to_the_docstring() -> None:
    """Without description=, a row is described by its function's docstring."""
    assert ToolSpec(name="lookup", effect=Effect.READ, fn=lookup).description == "Look items up."


# -- escalation rules


def test_escalate_above_picks_the_higher_role_with_a_note() -> None:
    """Above the limit the rule's role applies and its note is returned; at the limit it does not."""
    rule = Escalate.above("amount", 100, role="finance_lead", note="big")
    spec = ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance", escalate=(rule,))
    assert spec.role_for({"account": "a", "amount": 101}) == ("finance_lead", ["big: amount = 101 (> 100)"])
    assert spec.role_for({"account": "a", "amount": 100}) == ("finance", [])


def test_escalate_count_above_counts_list_items() -> None:
    """count_above counts a list's items; a single string counts as one."""
    rule = Escalate.count_above("to", 2, role="marketing_lead", note="bulk")

    def send(to: list[str] | str) -> None:
        return None

    spec = ToolSpec(name="send", effect=Effect.SEND, fn=send, approver_role="support", escalate=(rule,))
    assert spec.role_for({"to": ["a", "b", "c"]})[0] == "marketing_lead"
    assert spec.role_for({"to": ["a", "b"]})[0] == "support"
    assert spec.role_for({"to": "abc"})[0] == "support"


def test_first_matching_escalation_rule_wins() -> None:
    """Rules are tried in order; the first that matches decides the role."""
    rules = (
        Escalate.above("amount", 1000, role="cfo"),
        Escalate.above("amount", 100, role="finance_lead"),
    )
    spec = ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance", escalate=rules)
    assert spec.role_for({"account": "a", "amount": 5000})[0] == "cfo"
    assert spec.role_for({"account": "a", "amount": 500})[0] == "finance_lead"


# -- TOML owned by the downstream teams

SHOP_TOML = """
[tools.get_order]
effect = "read_only"
subject = "order_id"
scope = "owns_order"
owner = "orders"

[tools.refund_order]
effect = "high"
approver_role = "finance"
reversibility = "compensable"
subject = ["order_id"]
scope = "owns_order"
confirm = "refund_within_balance"
reconcile = "reconcile_refund"
owner = "payments"
escalate = [{ arg = "amount", above = 100000, role = "finance_lead", note = "refund above 1000.00" }]

[tools.send_email]
effect = "bulk"
fn = "send"
approver_role = "support_lead"
subject = "to"
escalate = [
  { when = "to_the_press", role = "comms_lead", note = "press contact" },
  { arg = "to", count_above = 500, role = "marketing_lead", note = "bulk send" },
]

[agents]
support = ["get_order", "refund_order", "send_email"]
queue_summarizer = ["get_order"]
"""


def to_the_press(args: Any) -> bool:
    return any(str(a).endswith("@press.example") for a in args.get("to", []))


def bindings(shop: Shop) -> dict[str, Any]:
    return {
        "get_order": shop.get_order,
        "refund_order": shop.refund_order,
        "send": shop.send_email,
        "owns_order": shop.owns_order,
        "refund_within_balance": shop.refund_within_balance,
        "reconcile_refund": shop.reconcile_refund,
        "to_the_press": to_the_press,
    }


def test_toml_rows_bind_names_to_callables() -> None:
    """Each row's fn, scope, confirm and reconcile are the bound callables; labels map to effects."""
    shop = Shop()
    table = EffectTable.from_toml(SHOP_TOML, bindings(shop))
    refund = table["refund_order"]
    assert refund.effect is Effect.MONEY
    assert refund.reversibility is Reversibility.COMPENSABLE
    assert refund.subject == ("order_id",)
    assert (refund.fn, refund.scope, refund.confirm, refund.reconcile) == (
        shop.refund_order,
        shop.owns_order,
        shop.refund_within_balance,
        shop.reconcile_refund,
    )
    assert table["send_email"].fn == shop.send_email
    assert table["send_email"].effect is Effect.SEND
    assert table["get_order"].effect is Effect.READ


def test_toml_allowlists_are_loaded() -> None:
    """[agents] sets each agent's allowlist."""
    table = EffectTable.from_toml(SHOP_TOML, bindings(Shop()))
    assert table.allowlist("support") == {"get_order", "refund_order", "send_email"}
    assert table.allowlist("queue_summarizer") == {"get_order"}


def test_toml_escalation_rules_apply() -> None:
    """above, count_above and when rules from TOML escalate as the code-built ones do."""
    table = EffectTable.from_toml(SHOP_TOML, bindings(Shop()))
    refund = {"order_id": "1042", "amount": 150000, "currency": "GBP"}
    assert table["refund_order"].role_for(refund)[0] == "finance_lead"
    send = table["send_email"]
    many = {"to": [f"u{i}@example.com" for i in range(501)], "subject": "s", "body": "b"}
    assert send.role_for(many) == ("marketing_lead", ["bulk send: to: 501 (> 500)"])
    assert send.role_for({"to": ["ed@press.example"], "subject": "s", "body": "b"}) == (
        "comms_lead",
        ["press contact"],
    )
    assert send.role_for({"to": ["ada@example.com"], "subject": "s", "body": "b"}) == ("support_lead", [])


def test_toml_loads_from_a_path(tmp_path: Path) -> None:
    """A path (no newline in the argument) is read as a file."""
    path = tmp_path / "effects.toml"
    path.write_text(SHOP_TOML)
    assert {t.name for t in EffectTable.from_toml(path, bindings(Shop()))} == {
        "get_order",
        "refund_order",
        "send_email",
    }


def test_toml_row_matches_the_code_row_fingerprint() -> None:
    """get_order from TOML and from the shop's code is the same row: equal fingerprints."""
    shop = Shop()
    from_toml = EffectTable.from_toml(SHOP_TOML, bindings(shop))["get_order"]
    assert from_toml.fingerprint == shop.table()["get_order"].fingerprint


def toml_error(text: str, bound: dict[str, Any] | None = None) -> TableError:
    with pytest.raises(TableError) as raised:
        EffectTable.from_toml(text, bindings(Shop()) if bound is None else bound)
    return raised.value


def test_toml_unknown_field_is_refused() -> None:
    """A misspelt field is refused, naming the tool and the field, never silently ignored."""
    error = toml_error('[tools.get_order]\neffect = "read"\napprover = "x"\n')
    assert (error.tool, error.field) == ("get_order", "approver")


def test_toml_unknown_section_is_refused() -> None:
    """A top-level section other than tools and agents is refused."""
    error = toml_error('[tool.get_order]\neffect = "read"\n')
    assert error.field == "sections"


def test_toml_unbound_fn_is_refused() -> None:
    """A row whose function name is not bound is refused at the field fn."""
    error = toml_error('[tools.wire_money]\neffect = "money"\napprover_role = "finance"\n')
    assert (error.tool, error.field) == ("wire_money", "fn")


def test_toml_unbound_check_is_refused() -> None:
    """A scope naming an unbound callable is refused at the field scope."""
    error = toml_error('[tools.get_order]\neffect = "read"\nscope = "nobody_checks"\n')
    assert (error.tool, error.field) == ("get_order", "scope")


def test_toml_row_without_effect_is_refused() -> None:
    """A TOML row without effect is refused at the field effect."""
    error = toml_error('[tools.get_order]\nowner = "orders"\n')
    assert (error.tool, error.field) == ("get_order", "effect")


def test_toml_gated_row_without_a_role_is_refused() -> None:
    """A money row in TOML without approver_role is refused like one in code."""
    error = toml_error('[tools.refund_order]\neffect = "money"\n')
    assert (error.tool, error.field) == ("refund_order", "approver_role")


def test_toml_unbound_escalation_predicate_is_refused() -> None:
    """An escalate rule whose `when` is not bound is refused at the field escalate."""
    error = toml_error(
        '[tools.refund_order]\neffect = "money"\napprover_role = "finance"\n'
        'escalate = [{ when = "is_vip", role = "finance_lead" }]\n'
    )
    assert (error.tool, error.field) == ("refund_order", "escalate")


def test_toml_escalation_rule_without_a_role_is_refused() -> None:
    """An escalate rule without a role is refused at the field escalate."""
    error = toml_error(
        '[tools.refund_order]\neffect = "money"\napprover_role = "finance"\n'
        'escalate = [{ arg = "amount", above = 5 }]\n'
    )
    assert (error.tool, error.field) == ("refund_order", "escalate")


def test_toml_allowlist_naming_a_missing_tool_is_refused() -> None:
    """[agents] may only name rows of the table."""
    error = toml_error(
        '[tools.get_order]\neffect = "read"\n[agents]\nsupport = ["get_order", "refund_order"]\n'
    )
    assert (error.tool, error.field) == ("refund_order", "allowlist")


def test_toml_unknown_reversibility_is_refused_naming_the_field() -> None:
    """An unknown reversibility is a TableError naming the tool and the field."""
    error = toml_error('[tools.get_order]\neffect = "read"\nreversibility = "undoable"\n')
    assert (error.tool, error.field) == ("get_order", "reversibility")


def test_toml_escalation_rule_without_an_arg_is_refused() -> None:
    """An `above` rule that names no argument is a TableError at the field escalate."""
    error = toml_error(
        '[tools.refund_order]\neffect = "money"\napprover_role = "finance"\n'
        'escalate = [{ above = 5, role = "finance_lead" }]\n'
    )
    assert (error.tool, error.field) == ("refund_order", "escalate")


# -- fingerprints


def test_fingerprint_is_stable_across_rebuilds() -> None:
    """Two tables built from two shops (a restart) have the same row and table fingerprints."""
    first, second = Shop().table(), Shop().table()
    assert first.fingerprint == second.fingerprint
    assert [s.fingerprint for s in first] == [s.fingerprint for s in second]


@pytest.mark.parametrize(
    "change",
    [
        {"effect": Effect.WRITE, "approver_role": None},
        {"approver_role": "finance_lead"},
        {"reversibility": Reversibility.IRREVERSIBLE},
        {"escalate": ()},
        {"subject": ()},
        {"owner": "treasury"},
    ],
    ids=["effect", "role", "reversibility", "escalate", "subject", "owner"],
)
def test_reclassifying_a_row_changes_its_fingerprint(change: dict[str, Any]) -> None:
    """Changing what a row says about the tool changes the row's and the table's fingerprint."""
    table = Shop().table()
    spec = table["refund_order"]
    changed = table.replace(dataclasses.replace(spec, **change))
    assert changed["refund_order"].fingerprint != spec.fingerprint
    assert changed.fingerprint != table.fingerprint
    assert changed["get_order"].fingerprint == table["get_order"].fingerprint


def test_description_change_is_not_a_reclassification() -> None:
    """A reworded description leaves the fingerprint alone."""
    table = Shop().table()
    spec = table["refund_order"]
    assert dataclasses.replace(spec, description="Refund money.").fingerprint == spec.fingerprint


def test_a_pinned_description_is_part_of_the_fingerprint() -> None:
    """With `pin_description` (a row built from a tool definition someone else controls, such as
    an upstream MCP server's), a reworded description is another row."""
    spec = dataclasses.replace(Shop().table()["refund_order"], pin_description=True)
    assert dataclasses.replace(spec, description="Refund money.").fingerprint != spec.fingerprint
    assert dataclasses.replace(spec, description=spec.description).fingerprint == spec.fingerprint


def test_replace_leaves_the_original_table_alone() -> None:
    """table.replace returns a copy; the original keeps its row and fingerprint, allowlists carry over."""
    table = Shop().table()
    before = table.fingerprint
    spec = table["refund_order"]
    changed = table.replace(dataclasses.replace(spec, approver_role="finance_lead"))
    assert table["refund_order"] is spec
    assert table.fingerprint == before
    assert changed.allowlist(SUPPORT_AGENT) == table.allowlist(SUPPORT_AGENT)


def test_allowlist_change_changes_the_table_fingerprint() -> None:
    """Who may call what is part of the table's fingerprint."""
    table = Shop().table()
    before = table.fingerprint
    table.allow(SUMMARY_AGENT, ["get_order"])
    assert table.fingerprint != before


# -- the policy


def test_policy_cannot_gate_reads() -> None:
    """A policy without READ among the autonomous classes is refused."""
    with pytest.raises(ValueError, match="READ"):
        Policy(autonomous=frozenset({Effect.WRITE}))


def test_default_policy_gates_send_money_destructive() -> None:
    """By default send, money and destructive wait for a person; destructive needs two."""
    policy = Policy()
    assert [e for e in Effect if policy.gates(e)] == [Effect.SEND, Effect.MONEY, Effect.DESTRUCTIVE]
    assert policy.approvals_needed(Effect.DESTRUCTIVE) == 2
    assert policy.approvals_needed(Effect.MONEY) == 1
    assert policy.approvals_needed(Effect.READ) == 0
