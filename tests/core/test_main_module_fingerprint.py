"""A row's fingerprint does not depend on how the file defining its tools was started.

A user's `myshop.py` run as `python myshop.py` (module `__main__`) proposes; `effectgate --app
myshop:factory approve` imports it as `myshop`. The rows must fingerprint the same, or the
approval is refused as `reclassified` although nothing changed.
"""

from __future__ import annotations

import importlib
import runpy
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from effectgate import EffectGate, open_store
from effectgate.cli import main

MODULE = "eg_mainmod_shop"

SOURCE = textwrap.dedent(
    '''
    """Tools, table, factory and an agent run in one module, as a newcomer writes it."""
    from pathlib import Path
    from typing import Any

    from effectgate import CallContext, Effect, EffectGate, EffectTable, Escalate, Pending, ToolSpec
    from effectgate import open_store

    RUNS = Path(__file__).with_name("runs.txt")


    class ProviderDown(Exception):
        pass


    def big_customer(args: Any) -> bool:
        return args.get("order_id") == "vip"


    def refund_order(order_id: str, amount: int) -> dict[str, Any]:
        with RUNS.open("a") as f:
            f.write(order_id + "\\n")
        return {"refund_id": "re_1", "order_id": order_id, "amount": amount}


    def table() -> EffectTable:
        t = EffectTable(
            [
                ToolSpec(
                    name="refund_order",
                    effect=Effect.MONEY,
                    fn=refund_order,
                    approver_role="finance",
                    subject=("order_id",),
                    escalate=(Escalate.when(big_customer, role="finance_lead", note="vip"),),
                    definite_failures=(ProviderDown,),
                )
            ]
        )
        t.allow("support", ["refund_order"])
        return t


    def factory(store: Any, *, keyring: Any = None) -> EffectGate:
        return EffectGate(table(), store, keyring=keyring)


    # Computed while the module runs: a class (ProviderDown) defined in `__main__` is named
    # through the running `sys.modules["__main__"]`, which runpy restores when it returns.
    CANONICAL = table().get("refund_order").canonical()
    FINGERPRINT = table().fingerprint


    if __name__ == "__main__":
        import sys

        store = open_store(sys.argv[1])
        store.setup()
        with factory(store) as gate:
            ctx = CallContext(session_id="s1", origin_message_id="m1", user_id="u1", agent_id="support")
            out = gate.call("refund_order", {"order_id": "1042", "amount": 500}, ctx)
            assert isinstance(out, Pending), out
            print(out.approval_id)
        store.close()
    '''
)


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The user's file in its own directory, importable as MODULE (as `--app` imports it)."""
    monkeypatch.delenv("EFFECTGATE_KEYRING", raising=False)
    path = tmp_path / f"{MODULE}.py"
    path.write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(MODULE, None)
    yield path
    sys.modules.pop(MODULE, None)


def test_a_call_proposed_by_a_script_is_approved_through_app_and_runs_once(
    user_module: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`python myshop.py` proposes in its own process; `effectgate --app myshop:factory approve`
    accepts it (it was refused as reclassified), the grant runs the tool once, and the audit is
    clean (it reported the row as reclassified)."""
    url = f"sqlite:///{user_module.parent / 'shop.db'}"
    proposed = subprocess.run(
        [sys.executable, user_module.name, url],
        cwd=user_module.parent,
        capture_output=True,
        text=True,
        check=True,
    )
    approval_id = proposed.stdout.strip().splitlines()[-1]
    app = f"{MODULE}:factory"
    approve = ["approve", approval_id, "--version", "1", "--as", "finance", "--approver", "fiona"]
    assert main(["--db", url, "--app", app, *approve]) == 0, capsys.readouterr()
    token = capsys.readouterr().out.strip().splitlines()[-1]

    store = open_store(url)
    try:
        with importlib.import_module(MODULE).factory(store) as gate:
            assert isinstance(gate, EffectGate)
            gate.execute(token)
            assert gate.result(approval_id) is not None
    finally:
        store.close()
    assert (user_module.parent / "runs.txt").read_text().splitlines() == ["1042"]

    code = main(["--db", url, "--app", app, "audit"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "reclassified" not in out


def test_the_table_fingerprints_the_same_run_as_main_by_path_or_module_and_imported(
    user_module: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run by path (`python myshop.py`: the file's stem) or as `python -m myshop` (the spec's
    name), every row fingerprints as when imported: the tool, the predicate and the exception."""
    monkeypatch.setattr(sys, "argv", ["x", f"sqlite:///{user_module.parent / 'runpy.db'}"])
    as_script = runpy.run_path(str(user_module), run_name="__main__")
    as_dash_m = runpy.run_module(MODULE, run_name="__main__", alter_sys=True)
    imported = importlib.import_module(MODULE)
    assert imported.refund_order.__module__ == MODULE
    assert imported.CANONICAL["fn"] == f"{MODULE}.refund_order"
    assert imported.CANONICAL["escalate"] == [{"role": "finance_lead", "when": f"{MODULE}.big_customer"}]
    assert imported.CANONICAL["definite_failures"] == [f"{MODULE}.ProviderDown"]
    for run in (as_script, as_dash_m):
        assert run["refund_order"].__module__ == "__main__"
        assert run["CANONICAL"] == imported.CANONICAL
        assert run["FINGERPRINT"] == imported.FINGERPRINT
        # functions name their module through their globals, also after runpy returned
        assert run["table"]().get("refund_order").canonical()["fn"] == f"{MODULE}.refund_order"


def test_functions_of_imported_modules_keep_their_names() -> None:
    """Only `__main__` is renamed: every other function's name (so existing ledgers'
    fingerprints and eg_rules) is unchanged."""
    from effectgate._rules import _qualname, count_of

    assert _qualname(count_of) == "effectgate._rules.count_of"
    assert _qualname(ValueError) == "builtins.ValueError"
    assert _qualname(None) is None
