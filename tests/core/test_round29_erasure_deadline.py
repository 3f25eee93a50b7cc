"""Round 29: `redact` and `retain` judge whether a pending call is still open by the deadline the
gate derives (its version's proposal event plus the gate's `pending_ttl`, `_deadline.for_erasure`),
never by the unsealed `expires_at` column. On SQLite and PostgreSQL; refunds counted at the
provider's receiver.

- Edited backward, the column erases nothing live: the redaction is refused, a retention pass
  skips the call, and it is then approved and runs once.
- Edited forward after the call lapsed, the column keeps nothing: given the gate's policy, the
  lapsed call's arguments are erased by a redaction and by a retention pass.
- Without the gate's policy, the column can only keep a call longer: the `pending_ttl` its
  proposal event recorded (the default's when none) still bounds an edit backward.
- The command line's `redact` and `retain` take the policy of the `--app` gate.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from effectgate import EffectGate, Grant, Keyring, open_store
from effectgate.cli import keyring_for
from effectgate.examples.shop import SHOP_POLICY, Shop, app
from effectgate.redact import RedactionError, redact, retain
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from . import test_cli
from .conftest import ShopGate
from .test_cli import Run
from .test_round29_deadline import FINANCE, _propose, _set_deadline

cli = test_cli.cli  # its fixtures: the command run in-process, and a clean environment
_cli_env = test_cli._cli_env


def _erased(store: SQLStore, approval_id: str) -> bool:
    row = store.get_approval(approval_id)
    assert row is not None
    return row.args_json.startswith('{"$redacted"')


def _approve_and_run_once(shop_gate: ShopGate, store: SQLStore, approval_id: str) -> None:
    grant = shop_gate.gate.approve(approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    shop_gate.gate.execute(grant.token)
    assert shop_gate.shop.receiver.count("refund") == 1
    assert [e.status for e in store.executions(approval_id=approval_id)] == ["succeeded"]


@pytest.mark.parametrize("with_policy", [True, False], ids=["policy", "no-policy"])
def test_a_redaction_refuses_a_live_call_whose_deadline_was_edited_backward(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock, with_policy: bool
) -> None:
    """A live call whose column says it lapsed is not erased: the redaction is refused, and the
    call is then approved and runs once."""
    gate = shop_gate.gate
    pending = _propose(shop_gate)
    clock.advance(gate.policy.pending_ttl / 2)
    _set_deadline(store, pending.approval_id, clock.now() - 1)
    with pytest.raises(RedactionError, match="may still run"):
        redact(
            store,
            gate.keyring,
            user_id="u1",
            by="dpo",
            reason="erasure",
            policy=gate.policy if with_policy else None,
        )
    assert not _erased(store, pending.approval_id)
    assert [e.kind for e in store.events() if e.kind == "redacted"] == []
    _approve_and_run_once(shop_gate, store, pending.approval_id)


def test_a_retention_pass_skips_a_live_call_whose_deadline_was_edited_backward(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock
) -> None:
    """A retention pass leaves a live call alone whatever its column says; it runs once after."""
    gate = shop_gate.gate
    pending = _propose(shop_gate)
    clock.advance(gate.policy.pending_ttl / 2)
    _set_deadline(store, pending.approval_id, clock.now() - 1)
    done = retain(store, gate.keyring, {"money": 0}, by="nightly", policy=gate.policy)
    assert done.values == 0
    assert not _erased(store, pending.approval_id)
    _approve_and_run_once(shop_gate, store, pending.approval_id)


def test_a_lapsed_call_whose_deadline_was_edited_forward_is_erased_by_a_redaction(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock
) -> None:
    """Past its derived deadline (not swept: still `pending`), a call is erased whatever its
    column says."""
    gate = shop_gate.gate
    pending = _propose(shop_gate)
    clock.advance(gate.policy.pending_ttl * 3)
    _set_deadline(store, pending.approval_id, clock.now() + 3600)
    done = redact(store, gate.keyring, user_id="u1", by="dpo", reason="erasure", policy=gate.policy)
    assert done.values > 0
    assert _erased(store, pending.approval_id)
    row = store.get_approval(pending.approval_id)
    assert row is not None
    assert (row.status, row.grants) == ("pending", 0)  # erased as it stood: nothing granted it
    assert shop_gate.shop.receiver.count("refund") == 0


def test_a_lapsed_call_whose_deadline_was_edited_forward_is_erased_by_a_retention_pass(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock
) -> None:
    """A retention pass erases a lapsed call whose column was moved past now."""
    gate = shop_gate.gate
    pending = _propose(shop_gate)
    clock.advance(gate.policy.pending_ttl * 3)
    _set_deadline(store, pending.approval_id, clock.now() + 3600)
    done = retain(store, gate.keyring, {"money": 0}, by="nightly", policy=gate.policy)
    assert done.values > 0
    assert _erased(store, pending.approval_id)
    assert shop_gate.shop.receiver.count("refund") == 0


def test_without_the_policy_a_forward_edit_only_keeps_the_call_longer(
    shop_gate: ShopGate, store: SQLStore, clock: FakeClock
) -> None:
    """Given no policy, erasure keeps a call while its column or the default deadline says it is
    open: an edit may delay its erasure, never make it early."""
    gate = shop_gate.gate
    pending = _propose(shop_gate)
    clock.advance(gate.policy.pending_ttl * 3)
    _set_deadline(store, pending.approval_id, clock.now() + 3600)
    assert retain(store, gate.keyring, {"money": 0}, by="nightly").values == 0
    assert not _erased(store, pending.approval_id)
    clock.advance(3601)
    assert retain(store, gate.keyring, {"money": 0}, by="nightly").values > 0
    assert _erased(store, pending.approval_id)


@pytest.fixture
def ledger_at(tmp_path: Path) -> Callable[[float], tuple[str, str]]:
    """A SQLite ledger holding u1's pending refund proposed `age` seconds ago (the command line
    runs on the system clock); its URL and the approval's id."""

    def make(age: float) -> tuple[str, str]:
        url = f"sqlite:///{tmp_path / 'shop.db'}"
        with open_store(url, clock=FakeClock(time.time() - age)) as store:
            store.setup()
            gate = app(store, keyring=keyring_for(url))
            pending = _propose(ShopGate(Shop(), gate))
            gate.close()
        return url, pending.approval_id

    return make


