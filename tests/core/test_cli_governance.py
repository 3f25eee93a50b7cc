"""`effectgate redact`, `retain` and `hold` through the command line: what each changed in the
ledger (and an export file), its exit code, and that a refusal changes nothing."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from effectgate import Approver, Executed, Grant, Pending, open_store
from effectgate.cli import keyring_for
from effectgate.examples.shop import app, context

from . import test_cli
from .test_cli import Run

cli = test_cli.cli  # its fixtures: the command run in-process, and a clean environment
_cli_env = test_cli._cli_env

REFUND = {"order_id": "1042", "amount": 5000, "currency": "GBP"}


@pytest.fixture
def executed(tmp_path: Path) -> str:
    """A database with u1's refund of order 1042 approved and executed; returns its URL."""
    url = f"sqlite:///{tmp_path / 'shop.db'}"
    with open_store(url) as store:
        store.setup()
        gate = app(store, keyring=keyring_for(url))
        pending = gate.call("refund_order", REFUND, context("m1"))
        assert isinstance(pending, Pending)
        grant = gate.approve(pending.approval_id, version=1, approver=Approver("fiona", "finance"))
        assert isinstance(grant, Grant)
        assert isinstance(gate.execute(grant.token), Executed)
        gate.close()
    return url


def test_redact_erases_the_users_values_in_the_ledger_and_an_export(
    executed: str, tmp_path: Path, cli: Callable[..., Run]
) -> None:
    export = tmp_path / "x.jsonl"
    assert cli("export", "--db", executed, "--out", str(export), "--settle", "0").code == 0
    run = cli(
        "redact", "--db", executed, "--user", "u1", "--by", "dpo", "--reason", "request 77",
        "--export", str(export), "--json",
    )  # fmt: skip
    assert run.code == 0, run.err
    done = json.loads(run.out)
    assert done["rows"] > 0
    assert done["exports"] == {str(export): 1}
    with open_store(executed) as store:
        [approval] = store.approvals()
        assert json.loads(approval.args_json) == {"$redacted": done["id"], "amount": 5000, "currency": "GBP"}
    [line] = [json.loads(text) for text in export.read_text().splitlines()]
    assert line["personal"] == {}  # the arguments' text is gone; the facts and the chain stay
    assert line["record"]["args"] == {"amount": 5000, "currency": "GBP"}
    assert cli("verify", "--db", executed, str(export)).code == 0
    assert cli("audit", "--db", executed).code == 0


def test_a_hold_refuses_redaction_with_exit_4_until_released(executed: str, cli: Callable[..., Run]) -> None:
    placed = cli("hold", "--db", executed, "--user", "u1", "--by", "legal", "--reason", "case 14")
    assert placed.code == 0, placed.err
    hold_id = placed.out.split()[1]
    listed = cli("hold", "--db", executed, "--json")
    assert [h["id"] for h in json.loads(listed.out)] == [hold_id]
    refused = cli("redact", "--db", executed, "--user", "u1", "--by", "dpo", "--reason", "r")
    assert refused.code == 4
    assert "legal hold" in refused.err
    with open_store(executed) as store:
        assert '"1042"' in store.approvals()[0].args_json
    assert cli("hold", "--db", executed, "--release", hold_id, "--by", "legal").code == 0
    assert cli("hold", "--db", executed, "--release", hold_id, "--by", "legal").code == 4
    assert cli("redact", "--db", executed, "--user", "u1", "--by", "dpo", "--reason", "r").code == 0


@pytest.mark.parametrize(
    "argv",
    [
        ["retain", "--rule", "read", "--by", "x"],
        ["retain", "--rule", "reads=3", "--by", "x"],
        ["redact", "--user", "u1", "--by", "x", "--reason", "r", "--subject", "[1]"],
        ["hold", "--user", "u1", "--by", "x"],
    ],
)
def test_bad_arguments_are_usage_errors_that_change_nothing(
    executed: str, cli: Callable[..., Run], argv: list[str]
) -> None:
    with open_store(executed) as store:
        before = store.approvals()[0].args_json
    run = cli(argv[0], "--db", executed, *argv[1:])
    assert run.code in (2, 4), run
    with open_store(executed) as store:
        assert store.approvals()[0].args_json == before


def test_retain_erases_by_age(executed: str, cli: Callable[..., Run]) -> None:
    run = cli("retain", "--db", executed, "--rule", "money=0", "--by", "nightly", "--json")
    assert run.code == 0, run.err
    assert json.loads(run.out)["rows"] > 0
    with open_store(executed) as store:
        assert store.approvals()[0].args_json.startswith('{"$redacted"')


def test_retain_takes_the_unclassified_kind(executed: str, cli: Callable[..., Run]) -> None:
    """`unclassified` (events that name no effect class) is a kind of its own: it reaches no
    approval, execution or effect-classed event."""
    run = cli("retain", "--db", executed, "--rule", "unclassified=0", "--by", "nightly", "--json")
    assert run.code == 0, run.err
    assert json.loads(run.out)["rows"] == 0
    with open_store(executed) as store:
        assert not store.approvals()[0].args_json.startswith('{"$redacted"')
        assert not any(e.detail_json.startswith('{"$redacted"') for e in store.events())
