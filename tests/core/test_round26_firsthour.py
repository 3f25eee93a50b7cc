"""Round 26, a newcomer's first hour (the quick start, their own tools, the command line):

- A gate built as the quick start builds it (`EffectGate(table, store)`, no keyring) on a SQLite
  file whose key file was lost (copied without it, deleted) minted a new key file beside a ledger
  that holds records: every record of that ledger then failed to verify, new records were sealed
  under the new key (a ledger of two keyrings), and restoring the old key file broke the new ones.
  The command line never does that (`setup`, `mcp serve`, `mcp proxy`); the gate now refuses the
  same way (`MissingKeyring`, naming `$EFFECTGATE_KEYRING` and the key file), and writes nothing.
- An argument the function does not take (and no `**kwargs` takes), which the schema admits (an
  optional property, or any name under an open schema: models add arguments), was proposed,
  approved, and then failed binding (`TypeError` before the tool's body ran), recorded as an
  unknown outcome (`needs_reconciliation`, the approver paged) of a call that never ran. The call
  is `Invalid` now, before anything is stored; a closed schema naming one is a `TableError`.
- Ctrl-C in `effectgate approve` after the grant was committed but before its token reached the
  terminal left the approval `approved` with a grant no one holds: `approve` again was refused
  ("approved, not pending") until the grant lapsed. The grant is given back now (its sealed
  release), the command says so in one line (exit 130), and `approve` again grants a new round.
- `no database at effectgate.db` named neither the directory a relative path was read from nor the
  fix; it names both now (`effectgate --db ... setup`, or the path of an existing database).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from effectgate import (
    Approver,
    CallContext,
    Effect,
    EffectGate,
    EffectTable,
    Executed,
    Grant,
    Invalid,
    Pending,
    ToolSpec,
    open_store,
)
from effectgate.cli import keyring_for
from effectgate.errors import MissingKeyring, TableError, TokenError
from effectgate.examples.shop import Shop, app, context
from effectgate.testing import EffectRecorder

from . import test_cli
from .test_cli import Run

cli = test_cli.cli  # the command run in-process
_cli_env = test_cli._cli_env  # a clean environment, in tmp_path

FINANCE = Approver("fiona", "finance")
REFUND = {"order_id": "1042", "amount": 500, "currency": "GBP"}


# -- a lost key file is never replaced by a new key over a ledger that holds records


def _ledger_with_a_record(db: Path) -> str:
    url = f"sqlite:///{db}"
    with open_store(url) as store:
        store.setup()
        with app(store) as gate:  # no keyring: the key file beside the database
            assert isinstance(gate.call("refund_order", REFUND, context("m1")), Pending)
    return url


def test_a_gate_never_mints_a_key_file_for_a_ledger_that_holds_records(tmp_path: Path) -> None:
    db = tmp_path / "effectgate.db"
    url = _ledger_with_a_record(db)
    keys = Path(f"{db}.keys")
    keys.unlink()  # copied without it, or deleted
    with open_store(url) as store:
        with pytest.raises(MissingKeyring, match=r"EFFECTGATE_KEYRING.*effectgate\.db\.keys"):
            EffectGate(Shop().table(), store)
        assert not keys.exists()
        [approval] = store.approvals()
        assert approval.status == "pending"


def test_a_gate_on_an_empty_ledger_still_makes_its_key_file(tmp_path: Path) -> None:
    db = tmp_path / "effectgate.db"
    with open_store(f"sqlite:///{db}") as store:
        store.setup()
        with EffectGate(Shop().table(), store) as gate:
            assert Path(f"{db}.keys").read_text() == gate.keyring.dumps()


# -- a schema argument the function cannot take


def refund_order(order_id: str, amount: int, currency: str) -> dict[str, Any]:
    return {"order_id": order_id, "amount": amount}


def _schema(closed: bool = False, **extra: Any) -> dict[str, Any]:
    properties = {
        "order_id": {"type": "string"},
        "amount": {"type": "integer"},
        "currency": {"type": "string"},
    }
    schema = {
        "type": "object",
        "properties": {**properties, **extra},
        "required": ["order_id", "amount", "currency"],
    }
    return {**schema, "additionalProperties": False} if closed else schema


def _gated(fn: Callable[..., Any], schema: dict[str, Any]) -> EffectTable:
    table = EffectTable(
        [ToolSpec(name="refund_order", effect=Effect.MONEY, fn=fn, approver_role="finance", schema=schema)]
    )
    table.allow("support", ["refund_order"])
    return table


CTX = CallContext(session_id="s1", origin_message_id="m1", user_id="u1", agent_id="support")


def test_a_closed_schema_naming_an_argument_the_function_does_not_take_is_refused() -> None:
    with pytest.raises(TableError, match=r"'note' is no parameter of fn: a call that gives it would fail"):
        _gated(refund_order, _schema(closed=True, note={"type": "string"}))


@pytest.mark.parametrize("schema", [_schema(note={"type": "string"}), _schema()], ids=["named", "open"])
def test_an_argument_the_function_does_not_take_is_invalid_before_anything_is_stored(
    schema: dict[str, Any],
) -> None:
    """An open schema admits it (named or not): the call is Invalid, never approved to fail
    binding after its approval as an unknown outcome (`needs_reconciliation`) of a call that never ran."""
    recorder = EffectRecorder()

    def refund(order_id: str, amount: int, currency: str) -> dict[str, Any]:
        recorder.record("refund", order_id=order_id)
        return {"order_id": order_id}

    with open_store("sqlite://") as store:
        store.setup()
        with EffectGate(_gated(refund, schema), store) as gate:
            out = gate.call("refund_order", {**REFUND, "note": "x"}, CTX)
            assert isinstance(out, Invalid), out
            assert [(e.pointer, e.message) for e in out.errors] == [
                ("/note", "'note' is not an argument of refund_order")
            ]
            assert store.approvals() == []
            assert store.idempotency_records() == []
            pending = gate.call("refund_order", REFUND, CTX)  # without it: proposed, approved, run once
            assert isinstance(pending, Pending)
            grant = gate.approve(pending.approval_id, version=1, approver=FINANCE)
            assert isinstance(grant, Grant)
            assert isinstance(gate.execute(grant.token), Executed)
    assert recorder.count("refund") == 1


def test_an_argument_taken_by_kwargs_is_accepted_and_runs_once() -> None:
    ran: list[dict[str, Any]] = []

    def refund(order_id: str, amount: int, currency: str, **more: Any) -> dict[str, Any]:
        ran.append(more)
        return {"order_id": order_id}

    with open_store("sqlite://") as store:
        store.setup()
        with EffectGate(_gated(refund, _schema(closed=True, note={})), store) as gate:
            pending = gate.call("refund_order", {**REFUND, "note": "x"}, CTX)
            assert isinstance(pending, Pending)
            grant = gate.approve(pending.approval_id, version=1, approver=FINANCE)
            assert isinstance(grant, Grant)
            assert isinstance(gate.execute(grant.token), Executed)
    assert ran == [{"note": "x"}]


# -- Ctrl-C in `effectgate approve`


def _interrupt(*_: object) -> str:
    raise KeyboardInterrupt


def test_ctrl_c_before_the_token_is_shown_gives_the_grant_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli: Callable[..., Run]
) -> None:
    url = f"sqlite:///{tmp_path / 'shop.db'}"
    shop = Shop()
    with open_store(url) as store:
        store.setup()
        with app(store, keyring=keyring_for(url), shop=shop) as gate:
            pending = gate.call("refund_order", REFUND, context("m1"))
            assert isinstance(pending, Pending)
    approve = ("--db", url, "--app", "effectgate.examples.shop:app", "approve", pending.approval_id)
    who = ("--version", "1", "--as", "finance", "--approver", "fiona")
    with monkeypatch.context() as m:
        m.setattr("effectgate.cli._commands.remaining", _interrupt)  # Ctrl-C as the token line is made
        try:
            run = cli(*approve, *who)
        except KeyboardInterrupt:
            pytest.fail("the interrupt escaped the command, its grant stranded")
    assert run.code == 130, run.err
    assert run.err.startswith("effectgate: error: interrupted")
    assert "approve it again" in run.err
    assert "eg1." not in run.out + run.err
    with open_store(url) as store:
        [row] = store.approvals()
        assert row.status == "approved"
        assert [d.decision for d in store.all_decisions()] == ["approve", "release"]
    again = cli(*approve, *who)
    assert again.code == 0, again.err
    token = again.out.strip().splitlines()[-1]
    with open_store(url) as store, app(store, keyring=keyring_for(url), shop=shop) as gate:
        assert isinstance(gate.execute(token), Executed)
        with pytest.raises(TokenError):
            gate.execute(token)
    assert shop.receiver.count("refund") == 1


INTERRUPTED_APP = """
from typing import Any
from effectgate import Effect, EffectGate, EffectTable, ToolSpec
RUNS: list[str] = []
def pay(order_id: str) -> dict[str, Any]:
    RUNS.append(order_id)
    raise KeyboardInterrupt  # Ctrl-C while the tool runs
