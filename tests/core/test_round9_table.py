"""Round 9: how the effect table and its rules get in (rows, TOML, the policy, escalation)."""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import pytest

from effectgate import Approver, CallContext, Effect, EffectTable, Escalate, Pending, Policy, ToolSpec
from effectgate._rules import possible_roles
from effectgate.errors import TableError, WrongApprover
from effectgate.examples.shop import Shop
from effectgate.testing import EffectRecorder

from .conftest import MakeGate

AGENT = "agent"


def ctx(message_id: str = "m1") -> CallContext:
    return CallContext(session_id="s1", origin_message_id=message_id, user_id="u1", agent_id=AGENT)


def refund(order_id: str, amount: int) -> str:
    """Refund an order."""
    return "ok"


def money_row(**options: Any) -> ToolSpec:
    fields: dict[str, Any] = {"name": "refund", "approver_role": "finance", **options}
    return ToolSpec(effect=Effect.MONEY, fn=refund, **fields)


# -- an amount the schema lets the model write as text escalates as the number it is


def test_amount_written_as_text_still_escalates(make_gate: MakeGate) -> None:
    """A Decimal amount (pydantic: a number or a string) written by the model as "50000" is the
    refund of 50000 the tool makes: it needs the escalated role, not the row's own."""
    receiver = EffectRecorder()

    def pay(order_id: str, amount: Decimal) -> str:
        return "paid"

    spec = ToolSpec(
        name="pay",
        effect=Effect.MONEY,
        fn=receiver.wrap("pay", pay),
        approver_role="finance",
        escalate=[Escalate.above("amount", 1000, role="cfo")],
    )
    assert spec.validate({"order_id": "1", "amount": "50000"}) == []  # the schema takes it
    table = EffectTable([spec])
    table.allow_all(AGENT)
    gate = make_gate(table)
    out = gate.call("pay", {"order_id": "1", "amount": "50000"}, ctx())
    assert isinstance(out, Pending)
    assert out.card.approver_role == "cfo"
    with pytest.raises(WrongApprover):
        gate.approve(out.approval_id, version=out.version, approver=Approver("fiona", "finance"))
    assert receiver.count("pay") == 0
    # a text that is no number at all cannot be told to be small: the stricter role
    assert spec.role_for({"order_id": "1", "amount": "all"})[0] == "cfo"
    assert spec.role_for({"order_id": "1", "amount": "999.5"})[0] == "finance"
    # the audit's reading of the recorded row agrees with the gate's
    assert possible_roles(spec.canonical(), {"order_id": "1", "amount": "50000"}) == {"cfo"}


# -- the policy takes effect classes only


@pytest.mark.parametrize(
    "options",
    [
        {"double_confirmation": frozenset({"Destructive"})},  # a typo: one approver would do
        {"double_confirmation": "destructive"},  # a text: `in` tests its substrings
        {"autonomous": "read write"},
        {"autonomous": frozenset({"read", "write", "bulk"})},
    ],
)
def test_policy_refuses_what_is_not_an_effect_class(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="effect class"):
        Policy(**options)


def test_policy_takes_effect_values_as_text() -> None:
    policy = Policy(autonomous=frozenset({"read", "write"}), double_confirmation=frozenset({"destructive"}))  # type: ignore[arg-type]
    assert policy.approvals_needed(Effect.DESTRUCTIVE) == 2
    assert policy.fingerprint == Policy().fingerprint


# -- a row's roles and rules are what they say


@pytest.mark.parametrize(
    "options",
    [
        {"approver_role": 5},
        {"approver_role": ["finance"]},
        {"approver_role": "   "},
        {"owner": 5},
        {"escalate": [Escalate.above("amount", 100, role=5)]},  # type: ignore[arg-type]
        {"escalate": [Escalate.above("amount", 100, role="")]},
        {"escalate": "above 100"},
        {"escalate": ["above 100"]},
        {"subject": None},
        {"subject": ["order_id", 5]},
        {"shadow": "no"},
    ],
)
def test_row_refuses_fields_of_the_wrong_type(options: dict[str, Any]) -> None:
    with pytest.raises(TableError):
        money_row(**options)


@pytest.mark.parametrize(
    "options",
    [
        {"name": "refund\u200b"},  # zero-width space: looks like "refund"
        {"name": "refund\u202e"},  # right-to-left override
        {"name": "refund\n"},
        {"name": "r\u0435fund"},  # a Cyrillic "е" among Latin letters
        {"name": "cafe\u0301"},  # "café" with a combining accent: two texts read the same
        {"name": "\uff52efund"},  # a fullwidth "ｒ"
        {"approver_role": "fin\u200bance"},
        {"approver_role": "finance\n"},
        {"approver_role": "fin\u0430nce"},  # a Cyrillic "а"
        {"owner": "ops\u2066"},
        {"escalate": [Escalate.above("amount", 100, role="cf\u043e")]},  # a Cyrillic "о"
    ],
)
def test_row_refuses_names_and_roles_that_are_not_what_they_look_like(options: dict[str, Any]) -> None:
    with pytest.raises(TableError):
        money_row(**options)


