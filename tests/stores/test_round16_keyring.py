"""Round 16: the keyring (`EFFECTGATE_KEYRING`, `Keyring.parse`) and key rotation, with grants
executed against SQLite and PostgreSQL.

Defect found (failed before its fix):
- a keyring that held one secret under two key ids was accepted: the usual rotation mistake
  (the old secret pasted as the new key) left the "retired" key's secret signing every new grant
  and seal under the new id, so removing the old id retired nothing. Refused now, naming both ids
  (never the secret).
- entries written one per line were refused as "key 'k1' is not hex (kid:hexsecret)": the
  message now shows the comma-separated form.

A grant over an approval whose first decision was sealed with a retired key was refused as
"tampered"; since round 17 it is refused as a keyring mismatch naming the key (the audit still
reports decision_forged: it cannot tell a retired key from an edited key id).
"""

from __future__ import annotations

import secrets

import pytest

from effectgate import (
    Approver,
    Effect,
    EffectGate,
    EffectTable,
    Executed,
    Grant,
    Keyring,
    PartialApproval,
    Pending,
    ToolSpec,
)
from effectgate.errors import TokenError
from effectgate.examples.shop import context
from effectgate.stores import SQLStore
from effectgate.testing import EffectRecorder, FakeClock
from effectgate.tokens import ENV_VAR

OLD, NEW = secrets.token_hex(32), secrets.token_hex(32)
ANN, BOB = Approver("ann", "ops"), Approver("bob", "ops")


def test_one_secret_under_two_key_ids_is_refused_without_echoing_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rotation that kept the old secret under the new id is refused, by parse, the environment
    and the constructor alike, naming the ids and never the secret."""
    for text in (f"k2:{OLD},k1:{OLD}", f"k2:{OLD.upper()}, k1:{OLD}"):
        with pytest.raises(ValueError, match="key 'k1' has the secret of key 'k2'") as caught:
            Keyring.parse(text)
        assert OLD not in str(caught.value).lower()
    monkeypatch.setenv(ENV_VAR, f"k2:{OLD},k1:{OLD}")
    with pytest.raises(ValueError, match="has the secret of key"):
        Keyring.from_env()
    with pytest.raises(ValueError, match="has the secret of key"):
        Keyring({"a": bytes.fromhex(OLD), "b": bytes.fromhex(OLD)}, current="a")


def test_whitespace_around_entries_and_inside_the_hex_reads_as_the_same_keyring(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Spaces, tabs and a trailing newline (a secret file's) around the entries are not part of
    the keys; the first entry is current."""
    plain = Keyring.parse(f"k2:{NEW},k1:{OLD}")
    spaced = f"  k2:{NEW[:32]} {NEW[32:]} ,\tk1: {OLD}\n"
    monkeypatch.setenv(ENV_VAR, spaced)
    ring = Keyring.from_env()
    assert ring is not None
    assert ring.dumps() == plain.dumps()
    assert ring.kids == ("k2", "k1")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f"k1:{OLD},k1:{NEW}", "appears twice"),
        (f"k1:{OLD[:62]}", "shorter than 32 bytes"),
        (f"k1:{OLD},", "kid:hexsecret"),
        (f"k1:{OLD}\nk2:{NEW}", r"kid:hexsecret\[,kid:hexsecret"),  # one per line: say commas
        (f"k1:{'ab' * 32}", "not random"),
    ],
    # fixed ids: the secrets are random, and pytest-xdist needs every worker to collect the same names
    ids=["twice", "short", "trailing-comma", "newline", "not-random"],
)
def test_a_malformed_environment_keyring_is_a_clear_error_that_echoes_no_secret(
    monkeypatch: pytest.MonkeyPatch, text: str, message: str
) -> None:
    """Duplicate ids, short keys, a trailing comma, entries one per line, a key of repeated bytes:
    each refused with what is wrong, and without the secret in the message."""
    monkeypatch.setenv(ENV_VAR, text)
    with pytest.raises(ValueError, match=message) as caught:
        Keyring.from_env()
    assert OLD not in str(caught.value)
    assert NEW not in str(caught.value)


@pytest.fixture
def wiping() -> tuple[EffectTable, EffectRecorder]:
    """A destructive `wipe` (two distinct ops approvers) whose effects land at the receiver."""
    receiver = EffectRecorder()

    def wipe(account: str) -> dict[str, str]:
        receiver.record("wipe", account=account)
        return {"wiped": account}

    table = EffectTable(
        [ToolSpec(name="wipe", effect=Effect.DESTRUCTIVE, fn=wipe, approver_role="ops", subject=("account",))]
    )
    table.allow("support", ["wipe"])
    return table, receiver


