"""Round 23: the policy side of the effect table (escalation, subjects, a row's fn and schema)."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from effectgate import Approver, CallContext, Effect, EffectTable, Escalate, Keyring, Pending, ToolSpec
from effectgate.errors import EffectGateError, PolicyViolation, TableError
from effectgate.testing import EffectRecorder

from .conftest import MakeGate

AGENT = "agent"
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"order_id": {"type": "string"}, "amount": {"type": "integer"}},
    "required": ["order_id"],
    "additionalProperties": False,
}


def ctx(message_id: str = "m1") -> CallContext:
    return CallContext(session_id="s1", origin_message_id=message_id, user_id="u1", agent_id=AGENT)


def refund(order_id: str, amount: int = 10**9) -> str:
    return f"refunded {amount}"


# -- a left-out argument the tool runs with at its own default, which the schema does not declare


def test_an_escalated_argument_left_out_runs_at_the_tools_default_only_with_the_raised_role() -> None:
    """The schema (given, as a TOML row's is) neither requires `amount` nor declares its default;
    the tool's own default is 10**9. A model that leaves `amount` out got a refund of 10**9
    approved by `finance` (the rule tested nothing): the row is refused when built."""
    with pytest.raises(TableError, match="amount"):
        ToolSpec(
            name="refund",
            effect=Effect.MONEY,
            fn=refund,
            schema=SCHEMA,
            approver_role="finance",
            escalate=[Escalate.above("amount", 1000, role="cfo")],
        )
    declared = {**SCHEMA, "properties": {**SCHEMA["properties"], "amount": {"type": "integer", "default": 5}}}
    with pytest.raises(TableError, match="amount"):  # a default the schema declares but the tool does not use
        ToolSpec(
            name="refund",
            effect=Effect.MONEY,
            fn=refund,
            schema=declared,
            approver_role="finance",
            escalate=[Escalate.above("amount", 1000, role="cfo")],
        )


def test_rows_whose_left_out_arguments_test_as_the_tool_runs_still_load(make_gate: MakeGate) -> None:
    receiver = EffectRecorder()
    rule = [Escalate.above("amount", 1000, role="cfo")]
    derived = ToolSpec(  # the derived schema declares the default: tested at it
        name="refund",
        effect=Effect.MONEY,
        fn=receiver.wrap("refund", refund),
        approver_role="finance",
        escalate=rule,
    )
    assert derived.role_for({"order_id": "1"})[0] == "cfo"
    required = {**SCHEMA, "required": ["order_id", "amount"]}  # never left out
    ToolSpec(
        name="refund", effect=Effect.MONEY, fn=refund, schema=required, approver_role="finance", escalate=rule
    )

    def small(order_id: str, amount: int = 10) -> str:  # its default tests as the absent one does
        return "ok"

    ToolSpec(
        name="refund", effect=Effect.MONEY, fn=small, schema=SCHEMA, approver_role="finance", escalate=rule
    )
    table = EffectTable([derived])
    table.allow_all(AGENT)
    gate = make_gate(table)
    out = gate.call("refund", {"order_id": "1"}, ctx())
    assert isinstance(out, Pending)
    assert out.card.approver_role == "cfo"
    assert receiver.count("refund") == 0


def test_a_subject_argument_left_out_runs_at_the_tools_default_is_refused() -> None:
    """`order_id` defaults to "1042" in the tool but not in the schema: a call that leaves it out
    refunds order 1042 while it names no subject (keyed by its arguments), so a `confirm` check
    sees none of 1042's earlier refunds."""

    def refund_default(amount: int, order_id: str = "1042") -> str:
        return "ok"

    schema = {
        "type": "object",
        "properties": {"order_id": {"type": "string"}, "amount": {"type": "integer"}},
        "required": ["amount"],
        "additionalProperties": False,
    }
    with pytest.raises(TableError, match="order_id"):
        ToolSpec(
            name="refund",
            effect=Effect.MONEY,
            fn=refund_default,
            schema=schema,
            approver_role="finance",
            subject="order_id",
        )


# -- a schema the tool's function cannot be called with


@pytest.mark.parametrize(
    "schema",
    [
        {  # `amount` is no parameter of the tool: fn(amount=...) raises TypeError
            "type": "object",
            "properties": {"order_id": {"type": "string"}, "amount": {"type": "integer"}},
            "required": ["order_id", "amount"],
        },
        {  # the tool's required `amount_cents` is not among the arguments the model may give
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
            "additionalProperties": False,
        },
    ],
)
def test_a_schema_the_tool_cannot_be_called_with_is_refused(schema: dict[str, Any]) -> None:
    """The gate calls fn(**arguments): an approved call with an argument the function does not
    take, or without one it requires, fails with a TypeError after its approval, recorded as an
    unknown outcome (needs reconciliation) that a person must settle, for every call of the row."""

    def pay(order_id: str, amount_cents: int) -> str:
        return "ok"

    with pytest.raises(TableError, match="amount"):
        ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, schema=schema, approver_role="finance")


