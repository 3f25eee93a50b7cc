"""Review of what a newcomer meets in the first hour: effect tables from TOML, the testing helpers
(FakeClock, Script), and the shop demo on a database it did not make."""

from __future__ import annotations

import math
from typing import Any

import pytest

from effectgate import Approver, EffectTable, Keyring, Pending, open_store
from effectgate.cli import main
from effectgate.errors import TableError
from effectgate.examples.shop import app, context
from effectgate.testing import EffectRecorder, FakeClock, Script, Step, call, say


def _refund(order_id: str, amount: int) -> dict[str, Any]:
    return {"order_id": order_id, "amount": amount}


def _load(text: str) -> EffectTable:
    return EffectTable.from_toml(text, {"refund": _refund, "owns": lambda args, ctx: True})


def _refused(text: str) -> TableError:
    with pytest.raises(TableError) as raised:
        _load(text)
    return raised.value


# -- an approver role, owner or description of the wrong type is refused at load, not at the first call


@pytest.mark.parametrize("role", ['["finance"]', "5", "true", '"  "', '""'])
def test_a_toml_approver_role_that_is_not_a_role_name_is_refused(role: str) -> None:
    """`approver_role = ["finance"]` loaded, then every call crashed in the store (a list has no
    column); `approver_role = 5` loaded, then every approval was refused as a tampered record;
    a blank role named nobody. Each is refused at load, naming the field."""
    error = _refused(f'[tools.refund]\neffect = "money"\napprover_role = {role}\n')
    assert (error.tool, error.field) == ("refund", "approver_role")


@pytest.mark.parametrize("field", ["owner", "description"])
@pytest.mark.parametrize("value", ['["payments"]', "5"])
def test_a_toml_owner_or_description_that_is_not_text_is_refused(field: str, value: str) -> None:
    """`owner = ["payments"]` loaded, then every gated call crashed in the store (a list has no column)."""
    error = _refused(f'[tools.refund]\neffect = "money"\napprover_role = "finance"\n{field} = {value}\n')
    assert (error.tool, error.field) == ("refund", field)


# -- a TOML document of the wrong shape is a TableError naming where, never a raw TypeError


@pytest.mark.parametrize(
    ("text", "tool", "field"),
    [
        ("tools = 3\n", "<toml>", "tools"),
        ('[[tools]]\neffect = "read"\n', "<toml>", "tools"),
        ('agents = 3\n[tools.refund]\neffect = "read"\n', "<toml>", "agents"),
        ('[tools.refund]\neffect = "read"\n[agents]\nbot = 3\n', "<toml>", "agents"),
        ('[tools.refund]\neffect = "read"\n[agents]\nbot = "refund"\n', "<toml>", "agents"),
        ('[tools.refund]\neffect = "read"\n[agents]\nbot = ["refund", 3]\n', "<toml>", "agents"),
        ('[tools.refund]\neffect = "read"\nsubject = 5\n', "refund", "subject"),
        ('[tools.refund]\neffect = "read"\nsubject = ["order_id", 5]\n', "refund", "subject"),
        ('[tools.refund]\neffect = "read"\nfn = []\n', "refund", "fn"),
        ('[tools.refund]\neffect = "read"\nscope = ["owns"]\n', "refund", "scope"),
        ('[tools.refund]\neffect = "read"\ndefinite_failures = [[]]\n', "refund", "definite_failures"),
        ('[tools.refund]\neffect = "money"\napprover_role = "f"\nescalate = "x"\n', "refund", "escalate"),
        ('[tools.refund]\neffect = "money"\napprover_role = "f"\nescalate = ["x"]\n', "refund", "escalate"),
        (
            '[tools.refund]\neffect = "money"\napprover_role = "f"\n'
            'escalate = [{ arg = "amount", count_above = [1], role = "lead" }]\n',
            "refund",
            "escalate",
        ),
        ('tools.refund.effect = "read"\n[[[\n', "<toml>", "toml"),
    ],
)
def test_a_toml_table_of_the_wrong_shape_is_a_table_error(text: str, tool: str, field: str) -> None:
    """A section, allowlist, subject, callable name or rule of the wrong type raised AttributeError
    or TypeError from inside the loader (a TOML syntax error a bare TOMLDecodeError); each is a
    TableError naming the tool (or `<toml>`) and the field. `bot = "refund"` was read as the
    allowlist of the letters r, e, f, u, n, d."""
    error = _refused(text)
    assert (error.tool, error.field) == (tool, field)


# -- an escalation rule that can never match is refused, not loaded as a rule that never escalates


@pytest.mark.parametrize(
    "rule",
    [
        '{ arg = "amout", above = 100000, role = "finance_lead" }',
        '{ arg = "amount", count_above = 1.5, role = "finance_lead" }',
        '{ arg = "amount", count_above = true, role = "finance_lead" }',
    ],
)
def test_a_toml_escalation_on_an_argument_the_tool_lacks_is_refused(rule: str) -> None:
    """`arg = "amout"` (a typo) loaded a rule that tests an argument no call has: a refund of any
    size went to finance, never finance_lead, and nothing said so. A count limit that is not a
    whole number was silently truncated (1.5 -> 1, true -> 1) into the row's fingerprint."""
    error = _refused(f'[tools.refund]\neffect = "money"\napprover_role = "finance"\nescalate = [{rule}]\n')
    assert (error.tool, error.field) == ("refund", "escalate")


