"""The CLI for a newcomer (round 18, reproduced first): an `--app` factory that returns a gate
over a database other than the one `--db` names decided (and ran) the call there, while the
command said it acted on `--db`."""

from __future__ import annotations

import shutil
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from effectgate import CallContext, Effect, EffectGate, EffectTable, Pending, ToolSpec, open_store
from effectgate.errors import TableError
from effectgate.rows import NativeTool, money, table_for
from effectgate.testing import EffectRecorder

from . import test_cli
from .test_cli import Run

cli = test_cli.cli  # the command run in-process, and a clean environment
_cli_env = test_cli._cli_env

REFUND = {"order_id": "1042", "amount": 500}
CTX = CallContext(session_id="s1", origin_message_id="m1", user_id="u1", agent_id="support")


def _refund(order_id: str, amount: int) -> dict[str, Any]:
    return {"order_id": order_id, "amount": amount}


def _table(recorder: EffectRecorder) -> EffectTable:
    fn = recorder.wrap("refund", _refund)
    table = EffectTable([ToolSpec(name="refund", effect=Effect.MONEY, fn=fn, approver_role="finance")])
    table.allow_all("support")
    return table


def _statuses(url: str) -> tuple[list[str], int]:
    with open_store(url) as store:
        return [a.status for a in store.approvals()], len(store.executions())