def _ring(*entries: tuple[str, str]) -> Keyring:
    return Keyring.parse(",".join(f"{kid}:{hexkey}" for kid, hexkey in entries))


def test_a_grant_minted_with_the_old_key_runs_after_the_current_key_changes(
    wiping: tuple[EffectTable, EffectRecorder], store: SQLStore, clock: FakeClock
) -> None:
    """Rotation: a grant (and its approvals' seals) made under k1 executes in a gate whose current
    key is k2 with k1 kept, and an approval begun under k1 is completed under k2."""
    table, receiver = wiping
    with (
        EffectGate(table, store, keyring=_ring(("k1", OLD)), clock=clock) as before,
        EffectGate(table, store, keyring=_ring(("k2", NEW), ("k1", OLD)), clock=clock) as after,
    ):
        first = before.call("wipe", {"account": "a1"}, context("m1"))
        assert isinstance(first, Pending)
        assert isinstance(before.approve(first.approval_id, version=1, approver=ANN), PartialApproval)
        old_grant = before.approve(first.approval_id, version=1, approver=BOB)
        assert isinstance(old_grant, Grant)
        assert old_grant.token.split(".")[1] == "k1"

        second = before.call("wipe", {"account": "a2"}, context("m2"))
        assert isinstance(second, Pending)
        before.approve(second.approval_id, version=1, approver=ANN)  # sealed with k1
        new_grant = after.approve(second.approval_id, version=1, approver=BOB)  # with k2
        assert isinstance(new_grant, Grant)
        assert new_grant.token.split(".")[1] == "k2"

        assert isinstance(after.execute(old_grant.token), Executed)
        assert isinstance(after.execute(new_grant.token), Executed)
        assert [e.payload for e in receiver.effects] == [{"account": "a1"}, {"account": "a2"}]
        assert after.audit().findings == []


def test_a_retired_key_refuses_and_the_grant_is_not_spent(
    wiping: tuple[EffectTable, EffectRecorder], store: SQLStore, clock: FakeClock
) -> None:
    """A gate whose keyring no longer holds k1 refuses a grant signed with k1, and one whose
    approvals were sealed with it; nothing runs, and neither grant is spent: the keyring that
    still holds k1 runs each once."""
    table, receiver = wiping
    with (
        EffectGate(table, store, keyring=_ring(("k1", OLD)), clock=clock) as before,
        EffectGate(table, store, keyring=_ring(("k2", NEW), ("k1", OLD)), clock=clock) as rotated,
        EffectGate(table, store, keyring=_ring(("k2", NEW)), clock=clock) as retired,
    ):
        grants = []
        for n, last in ((1, before), (2, rotated)):  # signed with k1; signed with k2 over a k1 seal
            pending = before.call("wipe", {"account": f"a{n}"}, context(f"m{n}"))
            assert isinstance(pending, Pending)
            before.approve(pending.approval_id, version=1, approver=ANN)
            grant = last.approve(pending.approval_id, version=1, approver=BOB)
            assert isinstance(grant, Grant)
            grants.append(grant)
        for grant in grants:
            with pytest.raises(TokenError) as refused:
                retired.execute(grant.token)
            assert refused.value.reason in ("keyring_mismatch", "tampered")
        assert receiver.effects == []
        for grant in grants:
            assert isinstance(rotated.execute(grant.token), Executed)
        assert [e.payload for e in receiver.effects] == [{"account": "a1"}, {"account": "a2"}]


def test_a_grant_over_an_approval_sealed_with_a_retired_key_is_refused_as_a_keyring_mismatch(
    wiping: tuple[EffectTable, EffectRecorder], store: SQLStore, clock: FakeClock
) -> None:
    """Retiring k1 is not tampering: the refusal names the key the keyring lacks."""
    table, receiver = wiping
    with (
        EffectGate(table, store, keyring=_ring(("k1", OLD)), clock=clock) as before,
        EffectGate(table, store, keyring=_ring(("k2", NEW), ("k1", OLD)), clock=clock) as rotated,
        EffectGate(table, store, keyring=_ring(("k2", NEW)), clock=clock) as retired,
    ):
        pending = before.call("wipe", {"account": "a1"}, context("m1"))
        assert isinstance(pending, Pending)
        before.approve(pending.approval_id, version=1, approver=ANN)  # sealed with k1
        grant = rotated.approve(pending.approval_id, version=1, approver=BOB)  # signed with k2
        assert isinstance(grant, Grant)
        with pytest.raises(TokenError) as refused:
            retired.execute(grant.token)
        assert receiver.effects == []
        assert refused.value.reason == "keyring_mismatch"
        assert "k1" in str(refused.value)