def test_a_schema_the_tool_can_be_called_with_still_loads() -> None:
    def pay(order_id: str, amount_cents: int, note: str = "", **extra: Any) -> str:
        return "ok"

    schema = {
        "type": "object",
        "properties": {"order_id": {"type": "string"}, "amount_cents": {"type": "integer"}, "x": {}},
        "required": ["order_id", "amount_cents"],
    }
    ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, schema=schema, approver_role="finance")


# -- a table change between propose and execute


def test_a_call_of_an_agent_no_longer_allowed_the_tool_does_not_run(make_gate: MakeGate) -> None:
    receiver = EffectRecorder()

    def pay(order_id: str, amount: int) -> str:
        return "paid"

    spec = ToolSpec(name="pay", effect=Effect.MONEY, fn=receiver.wrap("pay", pay), approver_role="finance")
    table = EffectTable([spec])
    table.allow_all(AGENT)
    keyring = Keyring.generate()
    out = make_gate(table, keyring=keyring).call("pay", {"order_id": "1", "amount": 5}, ctx())
    assert isinstance(out, Pending)
    revoked = EffectTable([spec], allow={AGENT: []})
    gate = make_gate(revoked, keyring=keyring)
    with contextlib.suppress(EffectGateError):
        grant = gate.approve(out.approval_id, version=out.version, approver=Approver("fiona", "finance"))
        gate.execute(grant.token)
    assert receiver.count("pay") == 0


def test_a_grant_minted_before_the_allowlist_was_revoked_does_not_run(make_gate: MakeGate) -> None:
    """Approved while the agent was allowed the tool, executed after it was taken off its
    allowlist: refused (`not_allowed`), nothing run, the approval left approved and unspent."""
    receiver = EffectRecorder()

    def pay(order_id: str, amount: int) -> str:
        return "paid"

    spec = ToolSpec(name="pay", effect=Effect.MONEY, fn=receiver.wrap("pay", pay), approver_role="finance")
    table = EffectTable([spec])
    table.allow_all(AGENT)
    keyring = Keyring.generate()
    allowed = make_gate(table, keyring=keyring)
    out = allowed.call("pay", {"order_id": "1", "amount": 5}, ctx())
    assert isinstance(out, Pending)
    grant = allowed.approve(out.approval_id, version=out.version, approver=Approver("fiona", "finance"))
    revoked = make_gate(EffectTable([spec], allow={AGENT: []}), keyring=keyring)
    with pytest.raises(PolicyViolation) as refused:
        revoked.execute(grant.token)
    assert refused.value.code == "not_allowed"
    assert receiver.count("pay") == 0
    [row] = revoked.store.approvals()
    assert (row.status, row.token_used_at) == ("approved", None)


# -- a TOML allowlist of an agent id that is not what it reads as


@pytest.mark.parametrize("agent", ["support\u200b", "support ", "supp\u043ert", "\uff53upport"])
def test_a_toml_allowlist_of_an_agent_that_is_not_what_it_reads_as_is_refused(agent: str) -> None:
    """A reviewer reads `support = ["get_order"]` beside `suppоrt = ["get_order", "refund"]` (a
    Cyrillic o): two entries for one agent, one of which names another id; the real agent's
    allowlist is not what the file seems to say."""
    text = f'[tools.get_order]\neffect = "read"\n\n[agents]\n"{agent}" = ["get_order"]\n'
    with pytest.raises(TableError, match="agents"):
        EffectTable.from_toml(text, {"get_order": get_order})
    table = EffectTable.from_toml(text.replace(agent, "support-bot_2"), {"get_order": get_order})
    assert table.allowed("support-bot_2", "get_order")


def get_order(order_id: str) -> str:
    return order_id