def test_lookalike_rows_in_toml_are_refused() -> None:
    """Two rows that read the same in the TOML file: one money, one a read on the allowlist."""
    text = (
        '[tools.refund]\neffect = "money"\napprover_role = "finance"\n'
        '[tools."refund\\u200b"]\neffect = "read"\nfn = "refund"\n'
        '[agents]\nagent = ["refund\\u200b"]\n'
    )
    with pytest.raises(TableError):
        EffectTable.from_toml(text, {"refund": refund})


def test_names_in_one_script_are_taken() -> None:
    assert money_row(name="возврат", approver_role="финансы").name == "возврат"
    assert money_row(name="refund_order-2", approver_role="finance.lead").name == "refund_order-2"


# -- escalation rules that can never match


def test_rule_behind_a_lower_limit_on_the_same_argument_is_refused() -> None:
    """above 100 -> lead first: an amount above 10000 is above 100 too, so the cfo rule never
    matches and a refund of 50000 would need the lead only."""
    with pytest.raises(TableError, match="never"):
        money_row(
            escalate=[
                Escalate.above("amount", 100, role="lead"),
                Escalate.above("amount", 10000, role="cfo"),
            ]
        )
    with pytest.raises(TableError, match="never"):
        money_row(
            escalate=[
                Escalate.count_above("order_id", 1, role="lead"),
                Escalate.count_above("order_id", 1, role="cfo"),
            ]
        )
    text = (
        '[tools.refund]\neffect = "money"\napprover_role = "finance"\n'
        'escalate = [{arg = "amount", above = 100, role = "lead"},\n'
        '            {arg = "amount", above = 10000, role = "cfo"}]\n'
    )
    with pytest.raises(TableError, match="never"):
        EffectTable.from_toml(text, {"refund": refund})
    ordered = money_row(
        escalate=[Escalate.above("amount", 10000, role="cfo"), Escalate.above("amount", 100, role="lead")]
    )
    assert ordered.role_for({"order_id": "1", "amount": 50000})[0] == "cfo"


# -- shadow mode names rows it can shadow


def test_shadowed_refuses_a_row_that_is_not_gated() -> None:
    """A read or write row runs at once: asking for it in shadow mode and getting it live is refused."""
    table = Shop().table()
    with pytest.raises(TableError):
        table.shadowed(["get_order"])
    with pytest.raises(TypeError):
        table.shadowed("refund_order")  # its letters would be the names


# -- fingerprints change with what decides


def over(args: Mapping[str, Any], limit: int) -> bool:
    return isinstance(args.get("amount"), int) and args["amount"] > limit


def foreign(args: Mapping[str, Any], country: str = "GB") -> bool:
    return args.get("order_id", "").startswith(country)


def test_partial_predicates_fingerprint_by_function_and_arguments() -> None:
    """A `when` rule (or a check) given as functools.partial is named by what it calls and with
    what: another predicate, or another limit, is another row."""
    rows = [
        money_row(escalate=[Escalate.when(functools.partial(over, limit=1000), role="cfo", note="big")]),
        money_row(escalate=[Escalate.when(functools.partial(over, limit=10), role="cfo", note="big")]),
        money_row(escalate=[Escalate.when(functools.partial(foreign, country="FR"), role="cfo", note="big")]),
    ]
    assert len({row.fingerprint for row in rows}) == 3
    again = money_row(escalate=[Escalate.when(functools.partial(over, limit=1000), role="cfo", note="big")])
    assert again.fingerprint == rows[0].fingerprint


@pytest.mark.parametrize("grants", [{"lead": {"finance", 5}}, {5: {"finance"}}, {"lead": "finance"}])
def test_policy_refuses_role_grants_that_are_not_roles(grants: dict[Any, Any]) -> None:
    """Every role a grant names is text: a number would crash the policy's fingerprint later."""
    with pytest.raises(ValueError, match="role_grants"):
        Policy(role_grants=grants)


# -- allowlists


@pytest.mark.parametrize("allow", [{5: ["refund"]}, {"": ["refund"]}, {"agent": ["refund", 5]}])
def test_allowlist_of_an_agent_that_is_not_text_is_refused(allow: dict[Any, Any]) -> None:
    """An agent id that is not text would make the table's fingerprint fail on every call."""
    with pytest.raises(TableError, match="allowlist"):
        EffectTable([money_row()], allow=allow)


# -- a rule that cannot decide escalates


