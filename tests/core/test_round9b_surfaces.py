"""Review round 9b of the reviewer surfaces other than the web inbox (the `effectgate` command's
pending / show / approve / deny, the notebook card): exit codes per the README's table.

The command runs in-process (`main(argv)`), as in test_cli.py; the application's module is
written into `tmp_path`, as in test_cli_log.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from effectgate import CallContext, Pending, open_store
from effectgate.cli import keyring_for

from . import test_cli
from .test_cli import Run

cli = test_cli.cli  # the command run in-process, and a clean environment
_cli_env = test_cli._cli_env

# A charge whose provider declines definitely (the row lists the exception in `definite_failures`):
# nothing happened downstream, the approval ends `failed`, and the exception is the tool's own.
DECLINING_APP = """
from effectgate import Effect, EffectGate, EffectTable, ToolSpec
from effectgate.effects import Reversibility

CALLS = []


class CardDeclined(Exception):
    pass


def charge(card: str, amount: int) -> dict:
    CALLS.append(card)
    raise CardDeclined(f"card {card} declined")


def factory(store, *, keyring=None):
    spec = ToolSpec(
        name="charge", effect=Effect.MONEY, fn=charge, approver_role="finance",
        reversibility=Reversibility.IRREVERSIBLE, subject=("card",), definite_failures=(CardDeclined,),
    )
    table = EffectTable([spec])
    table.allow_all("billing")
    return EffectGate(table, store, keyring=keyring)
"""


@pytest.fixture
def declining(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """A pending charge whose run will be declined: (database URL, approval id)."""
    (tmp_path / "eg_round9b_declining.py").write_text(DECLINING_APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    import eg_round9b_declining  # type: ignore[import-not-found]

    url = f"sqlite:///{tmp_path / 'charges.db'}"
    with open_store(url) as store:
        store.setup()
        gate = eg_round9b_declining.factory(store, keyring=keyring_for(url))
        ctx = CallContext(session_id="s", origin_message_id="m", user_id="u1", agent_id="billing")
        pending = gate.call("charge", {"card": "4242", "amount": 50}, ctx)
        gate.close()
    assert isinstance(pending, Pending)
    return url, pending.approval_id


def test_approve_execute_whose_run_is_declined_exits_6_not_internal_error(
    declining: tuple[str, str], cli: Callable[..., Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`approve --execute` whose tool fails definitely with the application's own exception type
    (a `definite_failures` entry, e.g. a provider's CardDeclined) exited 70, "unexpected
    CardDeclined ... (a bug)", although the approval was recorded and its run failed: the README's
    table gives that case exit 6 ("approved, then the run failed"). A script reading 70 treats it
    as a crash of effectgate and may retry a run the ledger has already closed as failed."""
    monkeypatch.delenv("EFFECTGATE_DEBUG", raising=False)
    url, approval_id = declining
    argv = ["--db", url, "--app", "eg_round9b_declining:factory", "approve", approval_id]
    run = cli(*argv, "--version", "1", "--as", "finance", "--approver", "fiona", "--execute")
    import eg_round9b_declining

    assert eg_round9b_declining.CALLS == ["4242"]  # it ran, once
    with open_store(url) as store:
        row = store.get_approval(approval_id)
        assert row is not None
        assert row.status == "failed"  # the grant was recorded and spent
    assert run.code == 6, run.err  # approved, then the run failed
    assert "CardDeclined" in run.err


def test_pending_of_a_session_holding_nul_lists_none_on_every_store(
    store_url: str, cli: Callable[..., Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`pending --session` with a NUL in the session id (pasted from a log, or a byte in a
    script's variable) listed no approval on SQLite (exit 0) but on PostgreSQL failed with
    "database ...: PostgreSQL text fields cannot contain NUL" and exit 5, "store unavailable":
    a monitor that pages on 5 reports the database down for a typo. No session id holds a NUL
    (a CallContext refuses one), so no approval is that session's, on either store."""
    monkeypatch.setenv("EFFECTGATE_KEYRING", "k1:" + bytes(range(32)).hex())
    from effectgate.examples.shop import app, context

    with open_store(store_url) as store:
        store.setup()
        gate = app(store, keyring=keyring_for(store_url))
        refund = {"order_id": "1042", "amount": 500, "currency": "GBP"}
        pending = gate.call("refund_order", refund, context("m1"))
        gate.close()
    assert isinstance(pending, Pending)
    run = cli("pending", "--session", "s\x00", "--db", store_url, "--json")
    assert run.code == 0, run.err
    assert run.out.strip() == "[]"
    with open_store(store_url) as store:
        row = store.get_approval(pending.approval_id)
        assert row is not None
        assert row.status == "pending"  # nothing changed