def app(store: Any, *, keyring: Any = None) -> EffectGate:
    table = EffectTable([ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, approver_role="ops")])
    table.allow_all("a")
    return EffectGate(table, store, keyring=keyring)
"""


def test_ctrl_c_while_approve_execute_runs_the_tool_keeps_the_spent_grant_spent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli: Callable[..., Run]
) -> None:
    (tmp_path / "interrupted_app.py").write_text(INTERRUPTED_APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "interrupted_app", raising=False)  # this test's own, fresh
    import interrupted_app  # type: ignore[import-not-found]

    url = f"sqlite:///{tmp_path / 'pay.db'}"
    with open_store(url) as store:
        store.setup()
        with interrupted_app.app(store, keyring=keyring_for(url)) as gate:
            ctx = CallContext(session_id="s1", origin_message_id="m1", user_id="u1", agent_id="a")
            pending = gate.call("pay", {"order_id": "1"}, ctx)
    who = ("--version", "1", "--as", "ops", "--approver", "olga", "--execute")
    try:
        run = cli("--db", url, "--app", "interrupted_app:app", "approve", pending.approval_id, *who)
    except KeyboardInterrupt:
        pytest.fail("the interrupt escaped the command")
    assert run.code == 130, run.err
    assert "its run was cut short" in run.err
    assert interrupted_app.RUNS == ["1"]
    with open_store(url) as store:
        assert [d.decision for d in store.all_decisions()] == ["approve"]  # not given back: it ran
    assert cli("--db", url, "--app", "interrupted_app:app", "approve", pending.approval_id, *who).code == 4
    assert interrupted_app.RUNS == ["1"]


# -- a database path that is not there


def test_a_missing_database_names_the_directory_and_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli: Callable[..., Run]
) -> None:
    _ledger_with_a_record(tmp_path / "effectgate.db")
    elsewhere = tmp_path / "sub"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    run = cli("pending")
    assert run.code == 3
    assert f"no database at effectgate.db ({elsewhere / 'effectgate.db'})" in run.err
    assert "effectgate --db sqlite:///effectgate.db setup" in run.err
    assert not list(elsewhere.iterdir())