def test_an_app_whose_gate_is_over_another_database_is_refused(
    cli: Callable[..., Run], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The adapters keep their own gate (`helper.gate`, `gate_of(agent)`); a factory that returns
    it, not a gate over the store it is given, approved and executed the call in the adapter's
    database while `--db` named another copy of the ledger, which stayed pending (exit 0). The
    command refuses such a factory (exit 2): nothing is decided or run in either database."""
    recorder = EffectRecorder()
    own_url = f"sqlite:///{tmp_path / 'own.db'}"
    own = open_store(own_url)
    own.setup()
    app_gate = EffectGate(_table(recorder), own)
    pending = app_gate.call("refund", REFUND, CTX)
    assert isinstance(pending, Pending)
    for suffix in ("", "-wal", ".keys"):  # the ledger `--db` names: a copy, with its keys
        if (tmp_path / f"own.db{suffix}").exists():
            shutil.copy(tmp_path / f"own.db{suffix}", tmp_path / f"given.db{suffix}")
    given_url = f"sqlite:///{tmp_path / 'given.db'}"
    module = types.ModuleType("eg_round18_own_gate")
    module.factory = lambda store, *, keyring=None: app_gate  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    try:
        run = cli(
            "--db", given_url, "--app", f"{module.__name__}:factory", "approve", pending.approval_id,
            "--version", "1", "--as", "finance", "--approver", "fiona", "--execute",
        )  # fmt: skip
        assert run.code == 2, run
        assert "store it is given" in run.err
        assert recorder.count("refund") == 0
        assert _statuses(own_url) == (["pending"], 0)
        assert _statuses(given_url) == (["pending"], 0)
    finally:
        app_gate.close()
        own.close()


@pytest.mark.parametrize("value", ["3", "true", '["money"]'])
def test_a_table_file_whose_effect_is_not_text_names_the_value(value: str) -> None:
    """A TOML row with `effect = 3` (or a bool, a list) was refused as "every row needs an
    effect", though the row has one: the message names the value that is not an effect."""
    text = f'[tools.refund]\neffect = {value}\napprover_role = "finance"\n'
    with pytest.raises(TableError) as caught:
        EffectTable.from_toml(text, {"refund": _refund})
    message = str(caught.value).lower()
    assert "needs an effect" not in message
    assert "is not an effect" in message
    assert value.strip('"[]') in message


def test_an_app_whose_gate_is_over_the_same_database_runs_once(
    cli: Callable[..., Run], monkeypatch: pytest.MonkeyPatch, store_url: str
) -> None:
    """The legitimate form of the same mistake: a factory that returns its own gate over the very
    database `--db` names (another connection to it) still decides and runs the call, once."""
    monkeypatch.setenv("EFFECTGATE_KEYRING", "k1:" + bytes(range(32)).hex())
    recorder = EffectRecorder()
    own = open_store(store_url)
    own.setup()
    app_gate = EffectGate(_table(recorder), own)
    pending = app_gate.call("refund", REFUND, CTX)
    assert isinstance(pending, Pending)
    module = types.ModuleType("eg_round18_same_gate")
    module.factory = lambda store, *, keyring=None: app_gate  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    try:
        run = cli(
            "--db", store_url, "--app", f"{module.__name__}:factory", "approve", pending.approval_id,
            "--version", "1", "--as", "finance", "--approver", "fiona", "--execute",
        )  # fmt: skip
        assert run.code == 0, run
        assert recorder.count("refund") == 1
        assert _statuses(store_url) == (["executed"], 1)
    finally:
        app_gate.close()
        own.close()


@pytest.mark.parametrize("url", ["sqlite:/effectgate.db", "sqlite:effectgate.db", "postgresql:/x"])
def test_a_url_with_a_slash_too_few_is_not_offered_as_a_path(
    cli: Callable[..., Run], tmp_path: Path, url: str
) -> None:
    """`--db sqlite:/effectgate.db` (one slash) was answered "give sqlite:///sqlite:/effectgate.db":
    the URL taken for a file name. It names the URL forms instead; nothing is created (exit 5)."""
    run = cli("--db", url, "pending")
    assert run.code == 5, run
    assert "sqlite:///sqlite:" not in run.err
    assert "sqlite:///postgresql:" not in run.err
    assert "sqlite:///PATH" in run.err
    assert list(tmp_path.iterdir()) == []


def test_a_mistyped_effects_key_is_named_and_no_read_row_is_suggested() -> None:
    """`effects={"refund_ordr": money(...)}` was refused as "no effect row for 'refund_order': ...
    e.g. effects={"refund_order": read()}": the typo not named, and the one row offered a read,
    which, copied, would run the refund ungated. The message names the row that matches no tool
    and offers every row helper, none of them as the refund's."""
    tools = [NativeTool("refund_order", "Refund an order.", {"type": "object"}, _refund)]
    with pytest.raises(TableError) as caught:
        table_for(tools, {"refund_ordr": money("finance")}, agent_id="support")
    message = str(caught.value)
    assert "no effect row for 'refund_order'" in message
    assert "refund_ordr" in message
    assert '"refund_order": read()' not in message


def _refund_named(module: str, recorder: EffectRecorder) -> Callable[..., dict[str, Any]]:
    """The same refund function, as a script run from another directory names it."""

    def refund(order_id: str, amount: int) -> dict[str, Any]:
        recorder.record("refund", order_id=order_id, amount=amount)
        return _refund(order_id, amount)

    refund.__module__, refund.__qualname__ = module, "refund"
    return refund


def test_a_row_changed_only_by_its_module_name_says_so(
    cli: Callable[..., Run], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`python sub/shop.py` records its tool as `shop.refund`; `--app sub.shop:factory` names it
    `sub.shop.refund`, so `approve` refused with "refund changed in the effect table since this
    approval was proposed" though nobody changed anything. The refusal stands (exit 4, nothing
    decided or run) and now names both module names and the fix."""
    url = f"sqlite:///{tmp_path / 'shop.db'}"
    recorder = EffectRecorder()

    def table(module: str) -> EffectTable:
        fn = _refund_named(module, recorder)
        spec = ToolSpec(name="refund", effect=Effect.MONEY, fn=fn, approver_role="finance")
        return EffectTable([spec], allow={"support": ["refund"]})

    with open_store(url) as store:
        store.setup()
        with EffectGate(table("shop18"), store) as gate:
            pending = gate.call("refund", REFUND, CTX)
    assert isinstance(pending, Pending)
    module = types.ModuleType("eg_round18_moved")
    module.factory = lambda store, *, keyring=None: EffectGate(table("sub.shop18"), store, keyring=keyring)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    run = cli(
        "--db", url, "--app", f"{module.__name__}:factory", "approve", pending.approval_id,
        "--version", "1", "--as", "finance", "--approver", "fiona",
    )  # fmt: skip
    assert run.code == 4, run
    assert "changed in the effect table" in run.err
    assert "shop18.refund" in run.err
    assert "sub.shop18.refund" in run.err
    assert "python -m" in run.err
    assert recorder.count("refund") == 0
    assert _statuses(url) == (["pending"], 0)


def test_serve_refuses_an_approver_who_could_never_sign_in(cli: Callable[..., Run], tmp_path: Path) -> None:
    """An `[[approver]]` without `secret` (a line forgotten from the README's walkthrough) was
    accepted and the inbox started, where every sign-in of theirs read "wrong id or secret": only
    `--sso-header` signs in an approver without one. Without it the file is refused at start
    (exit 2), naming the approver and the fix; no database is opened or created."""
    approvers = tmp_path / "approvers.toml"
    approvers.write_text('[[approver]]\nid = "fiona"\nrole = "finance"\n')
    db = tmp_path / "inbox.db"
    run = cli(
        "serve", "--db", f"sqlite:///{db}", "--app", "effectgate.examples.shop:app",
        "--approvers", str(approvers), "--port", "1",
    )  # fmt: skip
    assert run.code == 2, run
    assert "'fiona'" in run.err
    assert "hash-secret" in run.err
    assert not db.exists()


def test_an_app_file_shadowed_by_an_installed_module_is_named(
    cli: Callable[..., Run], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`python email.py` runs the newcomer's file, but `--app email:factory` imports the standard
    library's `email` (the working directory comes last on the path, so it never shadows an
    installed module) and said only "module 'email' has no attribute 'factory'", about a file that
    has one. It says which module was imported instead of ./email.py, and to rename the file."""
    (tmp_path / "email.py").write_text("def factory(store, *, keyring=None):\n    raise SystemExit(9)\n")
    url = f"sqlite:///{tmp_path / 'shop.db'}"
    with open_store(url) as store:
        store.setup()
    monkeypatch.setenv("EFFECTGATE_KEYRING", "k1:" + bytes(range(32)).hex())
    run = cli("--db", url, "--app", "email:factory", "pending")
    assert run.code == 2, run
    assert "./email.py" in run.err
    assert "rename" in run.err
