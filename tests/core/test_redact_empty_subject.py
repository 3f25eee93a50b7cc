"""An empty subject is refused, on SQLite and PostgreSQL and on the command line: `{}` would match
every write of the user (a write is found by the fields of the subject its arguments hold, and
an empty subject has none to miss), so a redaction meant for one subject would erase them all.
Nothing is erased; leaving the subject out is how all of a user's records are erased."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from effectgate import EffectGate, open_store
from effectgate.redact import RedactionError, redact
from effectgate.stores import SQLStore

from . import test_cli, test_cli_governance, test_redact
from .test_cli import Run

cli = test_cli.cli  # the command run in-process, and a clean environment
_cli_env = test_cli._cli_env
ledger = test_redact.ledger  # Ada (u1): a read, a write (ticket tags), a refund and an email
executed = test_cli_governance.executed  # u1's refund of order 1042, approved and executed


def test_an_empty_subject_is_refused_and_nothing_changes(ledger: EffectGate) -> None:
    """redact(subject={}) raises RedactionError naming the subject; every value stays (Ada's
    ticket tags, a write's arguments, among them)."""
    store = ledger.store
    assert isinstance(store, SQLStore)
    snapshot = test_redact.everything(store)
    assert "ada-vip" in snapshot
    with pytest.raises(RedactionError, match="subject must name at least one field"):
        redact(store, ledger.keyring, user_id="u1", subject={}, by="dpo", reason="order 1042")
    assert test_redact.everything(store) == snapshot
    assert store.events(kind="redacted") == []


def test_the_command_refuses_an_empty_subject(executed: str, cli: Callable[..., Run]) -> None:
    """`effectgate redact --subject '{}'`: exit 2 with a message saying why and what to do;
    the ledger is unchanged."""
    run = cli("redact", "--db", executed, "--user", "u1", "--subject", "{}", "--by", "dpo", "--reason", "r")
    assert run.code == 2
    assert "--subject must be a JSON object naming at least one field" in run.err
    with open_store(executed) as store:
        assert '"1042"' in store.approvals()[0].args_json
        assert store.events(kind="redacted") == []
