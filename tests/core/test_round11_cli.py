"""Review round 11 of the non-governance commands (`pending`, `show`, `approve`, `deny`, `mcp`):
what `pending` lists versus what the deciding commands accept, and bad input.

State is proposed through the shop's gate (on SQLite and PostgreSQL through `store_url`); the
command runs in-process (`main(argv)`), as in test_cli.py, and each test asserts the records.
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from effectgate import Pending, open_store
from effectgate.cli import keyring_for
from effectgate.examples.shop import app, context

from . import test_cli
from .test_cli import Run

cli = test_cli.cli  # the command run in-process, and a clean environment
_cli_env = test_cli._cli_env

APP = "effectgate.examples.shop:app"
REFUND = {"order_id": "1042", "amount": 500, "currency": "GBP"}


@pytest.fixture
def proposed(store_url: str, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """A refund waiting for finance: (url, approval id)."""
    monkeypatch.setenv("EFFECTGATE_KEYRING", "k1:" + bytes(range(32)).hex())
    with open_store(store_url) as store:
        store.setup()
        gate = app(store, keyring=keyring_for(store_url))
        pending = gate.call("refund_order", REFUND, context("m1"))
        gate.close()
    assert isinstance(pending, Pending)
    return store_url, pending.approval_id


def _status(url: str, approval_id: str) -> str:
    with open_store(url) as store:
        row = store.get_approval(approval_id)
        assert row is not None
        return row.status


# -- `deny` without --app: the role grants of the policy recorded with the approval


def test_deny_by_a_granted_role_without_app_is_what_pending_lists(
    proposed: tuple[str, str], cli: Callable[..., Run]
) -> None:
    """The shop's policy lets finance_lead decide what finance may, and the approval records that
    policy: `pending --role finance_lead` (no --app) lists the refund in the lead's queue, but
    `deny ID --as finance_lead` (no --app, as the README shows it) judged the role with an empty
    policy and refused (exit 4, "needs role finance"): the lead could not deny what their own
    queue showed them. A role the recorded policy grants nothing is still refused."""
    url, approval_id = proposed
    queue = cli("pending", "--db", url, "--json", "--role", "finance_lead")
    assert [c["approval_id"] for c in json.loads(queue.out)] == [approval_id]
    deny = ["deny", approval_id, "--db", url, "--reason", "duplicate", "--approver", "fl"]
    other = cli(*deny, "--as", "privacy")
    assert other.code == 4, other
    assert _status(url, approval_id) == "pending"
    run = cli(*deny, "--as", "finance_lead")
    assert run.code == 0, run.err
    assert _status(url, approval_id) == "denied"


# -- `mcp serve` / `mcp proxy`: a new development key for a ledger that holds records


@pytest.fixture
def keyless_ledger(tmp_path: Path) -> tuple[str, Path]:
    """A SQLite ledger holding a write's sealed records (no approval), its key file lost."""
    db = tmp_path / "shop.db"
    url = f"sqlite:///{db}"
    with open_store(url) as store:
        store.setup()
        gate = app(store, keyring=keyring_for(url))
        gate.call("update_ticket_tags", {"ticket_id": "t-17", "tags": ["vip"]}, context("m1"))
        gate.close()
    keys = Path(f"{db}.keys")
    keys.unlink()
    return url, keys


def test_mcp_serve_never_makes_a_new_key_for_a_ledger_with_records(
    keyless_ledger: tuple[str, Path], cli: Callable[..., Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`mcp serve` created a new development key file for any database without approvals: one
    holding only writes' sealed executions, idempotency records and rules got a key that verifies
    none of them (`audit` then reports every write as a divergence, and a replayed write meets a
    record that does not verify). As every other command does, it must refuse (exit 2) and create
    nothing, and serve nothing."""
    pytest.importorskip("mcp")
    url, keys = keyless_ledger
    served: list[object] = []

    async def serve_stdio(server: object) -> None:
        served.append(server)

    monkeypatch.setattr("effectgate.mcp._serve.serve_stdio", serve_stdio)
    run = cli("mcp", "serve", "--db", url, "--app", APP, "--agent", "support", "--user", "u1")
    assert run.code == 2, run
    assert not keys.exists()
    assert served == []


def test_mcp_proxy_never_makes_a_new_key_for_a_ledger_with_records(
    keyless_ledger: tuple[str, Path], cli: Callable[..., Run], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`mcp proxy` likewise (its ledger may hold the records of earlier proxied writes)."""
    pytest.importorskip("mcp")
    url, keys = keyless_ledger
    config = tmp_path / "proxy.toml"
    config.write_text(
        '[servers.files]\ncommand = ["files-server"]\n[servers.files.tools.write]\neffect = "write"\n'
    )
    served: list[object] = []

    async def serve(proxy: object, args: object, identity: object) -> None:
        served.append(proxy)

    monkeypatch.setattr("effectgate.cli._mcp_proxy._serve", serve)
    run = cli("mcp", "proxy", "--db", url, "--config", str(config), "--agent", "desk", "--user", "u1")
    assert run.code == 2, run
    assert not keys.exists()
    assert served == []


# -- `demo --db ""`: never $EFFECTGATE_DB


def test_demo_with_an_empty_db_option_never_runs_on_effectgate_db(
    cli: Callable[..., Run], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The demo's database is its own, "never $EFFECTGATE_DB" (its --help): the demo starts afresh
    and its pending refunds would show to real reviewers. `demo --db ""` (a variable that was not
    set, `--db "$DEMO_DB"`) counted as a --db given, then fell back to $EFFECTGATE_DB: the demo
    ran on the application's database."""
    production = f"sqlite:///{tmp_path / 'production.db'}"
    monkeypatch.setenv("EFFECTGATE_DB", production)
    ran: list[str] = []

    def run_demo(url: str, out: object) -> int:
        ran.append(url)
        return 0

    monkeypatch.setattr("effectgate._demo.run_demo", run_demo)
    run = cli("demo", "--db", "")
    assert run.code == 0, run
    assert ran == ["sqlite:///effectgate-demo.db"]


# -- `hash-secret`: the secret read on stdin


def test_hash_secret_of_a_line_ending_in_crlf_is_the_secret_a_sign_in_sends(
    cli: Callable[..., Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`hash-secret < secret.txt` of a file saved with Windows line endings hashed the secret
    with its carriage return: no sign-in form ever sends one, so the approver registered with that
    hash could never sign in (and nothing said why)."""
    pytest.importorskip("starlette")
    from effectgate.web._auth import verify_secret

    monkeypatch.setattr(sys, "stdin", io.StringIO("s3cret-passphrase\r\n"))
    run = cli("hash-secret")
    assert run.code == 0, run
    assert verify_secret("s3cret-passphrase", run.out.strip())


def test_hash_secret_without_stdin_is_a_usage_error(
    cli: Callable[..., Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`effectgate hash-secret <&-` (no standard input at all) exited 70, "unexpected
    AttributeError ... (a bug)", where it is a usage error: there is nothing to read the secret from."""
    pytest.importorskip("starlette")
    monkeypatch.setattr(sys, "stdin", None)
    run = cli("hash-secret")
    assert run.code == 2, run
    assert run.out == ""
