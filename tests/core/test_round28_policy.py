"""Round 28, the effect table and policy:

- A schema derived from a function's type hints dropped what `Annotated[..., Field(...)]` says
  (`typing.get_type_hints` strips it): `amount: Annotated[int, Field(gt=0, le=1000)]` was derived
  as any integer, so a refund of -5 or 10**9 was valid and proposed. The derived schema keeps the
  constraints now (and an alias, which the function is not called by, is refused when built).
- `_rowcheck.accepted` read the signature behind a `functools.wraps` decorator: a wrapper that
  takes fewer arguments than the function it wraps (`def w(order_id)`) was taken to accept the
  wrapped one's (`amount`), so a call giving it was proposed, approved, and failed binding after
  its grant (an unknown outcome of a call that never ran). What the outer function takes by name
  decides now, unless it takes any (`**kwargs`, as a pass-through decorator does); a schema
  derived from the wrapped function's hints, naming what the wrapper does not take, is refused.
- `Escalate.above` on an argument whose schema leaves its type open (`{"description": ...}`)
  kept the row's lower role for an amount written as an object (`{"value": 5000}`), a list of line
  items or a bool: only a number or a text was tested. Such a value reads as no number now, and
  escalates (as a text that reads as none does); `count_above` counts an object's keys.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any

import pydantic
import pytest

from effectgate import (
    Approver,
    CallContext,
    Effect,
    EffectGate,
    EffectTable,
    Escalate,
    Executed,
    Grant,
    Invalid,
    Pending,
    ToolSpec,
    open_store,
)
from effectgate.errors import TableError, WrongApprover
from effectgate.testing import EffectRecorder

FINANCE = Approver("fiona", "finance")
CTX = CallContext(session_id="s1", origin_message_id="m1", user_id="u1", agent_id="support")


def _gate_call(fn: Any, args: dict[str, Any], recorder: EffectRecorder) -> tuple[object, int, int]:
    table = EffectTable([ToolSpec(name="refund_order", effect=Effect.MONEY, fn=fn, approver_role="finance")])
    table.allow("support", ["refund_order"])
    with open_store("sqlite://") as store:
        store.setup()
        with EffectGate(table, store) as gate:
            out = gate.call("refund_order", args, CTX)
            if isinstance(out, Pending):
                grant = gate.approve(out.approval_id, version=1, approver=FINANCE)
                assert isinstance(grant, Grant)
                out = gate.execute(grant.token)
            return out, len(store.approvals()), len(store.idempotency_records())


@pytest.mark.parametrize("amount", [-5, 0, 10**9])
def test_a_derived_schema_keeps_the_field_constraints_of_annotated_hints(amount: int) -> None:
    recorder = EffectRecorder()

    def refund(order_id: str, amount: Annotated[int, pydantic.Field(gt=0, le=1000)]) -> str:
        recorder.record("refund", order_id=order_id, amount=amount)
        return "ok"

    out, approvals, records = _gate_call(refund, {"order_id": "1042", "amount": amount}, recorder)
    assert isinstance(out, Invalid), out
    assert (approvals, records, recorder.count("refund")) == (0, 0, 0)


def test_a_derived_schema_within_its_constraints_runs_once() -> None:
    recorder = EffectRecorder()

    def refund(order_id: str, amount: Annotated[int, pydantic.Field(gt=0, le=1000)]) -> str:
        recorder.record("refund", order_id=order_id, amount=amount)
        return "ok"

    out, approvals, _ = _gate_call(refund, {"order_id": "1042", "amount": 500}, recorder)
    assert isinstance(out, Executed), out
    assert (approvals, recorder.count("refund", amount=500)) == (1, 1)


def test_an_alias_the_function_is_not_called_by_is_refused_when_built() -> None:
    """validate_call takes the alias only: a schema naming the parameter fails every call."""

    @pydantic.validate_call
    def refund(order_id: Annotated[str, pydantic.Field(alias="orderId")]) -> str:
        return order_id

    with pytest.raises(TableError, match="'orderId' is no parameter of fn"):
        ToolSpec(name="refund_order", effect=Effect.MONEY, fn=refund, approver_role="finance")


def test_a_wrapper_narrower_than_what_it_wraps_refuses_the_argument_it_does_not_take() -> None:
    recorder = EffectRecorder()

    def refund(order_id: str, amount: int = 0) -> str:
        recorder.record("refund", order_id=order_id, amount=amount)
        return "ok"

    def fixed_amount(fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(order_id: str) -> str:
            return str(fn(order_id, amount=100))

        return wrapper

    with pytest.raises(TableError, match="'amount' is no parameter of fn"):  # derived from `refund`
        ToolSpec(name="refund_order", effect=Effect.MONEY, fn=fixed_amount(refund), approver_role="finance")
    table = EffectTable(
        [
            ToolSpec(
                name="refund_order",
                effect=Effect.MONEY,
                fn=fixed_amount(refund),
                approver_role="finance",
                schema={"type": "object", "properties": {"order_id": {"type": "string"}}},
            )
        ]
    )
    table.allow("support", ["refund_order"])
    with open_store("sqlite://") as store:
        store.setup()
        with EffectGate(table, store) as gate:
            out = gate.call("refund_order", {"order_id": "1", "amount": 10**6}, CTX)
            assert isinstance(out, Invalid), out
            assert [e.pointer for e in out.errors] == ["/amount"]
            assert (store.approvals(), store.idempotency_records()) == ([], [])
    assert recorder.count("refund") == 0


def test_a_pass_through_decorator_still_refuses_what_the_wrapped_function_does_not_take() -> None:
    recorder = EffectRecorder()

    def refund(order_id: str) -> str:
        recorder.record("refund", order_id=order_id)
        return "ok"

    def logged(fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs)

        return wrapper

    spec = ToolSpec(name="refund_order", effect=Effect.MONEY, fn=logged(refund), approver_role="finance")
    assert [e.pointer for e in spec.validate({"order_id": "1", "note": "x"})] != []
    out, approvals, _ = _gate_call(logged(refund), {"order_id": "1"}, recorder)
    assert isinstance(out, Executed), out
    assert (approvals, recorder.count("refund")) == (1, 1)


# -- an `above` / `count_above` rule on an argument whose schema leaves its type open


def _untyped_refund(recorder: EffectRecorder) -> EffectTable:
    def refund(order_id: str, amount: Any) -> str:
        recorder.record("refund", order_id=order_id)
        return "ok"

    schema = {
        "type": "object",
        "properties": {"order_id": {"type": "string"}, "amount": {"description": "in cents"}},
        "required": ["order_id", "amount"],
    }
    row = ToolSpec(
        name="refund_order",
        effect=Effect.MONEY,
        fn=refund,
        approver_role="support",
        schema=schema,
        escalate=[Escalate.above("amount", 1000, role="finance")],
    )
    table = EffectTable([row])
    table.allow("support", ["refund_order"])
    return table


@pytest.mark.parametrize("amount", [{"value": 5000}, [5000], [600, 600], True], ids=str)
def test_an_amount_written_as_no_number_keeps_no_lower_role(amount: object) -> None:
    """The schema admits it, and the tool may read 5000 from it: the rule escalates (as for a
    text that reads as no number), so support cannot approve it."""
    recorder = EffectRecorder()
    with open_store("sqlite://") as store:
        store.setup()
        with EffectGate(_untyped_refund(recorder), store) as gate:
            out = gate.call("refund_order", {"order_id": "1042", "amount": amount}, CTX)
            assert isinstance(out, Pending), out
            assert out.card.approver_role == "finance"
            with pytest.raises(WrongApprover):  # the lower role approves nothing
                gate.approve(out.approval_id, version=1, approver=Approver("sam", "support"))
            grant = gate.approve(out.approval_id, version=1, approver=FINANCE)
            assert isinstance(grant, Grant)
            assert isinstance(gate.execute(grant.token), Executed)
    assert recorder.count("refund") == 1


def test_a_small_number_keeps_the_row_role() -> None:
    out = _untyped_refund(EffectRecorder()).get("refund_order")
    assert out is not None
    assert out.role_for({"order_id": "1", "amount": 500}) == ("support", [])
    assert out.role_for({"order_id": "1"}) == ("support", [])  # left out: the tool's own handling


def test_recipients_given_as_an_object_are_counted() -> None:
    def send(to: Any) -> str:
        return "ok"

    row = ToolSpec(
        name="send",
        effect=Effect.SEND,
        fn=send,
        approver_role="support",
        schema={"type": "object", "properties": {"to": {}}, "required": ["to"]},
        escalate=[Escalate.count_above("to", 2, role="lead")],
    )
    assert row.role_for({"to": {"a@x": 1, "b@x": 1, "c@x": 1}})[0] == "lead"
    assert row.role_for({"to": ["a@x", "b@x"]})[0] == "support"