def test_a_rule_that_raises_on_the_models_arguments_escalates(make_gate: MakeGate) -> None:
    """`when` predicates are code: one that raises on what the model wrote (an amount as text it
    compares with a number) neither takes the call down nor lets it through at the lower role."""
    receiver = EffectRecorder()

    def pay(order_id: str, amount: Decimal) -> str:
        return "paid"

    spec = ToolSpec(
        name="pay",
        effect=Effect.MONEY,
        fn=receiver.wrap("pay", pay),
        approver_role="finance",
        escalate=[Escalate.when(lambda a: a["amount"] > 1000, role="cfo", note="big payment")],
    )
    table = EffectTable([spec])
    table.allow_all(AGENT)
    gate = make_gate(table)
    out = gate.call("pay", {"order_id": "1", "amount": "5000"}, ctx())
    assert isinstance(out, Pending)
    assert out.card.approver_role == "cfo"
    with pytest.raises(WrongApprover):
        gate.approve(out.approval_id, version=out.version, approver=Approver("fiona", "finance"))
    assert receiver.count("pay") == 0


# -- a row's schema is the row's own


def test_a_schema_changed_after_the_row_was_built_changes_neither_row_nor_fingerprint() -> None:
    """The dict a row was built from, changed afterwards by its caller (a loop that reuses it
    for the next tool), leaves the row as it was: what is validated and what is fingerprinted."""
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {"order_id": {"type": "string"}, "amount": {"type": "integer", "maximum": 100}},
        "required": ["order_id", "amount"],
        "additionalProperties": False,
    }
    spec = ToolSpec(name="refund", effect=Effect.MONEY, fn=refund, schema=schema, approver_role="finance")
    built = copy.deepcopy(spec.canonical())
    fingerprint = spec.fingerprint
    schema["properties"]["amount"]["maximum"] = 10**6
    schema["properties"]["note"] = {"type": "string"}
    assert spec.canonical() == built
    assert (
        spec.fingerprint
        == fingerprint
        == ToolSpec(
            name="refund", effect=Effect.MONEY, fn=refund, schema=built["schema"], approver_role="finance"
        ).fingerprint
    )
    assert spec.validate({"order_id": "1", "amount": 5000}) != []


# -- an escalation raises the bar


def test_an_escalation_to_a_role_the_row_outranks_is_refused(make_gate: MakeGate) -> None:
    """finance_lead may approve for finance (role_grants): a finance_lead refund whose rule above
    100 "escalates" to finance lets every finance approver pass the big refunds."""
    policy = Policy(role_grants={"finance_lead": frozenset({"finance"})})
    row = money_row(approver_role="finance_lead", escalate=[Escalate.above("amount", 100, role="finance")])
    table = EffectTable([row])
    table.allow_all(AGENT)
    with pytest.raises(TableError, match="lowers the bar"):
        make_gate(table, policy=policy)
    raised = money_row(approver_role="finance", escalate=[Escalate.above("amount", 100, role="finance_lead")])
    make_gate(EffectTable([raised]), policy=policy)  # the other way round is an escalation


# -- a left-out argument is tested at the value the tool runs with


def test_a_left_out_argument_is_tested_at_its_default(make_gate: MakeGate) -> None:
    """The model leaves out `max_recipients`, whose default (10000) is over the rule's limit:
    the campaign goes to 10000 recipients, so it needs the escalated role."""
    receiver = EffectRecorder()

    def send_campaign(segment: str, max_recipients: int = 10000) -> str:
        return "sent"

    spec = ToolSpec(
        name="send_campaign",
        effect=Effect.SEND,
        fn=receiver.wrap("send_campaign", send_campaign),
        approver_role="support",
        escalate=[Escalate.above("max_recipients", 500, role="marketing_lead")],
    )
    table = EffectTable([spec])
    table.allow_all(AGENT)
    gate = make_gate(table)
    out = gate.call("send_campaign", {"segment": "all"}, ctx())
    assert isinstance(out, Pending)
    assert out.card.approver_role == "marketing_lead"
    with pytest.raises(WrongApprover):
        gate.approve(out.approval_id, version=out.version, approver=Approver("sam", "support"))
    assert receiver.count("send_campaign") == 0
    assert possible_roles(spec.canonical(), {"segment": "all"}) == {"marketing_lead"}
    assert spec.role_for({"segment": "all", "max_recipients": 100})[0] == "support"


@pytest.mark.parametrize(
    "rules",
    [
        [Escalate.above("amount", "100", role="cfo")],  # type: ignore[arg-type]
        [Escalate.above("amount", 100, role="lead"), Escalate.above("amount", "100", role="cfo")],  # type: ignore[arg-type]
        [Escalate.count_above("order_id", 2.5, role="cfo")],  # type: ignore[arg-type]
    ],
)
def test_a_rule_limit_that_is_not_a_number_is_refused(rules: list[Escalate]) -> None:
    with pytest.raises(TableError, match="escalate"):
        money_row(escalate=rules)


def test_a_table_of_something_other_than_rows_is_refused() -> None:
    with pytest.raises(TypeError, match="ToolSpec"):
        EffectTable([{"name": "refund", "effect": "money"}])  # type: ignore[list-item]