def _args_erased(url: str, approval_id: str) -> bool:
    with open_store(url) as store:
        return _erased(store, approval_id)


def _edit_deadline(url: str, approval_id: str, at: float) -> None:
    with open_store(url) as store:
        _set_deadline(store, approval_id, at)


def test_the_command_line_erases_by_the_app_gates_deadline(
    ledger_at: Callable[[float], tuple[str, str]], cli: Callable[..., Run]
) -> None:
    """`effectgate retain --app` judges a call by its gate's policy: a lapsed call whose column was
    edited forward is erased with it, and kept (the column can only delay) without it."""
    url, approval_id = ledger_at(3 * SHOP_POLICY.pending_ttl)
    _edit_deadline(url, approval_id, time.time() + 3600)
    retain_ = ("retain", "--db", url, "--rule", "money=0", "--by", "nightly", "--json")
    run = cli(*retain_)
    assert run.code == 0, run.err
    assert not _args_erased(url, approval_id)
    run = cli(*retain_, "--app", "effectgate.examples.shop:app")
    assert run.code == 0, run.err
    assert json.loads(run.out)["values"] > 0
    assert _args_erased(url, approval_id)


def test_the_command_line_refuses_to_erase_a_live_call_edited_backward(
    ledger_at: Callable[[float], tuple[str, str]], cli: Callable[..., Run]
) -> None:
    """`effectgate redact` (with or without `--app`) refuses a live call whose column says it lapsed."""
    url, approval_id = ledger_at(60)
    _edit_deadline(url, approval_id, time.time() - 3600)
    redact_ = ("redact", "--db", url, "--user", "u1", "--by", "dpo", "--reason", "request 77")
    for app_ in ((), ("--app", "effectgate.examples.shop:app")):
        run = cli(*redact_, *app_)
        assert run.code == 4, run
        assert "may still run" in run.err
        assert not _args_erased(url, approval_id)


def test_without_the_policy_the_pending_time_its_proposal_recorded_keeps_a_live_call(
    store: SQLStore, clock: FakeClock
) -> None:
    """A gate whose `pending_ttl` is longer than the default: given no policy, erasure reads the
    pending time the proposal event recorded, so a column edited backward erases nothing live."""
    shop = Shop()
    policy = dataclasses.replace(SHOP_POLICY, pending_ttl=3 * 86400.0)
    gate = EffectGate(shop.table(), store, policy=policy, keyring=Keyring.generate(), clock=clock)
    try:
        pending = _propose(ShopGate(shop, gate))
        clock.advance(2 * 86400)  # past the default's 24 hours, within the gate's three days
        _set_deadline(store, pending.approval_id, clock.now() - 1)
        with pytest.raises(RedactionError, match="may still run"):
            redact(store, gate.keyring, user_id="u1", by="dpo", reason="erasure")
        assert retain(store, gate.keyring, {"money": 0}, by="nightly").values == 0
        assert not _erased(store, pending.approval_id)
        _approve_and_run_once(ShopGate(shop, gate), store, pending.approval_id)
    finally:
        gate.close()