def test_a_valid_toml_escalation_still_loads_and_escalates() -> None:
    table = _load(
        '[tools.refund]\neffect = "money"\napprover_role = "finance"\nowner = "payments"\n'
        'description = "Refund."\nsubject = "order_id"\n'
        'escalate = [{ arg = "amount", above = 100, role = "finance_lead" }]\n'
        '[agents]\nsupport = ["refund"]\n'
    )
    assert table["refund"].role_for({"order_id": "1", "amount": 101})[0] == "finance_lead"
    assert table.allowlist("support") == {"refund"}


# -- the fake clock never goes backwards, or to a time no comparison can order


@pytest.mark.parametrize("seconds", [math.nan, math.inf, -1.0])
def test_the_fake_clock_refuses_a_step_it_cannot_take(seconds: float) -> None:
    """`advance(nan)` passed the `< 0` check and left the clock at NaN: every later time
    comparison was False, so nothing (a token, an approval, a lease) ever expired again."""
    clock = FakeClock()
    before = clock.now()
    with pytest.raises(ValueError, match="backwards"):
        clock.advance(seconds)
    with pytest.raises(ValueError, match="backwards"):
        clock.sleep(seconds)
    assert clock.now() == before
    assert clock.slept == []  # a refused sleep did not happen


@pytest.mark.parametrize("start", [math.nan, math.inf])
def test_the_fake_clock_refuses_a_start_no_clock_shows(start: float) -> None:
    with pytest.raises(ValueError, match="finite"):
        FakeClock(start)


# -- the scripted planner holds only turns


@pytest.mark.parametrize(
    "bad",
    ["Done.", [call("get_order", order_id="1042")], None, Step(()), Step(("get_order",))],  # type: ignore[arg-type]
)
def test_a_script_refuses_an_item_that_is_not_a_turn(bad: Any) -> None:
    """A plain string (meant as `say(...)`) or a list of calls (meant as `step(...)`) was kept as a
    turn and failed, if ever, deep inside a framework's model when that turn was reached; a step
    of no calls answered nothing at all."""
    with pytest.raises(TypeError):
        Script([call("get_order", order_id="1042"), bad, say("ok")])


# -- the demo writes only into a database it may


def test_the_demo_refuses_a_postgresql_database_that_holds_records(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """On SQLite the demo refuses a database it did not make; on PostgreSQL it wrote its refunds,
    emails and deletions into whatever database `--db` named (an application's own: its pending
    list then held a demo refund of order 1042 for the real finance team), then failed its own
    checks. It refuses, and the database keeps exactly its records."""
    keyring = Keyring.generate()
    monkeypatch.setenv("EFFECTGATE_KEYRING", keyring.dumps())
    with open_store(pg_url) as store:
        store.setup()
        gate = app(store, keyring=keyring)
        pending = gate.call(
            "refund_order", {"order_id": "1043", "amount": 500, "currency": "GBP"}, context("m1")
        )
        assert isinstance(pending, Pending)
        before = (len(store.approvals()), len(store.events()), len(store.executions()))
        gate.close()
    code = main(["demo", "--db", pg_url])
    capsys.readouterr()
    assert code == 1
    with open_store(pg_url) as store:
        assert (len(store.approvals()), len(store.events()), len(store.executions())) == before
        gate = app(store, keyring=keyring)
        assert [c.approval_id for c in gate.pending()] == [pending.approval_id]
        gate.approve(pending.approval_id, version=1, approver=Approver("fiona", "finance"))
        gate.close()


def test_the_demo_runs_on_an_empty_postgresql_database(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("EFFECTGATE_KEYRING", Keyring.generate().dumps())
    code = main(["demo", "--db", pg_url])
    out = capsys.readouterr().out
    assert code == 0, out[-2000:]


# -- the recorder counts by every field it recorded


def test_the_recorder_counts_by_the_idempotency_key_it_recorded() -> None:
    """`record("pay", idempotency_key=k, ...)` keeps the key beside the payload, but
    `count("pay", idempotency_key=k)` looked only in the payload: it was 0 for every key, so
    `assert receiver.count("pay", idempotency_key=k) == 0` passed after the payment landed, and
    `<= 1` could never see a key paid twice."""
    receiver = EffectRecorder()
    receiver.record("pay", idempotency_key="k1", account="a")
    receiver.record("pay", idempotency_key="k1", account="a")
    receiver.record("pay", idempotency_key="k2", account="b")
    assert receiver.count("pay", idempotency_key="k1") == 2
    assert receiver.count("pay", idempotency_key="k2", account="b") == 1
    assert receiver.count("pay", idempotency_key="k3") == 0


def test_the_recorder_does_not_match_a_field_an_effect_lacks() -> None:
    """A payload without `note` matched `count(note=None)`: a field never recorded is not None."""
    receiver = EffectRecorder()
    receiver.record("email", to="ada@example.com")
    receiver.record("email", to="grace@example.com", note=None)
    assert receiver.count("email", note=None) == 1
    assert receiver.count("email", idempotency_key=None) == 2  # recorded without a key: None
